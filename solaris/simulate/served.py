"""Simulated serving: every labelled row's SOLARIS inputs as the router would serve them.

The schedule simulation (``solaris.replay.coverage``) says which pairs the FM workers would
have computed and when; here those writes go, in event time, into an in-process
``PairStore`` holding the vectors the serving code computes (``PrecomputeWorker`` over the
user's history as of the speculating request), and each request of the period is looked up
with ``enrich_local`` -- the router's own planning, shard answer and assembly -- against KNN
tables built as the KNN job builds them (the FM's request tower over each user's history as
of the period's start; the FM's item embeddings). So the pair slot's tiers (own pair, user
neighbour, item neighbour), their ages and the aggregate come out exactly as serving makes
them, and a VM can train and be judged on them.

No Ray here. ``TableHistory`` is the worker's history provider over a dataset's event log.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from solaris.cache.query import Slots
from solaris.cache.store import PairStore
from solaris.config import HISTORY_TIMES, SolarisConfig, check_history_at
from solaris.data.schema import ITEM, SEQ, SURFACE, TS, USER, Dataset
from solaris.knn.neighbours import NeighbourTable
from solaris.online.enrich import enrich_local
from solaris.features import FeatureTables
from solaris.history import request_inputs
from solaris.models.encoder import PairEncoder
from solaris.models.batch import vm_batch
from solaris.models.api import FMModel
from solaris.precompute.pqueue import Group
from solaris.artifacts import SideTables
from solaris.precompute.worker import PrecomputeWorker
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.simulate.log import RequestLog
from solaris.simulate.log import row_index
from solaris.tiers import Tier

_TS_BITS = 33  # event times below 2**33 s (year 2242) fit beside the user id in one int64


class TableHistory:
    """``HistoryProvider`` over a dataset's event log: a request's window is the user's up to
    ``history_len`` events strictly before ``now``, most recent first (ties: the later row
    first), as ``HistoryStore.window`` gives it for the same events."""

    def __init__(self, tables: FeatureTables) -> None:
        self.order = np.lexsort((np.arange(tables.num_rows), tables.ts, tables.user))
        self.user = tables.user[self.order]
        self.ts = tables.ts[self.order]
        if len(self.ts) and (self.ts.min() < 0 or self.ts.max() >= 2**_TS_BITS):
            raise ValueError(f"event times outside [0, 2**{_TS_BITS}) s")
        self.key = (self.user << _TS_BITS) + self.ts
        self.item = tables.item[self.order]
        self.surface = tables.surface[self.order]
        bits = (tables.labels.astype(np.int64) << np.arange(tables.labels.shape[1])).sum(1)
        self.bits = bits[self.order]

    def window(self, users: np.ndarray, now: np.ndarray, history_len: int
               ) -> dict[str, np.ndarray]:
        users = np.asarray(users, np.int64)
        now = np.asarray(now, np.float64)
        first = np.searchsorted(self.key, users << _TS_BITS, side="left")  # (R,)
        end = np.searchsorted(self.key, (users << _TS_BITS) + np.ceil(now).astype(np.int64),
                              side="left")  # events with ts < now end here
        idx = end[:, None] - 1 - np.arange(history_len)[None, :]  # (R, L) newest first
        valid = idx >= first[:, None]
        j = np.where(valid, idx, 0)
        return {"valid": valid,
                "item": np.where(valid, self.item[j], 0),
                "ts": np.where(valid, self.ts[j], 0).astype(np.float64),
                "surface": np.where(valid, self.surface[j], 0).astype(np.int32),
                "bits": np.where(valid, self.bits[j], 0).astype(np.int32)}

    def batch(self, users: np.ndarray, now: np.ndarray, surfaces: np.ndarray,
              history_len: int, item_cat: np.ndarray, user_cat: np.ndarray,
              user_cont: np.ndarray, *, unseen_users: bool = False) -> dict[str, np.ndarray]:
        return request_inputs(self.window(users, now, history_len), users, now, surfaces,
                              item_cat, user_cat, user_cont, unseen_users=unseen_users)


def user_table_of(fm: FMModel, users: np.ndarray, items: np.ndarray, ts: np.ndarray,
                  seq: np.ndarray, surfaces: np.ndarray, labels: np.ndarray, side,
                  as_of: float, cfg: SolarisConfig, version: str = "sim") -> NeighbourTable:
    """The user table as the KNN job builds it at ``as_of`` from logged events (any order;
    ``seq`` breaks ties of time): every user with an event before ``as_of``, embedded as the
    user vector ``cfg.knn.user_vector`` of its history then. ``side``: the side-feature
    tables (``FeatureTables`` or ``SideTables``)."""
    from solaris.knn.tables import build_table
    from solaris.knn.user_encoder import events_read, recent_history, user_encoder
    from solaris.knn.user_encoder import request_inputs as user_request_inputs

    kind = cfg.knn.user_vector
    b = np.asarray(ts) < as_of
    hist = recent_history(users[b], items[b], ts[b], seq[b], surfaces[b], labels[b], as_of,
                          events_read(kind, fm, cfg.knn.user_events))
    req = user_request_inputs(hist, as_of, side.item_cat, side.user_cat, side.user_cont)
    user_t, _ = build_table("user", hist["user"], user_encoder(kind, fm).encode(req),
                            cfg.knn.k, cfg.knn, version)
    return user_t.neighbour_table()


def knn_tables_as_of(fm: FMModel, tables: FeatureTables, as_of: float,
                     cfg: SolarisConfig, version: str = "sim"
                     ) -> tuple[NeighbourTable, NeighbourTable]:
    """(user table, item table) as the KNN job builds them at ``as_of`` from the dataset's
    log (``user_table_of``; a row's index is its ``seq``); the FM's item embeddings."""
    from solaris.knn.tables import build_table
    from solaris.knn.user_encoder import item_embeddings

    t = tables
    user_t = user_table_of(fm, t.user, t.item, t.ts, np.arange(len(t.ts)), t.surface, t.labels,
                           t, as_of, cfg, version)
    ivec = item_embeddings(fm)
    item_t, _ = build_table("item", np.arange(len(ivec)), ivec, cfg.knn.item_k, cfg.knn,
                            version)
    return user_t, item_t.neighbour_table()


def user_knn_from_log(fm: FMModel, log: pa.Table, tasks: tuple[str, ...],
                      side: SideTables, as_of: float, cfg: SolarisConfig, version: str = "sim"
                      ) -> NeighbourTable:
    """``user_table_of`` over an interaction log ``log`` (the interaction schema; the closed
    loop's: an arm's own, ``arm_interactions``)."""
    col = {k: log.column(k).to_numpy() for k in (USER, ITEM, TS, SEQ, SURFACE)}
    labels = np.stack([log.column(t).to_numpy() for t in tasks], 1)
    return user_table_of(fm, col[USER], col[ITEM], col[TS], col[SEQ], col[SURFACE], labels,
                         side, as_of, cfg, version)


@dataclass
class ServedSlots:
    """The SOLARIS inputs of ``rows`` (N,) as simulated serving gives them."""

    rows: np.ndarray  # (N,) int64 interaction rows
    mapped: np.ndarray  # (N,) bool: the row was a labelled candidate of a simulated request
    pair_emb: np.ndarray  # (N, d) float32 (zeros where absent)
    pair_tier: np.ndarray  # (N,) int64 Tier codes
    pair_age_s: np.ndarray  # (N,) float64
    agg_emb: np.ndarray  # (N, d) float32
    agg_present: np.ndarray  # (N,) bool
    info: dict  # shares per tier, FM evaluations, agreement with the key-level simulation

    def slots(self, idx: np.ndarray, tiers: set[int] | None = None, agg: bool = True) -> Slots:
        """Slots of positions ``idx``: only the pair tiers in ``tiers`` kept (None: all), the
        aggregate on or off (``select_slots``)."""
        return select_slots(self.pair_tier[idx], self.pair_emb[idx], self.pair_age_s[idx],
                            self.agg_emb[idx], self.agg_present[idx], tiers, agg)

    def batch(self, tables: FeatureTables, idx: np.ndarray, read_ttl_s: float,
              tiers: set[int] | None = None, agg: bool = True) -> dict[str, torch.Tensor]:
        """The VM batch of positions ``idx`` as a tier-aware VM reads it (``vm_batch``)."""
        r = self.rows[idx]
        u, i = tables.user[r], tables.item[r]
        return vm_batch(u, i, tables.surface[r], tables.user_cat[u], tables.item_cat[i],
                        tables.item_cont[i], self.slots(idx, tiers, agg),
                        user_cont=tables.user_cont[u], item_mh=tables.item_mh[i],
                        request_cont=tables.request_cont[r], read_ttl_s=read_ttl_s)


def select_slots(tier: np.ndarray, pair_emb: np.ndarray, age_s: np.ndarray,
                 agg_emb: np.ndarray, agg_present: np.ndarray, tiers: set[int] | None = None,
                 agg: bool = True) -> Slots:
    """Slots with only the pair tiers in ``tiers`` kept (None: all; the others absent, zeros)
    and the aggregate on or off: how the transfer report and the replay switch tiers."""
    tier = np.asarray(tier, np.int64).copy()
    emb = np.array(pair_emb, np.float32)
    age = np.array(age_s, np.float64)
    if tiers is not None:
        off = ~np.isin(tier, sorted(int(t) for t in tiers))
        tier[off], emb[off], age[off] = Tier.NONE, 0.0, 0.0
    present = tier != Tier.NONE
    ap = np.asarray(agg_present, bool) & agg
    return Slots(pair_emb=emb, pair_present=present, pair_tier=tier, pair_age_s=age,
                 agg_emb=np.where(ap[:, None], agg_emb, 0).astype(np.float32),
                 agg_present=ap, missing=~present)


def write_vectors(fm: FMModel, encoder: PairEncoder, tables: FeatureTables,
                  version: str, writes: dict[str, np.ndarray], chunk: int = 512,
                  history_at: str = "request") -> np.ndarray:
    """z (W, d) float32 of each simulated write, computed as an FM worker computes it: one
    ``Group`` per (user, history time, surface), the history as of ``written_at`` (or of
    ``visible_at``: ``worker_vectors``)."""
    if len(writes["user"]) == 0:
        return np.zeros((0, encoder.width), np.float32)
    worker = PrecomputeWorker(fm, encoder, TableHistory(tables),
                              SideTables.from_features(tables), version)
    return worker_vectors(worker, writes, encoder.width, version, chunk=chunk,
                          history_at=history_at)


# the write field each ``ScheduleConfig.history_at`` reads the history as of
HISTORY_AT = dict(zip(HISTORY_TIMES, ("written_at", "visible_at")))


def worker_vectors(worker: PrecomputeWorker, writes: dict[str, np.ndarray], dim: int,
                   version: str, lo: int = 0, hi: int | None = None, chunk: int = 512,
                   history_at: str = "request") -> np.ndarray:
    """z (hi - lo, dim) float32 of writes lo..hi-1 by ``worker``, whose history provider
    answers as of each write's ``written_at`` (``history_at="request"``, the betting
    request's ts) or ``visible_at`` (``"visible"``, the tick end that released it;
    ``ScheduleConfig.history_at``): one ``Group`` per (user, that time, surface), as the FM
    workers group a queue lease."""
    check_history_at(history_at, "history_at")
    hi = len(writes["user"]) if hi is None else hi
    w = hi - lo
    out = np.zeros((max(w, 0), dim), np.float32)
    if w <= 0:
        return out
    user, at = writes["user"][lo:hi], writes[HISTORY_AT[history_at]][lo:hi]
    surface, item = writes["surface"][lo:hi], writes["item"][lo:hi]
    key = np.stack([user.astype(np.float64), at, surface.astype(np.float64)], 1)
    _, gid = np.unique(key, axis=0, return_inverse=True)
    gid = gid.ravel()
    order = np.argsort(gid, kind="stable")
    bounds = np.flatnonzero(np.r_[True, gid[order][1:] != gid[order][:-1], True])
    groups, members = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = order[a:b]
        j = int(m[0])
        groups.append(Group(int(user[j]), float(at[j]), int(surface[j]), version, item[m],
                            np.zeros(len(m))))
        members.append(m)
    for c0 in range(0, len(groups), chunk):
        _, _, z, _ = worker.run(groups[c0:c0 + chunk])
        out[np.concatenate(members[c0:c0 + chunk])] = z
    return out


def simulate_serving(cfg: SolarisConfig, ds: Dataset, tables: FeatureTables, lg: RequestLog,
                     scores: np.ndarray, rows: np.ndarray, fm: FMModel,
                     encoder: PairEncoder, version: str,
                     knn: tuple[NeighbourTable, NeighbourTable], seed: int = 0
                     ) -> ServedSlots:
    """The served SOLARIS inputs of ``rows`` over the request log ``lg``, the verifier
    ranking by ``scores`` (R, C) (the VM alone's, as in serving): the schedule simulation's
    writes, z as the workers compute it, looked up with every tier on."""
    s = cfg.schedule
    sim = simulate_pair_coverage(lg, scores, fraction=cfg.verifier.fraction,
                                 horizon_s=cfg.verifier.horizon_s,
                                 read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=s.lag_s,
                                 tick_s=s.tick_s, budget_per_hour=s.budget_per_hour,
                                 seed=seed, record_writes=True)
    wr = sim["writes"]
    z = write_vectors(fm, encoder, tables, version, wr, history_at=s.history_at)
    store = PairStore(dataclasses.replace(cfg.cache, dim=encoder.width))
    user_knn, item_knn = knn
    enrich = cfg.enrich
    rows = np.asarray(rows, np.int64)
    n, d = len(rows), encoder.width
    out = ServedSlots(rows, np.zeros(n, bool), np.zeros((n, d), np.float32),
                      np.zeros(n, np.int64), np.zeros(n), np.zeros((n, d), np.float32),
                      np.zeros(n, bool), {})
    pos = np.full(tables.num_rows, -1, np.int64)
    pos[rows] = np.arange(n)
    within = max(1, cfg.features.request_granularity_s) if ds.requests is None else 1
    lab = lg.labelled
    vis = wr["visible_at"]
    nxt = 0  # next write to put (writes are in release order, visible_at non-decreasing)
    agree = [0, 0]
    for i in range(lg.num_requests):
        t = float(lg.ts[i])
        stop = int(np.searchsorted(vis, t, side="right"))
        if stop > nxt:
            put_writes(store, wr, z[nxt:stop], nxt, stop, version)
            nxt = stop
        ci = np.flatnonzero(lab[i])
        if len(ci) == 0:
            continue
        r = row_index(ds, np.full(len(ci), lg.user[i]), lg.candidates[i, ci],
                      np.full(len(ci), lg.ts[i]), within)
        at = np.where(r >= 0, pos[np.maximum(r, 0)], -1)
        keep = at >= 0
        if not keep.any():
            continue
        slots = enrich_local(store, int(lg.user[i]), lg.candidates[i, ci[keep]], t, version,
                             user_knn, item_knn, enrich)
        a = at[keep]
        out.mapped[a] = True
        out.pair_emb[a], out.pair_tier[a] = slots.pair_emb, slots.pair_tier
        out.pair_age_s[a] = slots.pair_age_s
        out.agg_emb[a], out.agg_present[a] = slots.agg_emb, slots.agg_present
        own = slots.pair_tier == Tier.PAIR
        agree[0] += int((own == sim["found"][i, ci[keep]]).sum())
        agree[1] += int(keep.sum())
    m = out.mapped
    out.info = {"rows": n, "mapped": float(m.mean()) if n else float("nan"),
                "fm_evals": int(sim["fm_evals"]), "pair_simulated": sim["pair"],
                "own_pair_agrees_with_key_simulation": agree[0] / agree[1] if agree[1] else None,
                "tier_share": {t.label: float((out.pair_tier[m] == t).mean()) if m.any()
                               else float("nan") for t in Tier},
                "aggregate_share": float(out.agg_present[m].mean()) if m.any()
                else float("nan")}
    return out


def put_writes(store: PairStore, wr: dict[str, np.ndarray], z: np.ndarray, lo: int, hi: int,
               version: str) -> None:
    """Writes lo..hi-1 (their vectors ``z``, hi - lo rows) into ``store``, each at its own
    ``written_at`` (one put per time)."""
    at = wr["written_at"][lo:hi]
    for t in np.unique(at):
        m = np.flatnonzero(at == t)
        store.put(wr["user"][lo + m], wr["item"][lo + m], z[m], version, float(t))


def simulate_period(cfg: SolarisConfig, ds: Dataset, tables: FeatureTables, periods,
                    base: torch.nn.Module, fm: FMModel, encoder: PairEncoder,
                    version: str, period: str, seed: int = 0, lg: RequestLog | None = None,
                    verifier: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
                    | None = None) -> ServedSlots:
    """``simulate_serving`` of one period's rows (``vm``, ``val`` or ``test``) over its
    request log (``window_log``, or ``lg``): the verifier ranking by the VM alone ``base``
    (or by ``verifier``: (users, items, surfaces) -> probabilities, e.g. the cross-fitted
    models' out-of-sample scores, ``CrossFit.verifier``), KNN tables as of the period's
    start."""
    from solaris.simulate.schedule import candidate_scores, window_log

    start = {"vm": periods.cuts[0], "val": periods.cuts[1], "test": periods.cuts[2]}
    if period not in start:
        raise ValueError(f"period={period!r}: one of 'vm', 'val', 'test'")
    lg = window_log(cfg, ds, periods, period) if lg is None else lg
    c = lg.candidates.shape[1]
    score = verifier or (lambda u, i, s: candidate_scores(base, tables, u, i, s))
    scores = score(np.repeat(lg.user, c), lg.candidates.ravel(),
                   np.repeat(lg.surface, c)).reshape(-1, c)
    knn = knn_tables_as_of(fm, tables, float(start[period]), cfg)
    return simulate_serving(cfg, ds, tables, lg, scores, getattr(periods, period), fm,
                            encoder, version, knn, seed)
