"""A numpy hash index: 64-bit key hash -> int32 slot, answering whole batches at once.

Why not a dict: a Python object per key costs ~100 bytes and a Python-level probe per key;
this table costs one uint64 cell per 0.5-0.8 keys (10-16 bytes) and answers a batch of keys
with a fixed handful of vectorised passes -- no probing loop.

Bucketised cuckoo hashing: cells are grouped in buckets of ``WAYS`` = 4 (32 bytes); a key may
sit in one of two buckets, ``b1`` (from the high 32 bits of its hash) or ``b2 = (g - b1) mod
nb`` where ``g`` comes from the low 32 bits. Since ``b1 + b2 = g``, either bucket and the
fingerprint give the other, so an occupant can be moved ("kicked") without knowing its key.
A lookup gathers the two bucket rows of every key (one ``take`` per row); no key needs more.

Each cell packs ``fingerprint << 32 | slot`` (the fingerprint is the low 32 bits of the hash).
The owner confirms the full key of each fingerprint match, so answers are exact. The rare
key that finds no room after ``_MAX_KICKS`` moves waits in a small stash (scanned on every
lookup while non-empty) until the next rebuild; a stash that grows triggers one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

EMPTY = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_LOW32 = np.uint64(0xFFFF_FFFF)
_SLOT_LIMIT = np.uint64(1 << 31)  # real slots are < 2**31; EMPTY has all-ones low bits
_S32 = np.uint64(32)
WAYS = 4  # cells per bucket
_ROW = np.dtype("<u4")  # a row of WAYS bools read as one integer: byte j = column j
_BYTE_SUM = np.uint32(0x0101_0101)  # x * this: the sum of x's bytes lands in the top byte
_TARGET_LOAD = 0.5  # keys per cell right after a (re)build
_MAX_LOAD = 0.8  # above this, inserts rebuild larger first (kicks get long past ~0.9)
_MIN_LOAD = 0.15  # below this (and not tiny), the table is rebuilt smaller
_MAX_KICKS = 256
_MAX_STASH = 16

# splitmix64-style odd constants
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)
_K3 = np.uint64(0x165667B19E3779F9)
_K4 = np.uint64(0xBF58476D1CE4E5B9)
_K5 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over a uint64 array: a stable, well-spread 64-bit hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * _K4
    x = x ^ (x >> np.uint64(27))
    x = x * _K5
    return x ^ (x >> np.uint64(31))


def key_hash(a: np.ndarray, b: np.ndarray, c: np.ndarray | int) -> np.ndarray:
    """Hash of the key triple (a, b, c) of int64 arrays (broadcasting) -> uint64."""
    ha = np.asarray(a).astype(np.uint64) * _K1
    hb = np.asarray(b).astype(np.uint64) * _K2
    hc = np.asarray(c).astype(np.uint64) * _K3
    return mix64(ha ^ (hb + hc))


_M64 = (1 << 64) - 1


def key_hash_one(a: int, b: int, c: int) -> int:
    """``key_hash`` of one key in Python ints (no array overhead for a single lookup)."""
    x = ((a * int(_K1)) & _M64) ^ (((b * int(_K2)) + (c * int(_K3))) & _M64)
    x ^= x >> 30
    x = (x * int(_K4)) & _M64
    x ^= x >> 27
    x = (x * int(_K5)) & _M64
    return x ^ (x >> 31)


Verify = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""verify(key_positions, slots) -> bool mask: does slot hold the key at each key position."""


class HashIndex:
    """Maps 64-bit key hashes to int32 slots; the owner holds keys and confirms matches."""

    def __init__(self, expected: int = 0) -> None:
        self.live = 0  # keys in the table (stash included)
        self._alloc(expected)

    @property
    def nbytes(self) -> int:
        return int(self._cells.nbytes + self._stash_b.nbytes + self._stash_v.nbytes)

    @property
    def size(self) -> int:
        return self._nb * WAYS

    def _alloc(self, n_keys: int) -> None:
        self._nb = max(4, int(np.ceil(n_keys / _TARGET_LOAD / WAYS)))
        self._cells = np.full(self._nb * WAYS, EMPTY, dtype=np.uint64)
        self._rows = self._cells.reshape(self._nb, WAYS)
        self._stash_b = np.zeros(0, dtype=np.int64)  # bucket the stashed cell belongs to
        self._stash_v = np.zeros(0, dtype=np.uint64)  # stashed cell values
        self.live = 0

    def _buckets(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(b1, b2, fingerprint-in-place) of each hash."""
        nb = np.uint64(self._nb)
        low = h & _LOW32
        b1 = (((h >> _S32) * nb) >> _S32).view(np.int64)  # < nb < 2**63: the view is exact
        o = ((low * nb) >> _S32).view(np.int64) - b1  # b2 = (g - b1) mod nb
        o += (o >> 63) & self._nb  # + nb where negative (arithmetic shift: all ones)
        return b1, o, low << _S32

    def needs_rebuild(self, n_new: int) -> bool:
        """True when n_new more keys would pass the load limit, or the table is far larger
        than its keys (memory goes back after expiry), or the stash is long."""
        load = (self.live + n_new) / self.size
        return (load > _MAX_LOAD or len(self._stash_v) > _MAX_STASH
                or (self._nb > 64 and load < _MIN_LOAD))

    def rebuild(self, h: np.ndarray, slots: np.ndarray, n_extra: int = 0) -> None:
        """Start over with exactly these keys, sized for them plus n_extra more."""
        self._alloc(len(h) + n_extra)
        self.insert(h, slots)

    def lookup(self, h: np.ndarray, verify: Verify) -> tuple[np.ndarray, np.ndarray]:
        """(slot (n,) int64, cell (n,) int64) of each key hash; -1 where absent.

        ``probe`` finds the first fingerprint match of each key; it goes to ``verify``. A
        rejected match (p ~ 2**-32 per cell) is resolved key by key; the stash (almost always
        empty) is checked for keys not found, and its cells come back as ``-2 - stash index``.
        """
        n = len(h)
        slot = np.full(n, -1, dtype=np.int64)
        cell = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.live == 0:
            return slot, cell
        keys, cand, at = self.probe(h)
        ok = verify(keys, cand)
        slot[keys[ok]], cell[keys[ok]] = cand[ok], at[ok]
        if not ok.all() or len(self._stash_v):
            self.resolve(h, verify, slot, cell, keys[~ok])
        return slot, cell

    def probe(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, slots, cells) of the key hashes with a fingerprint match in their rows: the
        first match of each (b1's row before b2's), for the owner to confirm.

        Gathers both bucket rows of every key, one ``take`` each; no key needs more. A key
        whose match the owner rejects, or that is absent while the stash holds cells, goes to
        ``resolve``.
        """
        b1, b2, fp = self._buckets(h)
        rows = self._rows
        # a fingerprint match: cell ^ fp leaves only the slot bits (EMPTY leaves all ones)
        m1 = ((rows.take(b1, axis=0) ^ fp[:, None]) < _SLOT_LIMIT).view(_ROW).ravel()  # (n,)
        m2 = ((rows.take(b2, axis=0) ^ fp[:, None]) < _SLOT_LIMIT).view(_ROW).ravel()
        in1 = m1 != 0
        mv = np.where(in1, m1, m2)  # b1's row first, else b2's
        keys = np.flatnonzero(mv)
        col = mv[keys].view(np.bool_).reshape(-1, WAYS).argmax(axis=1)  # first matching cell
        at = np.where(in1[keys], b1[keys], b2[keys]) * WAYS + col
        return keys, (self._cells[at] & _LOW32).view(np.int64), at

    @property
    def stashed(self) -> int:
        """Cells waiting in the stash (lookups of absent keys scan it while non-empty)."""
        return len(self._stash_v)

    def resolve(self, h: np.ndarray, verify: Verify, slot: np.ndarray, cell: np.ndarray,
                rejected: np.ndarray) -> None:
        """Complete ``probe``'s answer in place: every fingerprint match of the ``rejected``
        keys, one key at a time, then the stash for keys still absent."""
        if len(rejected) == 0 and not len(self._stash_v):
            return
        b1, b2, fp = self._buckets(h)
        if len(rejected):
            self._lookup_rows(rejected, b1, b2, fp, verify, slot, cell)
        if len(self._stash_v):
            miss = np.flatnonzero(slot < 0)
            sb, sv = self._stash_b, self._stash_v
            hit = (((sv[None, :] ^ fp[miss, None]) < _SLOT_LIMIT)
                   & ((sb[None, :] == b1[miss, None]) | (sb[None, :] == b2[miss, None])))
            r, j = np.nonzero(hit)  # (key, stash entry) pairs with a fingerprint match
            cand = (sv[j] & _LOW32).astype(np.int64)
            ok = verify(miss[r], cand)
            slot[miss[r[ok]]], cell[miss[r[ok]]] = cand[ok], -2 - j[ok]  # stash cells < -1

    def _lookup_rows(self, keys, b1, b2, fp, verify: Verify, slot, cell) -> None:
        """Every fingerprint match in both rows of these keys, one key at a time (the path
        of a first match the owner rejected: p ~ 2**-32 per cell)."""
        for k in keys.tolist():
            for bb in (int(b1[k]), int(b2[k])):
                for j in range(WAYS):
                    v = self._cells[bb * WAYS + j]
                    if (v ^ fp[k]) < _SLOT_LIMIT and slot[k] < 0:
                        s = int(v & _LOW32)
                        if verify(np.array([k]), np.array([s]))[0]:
                            slot[k], cell[k] = s, bb * WAYS + j

    def find_one(self, h: int, verify_one: Callable[[int], bool]) -> int:
        """The slot of one key hash (Python int), -1 if absent; ``verify_one(slot)``
        confirms the full key. Same answer as ``lookup`` without its array overhead."""
        if self.live == 0:
            return -1
        nb = self._nb
        fp = h & 0xFFFF_FFFF
        b1 = ((h >> 32) * nb) >> 32
        b2 = ((fp * nb) >> 32) - b1
        b2 = b2 + nb if b2 < 0 else b2
        for bb in (b1, b2):
            for v in self._cells[bb * WAYS:(bb + 1) * WAYS].tolist():
                if v >> 32 == fp and (v & 0xFFFF_FFFF) < (1 << 31) and verify_one(v & 0xFFFF_FFFF):
                    return v & 0xFFFF_FFFF
        for b, v in zip(self._stash_b.tolist(), self._stash_v.tolist()):
            if b in (b1, b2) and v >> 32 == fp and verify_one(v & 0xFFFF_FFFF):
                return v & 0xFFFF_FFFF
        return -1

    def insert(self, h: np.ndarray, slots: np.ndarray) -> None:
        """Add keys known to be absent and distinct (callers look up first).

        Each key goes to the emptier of its two buckets (b1 on a tie): with the two choices
        balanced, far fewer keys find both buckets full as the load nears ``_MAX_LOAD``
        (first-free-bucket placement left ~11% of inserts homeless there). A key that does
        find both full moves one occupant to that occupant's other bucket (``_displace``,
        vectorised); only what is left goes through ``_kick``, one key at a time.
        """
        n = len(h)
        if n == 0:
            return
        b1, b2, fp = self._buckets(h)
        val = fp | slots.astype(np.uint64)
        cells = self._cells
        todo = np.arange(n)
        homeless = []
        while todo.size:
            f1 = (self._rows.take(b1[todo], axis=0) == EMPTY).view(_ROW).ravel()
            f2 = (self._rows.take(b2[todo], axis=0) == EMPTY).view(_ROW).ravel()
            # free cells per row: each byte of f is 0 or 1, the top byte of f * 0x01010101
            # is their sum
            in1 = ((f1 * _BYTE_SUM) >> 24 >= (f2 * _BYTE_SUM) >> 24) & (f1 != 0)
            has = in1 | (f2 != 0)
            col = np.where(in1, f1, f2)[has].view(np.bool_).reshape(-1, WAYS).argmax(axis=1)
            target = np.where(in1, b1[todo], b2[todo])[has] * WAYS + col
            # several keys may pick one free cell: write all, keep the ones that stuck
            cells[target] = val[todo[has]]
            won = np.zeros(len(todo), dtype=bool)
            won[np.flatnonzero(has)[cells[target] == val[todo[has]]]] = True
            homeless.extend(todo[~has].tolist())
            todo = todo[has & ~won]  # lost a race: look again
        self.live += n
        if homeless:
            left = np.array(homeless, dtype=np.int64)
            left = left[~self._displace(val[left], b1[left], b2[left])]
            for k in left.tolist():
                self._kick(int(val[k]), int(b1[k]))

    def _displace(self, val: np.ndarray, b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
        """Place keys whose two buckets are full by moving one occupant of either bucket to
        the occupant's other bucket where that has a free cell: one vectorised pass (a
        cuckoo move of depth one). Returns which keys were placed; two keys that would use
        the same occupant or the same free cell leave all but the first to ``_kick``."""
        nb = self._nb
        pos = np.concatenate([b1[:, None], b2[:, None]], axis=1)  # (h, 2) buckets
        pos = (pos[:, :, None] * WAYS + np.arange(WAYS)).reshape(len(val), 2 * WAYS)  # (h, 8)
        occ = self._cells[pos]  # (h, 8) occupants
        home = pos // WAYS
        alt = (((occ >> _S32) * np.uint64(nb)) >> _S32).view(np.int64) - home
        alt += (alt >> 63) & nb  # each occupant's other bucket
        room = self._rows[alt] == EMPTY  # (h, 8, WAYS)
        movable = room.any(axis=2) & (occ != EMPTY)
        ok = np.flatnonzero(movable.any(axis=1))
        placed = np.zeros(len(val), dtype=bool)
        if not len(ok):
            return placed
        j = movable[ok].argmax(axis=1)  # first occupant that can move
        src = pos[ok, j]
        dst = alt[ok, j] * WAYS + room[ok, j].argmax(axis=1)
        first = np.zeros(len(ok), dtype=bool)
        first[np.unique(src, return_index=True)[1]] = True
        uniq_dst = np.zeros(len(ok), dtype=bool)
        uniq_dst[np.unique(dst, return_index=True)[1]] = True
        keep = first & uniq_dst
        ok, j, src, dst = ok[keep], j[keep], src[keep], dst[keep]
        self._cells[dst] = occ[ok, j]  # the occupant moves to its other bucket ...
        self._cells[src] = val[ok]  # ... and the key takes its cell
        placed[ok] = True
        return placed

    def _kick(self, v: int, b: int) -> None:
        """Place cell value v (homed at bucket b or its pair) by moving occupants along.
        Plain Python ints: one key at a time, numpy scalars would cost more than the work."""
        cells, nb, empty = self._cells, self._nb, int(EMPTY)

        def other(b: int, v: int) -> int:
            o = (((v >> 32) * nb) >> 32) - b
            return o + nb if o < 0 else o

        for step in range(_MAX_KICKS):
            for bb in (b, other(b, v)):
                row = cells[bb * WAYS:(bb + 1) * WAYS].tolist()
                if empty in row:
                    cells[bb * WAYS + row.index(empty)] = v
                    return
            j = b * WAYS + step % WAYS  # evict a resident of b; it moves to its other bucket
            v, cells[j] = int(cells[j]), v
            b = other(b, v)
        self._stash_b = np.append(self._stash_b, b)
        self._stash_v = np.append(self._stash_v, np.uint64(v))

    def remove(self, cell: np.ndarray) -> None:
        """Delete the keys at these cells (as returned by lookup)."""
        cell = np.asarray(cell, dtype=np.int64)
        if len(cell) == 0:
            return
        self._cells[cell[cell >= 0]] = EMPTY
        st = -2 - cell[cell < 0]
        if st.size:
            keep = np.ones(len(self._stash_v), dtype=bool)
            keep[st] = False
            self._stash_b, self._stash_v = self._stash_b[keep], self._stash_v[keep]
        self.live -= len(cell)
