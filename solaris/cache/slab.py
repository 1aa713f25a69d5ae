"""A store's slots: their record layout (shared by the store, its reads and its snapshots)
and the ``SlotTable`` that owns them.

One 32-byte record per slot (user, item, written_at, verifier score, version id, read flag;
version id 0 marks a free slot), so checking a key's fields costs one cache line, and a batch
of records is gathered as 4 x uint64 rows: ~30x faster than numpy's structured fancy indexing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Callable

import numpy as np

from solaris.cache.codec import Codec
from solaris.cache.index import HashIndex, key_hash

log = logging.getLogger(__name__)

META = np.dtype([("user", "<i8"), ("item", "<i8"), ("written", "<f8"), ("score", "<f4"),
                 ("vid", "<u2"), ("read", "u1"), ("pad", "u1")])
assert META.itemsize == 32


def gather(meta: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """meta[idx] for an index array, whole records at once."""
    return meta.view(np.uint64).reshape(-1, 4).take(idx, axis=0).view(META).reshape(-1)


MIN_SLOTS = 256
GROW = 1.25  # slab growth factor (bounded by the capacity)
SHRINK_BELOW = 0.6  # live share of the slab under which it is rebuilt smaller ...
SHRUNK = 1.15  # ... to this many slots per live entry


def _libc_trim() -> Callable[[], None]:
    """glibc keeps freed heap blocks mapped (its mmap threshold rises after large frees), so
    after a slab or index is rebuilt the process would keep the old arrays' pages; trimming
    hands them back, so resident memory follows the live size. A no-op elsewhere."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0) and None


_trim_heap = _libc_trim()


class SlotTable:
    """The slot table of one store: a ``META`` record and the codec bytes of every slot
    (``meta``, ``rows``), the free list, and the hash index over (user, item, version id) ->
    slot. It owns where an entry lives; the store above it owns what entries mean (running
    sums, versions, time buckets, counters).

    ``meta`` and ``rows`` are read by the store, its answers and its snapshots; they change
    only through ``insert``, ``overwrite``, ``free`` and ``mark_read``. The slabs grow in
    place (every live slot keeps its number) and are compacted when less than 60% is live.
    """

    def __init__(self, codec: Codec, capacity: int) -> None:
        self.codec = codec
        self.capacity = capacity
        self.meta = np.zeros(0, dtype=META)
        self.rows = np.zeros((0, codec.row_bytes), dtype=np.uint8)
        self._free = np.zeros(0, dtype=np.int64)  # free slots; popped from the end
        self.index = HashIndex()
        self.live = 0

    # ---------------------------------------------------------------- reads
    def lookup(self, users: np.ndarray, items: np.ndarray, vid: int | np.ndarray,
               h: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(slot, cell) of each key (users, items, vid); -1 where absent. ``vid`` is one
        version id or one per key."""
        if h is None:
            h = key_hash(users, items, vid)
        return self.index.lookup(h, self.verifier(users, items, vid))

    def verifier(self, users: np.ndarray, items: np.ndarray, vid: int | np.ndarray):
        """verify(pos, slots): does each slot hold key ``pos`` of (users, items, vid)."""
        meta = self.meta
        per_key = np.ndim(vid) > 0

        def verify(pos: np.ndarray, slots: np.ndarray) -> np.ndarray:
            m = gather(meta, slots)  # whole records in one pass (one cache line each)
            same_v = m["vid"] == (vid[pos] if per_key else vid)
            return (m["user"] == users[pos]) & (m["item"] == items[pos]) & same_v
        return verify

    def records(self, slots: np.ndarray) -> np.ndarray:
        """The META records of ``slots`` (a copy)."""
        return gather(self.meta, slots)

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        """Decoded float32 vectors (n, d) of ``slots``."""
        return self.codec.decode(self.rows.take(slots, axis=0))

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.meta["vid"] != 0)

    @property
    def nbytes(self) -> int:
        """Bytes of the slabs, the free list and the index."""
        return int(self.rows.nbytes + self.meta.nbytes + self._free.nbytes + self.index.nbytes)

    # ---------------------------------------------------------------- writes
    def mark_read(self, slots: np.ndarray) -> None:
        """These entries were served as their user's own pair."""
        self.meta["read"][slots] = 1

    def overwrite(self, slots: np.ndarray, written: np.ndarray, score: np.ndarray,
                  read: np.ndarray, rows: np.ndarray) -> None:
        """New contents for live slots (same keys)."""
        self.meta["written"][slots] = written
        self.meta["score"][slots] = score
        self.meta["read"][slots] = read
        self.rows[slots] = rows

    def insert(self, users: np.ndarray, items: np.ndarray, vid: int, written: np.ndarray,
               score: np.ndarray, read: np.ndarray, rows: np.ndarray, h: np.ndarray
               ) -> np.ndarray:
        """New entries of distinct keys not held (the caller looked them up; ``h`` their
        hashes); returns their slots. The caller keeps the count under the capacity."""
        n = len(users)
        s = self._alloc(n)
        m = self.meta
        m["user"][s], m["item"][s], m["vid"][s] = users, items, vid
        m["written"][s], m["score"][s], m["read"][s] = written, score, read
        self.rows[s] = rows
        self.live += n
        if self.index.needs_rebuild(n):
            self._rebuild_index()  # the new slots are live already
        else:
            self.index.insert(h, s)
        return s

    def free(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Free these live slots (index included; the slabs shrink if mostly empty); returns
        their records and decoded vectors as they were."""
        m = gather(self.meta, slots)
        found, cells = self.lookup(m["user"], m["item"], m["vid"])
        assert (found == slots).all(), "a live slot missing from the index"
        self.index.remove(cells)
        vectors = self.codec.decode(self.rows[slots])
        self.meta[slots] = 0
        self._free = np.concatenate([self._free, slots.astype(np.int64)])
        self.live -= len(slots)
        if len(self.meta) > MIN_SLOTS and self.live < SHRINK_BELOW * len(self.meta):
            self._resize(min(self.capacity, max(MIN_SLOTS, int(self.live * SHRUNK))))
        elif self.index.needs_rebuild(0):
            self._rebuild_index()
        return m, vectors

    # ---------------------------------------------------------------- slab management
    def _resize(self, cap: int) -> None:
        """Move live slots to new slabs of ``cap`` slots, compacted (shrink to free memory;
        growth goes through ``_grow``, which keeps the slots where they are)."""
        live = self.live_slots()
        n = len(live)
        cap = max(cap, n)
        meta = np.zeros(cap, dtype=META)
        rows = np.zeros((cap, self.codec.row_bytes), dtype=np.uint8)
        if n == len(self.meta):  # growing a full slab: no holes to skip
            meta[:n], rows[:n] = self.meta, self.rows
        else:
            meta[:n] = gather(self.meta, live)
            rows[:n] = self.rows.take(live, axis=0)
        log.debug("slab %d -> %d slots (%d live)", len(self.meta), cap, n)
        self.meta, self.rows = meta, rows
        self._free = np.arange(cap - 1, n - 1, -1, dtype=np.int64)
        self._rebuild_index()

    def _rebuild_index(self, extra: int = 0) -> None:
        live = self.live_slots()
        m = gather(self.meta, live)
        self.index.rebuild(key_hash(m["user"], m["item"], m["vid"]), live, extra)
        _trim_heap()

    def _grow(self, cap: int) -> None:
        """Enlarge the slabs to ``cap`` slots, every live slot keeping its number, so the
        index stays valid: no rebuild (re-hashing and re-inserting every live key on each
        growth made growing cost more than the writes themselves). Holes stay free and are
        handed out first."""
        old = len(self.meta)
        meta = np.zeros(cap, dtype=META)
        rows = np.zeros((cap, self.codec.row_bytes), dtype=np.uint8)
        meta[:old], rows[:old] = self.meta, self.rows
        log.debug("slab %d -> %d slots (%d live)", old, cap, self.live)
        self.meta, self.rows = meta, rows
        self._free = np.concatenate([np.arange(cap - 1, old - 1, -1, dtype=np.int64),
                                     self._free])
        _trim_heap()  # the old slabs' pages go back (see ``_libc_trim``)

    def _alloc(self, k: int) -> np.ndarray:
        if len(self._free) < k:
            grown = max(self.live + k, int(len(self.meta) * GROW), MIN_SLOTS)
            self._grow(min(self.capacity, grown))
        assert len(self._free) >= k, "allocating past capacity"
        out, self._free = self._free[len(self._free) - k:], self._free[:len(self._free) - k]
        return out
