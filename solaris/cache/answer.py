"""Reads of one shard's store: a request's answer (``answer_query``) and the batch reads behind
``PairStore.get`` / ``aggregate`` / ``holders``.

A request's answer is reduced here, on the shard, asking the hash index only what the tiers
before left open (tier order: pair -> user-neighbour -> item-neighbour):

1. the user's own pairs of the candidates (on the user's shard: one lookup);
2. the user-neighbour probe, a set intersection: which probed neighbours hold a fresh pair of
   which candidate. "Does user v hold item i" is one hash probe, so intersecting k ~ 10
   neighbours with an item's holders costs k probes however popular the item is (walking a
   per-item holder list would cost its length). A neighbour who holds no pair of the version
   (no running-sum row; one small lookup) is left out of the grid. On the user's shard only
   candidates without a fresh own pair are probed; in nearest mode only the nearest hit per
   candidate goes back;
3. the item-neighbour tier (on the user's shard): for candidates without a fresh own pair,
   the user's own pairs of their item neighbours; only the nearest fresh one per candidate
   still open after step 2 goes back. Steps 2 and 3 share one lookup: each lookup costs ~50
   numpy calls whatever its size, and on a 2-core machine those calls, not the keys, are most
   of a shard's time.

So an answer holds at most one row per candidate and tier (similarity-weighted mode: every
neighbour hit), not one per key asked. The aggregate goes back as the user's running sum and
count; the candidates' own retained pairs come with the own pairs, so the client leaves each
candidate out in O(d). An entry's ``read`` flag records that it was served as its user's own
pair (what speculation precision counts), not its use as a neighbour's imputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from solaris.cache.index import key_hash
from solaris.cache.query import ShardAnswer
from solaris.cache.slab import SlotTable, gather
from solaris.cache.sums import UserSums

Keys = Callable[[np.ndarray], "np.ndarray | int"]


@dataclass(frozen=True)
class StoreView:
    """What a read of a store sees: its slot table, its running sums, the live entries of
    each version id, its counters (which reads count into) and the read TTL. The store
    builds one and passes it; the reads touch nothing else (and change only the counters
    and the table's read flags)."""

    table: SlotTable
    sums: UserSums
    held: dict[int, int]  # version id -> live entries
    counters: dict[str, int]
    read_ttl_s: float

    @property
    def dim(self) -> int:
        return self.table.codec.dim

    def holds(self, vid: int) -> bool:
        """Any live entry of version id ``vid`` (0: a version never written)."""
        return vid != 0 and self.held.get(vid, 0) > 0


def fresh_at(age: np.ndarray, ttl: float) -> np.ndarray:
    """Which entries of these ages (read time - write time) are served: written at or before
    the read (never a negative age, an entry from the reader's future) and within the TTL."""
    return (age >= 0.0) & (age <= ttl)


def _find(store: StoreView, h: np.ndarray, key_user: Keys, key_item: Keys, vid: int,
          now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, slot, age_s) of the keys held in version ``vid`` (any age), ascending positions.

    ``h`` holds the key hashes; ``key_user(pos)`` / ``key_item(pos)`` give the fields of the
    keys at those positions, so a key grid never needs materialising. The usual answer is one
    ``probe`` and one gather of the matched records (which also give the ages); a rejected
    fingerprint or a non-empty stash takes the general lookup.
    """
    index = store.table.index
    if len(h) == 0 or index.live == 0:
        return _NONE, _NONE, _NO_AGE
    pos, slot, _ = index.probe(h)
    m = gather(store.table.meta, slot)
    ok = (m["item"] == key_item(pos)) & (m["user"] == key_user(pos)) & (m["vid"] == vid)
    if ok.all() and not index.stashed:
        return pos, slot, now - m["written"]
    every = np.arange(len(h))
    users = np.broadcast_to(np.asarray(key_user(every), dtype=np.int64), h.shape)
    slot, _ = index.lookup(h, store.table.verifier(users, key_item(every), vid))
    pos = np.flatnonzero(slot >= 0)
    slot = slot[pos]
    return pos, slot, now - store.table.meta["written"][slot]


def _find_keys(store: StoreView, users: np.ndarray | int, items: np.ndarray, vid: int,
               now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_find`` of keys (users[j], items[j]); ``users`` may be one int for all."""
    h = key_hash(users, items, vid)
    if np.ndim(users):
        return _find(store, h, users.__getitem__, items.__getitem__, vid, now)
    return _find(store, h, lambda pos: users, items.__getitem__, vid, now)


def _find_grid(store: StoreView, users: np.ndarray, items: np.ndarray, vid: int,
               now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_find`` of every (item, user) of items (m,) x users (k,), item-major: position
    ``row * k + rank`` is (items[row], users[rank])."""
    k = len(users)
    h = key_hash(users[None, :], items[:, None], vid).ravel()
    return _find(store, h, lambda pos: users[pos % k], lambda pos: items[pos // k], vid, now)


_NONE = np.zeros(0, dtype=np.int64)
_NO_AGE = np.zeros(0)
_NONE.setflags(write=False)
_NO_AGE.setflags(write=False)


def _vectors(store: StoreView, slots: np.ndarray) -> np.ndarray:
    """Decoded float32 vectors (n, d) of these slots."""
    return store.table.vectors(slots)


def _count_pairs(store: StoreView, vid: int, users: np.ndarray | int, items: np.ndarray,
                 held: np.ndarray, hits: int) -> None:
    """Count own-pair hits, misses, stale reads and misses held in another version.
    ``held``: positions of the keys held in ``vid`` (any age); ``users``: per key, or one."""
    c, n = store.counters, len(items)
    c["pair_hits"] += hits
    c["pair_misses"] += n - hits
    c["pair_stale"] += len(held) - hits
    others = [v for v, cnt in store.held.items() if v != vid and cnt > 0]
    if others and len(held) < n:  # a rollover signal: the pair exists, in another version
        absent = np.ones(n, bool)
        absent[held] = False
        users = np.broadcast_to(np.asarray(users, dtype=np.int64), (n,))
        for other in others:
            slot, _ = store.table.lookup(users[absent], items[absent], other)
            c["pair_other_version"] += int(np.count_nonzero(slot >= 0))


def _holders(store: StoreView, users: np.ndarray, vid: int) -> np.ndarray:
    """Positions in ``users`` of those holding any pair of version ``vid`` (the running sums
    keep a row exactly while a user holds one): one small lookup per user, cheaper than the
    grid keys a user holding nothing would cost."""
    find = store.sums.find_one
    return np.array([j for j, v in enumerate(users.tolist()) if find(v, vid) >= 0],
                    dtype=np.int64)


def _first_of_each(rows: np.ndarray) -> np.ndarray:
    """Positions opening each run of equal values in a sorted array."""
    return np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1]))) if len(rows) \
        else _NONE


def answer_query(store: StoreView, vid: int, now: float, items: np.ndarray, user: int,
                 item_nbrs: np.ndarray, aggregate: bool, nbr_users: np.ndarray,
                 nbr_all: bool) -> ShardAnswer:
    """The ShardAnswer of a checked ShardQuery (its fields as arguments)."""
    out = ShardAnswer.empty(store.dim)
    c = store.counters
    n_items, own, k = len(items), user >= 0, len(nbr_users)
    if own and aggregate:
        c["agg_requests"] += n_items
    if not store.holds(vid):
        if own:
            _count_pairs(store, vid, user, items, _NONE, 0)
        return out
    ttl = store.read_ttl_s
    if not own:  # only the user-neighbour probe, of every candidate
        if k and n_items:
            held = _holders(store, nbr_users, vid)
            pos, slot, age = _find_grid(store, nbr_users[held], items, vid, now)
            f = fresh_at(age, ttl)
            _neighbour_hits(out, store, pos[f], slot[f], age[f], held, k, np.arange(n_items),
                            nbr_all)
        return out

    # 1. the user's own pairs of the candidates (none to look for if the user holds no pair
    # of this version: the running sums keep a row exactly while the user holds one)
    user_row = store.sums.find_one(user, vid)
    pos, slot, age = (_find_keys(store, user, items, vid, now) if user_row >= 0
                      else (_NONE, _NONE, _NO_AGE))
    fresh = fresh_at(age, ttl)
    hit = pos[fresh]
    if aggregate:  # the retained stale ones too: the client leaves each candidate out
        out.own_idx, out.own_fresh, out.own_age_s = pos, fresh, age
        out.own_vectors = _vectors(store, slot)
    else:
        out.own_idx, out.own_fresh, out.own_age_s = hit, fresh[fresh], age[fresh]
        out.own_vectors = _vectors(store, slot[fresh])
    store.table.mark_read(slot[fresh])  # served as its user's own pair
    _count_pairs(store, vid, user, items, pos, len(hit))
    if aggregate:
        r = user_row
        if r >= 0:
            out.agg_sum = store.sums.sums[r].copy()
            out.agg_count = cnt = int(store.sums.counts[r])
            # candidates whose mean, leaving themselves out, still averages something
            c["agg_present"] += n_items if cnt > 1 else n_items - len(pos)

    # 2. the candidates without a fresh own pair: user-neighbour probe and item-neighbour
    # tier in one lookup (grid of (item, neighbour) keys, then (user, item neighbour) keys;
    # the latter only if the user holds a pair of this version, else none can hit)
    ki = item_nbrs.shape[1]
    need = np.ones(n_items, bool)
    need[hit] = False
    cols = np.flatnonzero(need)
    m = len(cols)
    if m == 0 or k + ki == 0:
        return out
    nbrs = item_nbrs[cols]  # (m, ki)
    # the probed neighbours who hold any pair of this version (their rank in ``nbr_users``):
    # the others can hit nothing, so the grid leaves them out
    held = _holders(store, nbr_users, vid)
    kh = len(held)
    n_grid = m * kh
    users = np.empty(n_grid + (m * ki if user_row >= 0 else 0), dtype=np.int64)
    keys = np.empty_like(users)
    users[:n_grid].reshape(m, kh)[:] = nbr_users[held]  # the grid, item-major
    keys[:n_grid].reshape(m, kh)[:] = items[cols, None]
    users[n_grid:] = user  # then the user's pairs of the item neighbours
    keys[n_grid:] = nbrs.ravel()[:len(keys) - n_grid]  # a -1 pad matches nothing
    pos, slot, age = _find_keys(store, users, keys, vid, now)
    f = fresh_at(age, ttl)
    pos, slot, age = pos[f], slot[f], age[f]
    g = int(np.searchsorted(pos, n_grid))  # grid hits come first
    rows = _neighbour_hits(out, store, pos[:g], slot[:g], age[:g], held, k, cols, nbr_all)
    if ki:
        c["inbr_probes"] += int(np.count_nonzero(nbrs >= 0))
        p = pos[g:] - n_grid
        row = p // ki
        open_ = np.ones(m, bool)  # no user-neighbour hit: the item-neighbour tier applies
        open_[rows] = False
        use = np.flatnonzero(open_[row])
        first = use[_first_of_each(row[use])]  # the nearest item neighbour held fresh
        c["inbr_hits"] += len(first)
        out.inbr_idx = cols[row[first]]
        out.inbr_vectors, out.inbr_age_s = _vectors(store, slot[g:][first]), age[g:][first]
    return out


def _neighbour_hits(out: ShardAnswer, store: StoreView, pos: np.ndarray, slot: np.ndarray,
                    age: np.ndarray, held: np.ndarray, k: int, cols: np.ndarray,
                    nbr_all: bool) -> np.ndarray:
    """Fill ``out``'s user-neighbour hits from the fresh hits of an item-major (item,
    neighbour) grid of ``len(cols)`` rows by the ``held`` neighbours (their ranks among the
    ``k`` probed); returns the grid rows with a hit."""
    c = store.counters
    c["nbr_probes"] += len(cols) * k
    kh = max(1, len(held))
    row = pos // kh
    first = _first_of_each(row)  # the nearest neighbour holding each item
    c["nbr_hits"] += len(first)
    sel = slice(None) if nbr_all else first
    out.nbr_idx, out.nbr_rank = cols[row[sel]], held[pos[sel] - row[sel] * kh]
    out.nbr_vectors, out.nbr_age_s = _vectors(store, slot[sel]), age[sel]
    return row[first]


# ---- batch reads (PairStore.get / aggregate / holders) ------------------------------------------
def get_pairs(store: StoreView, vid: int, now: float, users: np.ndarray, items: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(found (n,), vectors (n, d) float32, age_s (n,)) of fresh pairs; zeros elsewhere."""
    n, d = len(users), store.dim
    found, vecs, ages = np.zeros(n, bool), np.zeros((n, d), np.float32), np.zeros(n)
    if not store.holds(vid):
        _count_pairs(store, vid, users, items, _NONE, 0)
        return found, vecs, ages
    pos, slot, age = _find_keys(store, users, items, vid, now)
    f = fresh_at(age, store.read_ttl_s)
    hit = pos[f]
    found[hit], vecs[hit], ages[hit] = True, _vectors(store, slot[f]), age[f]
    store.table.mark_read(slot[f])
    _count_pairs(store, vid, users, items, pos, len(hit))
    return found, vecs, ages


def aggregate_rows(store: StoreView, vid: int, users: np.ndarray, exclude: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors (a, d) float32, present (a,), count (a,)): the mean of each user's retained
    pairs, leaving out one item per row (where retained)."""
    a, d = len(users), store.dim
    store.counters["agg_requests"] += a
    if not store.holds(vid) or a == 0:
        return np.zeros((a, d), np.float32), np.zeros(a, bool), np.zeros(a, np.int64)
    sums = store.sums
    r = sums.find(users, vid)
    has = r >= 0
    num = np.where(has[:, None], sums.sums[np.maximum(r, 0)], 0.0)
    cnt = np.where(has, sums.counts[np.maximum(r, 0)], 0)
    slot, _ = store.table.lookup(users, exclude, vid)
    e = np.flatnonzero(slot >= 0)  # the excluded item is retained: take it out
    num[e] -= _vectors(store, slot[e])
    cnt[e] -= 1
    present = cnt > 0
    vec = (num / np.maximum(cnt, 1)[:, None]).astype(np.float32)
    vec[~present] = 0.0
    store.counters["agg_present"] += int(np.count_nonzero(present))
    return vec, present, cnt


def holder_grid(store: StoreView, vid: int, now: float, items: np.ndarray,
                users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(item_idx, user_idx, vectors, age_s) of every fresh (item, user) pair of the grid,
    ordered by item then user."""
    m, k, d = len(items), len(users), store.dim
    store.counters["nbr_probes"] += m * k
    if not store.holds(vid) or m * k == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros((0, d), np.float32), np.zeros(0)
    pos, slot, age = _find_grid(store, users, items, vid, now)
    f = fresh_at(age, store.read_ttl_s)
    g = pos[f]
    store.counters["nbr_hits"] += len(g)
    return g // k, g % k, _vectors(store, slot[f]), age[f]
