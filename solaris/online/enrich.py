"""A request's two SOLARIS slots (DESIGN.md step 3): plan the keys, route them, assemble.

``plan`` picks what a request needs (the candidates, their probed item neighbours, the user's
probed nearest neighbours); ``route`` splits it by shard into one ``ShardQuery`` per shard
(one round of calls): the user's shard gets the user's part (own pairs, item-neighbour tier,
aggregate), each neighbour's shard the probe of the neighbours it owns. Each shard's
``PairStore.answer`` reduces its part to at most one row per candidate and tier
(``solaris.cache.answer``); ``assemble`` fills the slots in the fixed tier order pair ->
user-neighbour -> item-neighbour -> zeros, with provenance (tier, age) per candidate, and the
aggregate excluding each candidate whenever it exists. ``enrich_local`` is the whole path
against one in-process store; through the shard actors the result is the same, bit for bit.

No Ray here: the shard client in ``actors/`` makes the calls between ``route`` and
``assemble``; a shard that does not answer contributes ``None`` (all its keys miss)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from solaris.cache.inputs import check_ids, check_time, check_user, check_version
from solaris.cache.query import ShardAnswer, ShardQuery, Slots
from solaris.config import EnrichConfig
from solaris.errors import RequestError
from solaris.knn.neighbours import NeighbourTable
from solaris.tiers import Tier

if TYPE_CHECKING:
    from solaris.cache.store import PairStore

ShardOf = Callable[[np.ndarray], np.ndarray]
_MIN_WEIGHT = 1e-6  # weighted mode: non-positive similarities count (almost) nothing


@dataclass
class RequestPlan:
    """Every key one request needs, and how to read the answers back per candidate."""

    user: int
    # (C,) int64 the candidates as given; a repeated one is simply asked twice (repeats are
    # rare, and finding them would cost every request a sort)
    items: np.ndarray
    nbr_users: np.ndarray  # (k,) int64 probed user neighbours, nearest first
    nbr_sims: np.ndarray  # (k,) float32
    item_nbrs: np.ndarray  # (C, ki) int64 probed item neighbours, nearest first, -1 pad
    weighted: bool  # user-neighbour tier: similarity-weighted mean (else the nearest)
    aggregate: bool  # ask for the aggregated user embedding
    # filled by route(): which shard got the user's keys and which neighbours each shard got
    user_shard: int = -1
    nbr_ranks: dict[int, np.ndarray] = field(default_factory=dict)


def plan(user: int, candidates: np.ndarray, user_knn: NeighbourTable | None,
         item_knn: NeighbourTable | None, cfg: EnrichConfig) -> RequestPlan:
    """The keys of one request; raises RequestError naming a bad user or candidate list."""
    check_user(user)
    cands = check_ids(candidates, "candidates")
    if len(cands) > cfg.max_candidates:
        raise RequestError(f"candidates: {len(cands)} > enrich.max_candidates="
                           f"{cfg.max_candidates}")
    nbr_users = np.zeros(0, dtype=np.int64)
    nbr_sims = np.zeros(0, dtype=np.float32)
    if user_knn is not None and cfg.user_knn_probe > 0:
        nbr_users, nbr_sims = user_knn.nearest(int(user), cfg.user_knn_probe)
    item_nbrs = np.zeros((len(cands), 0), dtype=np.int64)
    if item_knn is not None and cfg.item_tier and cfg.item_knn_probe > 0:
        item_nbrs = item_knn.neighbour_ids(cands, cfg.item_knn_probe)
    return RequestPlan(user=int(user), items=cands, nbr_users=nbr_users,
                       nbr_sims=nbr_sims, item_nbrs=item_nbrs,
                       weighted=cfg.user_knn_mode == "weighted", aggregate=cfg.aggregate)


def route(plan: RequestPlan, shard_of: ShardOf, version: str, now: float) -> dict[int, ShardQuery]:
    """One ShardQuery per shard holding any of the request's keys, the user's shard first.

    The user's shard gets the user's part (own pairs, item-neighbour tier, aggregate); each
    neighbour's shard gets the probe of the neighbours it owns. Records the split in ``plan``
    so ``assemble`` can read the answers back.
    """
    now, version = check_time(now), check_version(version)
    # one ring call for the user and its neighbours
    shards = np.asarray(shard_of(np.concatenate(([plan.user], plan.nbr_users))), dtype=np.int64)
    us = int(shards[0])
    own = ShardQuery(version=version, now=now, items=plan.items, user=plan.user,
                     item_nbrs=plan.item_nbrs, aggregate=plan.aggregate, nbr_all=plan.weighted)
    queries = {us: own}
    plan.user_shard = us
    plan.nbr_ranks = {}
    nbr_shards = shards[1:]
    for s in sorted(set(nbr_shards.tolist())):
        ranks = np.flatnonzero(nbr_shards == s)
        q = queries.get(s)
        if q is None:
            q = queries[s] = ShardQuery(version=version, now=now, items=plan.items,
                                        nbr_all=plan.weighted)
        q.nbr_users = plan.nbr_users[ranks]
        plan.nbr_ranks[s] = ranks
    return queries


def excluded_means(agg_sum: np.ndarray, agg_count: int, n: int, held_idx: np.ndarray,
                   held_vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(means (n, d) float32, present (n,)): the user's aggregate leaving out each of n items.

    ``agg_sum`` (d,) float64 and ``agg_count`` cover the user's retained pairs; item
    ``held_idx[j]`` is one of them, with vector ``held_vectors[j]``, so its mean is
    ``(sum - z) / (count - 1)``; every other item's is ``sum / count``. O(d) per item.
    """
    out = np.zeros((n, len(agg_sum)), dtype=np.float32)
    present = np.full(n, agg_count > 0)
    if agg_count > 0:
        out[:] = (agg_sum / agg_count).astype(np.float32)
    if len(held_idx):
        if agg_count > 1:  # float64 sum minus the float32 vector, exactly as the store keeps it
            out[held_idx] = ((agg_sum - held_vectors) / (agg_count - 1)).astype(np.float32)
        else:  # the item is the user's only pair: nothing left to average
            out[held_idx] = 0.0
            present[held_idx] = False
    return out, present


def assemble(plan: RequestPlan, answers: dict[int, ShardAnswer | None], dim: int) -> Slots:
    """The VM's slots per candidate from the shards' answers (None = that shard missed)."""
    C = len(plan.items)
    emb = np.zeros((C, dim), dtype=np.float32)
    tier = np.zeros(C, dtype=np.int64)  # Tier.NONE
    age = np.zeros(C)
    agg_emb = np.zeros((C, dim), dtype=np.float32)
    agg_present = np.zeros(C, dtype=bool)
    own = answers.get(plan.user_shard)
    if own is not None:
        f = own.own_fresh
        rows = own.own_idx[f]
        emb[rows], age[rows] = own.own_vectors[f], own.own_age_s[f]
        tier[rows] = Tier.PAIR
        if plan.aggregate and own.agg_count > 0:
            agg_emb, agg_present = excluded_means(own.agg_sum, own.agg_count, C, own.own_idx,
                                                  own.own_vectors)
    missing = tier == Tier.NONE

    # user-neighbour tier: hits of every neighbour shard, as (item, neighbour rank)
    parts = [(a, plan.nbr_ranks[s]) for s, a in answers.items()
             if a is not None and s in plan.nbr_ranks and len(a.nbr_idx)]
    if parts and missing.any():
        item = np.concatenate([a.nbr_idx for a, _ in parts])
        rank = np.concatenate([r[a.nbr_rank] for a, r in parts])
        use = np.flatnonzero(missing[item])
        if len(parts) > 1:  # the order one shard holding every neighbour gives: item, rank
            use = use[np.lexsort((rank[use], item[use]))]
        item, rank = item[use], rank[use]
        vec = np.concatenate([a.nbr_vectors for a, _ in parts])[use]
        vage = np.concatenate([a.nbr_age_s for a, _ in parts])[use]
        if len(item):
            if plan.weighted:
                w = np.maximum(plan.nbr_sims[rank].astype(np.float64), _MIN_WEIGHT)
                wsum = np.bincount(item, w, minlength=C)
                acc = np.zeros((C, dim))
                np.add.at(acc, item, w[:, None] * vec)
                got = wsum > 0
                emb[got] = (acc[got] / wsum[got, None]).astype(np.float32)
                age[got] = np.bincount(item, w * vage, minlength=C)[got] / wsum[got]
                tier[got] = Tier.USER_NEIGHBOUR
            else:  # per item, the nearest neighbour first (one shard sends only that one)
                if len(parts) > 1:
                    first = np.flatnonzero(np.concatenate(([True], item[1:] != item[:-1])))
                    item, vec, vage = item[first], vec[first], vage[first]
                emb[item], age[item] = vec, vage
                tier[item] = Tier.USER_NEIGHBOUR

    # item-neighbour tier: the user's own fresh pair of the nearest item neighbour holding one
    if own is not None and len(own.inbr_idx):
        use = tier[own.inbr_idx] == Tier.NONE
        rows = own.inbr_idx[use]
        emb[rows], age[rows] = own.inbr_vectors[use], own.inbr_age_s[use]
        tier[rows] = Tier.ITEM_NEIGHBOUR

    return Slots(pair_emb=emb, pair_present=tier != Tier.NONE, pair_tier=tier, pair_age_s=age,
                 agg_emb=agg_emb, agg_present=agg_present, missing=missing)


def enrich_local(store: "PairStore", user: int, candidates: np.ndarray, now: float,
                 version: str, user_knn: NeighbourTable | None,
                 item_knn: NeighbourTable | None, cfg: EnrichConfig) -> Slots:
    """The whole lookup against one in-process store (every key on shard 0)."""
    p = plan(user, candidates, user_knn, item_knn, cfg)
    queries = route(p, _one_shard, version, now)
    return assemble(p, {s: store.answer(q) for s, q in queries.items()}, store.cfg.dim)


def _one_shard(users: np.ndarray) -> np.ndarray:
    return np.zeros(len(users), dtype=np.int64)
