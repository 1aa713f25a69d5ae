"""Scoring on the serving path: the vertical models, and the FM inline (the benchmark's baseline).

``VMScorer`` runs one trained VM over a batch of requests (the shape ``@serve.batch`` hands
a replica): each request's candidates with the two SOLARIS slots as the router looked them
up (or none, for the VM alone). ``InlineFM`` is the same FM + encoder artifact that fills
the cache, run in the request path (the plain per-pair forward, or with the request part
shared), the pair slot filled for every known candidate with age 0.

Ids the models never saw are served, never refused: an unknown user or item reads an
out-of-vocabulary embedding (the mean of the trained rows) and zero side features, and in
the inline FM an unknown item's pair slot is absent. A request's real-time features
(``ScoreRequest.features``, standardised by ``request_vector``) reach every candidate's row;
a feature the request does not carry reads its training mean (0).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from solaris import wire
from solaris.artifacts import Artifacts, SideTables
from solaris.cache.query import Slots
from solaris.data.schema import FeatureSpec
from solaris.errors import RequestError
from solaris.models.batch import base_batch, slot_batch, vm_batch
from solaris.models.blocks import blockwise
from solaris.online.newusers import computable
from solaris.precompute.pqueue import Group
from solaris.precompute.worker import HistoryProvider, PrecomputeWorker
from solaris.tiers import NUM_TIERS, Tier

Tensor = torch.Tensor


@contextmanager
def scales_set(model: nn.Module, scales: np.ndarray | None) -> Iterator[None]:
    """A residual VM with ``scales`` (2, 4) in place of its own for the block, its own
    restored after; None: as it is."""
    if scales is None:
        yield
        return
    own = model.scale.clone()
    model.scale.copy_(torch.from_numpy(np.array(scales, np.float32).reshape(own.shape)))
    try:
        yield
    finally:
        model.scale.copy_(own)


@dataclass
class PackedSlots:
    """``Slots`` for the trip from router to VM, exactly, in fewer bytes: pair embeddings
    only where present, and the aggregate as one shared row plus the rows that differ from
    it (a user's aggregate differs only for candidates whose own pair is in it). Two
    (C, d) float32 arrays at C = 500, d = 32 are 128 KB, past the size Ray passes inline."""

    n: int
    pair_idx: np.ndarray  # (p,) int32 candidates with a pair slot
    pair_rows: np.ndarray  # (p, d) float32
    pair_tier: np.ndarray  # (C,) int8
    pair_age_s: np.ndarray  # (C,) float32
    agg_base: np.ndarray  # (d,) float32 the row most candidates share
    agg_idx: np.ndarray  # (q,) int32 candidates whose row differs from agg_base
    agg_rows: np.ndarray  # (q, d) float32
    agg_present: np.ndarray  # (C,) bool

    @classmethod
    def pack(cls, z: Slots) -> "PackedSlots":
        pidx = np.flatnonzero(z.pair_present).astype(np.int32)
        ap = np.flatnonzero(z.agg_present)
        base = z.agg_emb[ap[-1]] if len(ap) else np.zeros(z.agg_emb.shape[1], np.float32)
        differ = z.agg_present & (z.agg_emb != base).any(axis=1)
        aidx = np.flatnonzero(differ).astype(np.int32)
        return cls(len(z.pair_present), pidx, z.pair_emb[pidx], z.pair_tier.astype(np.int8),
                   z.pair_age_s.astype(np.float32), base, aidx, z.agg_emb[aidx],
                   z.agg_present.astype(bool))

    def unpack(self) -> Slots:
        c, d = self.n, len(self.agg_base)
        pair = np.zeros((c, d), np.float32)
        pair[self.pair_idx] = self.pair_rows
        present = np.zeros(c, bool)
        present[self.pair_idx] = True
        agg = np.where(self.agg_present[:, None], self.agg_base[None, :], 0).astype(np.float32)
        agg[self.agg_idx] = self.agg_rows
        return Slots(pair_emb=pair, pair_present=present,
                     pair_tier=self.pair_tier.astype(np.int64),
                     pair_age_s=self.pair_age_s.astype(np.float64), agg_emb=agg,
                     agg_present=self.agg_present, missing=~present)


@dataclass
class ScoreRequest:
    """One request as a VM replica receives it."""

    user: int
    items: np.ndarray  # (C,) int64
    surface: int
    slots: Slots | PackedSlots | None  # None: no SOLARIS inputs (the VM alone)
    # (2, 4) the router's live scales for this VM (``solaris/online/scales.py``); None: the VM's own
    scales: np.ndarray | None = None
    # (n_rq,) float32 the request-time features, standardised (``request_vector``); None:
    # none carried, each at its training mean (0)
    features: np.ndarray | None = None


# rows per VM forward (solaris.models.blocks): a 500-candidate request is one block, one
# call as before the blocks (256-row blocks double the calls; bench/request_cpu.py)
VM_BLOCK_ROWS = 512

_PACKED = ("n", "pair_idx", "pair_rows", "pair_tier", "pair_age_s", "agg_base", "agg_idx",
           "agg_rows", "agg_present")


def encode_score_request(version: str, req: ScoreRequest) -> bytes:
    """One ``score_request`` frame (``solaris.wire``): the VM version and ``req``, its slots
    packed (``PackedSlots``); what the router sends a VM replica."""
    slots = req.slots
    if isinstance(slots, Slots):
        slots = PackedSlots.pack(slots)
    packed = ([None] * len(_PACKED) if slots is None
              else [getattr(slots, f) for f in _PACKED])
    features = None if req.features is None else np.asarray(req.features, np.float32)
    return wire.encode("score_request", [str(version), int(req.user),
                                         np.asarray(req.items, np.int64), int(req.surface),
                                         req.scales, features, slots is not None, *packed])


def decode_score_request(buf: bytes) -> tuple[str, ScoreRequest]:
    """(version, ScoreRequest) from an ``encode_score_request`` frame."""
    version, user, items, surface, scales, features, has_slots, *packed = wire.decode(
        buf, "score_request", 7 + len(_PACKED))
    slots = PackedSlots(*packed) if has_slots else None
    return version, ScoreRequest(user, items, surface, slots, scales, features)


def request_vector(spec: FeatureSpec, features: Mapping[str, float] | None) -> np.ndarray:
    """(n_rq,) float32: a request's real-time features ``name -> raw value`` standardised
    with the training mean and std (``spec.request_continuous``); a declared feature the
    request does not carry is 0 (its mean: the loader's convention for nulls).
    ``RequestError`` naming the feature: a name the spec does not declare, or a value that
    is not a finite number."""
    names = spec.request_continuous
    out = np.zeros(len(names), np.float32)
    if not features:
        return out
    index = {n: j for j, n in enumerate(names)}
    for name, value in features.items():
        if name not in index:
            raise RequestError(f"feature {name!r} is not declared (request features: "
                               f"{', '.join(names) if names else 'none'})")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                or not math.isfinite(float(value)):
            raise RequestError(f"feature {name!r}: must be a finite number")
        j = index[name]
        out[j] = (float(value) - spec.request_mean[j]) / spec.request_std[j]
    return out


def encode_scores(scores: np.ndarray) -> bytes:
    """A replica's (2, C) answer to one request as a ``scores`` frame."""
    return wire.encode("scores", [np.asarray(scores)])


def decode_scores(buf: bytes) -> np.ndarray:
    """The (2, C) array ``encode_scores`` framed (read-only)."""
    (scores,) = wire.decode(buf, "scores", 1)
    return scores


class VMScorer:
    """One trained VM (``vm_<task>.pt``) scoring whole requests, batched across requests."""

    def __init__(self, artifacts: Artifacts, task: str, side: SideTables,
                 read_ttl_s: float = 4 * 3600.0, block_rows: int = VM_BLOCK_ROWS,
                 alone: bool = False):
        """``block_rows``: the fixed block size of the forward (0: one call per batch).
        ``alone``: score with the VM alone (``vm_<task>_alone.pt``) on its own, slots and
        scales ignored -- what evaluation compares the served VM with."""
        self.block_rows = int(block_rows)
        self.alone = bool(alone)
        model, vm, meta = artifacts.vm(task)
        if self.alone:
            model = vm = artifacts.vm_alone(task)[0]
        vm.with_unknown_ids()  # ids num_users / num_items read the out-of-vocabulary rows
        self.model = model.eval()
        self.task = task
        self.version = str(meta.get("version", ""))
        self.dim = int(meta["slot_dim"])
        self.num_users, self.num_items = int(meta["num_users"]), int(meta["num_items"])
        self.spec = FeatureSpec.from_dict(meta["spec"])
        self.num_surfaces = self.spec.num_surfaces
        self.side = side
        self.read_ttl_s = float(read_ttl_s)

    def batch_rows(self, user: np.ndarray, item: np.ndarray, surface: np.ndarray,
                   slots: Slots | PackedSlots | None = None, base_only: bool = False,
                   request_cont: np.ndarray | None = None) -> dict[str, Tensor]:
        """The VM's input batch for rows (user, item, surface), each (B,), as served: an id
        the VM never saw reads the out-of-vocabulary row and zero side features, a surface
        outside the vocabulary the nearest one; ``slots`` (B rows) as the router looked
        them up (a tier the VM did not train on has scale 0); None: no SOLARIS inputs.
        ``base_only``: only the keys a VM alone reads (``base_batch``; slots ignored).
        ``request_cont``: (n_rq,) one request's standardised real-time features for every
        row, or (B, n_rq) per row; None: each at its training mean (0)."""
        user, item = np.asarray(user, np.int64), np.asarray(item, np.int64)
        known_u = (0 <= user) & (user < self.num_users)
        known_i = item < self.num_items
        s = self.side

        def side(table: np.ndarray, known: np.ndarray, ids: np.ndarray) -> np.ndarray:
            out = np.zeros((len(ids), *table.shape[1:]), table.dtype)  # unknown: zeros
            out[known] = table[ids[known]]
            return out

        feats = dict(user_cont=side(s.user_cont, known_u, user),
                     item_mh=side(s.item_mh, known_i, item),
                     request_cont=self._request_rows(len(user), request_cont))
        user_cat = side(s.user_cat, known_u, user)
        item_cat = side(s.item_cat, known_i, item)
        item_cont = side(s.item_cont, known_i, item)
        ids = (np.where(known_u, user, self.num_users), np.where(known_i, item, self.num_items),
               np.clip(np.asarray(surface, np.int64), 0, self.num_surfaces - 1))
        if base_only:
            return base_batch(*ids, user_cat, item_cat, item_cont, **feats)
        z = slots.unpack() if isinstance(slots, PackedSlots) else slots
        return vm_batch(*ids, user_cat, item_cat, item_cont, z, dim=self.dim,
                        read_ttl_s=self.read_ttl_s, **feats)

    def _request_rows(self, n: int, request_cont: np.ndarray | None) -> np.ndarray:
        """(n, n_rq) float32 of ``batch_rows``'s ``request_cont``; RequestError if its width
        is not the VM's."""
        width = len(self.spec.request_continuous)
        if request_cont is None:
            return np.zeros((n, width), np.float32)
        r = np.asarray(request_cont, np.float32)
        if r.shape[-1:] != (width,) or r.ndim not in (1, 2):
            raise RequestError(f"request features of shape {r.shape}: the VM reads {width} "
                               f"({', '.join(self.spec.request_continuous) or 'none'})")
        return np.broadcast_to(r, (n, width))

    def batch(self, requests: Sequence[ScoreRequest], base_only: bool = False
              ) -> dict[str, Tensor]:
        """The VM's input batch for whole requests, their candidates one after another (what
        ``score`` runs the VM on; ``base_only``: what its VM alone runs on)."""
        parts = [self.batch_rows(np.full(len(r.items), r.user, np.int64), r.items,
                                 np.full(len(r.items), r.surface, np.int64), r.slots,
                                 base_only, r.features)
                 for r in requests]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def scales(self) -> np.ndarray:
        """(2, 4) the scales this VM applies (the VM alone: none, all 0)."""
        if self.alone:
            return np.zeros((2, NUM_TIERS), np.float32)
        return self.model.scale.numpy().copy()

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest], with_base: bool = False
              ) -> list[np.ndarray]:
        """Probabilities (C_r,) float32 of each request's candidates: one forward per set of
        scales the requests carry (one, unless an operator just changed them). ``with_base``:
        (2, C_r) per request, the served probabilities and the VM alone's inside it (what the
        verifier ranks by)."""
        if not requests:
            return []
        groups: dict[bytes | None, list[int]] = {}
        for i, r in enumerate(requests):
            key = None if r.scales is None or self.alone else \
                np.asarray(r.scales, np.float32).tobytes()
            groups.setdefault(key, []).append(i)
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(requests)
        for key, idx in groups.items():
            scales = None if key is None else np.frombuffer(key, np.float32)
            with scales_set(self.model, scales):
                for i, p in zip(idx, self._forward([requests[i] for i in idx], with_base)):
                    out[i] = p
        return out

    def _forward(self, requests: Sequence[ScoreRequest], with_base: bool = False
                 ) -> list[np.ndarray]:
        batch = self.batch(requests)
        cuts = np.cumsum([len(r.items) for r in requests])[:-1]
        # in fixed-size blocks, the sigmoid included (an elementwise op rounds by the shape
        # it runs over, too): a candidate's score does not depend on which requests shared
        # its @serve.batch call (solaris.models.blocks); the served score and the VM alone
        # inside it go through the same shapes, so a miss equals the VM alone bit for bit
        if not with_base or self.alone:
            if self.alone and with_base:
                raise RequestError(f"task={self.task!r}: the VM alone has no base of its own; "
                                   "score it without with_base")
            return np.split(blockwise(lambda b: torch.sigmoid(self.model(b)), batch,
                                      self.block_rows).numpy(), cuts)  # (sum C,)
        logit, base = blockwise(lambda b: tuple(torch.sigmoid(x)
                                                for x in self.model.forward_both(b)), batch,
                                self.block_rows)
        both = np.stack([logit.numpy(), base.numpy()])
        return np.split(both, cuts, axis=1)  # (2, C) each

    @torch.inference_mode()
    def base_logits(self, requests: Sequence[ScoreRequest]) -> list[np.ndarray]:
        """The VM alone's logits (C_r,) float32 of each request's candidates (slots and
        scales ignored): what ``ResidualHead.served`` completes into the served scores, in the
        same fixed-size blocks as ``score``, so the two give ``score(with_base=True)``'s
        bits."""
        if self.alone:
            raise RequestError(f"task={self.task!r}: a VM-alone scorer; score() is its logits")
        if not requests:
            return []
        batch = self.batch(requests, base_only=True)
        cuts = np.cumsum([len(r.items) for r in requests])[:-1]
        return np.split(blockwise(self.model.base, batch, self.block_rows).numpy(), cuts)


class ResidualHead:
    """A residual VM's corrections without its VM alone: ``served(base logits, slots,
    scales)`` gives the (2, C) probabilities ``VMScorer.score(with_base=True)`` gives, bit
    for bit (the same modules on the same fixed-size blocks, ``tests/unit/test_scoring.py``).

    The router holds one per residual VM, so that its lookup round and the VM alone's forward
    run side by side (``VMScorer.base_logits`` in the VM replica): the corrections read only
    the slots, their tier and age and the base's logit, a few small products per candidate.
    """

    def __init__(self, artifacts: Artifacts, task: str, read_ttl_s: float = 4 * 3600.0,
                 block_rows: int = VM_BLOCK_ROWS):
        model, _, meta = artifacts.vm(task)
        self.model = model.eval()
        self.model.base = None  # the VM replica runs it; forward is always given its logits
        self.task = task
        self.dim = int(meta["slot_dim"])
        self.num_items = int(meta["num_items"])
        self.reads_items = bool(meta.get("agg_items"))
        self.read_ttl_s = float(read_ttl_s)
        self.block_rows = int(block_rows)

    @torch.inference_mode()
    def served(self, base_logit: np.ndarray, slots: Slots | None,
               scales: np.ndarray | None = None, items: np.ndarray | None = None
               ) -> np.ndarray:
        """(2, C) float32: the served probabilities and the VM alone's, from the VM alone's
        logits (C,) and the request's slots as looked up (None: none, the VM alone);
        ``scales`` (2, 4): the router's live scales for this VM (None: the VM's own);
        ``items`` (C,): the candidates' item ids, which an aggregate correction that meets
        the candidate reads (an id the VM does not know reads its zero row)."""
        b = np.array(base_logit, np.float32)  # a copy: a decoded frame is read-only
        if b.ndim != 1:
            raise RequestError(f"base_logit: expected shape (C,), got {b.shape}")
        batch = slot_batch(len(b), slots, dim=self.dim, read_ttl_s=self.read_ttl_s)
        if items is not None:
            it = np.asarray(items, np.int64)
            if it.shape != b.shape:
                raise RequestError(f"items: expected shape {b.shape}, got {it.shape}")
            known = (0 <= it) & (it < self.num_items)
            batch["item"] = torch.from_numpy(np.where(known, it, self.num_items))
        elif self.reads_items:
            if slots is not None and bool(np.any(slots.agg_present)):
                raise RequestError(f"task={self.task!r}: this VM's aggregate correction reads "
                                   "the candidates: pass their item ids")
            batch["item"] = torch.full((len(b),), self.num_items)  # no aggregate: not read
        batch["base"] = torch.from_numpy(b)
        with scales_set(self.model, scales):
            logit, base = blockwise(
                lambda x: (torch.sigmoid(self.model(x, base_logit=x["base"])),
                           torch.sigmoid(x["base"])), batch, self.block_rows)
        return np.stack([logit.numpy(), base.numpy()])


class InlineFM:
    """The cache's FM + encoder run in the request path: a pair slot for every known candidate.

    The forward is the FM workers' own (``PrecomputeWorker``) over one request group: with
    ``sharing`` the request part runs once, as the workers run it; without, every pair
    carries its own request side, as a ranking model scores pairs in the request path."""

    def __init__(self, artifacts: Artifacts, side: SideTables, history: HistoryProvider,
                 sharing: bool = False):
        fm, enc, version = artifacts.models()
        self.worker = PrecomputeWorker(fm, enc, history, side, version)
        self.sharing = sharing
        self.version = version
        self.num_users, self.num_items = artifacts.num_users, artifacts.num_items
        self.dim = enc.width

    def embed(self, user: int, items: np.ndarray, surface: int, now: float
              ) -> tuple[np.ndarray, np.ndarray]:
        """(z (C, d) float32, known (C,) bool): the pair embedding of every known candidate."""
        items = np.asarray(items, np.int64)
        # a user the FM never saw: none of its pairs, unless the FM reads such users
        known = computable(user, items, self.num_users, self.num_items,
                           self.worker.unseen_users)
        z = np.zeros((len(items), self.dim), np.float32)
        if not known.any():
            return z, known
        it = items[known]
        group = Group(user, float(now), max(surface, 0), self.version, it, np.zeros(len(it)))
        run = self.worker.run if self.sharing else self.worker.run_naive
        z[known] = run([group])[2]  # (B, d)
        return z, known

    def slots(self, user: int, items: np.ndarray, surface: int, now: float) -> Slots:
        z, known = self.embed(user, items, surface, now)
        c = len(z)
        return Slots(pair_emb=z, pair_present=known,
                     pair_tier=np.where(known, Tier.PAIR, Tier.NONE).astype(np.int64),
                     pair_age_s=np.zeros(c), agg_emb=np.zeros_like(z),
                     agg_present=np.zeros(c, bool), missing=np.zeros(c, bool))
