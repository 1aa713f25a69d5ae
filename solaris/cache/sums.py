"""Per-(user, version) running sums of retained pair embeddings, in float64.

The aggregated user embedding excluding the current item is ``(sum - z(u, i)) / (count - 1)``,
so a lookup costs O(d) whatever the number of the user's pairs. The store adds a vector when
it writes an entry and subtracts the same *decoded* vector when it overwrites, expires or
evicts it, so int8 and fp16 stores stay consistent with what they serve. A row is freed (and
zeroed, so rounding drift never outlives it) when its count reaches zero.
"""

from __future__ import annotations

import numpy as np

from solaris.cache.index import HashIndex, key_hash, key_hash_one

_MIN_ROWS = 256


def group_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique rows, order, starts): ``order`` sorts by row, ``starts`` opens each group."""
    order = np.argsort(rows, kind="stable")
    sr = rows[order]
    starts = np.flatnonzero(np.r_[True, sr[1:] != sr[:-1]]) if len(sr) else np.zeros(0, int)
    return sr[starts], order, starts


class UserSums:
    """Float64 sums and counts of decoded vectors per (user, version id)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._index = HashIndex()
        self.users = np.zeros(0, dtype=np.int64)  # (R,) owner of each row
        self.vids = np.zeros(0, dtype=np.uint16)  # (R,) version id of each row, 0 = free
        self.sums = np.zeros((0, dim), dtype=np.float64)  # (R, d)
        self.counts = np.zeros(0, dtype=np.int64)  # (R,)
        self._free = np.zeros(0, dtype=np.int64)
        self.live = 0

    @property
    def nbytes(self) -> int:
        return int(self.users.nbytes + self.vids.nbytes + self.sums.nbytes + self.counts.nbytes
                   + self._free.nbytes + self._index.nbytes)

    def _verify(self, users: np.ndarray, vids: np.ndarray):
        def verify(pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
            return (self.users[rows] == users[pos]) & (self.vids[rows] == vids[pos])
        return verify

    def find(self, users: np.ndarray, vids: np.ndarray) -> np.ndarray:
        """(n,) row of each (user, vid), -1 where the user holds nothing of that version."""
        users = np.asarray(users, dtype=np.int64)
        vids = np.broadcast_to(np.asarray(vids, dtype=np.uint16), users.shape)
        rows, _ = self._index.lookup(key_hash(users, 0, vids), self._verify(users, vids))
        return rows

    def find_one(self, user: int, vid: int) -> int:
        """``find`` for one (user, vid): the request path's aggregate of one user."""
        def verify_one(row: int) -> bool:
            return int(self.users[row]) == user and int(self.vids[row]) == vid
        return self._index.find_one(key_hash_one(user, 0, vid), verify_one)

    def add(self, users: np.ndarray, vids: np.ndarray, vecs: np.ndarray, sign: int) -> None:
        """Add (sign=+1) or subtract (sign=-1) decoded vectors (n, d) of these keys.

        Keys are grouped first (a write batch holds a few users, many items each), so the
        index is asked once per distinct (user, vid), not once per vector."""
        if len(users) == 0:
            return
        users = np.asarray(users, dtype=np.int64)
        vids = np.broadcast_to(np.asarray(vids, dtype=np.uint16), users.shape)
        order = np.lexsort((vids, users))  # stable: each group keeps the batch's order
        su, sv = users[order], vids[order]
        starts = np.flatnonzero(np.r_[True, (su[1:] != su[:-1]) | (sv[1:] != sv[:-1])])
        gu, gv = su[starts], sv[starts]  # distinct (user, vid)
        rows = self.find(gu, gv)
        if sign > 0 and (rows < 0).any():
            rows = self._create(gu, gv, rows)
        assert (rows >= 0).all(), "subtracting a vector that was never added"
        acc = np.add.reduceat(np.asarray(vecs, dtype=np.float64)[order], starts, axis=0)
        cnt = np.diff(np.r_[starts, len(users)])
        if sign > 0:
            self.sums[rows] += acc
            self.counts[rows] += cnt
        else:
            self.sums[rows] -= acc
            self.counts[rows] -= cnt
            self._release(rows[self.counts[rows] == 0])

    def adjust(self, rows: np.ndarray, delta: np.ndarray) -> None:
        """sums[rows] += delta (n, d) for existing rows, counts unchanged (an overwrite)."""
        uniq, order, starts = group_rows(rows)
        self.sums[uniq] += np.add.reduceat(np.asarray(delta, np.float64)[order], starts, axis=0)

    def _create(self, users: np.ndarray, vids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        miss = np.flatnonzero(rows < 0)
        mu, mv = users[miss], vids[miss]
        o = np.lexsort((mu, mv))
        first = np.r_[True, (mu[o][1:] != mu[o][:-1]) | (mv[o][1:] != mv[o][:-1])]
        new_u, new_v = mu[o][first], mv[o][first]
        new_rows = self._alloc(len(new_u))
        self.users[new_rows] = new_u
        self.vids[new_rows] = new_v
        self.sums[new_rows] = 0.0
        self.counts[new_rows] = 0
        self.live += len(new_rows)
        if self._index.needs_rebuild(len(new_rows)):
            self._rebuild()  # the new rows are live already: the rebuild indexes them
        else:
            self._index.insert(key_hash(new_u, 0, new_v), new_rows)
        return self.find(users, vids)

    def _alloc(self, k: int) -> np.ndarray:
        if len(self._free) < k:
            self._resize(max(_MIN_ROWS, int((self.live + k) * 1.25), len(self.users)))
        out, self._free = self._free[-k:], self._free[:-k]
        return out

    def _release(self, rows: np.ndarray) -> None:
        if len(rows) == 0:
            return
        _, cells = self._index.lookup(key_hash(self.users[rows], 0, self.vids[rows]),
                                      self._verify(self.users[rows], self.vids[rows]))
        self._index.remove(cells)
        self.vids[rows] = 0
        self.sums[rows] = 0.0
        self._free = np.concatenate([self._free, rows.astype(np.int64)])
        self.live -= len(rows)
        if len(self.users) > _MIN_ROWS and self.live < len(self.users) // 2:
            self._resize(max(_MIN_ROWS, int(self.live * 1.25)))
        elif self._index.needs_rebuild(0):
            self._rebuild()

    def _resize(self, cap: int) -> None:
        """Move the live rows to arrays of ``cap`` rows (grow, or shrink to give memory back)."""
        live = np.flatnonzero(self.vids != 0)
        n = len(live)
        cap = max(cap, n)
        users = np.zeros(cap, np.int64)
        vids = np.zeros(cap, np.uint16)
        sums = np.zeros((cap, self.dim), np.float64)
        counts = np.zeros(cap, np.int64)
        users[:n], vids[:n] = self.users[live], self.vids[live]
        sums[:n], counts[:n] = self.sums[live], self.counts[live]
        self.users, self.vids, self.sums, self.counts = users, vids, sums, counts
        self._free = np.arange(cap - 1, n - 1, -1, dtype=np.int64)
        self._rebuild()

    def _rebuild(self, extra: int = 0) -> None:
        live = np.flatnonzero(self.vids != 0)
        self._index.rebuild(key_hash(self.users[live], 0, self.vids[live]), live, extra)
