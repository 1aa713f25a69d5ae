"""``PairStore.answer``: a request's three lookups on one shard in one vectorised pass.

All keys of a query -- direct pairs, the aggregate's excluded items and the user-neighbour
probe grid -- go through the hash index together, so a request costs a few numpy passes
whatever its size.

The user-neighbour probe is a set intersection: for each candidate item, the users holding a
fresh pair of it (the item's holders) intersected with the probed neighbours. Holders are
found through the pair index itself: "does user u hold item i in version v" is one hash
probe, so intersecting a small neighbour set (k ~ 10) with an item's holder set costs k
probes, however many users hold the item (popular items have thousands of holders; walking a
per-item holder list would cost that many steps). The probe grid is built item-major, so hits
come out ordered by item, then neighbour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from solaris.cache.query import ShardAnswer, ShardQuery

if TYPE_CHECKING:
    from solaris.cache.store import PairStore


def answer_query(store: "PairStore", vid: int, now: float, pu: np.ndarray, pi: np.ndarray,
                 au: np.ndarray, ax: np.ndarray, nu: np.ndarray, ni: np.ndarray) -> ShardAnswer:
    """The ShardAnswer of checked query arrays (pairs pu/pi, aggregate au/ax, probe nu x ni)."""
    d = store.codec.dim
    n, a, k, m = len(pu), len(au), len(nu), len(ni)
    c = store.counters
    c["nbr_probes"] += k * m
    c["agg_requests"] += a
    if vid == 0 or store._vcount.get(vid, 0) == 0:
        c["pair_misses"] += n
        _count_other_versions(store, vid, pu, pi)
        q = ShardQuery(version="", now=now, pair_users=pu, pair_items=pi, agg_users=au,
                       agg_exclude=ax)
        return ShardAnswer.empty(q, d)

    # one lookup for every key of the query
    users = np.concatenate([pu, au, np.tile(nu, m)])
    items = np.concatenate([pi, ax, np.repeat(ni, k)])
    slot, _ = store._lookup(users, items, vid)
    held = slot >= 0
    hpos = np.flatnonzero(held)
    hslot = slot[hpos]
    age = np.zeros(len(slot))
    age[hpos] = now - store._meta["written"][hslot]
    fresh = held & (age <= store.cfg.read_ttl_s)
    rows, decode = store._rows, store.codec.decode

    # direct pairs
    found = fresh[:n]
    fpos = np.flatnonzero(found)
    pair_vec = np.zeros((n, d), dtype=np.float32)
    if fpos.size:
        hit_slots = slot[fpos]
        pair_vec[fpos] = decode(rows.take(hit_slots, axis=0))
        store._meta["read"][hit_slots] = 1
    nf = len(fpos)
    c["pair_hits"] += nf
    c["pair_misses"] += n - nf
    if n - nf:
        c["pair_stale"] += int(np.count_nonzero(held[:n])) - nf
        if len(store._vcount) > 1:
            miss = ~held[:n]
            _count_other_versions(store, vid, pu[miss], pi[miss])
    pair_age = np.where(found, age[:n], 0.0)

    # aggregate: running sum of the user's retained pairs, minus the excluded item
    agg_vec = np.zeros((a, d), dtype=np.float32)
    agg_present = np.zeros(a, dtype=bool)
    agg_count = np.zeros(a, dtype=np.int64)
    if a:
        sums = store._sums
        if (au == au[0]).all():  # the usual case: one user's request
            r = sums.find_one(int(au[0]), vid)
            num = np.zeros((a, d)) if r < 0 else np.repeat(sums.sums[r:r + 1], a, axis=0)
            cnt = np.full(a, 0 if r < 0 else int(sums.counts[r]), dtype=np.int64)
        else:
            uu, inv = np.unique(au, return_inverse=True)
            rows_a = sums.find(uu, vid)[inv.reshape(-1)]
            has = rows_a >= 0
            num = np.where(has[:, None], sums.sums[np.maximum(rows_a, 0)], 0.0)
            cnt = np.where(has, sums.counts[np.maximum(rows_a, 0)], 0)
        epos = np.flatnonzero(held[n:n + a])  # excluded items count while retained
        if epos.size:
            num[epos] -= decode(rows.take(slot[n + epos], axis=0))
            cnt[epos] -= 1
        agg_present = cnt > 0
        agg_vec = (num / np.maximum(cnt, 1)[:, None]).astype(np.float32)
        agg_vec[~agg_present] = 0.0
        agg_count = cnt
        c["agg_present"] += int(np.count_nonzero(agg_present))

    # user-neighbour probe: item-major grid of (item, neighbour) keys
    g = np.flatnonzero(fresh[n + a:])
    c["nbr_hits"] += len(g)
    gs = n + a + g
    return ShardAnswer(
        pair_found=found, pair_vectors=pair_vec, pair_age_s=pair_age,
        agg_vectors=agg_vec, agg_present=agg_present, agg_count=agg_count,
        nbr_item_idx=g // k if k else g, nbr_user_idx=g % k if k else g,
        nbr_vectors=decode(rows.take(slot[gs], axis=0)) if g.size else np.zeros((0, d), np.float32),
        nbr_age_s=age[gs])


def _count_other_versions(store: "PairStore", vid: int, users: np.ndarray,
                          items: np.ndarray) -> None:
    """Count missed pairs that the store holds in another version (a rollover signal)."""
    if len(users) == 0:
        return
    for other, cnt in store._vcount.items():
        if other != vid and cnt > 0:
            slot, _ = store._lookup(users, items, other)
            store.counters["pair_other_version"] += int(np.count_nonzero(slot >= 0))
