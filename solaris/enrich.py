"""A request's two SOLARIS slots (DESIGN.md step 3): plan the keys, route them, assemble.

``plan`` picks the keys a request needs (the user's own pairs for the candidates and for
their item neighbours, the aggregate excluding each candidate, the probe of the user's
nearest neighbours); ``route`` groups them by shard into one ``ShardQuery`` per shard (one
round of calls); each shard's ``PairStore.answer`` replies; ``assemble`` fills the slots in
the fixed tier order pair -> user-neighbour -> item-neighbour -> zeros, with provenance
(tier, age) per candidate, and the aggregate whenever it exists. ``enrich_local`` is the
whole path against one in-process store.

No Ray here: the shard client in ``actors/`` makes the calls between ``route`` and
``assemble``; a shard that does not answer contributes ``None`` (all its keys miss).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from solaris.cache.inputs import check_ids, check_time, check_version
from solaris.cache.query import (TIER_ITEM_NBR, TIER_NONE, TIER_PAIR, TIER_USER_NBR,
                                 ShardAnswer, ShardQuery, Slots)
from solaris.config import EnrichConfig
from solaris.errors import DataError, RequestError

if TYPE_CHECKING:
    from solaris.cache.store import PairStore

ShardOf = Callable[[np.ndarray], np.ndarray]
_MIN_WEIGHT = 1e-6  # weighted mode: non-positive similarities count (almost) nothing


@dataclass
class NeighbourTable:
    """A KNN table: row r lists the neighbours of id r, nearest first.

    Ids outside ``[0, n)`` have no neighbours. A row's own id and -1 pads are skipped.
    """

    ids: np.ndarray  # (n, K) int64, -1 = pad
    sims: np.ndarray  # (n, K) float32 similarity of each neighbour
    version: str  # the KNN build that made the table

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        self.sims = np.asarray(self.sims, dtype=np.float32)
        if self.ids.ndim != 2 or self.ids.shape != self.sims.shape:
            raise DataError(f"NeighbourTable ids shape={self.ids.shape}, sims shape="
                            f"{self.sims.shape}: expected two equal (n, K) shapes")

    def neighbours(self, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (len, k) int64 with -1 pad, sims (len, k) float32 with 0 pad) of each key."""
        keys = np.asarray(keys, dtype=np.int64)
        n, width = self.ids.shape
        out_ids = np.full((len(keys), k), -1, dtype=np.int64)
        out_sims = np.zeros((len(keys), k), dtype=np.float32)
        known = (keys >= 0) & (keys < n)
        if k == 0 or width == 0 or not known.any():
            return out_ids, out_sims
        rows = np.flatnonzero(known)
        ids = self.ids.take(keys[rows], axis=0)  # (r, K)
        sims = self.sims.take(keys[rows], axis=0)
        valid = (ids >= 0) & (ids != keys[rows, None])
        if valid[:, :k].all():  # the usual case: the first k are real neighbours
            w = min(k, width)
            out_ids[rows, :w], out_sims[rows, :w] = ids[:, :w], sims[:, :w]
            return out_ids, out_sims
        rank = np.cumsum(valid, axis=1) - 1  # position among the row's valid neighbours
        src = np.flatnonzero(valid & (rank < k))  # flat (row, column) of the kept ones
        dst = rows[src // width] * k + rank.ravel()[src]  # flat (key, rank) in the output
        out_ids.ravel()[dst] = ids.ravel()[src]
        out_sims.ravel()[dst] = sims.ravel()[src]
        return out_ids, out_sims


@dataclass
class RequestPlan:
    """Every key one request needs, and how to read the answers back per candidate."""

    user: int
    candidates: np.ndarray  # (C,) int64 as given
    items: np.ndarray  # (U,) int64 distinct candidates, sorted
    cand_to_item: np.ndarray  # (C,) int64 index into items
    nbr_users: np.ndarray  # (k,) int64 probed user neighbours, nearest first
    nbr_sims: np.ndarray  # (k,) float32
    pair_items: np.ndarray  # (p,) int64 the user's pairs to get: items, then their neighbours
    item_pos: np.ndarray  # (U,) int64 index of each item in pair_items
    inbr_pos: np.ndarray  # (U, ki) int64 index of each item neighbour in pair_items, -1 pad
    weighted: bool  # user-neighbour tier: similarity-weighted mean (else the nearest)
    aggregate: bool  # ask for the aggregated user embedding
    # filled by route(): which shard got the user's keys and which neighbours each shard got
    user_shard: int = -1
    nbr_ranks: dict[int, np.ndarray] = field(default_factory=dict)


def plan(user: int, candidates: np.ndarray, user_knn: NeighbourTable | None,
         item_knn: NeighbourTable | None, cfg: EnrichConfig) -> RequestPlan:
    """The keys of one request; raises RequestError naming a bad user or candidate list."""
    if not isinstance(user, (int, np.integer)) or isinstance(user, bool) or user < 0:
        raise RequestError(f"user={user!r}: must be a non-negative integer id")
    cands = check_ids(candidates, "candidates")
    if len(cands) > cfg.max_candidates:
        raise RequestError(f"candidates: {len(cands)} > enrich.max_candidates="
                           f"{cfg.max_candidates}")
    items, cand_to_item = np.unique(cands, return_inverse=True)
    nbr_users = np.zeros(0, dtype=np.int64)
    nbr_sims = np.zeros(0, dtype=np.float32)
    if user_knn is not None and cfg.user_knn_probe > 0:
        ids, sims = user_knn.neighbours(np.array([user]), cfg.user_knn_probe)
        keep = ids[0] >= 0
        nbr_users, nbr_sims = ids[0][keep], sims[0][keep]
    inb = np.zeros((len(items), 0), dtype=np.int64)
    if item_knn is not None and cfg.item_tier and cfg.item_knn_probe > 0:
        inb, _ = item_knn.neighbours(items, cfg.item_knn_probe)
    # not deduplicated: a repeated key costs the store less than sorting them here does
    U, ki = inb.shape
    pair_items = np.concatenate([items, inb[inb >= 0]])
    item_pos = np.arange(U)
    inbr_pos = np.full(inb.shape, -1, dtype=np.int64)
    inbr_pos[inb >= 0] = U + np.arange(len(pair_items) - U)
    return RequestPlan(user=int(user), candidates=cands, items=items,
                       cand_to_item=cand_to_item.reshape(-1), nbr_users=nbr_users,
                       nbr_sims=nbr_sims, pair_items=pair_items, item_pos=item_pos,
                       inbr_pos=inbr_pos, weighted=cfg.user_knn_mode == "weighted",
                       aggregate=cfg.aggregate)


def route(plan: RequestPlan, shard_of: ShardOf, version: str, now: float) -> dict[int, ShardQuery]:
    """One ShardQuery per shard holding any of the request's keys.

    The user's shard gets the user's own pairs (candidates and item neighbours) and the
    aggregate; each neighbour's shard gets the probe of the neighbours it owns. Records the
    split in ``plan`` so ``assemble`` can read the answers back.
    """
    now, version = check_time(now), check_version(version)
    us = int(np.asarray(shard_of(np.array([plan.user], dtype=np.int64)))[0])
    n_items = len(plan.items)
    own = ShardQuery(version=version, now=now,
                     pair_users=np.full(len(plan.pair_items), plan.user, dtype=np.int64),
                     pair_items=plan.pair_items)
    if plan.aggregate:
        own.agg_users = np.full(n_items, plan.user, dtype=np.int64)
        own.agg_exclude = plan.items
    queries = {us: own}
    plan.user_shard = us
    plan.nbr_ranks = {}
    if len(plan.nbr_users):
        shards = np.asarray(shard_of(plan.nbr_users), dtype=np.int64)
        for s in np.unique(shards).tolist():
            ranks = np.flatnonzero(shards == s)
            q = queries.setdefault(s, ShardQuery(version=version, now=now))
            q.nbr_users = plan.nbr_users[ranks]
            q.nbr_items = plan.items
            plan.nbr_ranks[s] = ranks
    return queries


def assemble(plan: RequestPlan, answers: dict[int, ShardAnswer | None], dim: int) -> Slots:
    """The VM's slots per candidate from the shards' answers (None = that shard missed)."""
    U = len(plan.items)
    emb = np.zeros((U, dim), dtype=np.float32)
    tier = np.full(U, TIER_NONE, dtype=np.int64)
    age = np.zeros(U)
    agg_emb = np.zeros((U, dim), dtype=np.float32)
    agg_present = np.zeros(U, dtype=bool)
    own = answers.get(plan.user_shard)
    found = np.zeros(len(plan.pair_items), dtype=bool)
    if own is not None:
        found = own.pair_found
        hit = found[plan.item_pos]
        rows = plan.item_pos[hit]
        emb[hit], age[hit] = own.pair_vectors[rows], own.pair_age_s[rows]
        tier[hit] = TIER_PAIR
        if plan.aggregate:
            agg_emb, agg_present = own.agg_vectors.astype(np.float32), own.agg_present.copy()
    missing = tier == TIER_NONE

    # user-neighbour tier: hits of every neighbour shard, as (item, neighbour rank)
    parts = [(a, plan.nbr_ranks[s]) for s, a in answers.items()
             if a is not None and s in plan.nbr_ranks and len(a.nbr_item_idx)]
    if parts and missing.any():
        item = np.concatenate([a.nbr_item_idx for a, _ in parts])
        rank = np.concatenate([r[a.nbr_user_idx] for a, r in parts])
        vec = np.concatenate([a.nbr_vectors for a, _ in parts])
        vage = np.concatenate([a.nbr_age_s for a, _ in parts])
        use = missing[item]
        item, rank, vec, vage = item[use], rank[use], vec[use], vage[use]
        if len(item):
            if plan.weighted:
                w = np.maximum(plan.nbr_sims[rank].astype(np.float64), _MIN_WEIGHT)
                wsum = np.bincount(item, w, minlength=U)
                acc = np.zeros((U, dim))
                np.add.at(acc, item, w[:, None] * vec)
                got = wsum > 0
                emb[got] = (acc[got] / wsum[got, None]).astype(np.float32)
                age[got] = np.bincount(item, w * vage, minlength=U)[got] / wsum[got]
            else:
                # per item, nearest neighbour first; one shard's hits already come that way
                o = np.arange(len(item)) if len(parts) == 1 else np.lexsort((rank, item))
                first = o[np.r_[True, item[o][1:] != item[o][:-1]]]
                got = np.zeros(U, dtype=bool)
                got[item[first]] = True
                emb[item[first]], age[item[first]] = vec[first], vage[first]
            tier[got] = TIER_USER_NBR

    # item-neighbour tier: the user's own fresh pair of the nearest item neighbour holding one
    left = tier == TIER_NONE
    if own is not None and plan.inbr_pos.shape[1] and left.any():
        pos = plan.inbr_pos
        f = (pos >= 0) & found[np.maximum(pos, 0)]  # (U, ki)
        rows = np.flatnonzero(left & f.any(axis=1))
        if len(rows):
            src = pos[rows, f[rows].argmax(axis=1)]
            emb[rows], age[rows] = own.pair_vectors[src], own.pair_age_s[src]
            tier[rows] = TIER_ITEM_NBR

    c = plan.cand_to_item
    return Slots(pair_emb=emb[c], pair_present=tier[c] != TIER_NONE, pair_tier=tier[c],
                 pair_age_s=age[c], agg_emb=agg_emb[c], agg_present=agg_present[c],
                 missing=missing[c])


def enrich_local(store: "PairStore", user: int, candidates: np.ndarray, now: float,
                 version: str, user_knn: NeighbourTable | None,
                 item_knn: NeighbourTable | None, cfg: EnrichConfig) -> Slots:
    """The whole lookup against one in-process store (every key on shard 0)."""
    p = plan(user, candidates, user_knn, item_knn, cfg)
    queries = route(p, lambda u: np.zeros(len(u), dtype=np.int64), version, now)
    return assemble(p, {s: store.answer(q) for s, q in queries.items()}, store.cfg.dim)
