"""The FM worker's pure step: leased request groups in, pair embeddings out.

DESIGN.md step 6 and the request-side sharing contract. For a lease's groups (one served
request each), ``PrecomputeWorker.run`` builds one request batch -- one row per group, the
user's history as of the group's event time -- runs the FM's ``request_part`` once over it,
then ``candidate_part`` over every chosen item of every group in one batch (``req_index``
maps each item to its group's row), and compresses the last shared layer with the pair
encoder. ``run_naive`` computes the same vectors with the plain per-pair forward (every pair
carries its own copy of the request side), the baseline the precompute benchmark compares.

Where the history comes from is a ``HistoryProvider``: live, ``WindowHistory`` over the
cache shards' history windows (what ``actors.precompute`` wires by default); or any object
with ``batch``, e.g. an in-process ``HistoryStore`` filled from a log (tests, benchmarks).

The actor around it owns leasing, the cache write (with ``version``) and the ack.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from solaris.config import PrecomputeConfig
from solaris.errors import RequestError
from solaris.history import request_inputs
from solaris.models.api import REQUEST_KEYS, FMModel, reads_unseen_users, shared_layer
from solaris.models.blocks import blockwise
from solaris.models.encoder import PairEncoder
from solaris.precompute.pqueue import Group

log = logging.getLogger(__name__)

Tensor = torch.Tensor
Result = tuple[np.ndarray, np.ndarray, np.ndarray, float]  # users, items, vectors, seconds


class SideFeatures(Protocol):
    """Side-feature tables, indexed by user / item id (``FeatureTables`` has them)."""

    user_cat: np.ndarray  # (num_users, n_uc) int
    user_cont: np.ndarray  # (num_users, n_ud) float32
    item_cat: np.ndarray  # (num_items, n_ic) int, raw codes
    item_mh: np.ndarray  # (num_items, n_mh, M) int, codes + 1 (0 = pad)
    item_cont: np.ndarray  # (num_items, n_id) float32


class HistoryProvider(Protocol):
    """What the worker needs of the history store (``solaris.history.HistoryStore``):
    ``batch`` is ``solaris.history.request_inputs`` over the users' history windows."""

    def batch(self, users: np.ndarray, now: np.ndarray, surfaces: np.ndarray,
              history_len: int, item_cat: np.ndarray, user_cat: np.ndarray,
              user_cont: np.ndarray, *, unseen_users: bool = False
              ) -> dict[str, np.ndarray]: ...


WindowFetch = Callable[[np.ndarray, np.ndarray, int], dict]  # (users, now, L) -> window
# (users, now, L) -> a function that returns the window: the read goes out at once
WindowStart = Callable[[np.ndarray, np.ndarray, int], Callable[[], dict]]
# the fixed block sizes of a forward (solaris.models.blocks; PrecomputeConfig's defaults):
# small enough that padding a lease's last block costs little, large enough that a CPU
# matrix product stays efficient
BLOCK_REQUESTS = PrecomputeConfig.block_requests
BLOCK_PAIRS = PrecomputeConfig.block_pairs
MAX_AHEAD = 4  # prefetched windows kept; an unused one (its lease failed) is dropped


class WindowHistory:
    """A ``HistoryProvider`` over raw history windows fetched elsewhere -- the live wiring:
    ``fetch`` is ``actors.cache.CacheGroup.history.window`` (one parallel round to the
    cache shards that own the users' histories) or, in process, ``HistoryStore.window``.

    The shards return raw windows (item ids, times, surfaces, label bits) and the request
    inputs are built here with the worker's side tables (``solaris.history.request_inputs``):
    cheaper than giving every shard the item and user tables and shipping (R, L, n_ic)
    category codes back.
    """

    def __init__(self, fetch: WindowFetch, start: WindowStart | None = None) -> None:
        self.fetch = fetch
        self.start = start  # e.g. ``CacheGroup.history.window_start``; None: no prefetch
        self._ahead: dict[tuple, Callable[[], dict]] = {}  # reads in flight, by request rows

    @staticmethod
    def _key(users: np.ndarray, now: np.ndarray, history_len: int) -> tuple:
        return (np.asarray(users, np.int64).tobytes(), np.asarray(now, np.float64).tobytes(),
                int(history_len))

    def prefetch(self, users: np.ndarray, now: np.ndarray, history_len: int) -> None:
        """Start reading these requests' window now; the ``batch`` call for exactly these
        rows uses it (any other call reads afresh). Not thread-safe: call from the thread
        that calls ``batch``."""
        if self.start is None or not len(users):
            return
        while len(self._ahead) >= MAX_AHEAD:
            self._ahead.pop(next(iter(self._ahead)))
        self._ahead[self._key(users, now, history_len)] = self.start(users, now, history_len)

    def batch(self, users: np.ndarray, now: np.ndarray, surfaces: np.ndarray,
              history_len: int, item_cat: np.ndarray, user_cat: np.ndarray,
              user_cont: np.ndarray, *, unseen_users: bool = False) -> dict[str, np.ndarray]:
        """``HistoryProvider.batch`` from the fetched (or prefetched) window."""
        pending = self._ahead.pop(self._key(users, now, history_len), None)
        win = pending() if pending is not None else self.fetch(users, now, history_len)
        return request_inputs(win, users, now, surfaces, item_cat, user_cat, user_cont,
                              unseen_users=unseen_users)


def device_sizes(cfg: PrecomputeConfig, device: str | torch.device
                 ) -> tuple[int, int, int | None]:
    """(block requests, block pairs, pairs per lease) of a worker on ``device``: a GPU's own
    larger sizes, or the CPU's blocks and the queue's default lease (None)."""
    if torch.device(device).type == "cuda":
        return cfg.gpu_block_requests, cfg.gpu_block_pairs, cfg.gpu_lease_pairs
    return cfg.block_requests, cfg.block_pairs, None


def describe_device(device: str | torch.device) -> str:
    """Where FM inference runs, for logs, ``/stats`` and bench JSON: ``cpu``, or
    ``cuda:<index> (<GPU name>)`` -- which GPU, not only that there is one."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


class PrecomputeWorker:
    """Runs FM + encoder over leased request groups, sharing each group's request part."""

    def __init__(self, fm: FMModel, encoder: PairEncoder, history: HistoryProvider,
                 tables: SideFeatures, version: str, device: str | torch.device = "cpu",
                 timer: Callable[[], float] = time.perf_counter, *,
                 block_requests: int = BLOCK_REQUESTS, block_pairs: int = BLOCK_PAIRS) -> None:
        """``block_requests`` / ``block_pairs``: the fixed block sizes of the request and the
        candidate parts (``solaris.models.blocks``): a pair's embedding is then the same
        whatever else its lease holds (0: one call on the whole lease)."""
        if not version:
            raise RequestError(f"version={version!r}: must be non-empty")
        self.block_requests, self.block_pairs = int(block_requests), int(block_pairs)
        self.device = torch.device(device)
        self.fm = fm.to(self.device).eval()  # no dropout: precompute is inference
        self.encoder = encoder.to(self.device).eval()
        self.history = history
        self.tables = tables
        self.version = version
        self.timer = timer  # measures FM-seconds (cost accounting, not TTL logic)
        self.num_items = len(tables.item_cat)
        # an FM that reads users it never saw gets their groups (an id past the user
        # tables, zero side features); any other refuses them (the router queues none)
        self.unseen_users = reads_unseen_users(fm)

    # ------------------------------------------------------------------ batches
    def _check(self, groups: Sequence[Group]) -> list[Group]:
        out = []
        for g in groups:
            if g.version != self.version:
                raise RequestError(f"group version={g.version!r}: this worker computes "
                                   f"{self.version!r}")
            items = np.asarray(g.items)
            if items.ndim != 1 or (len(items) and (items.min() < 0
                                                   or items.max() >= self.num_items)):
                raise RequestError(f"group of user {g.user}: items outside 0..{self.num_items - 1}")
            if len(items):
                out.append(g)
        return out

    @staticmethod
    def history_times(groups: Sequence[Group], read_at: float | None = None) -> np.ndarray:
        """(groups,) float64: the event time each group's history is read as of: ``read_at``
        for all (``Lease.read_at``), or None: each group's own request time."""
        return np.array([g.now if read_at is None else read_at for g in groups], np.float64)

    def _batches(self, groups: list[Group], read_at: float | None = None
                 ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor, np.ndarray,
                            np.ndarray]:
        """(request batch (R rows), candidate batch (B rows), req_index (B,), users, items)."""
        t = self.tables
        r_users = np.array([g.user for g in groups], np.int64)  # (R,)
        r_now = self.history_times(groups, read_at)  # (R,)
        r_surf = np.array([g.surface for g in groups], np.int64)  # (R,)
        req_np = self.history.batch(r_users, r_now, r_surf, self.fm.history_len, t.item_cat,
                                    t.user_cat, t.user_cont, unseen_users=self.unseen_users)
        sizes = np.array([len(g.items) for g in groups], np.int64)
        items = np.concatenate([np.asarray(g.items, np.int64) for g in groups])  # (B,)
        req_index = np.repeat(np.arange(len(groups)), sizes)  # (B,)
        dev = self.device
        req = {k: torch.from_numpy(np.ascontiguousarray(req_np[k])).to(dev) for k in REQUEST_KEYS}
        cand = {"item": torch.from_numpy(items).to(dev),  # (B,)
                "item_cat": torch.from_numpy(t.item_cat[items].astype(np.int64)).to(dev),
                "item_mh": torch.from_numpy(t.item_mh[items].astype(np.int64)).to(dev),
                "item_cont": torch.from_numpy(t.item_cont[items].astype(np.float32)).to(dev)}
        return req, cand, torch.from_numpy(req_index).to(dev), r_users[req_index], items

    def _empty(self) -> Result:
        return (np.zeros(0, np.int64), np.zeros(0, np.int64),
                np.zeros((0, self.encoder.width), np.float32), 0.0)

    # ------------------------------------------------------------------ forward passes
    def run(self, groups: Sequence[Group], read_at: float | None = None) -> Result:
        """(users (n,), items (n,), vectors (n, d) float32, FM-seconds) for every pair of
        ``groups``, in group order; the request part runs once per group. The history is
        read as of ``read_at`` (``Lease.read_at``), None: as of each group's request."""
        return self._forward(groups, naive=False, read_at=read_at)

    def run_naive(self, groups: Sequence[Group], read_at: float | None = None) -> Result:
        """Same result through the plain per-pair forward: each pair carries its own copy of
        its group's request side, so the request part runs once per pair."""
        return self._forward(groups, naive=True, read_at=read_at)

    def _forward(self, groups: Sequence[Group], naive: bool,
                 read_at: float | None = None) -> Result:
        groups = self._check(groups)
        if not groups:
            return self._empty()
        req, cand, req_index, users, items = self._batches(groups, read_at)
        with torch.inference_mode():
            t0 = self.timer()
            if naive:
                batch = {k: v.index_select(0, req_index) for k, v in req.items()}  # B rows each
                batch.update(cand)
                shared = shared_layer(self.fm, batch)  # (B, S)
                z = self.encoder.encode(shared)
            else:  # in fixed-size blocks: a pair's vector does not depend on its lease
                state = blockwise(self.fm.request_part, req, self.block_requests)  # R rows
                z = blockwise(lambda c: self.encoder.encode(self.fm.candidate_part(
                    state, c, c["req_index"])), {**cand, "req_index": req_index},
                    self.block_pairs)  # (B, d)
            z = z.float().cpu().numpy()  # (B, d)
            seconds = self.timer() - t0
        return users, items, z, seconds
