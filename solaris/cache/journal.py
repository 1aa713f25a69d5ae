"""A store's change journal: what a read replica pulls to follow a shard.

Every change to a store's entries is one record, numbered by the store's sequence (1, 2, ...):
an **upsert** (an entry written or rewritten: its key, written-at time, verifier score and
codec bytes) or a **removal** (replaced entries are upserts; evicted and expired ones are
removals). Read flags are not journalled: a replica keeps its own and sends the marks it makes
back to the shard (``solaris.cache.replica``).

The journal keeps the last ``limit`` records. A reader at sequence ``s`` asks for what came
after it (``since``); one that fell behind the oldest record kept, or whose store is another
incarnation (``epoch``: a restarted shard starts a new one), reads the whole store instead
(``PairStore.changes`` answers with every live entry). Memory: ~35 B per record plus the
codec bytes of upserts (int8, width 32: 36 B), so the default 100,000 records cost ~7 MB.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass

import numpy as np

UPSERT, REMOVE = 0, 1


@dataclass
class Changes:
    """Records in order: ``kind`` (UPSERT / REMOVE), the key (``users``, ``items``, ``vids``:
    the writer's version ids, named by ``versions``), and for upserts only -- in the order the
    upserts come -- ``written``, ``score`` and the codec bytes ``rows``."""

    kind: np.ndarray  # (n,) int8
    users: np.ndarray  # (n,) int64
    items: np.ndarray  # (n,) int64
    vids: np.ndarray  # (n,) int32
    written: np.ndarray  # (u,) float64, u = upserts
    score: np.ndarray  # (u,) float32
    rows: np.ndarray  # (u, row_bytes) uint8

    @classmethod
    def empty(cls, row_bytes: int) -> "Changes":
        z = np.zeros(0, np.int64)
        return cls(np.zeros(0, np.int8), z, z, np.zeros(0, np.int32), np.zeros(0),
                   np.zeros(0, np.float32), np.zeros((0, row_bytes), np.uint8))

    def __len__(self) -> int:
        return len(self.kind)

    def runs(self) -> list[tuple[int, slice, slice]]:
        """(kind, record slice, upsert slice) of each run of records of one kind, in order:
        a reader applies the runs one after the other."""
        n = len(self.kind)
        if n == 0:
            return []
        cut = np.flatnonzero(self.kind[1:] != self.kind[:-1]) + 1
        starts, ends = np.r_[0, cut], np.r_[cut, n]
        ups = np.r_[0, np.cumsum(self.kind == UPSERT)]
        return [(int(self.kind[a]), slice(int(a), int(b)), slice(int(ups[a]), int(ups[b])))
                for a, b in zip(starts.tolist(), ends.tolist())]


class Journal:
    """The last ``limit`` change records of one store (a ring of batches)."""

    def __init__(self, limit: int, row_bytes: int) -> None:
        self.limit = int(limit)
        self.row_bytes = row_bytes
        self.epoch = uuid.uuid4().hex[:16]  # this incarnation of the store
        self.seq = 0  # records so far
        self._batches: deque = deque()  # (first seq, kind, users, items, vids, written, score, rows)
        self._kept = 0

    @property
    def low(self) -> int:
        """The sequence before the oldest record kept: a reader at ``s >= low`` can follow."""
        return self.seq - self._kept

    def upserts(self, users: np.ndarray, items: np.ndarray, vid: int | np.ndarray,
                written: np.ndarray, score: np.ndarray, rows: np.ndarray) -> None:
        n = len(users)
        if n:
            self._add(UPSERT, users, items, vid, written, score, rows)

    def removes(self, users: np.ndarray, items: np.ndarray, vids: np.ndarray) -> None:
        if len(users):
            self._add(REMOVE, users, items, vids, None, None, None)

    def _add(self, kind, users, items, vids, written, score, rows) -> None:
        n = len(users)
        v = np.broadcast_to(np.asarray(vids, np.int32), (n,)).copy()
        self._batches.append((self.seq + 1, kind, np.array(users, np.int64),
                              np.array(items, np.int64), v,
                              None if written is None else np.array(written, np.float64),
                              None if score is None else np.array(score, np.float32),
                              None if rows is None else np.array(rows, np.uint8)))
        self.seq += n
        self._kept += n
        while self._kept > self.limit and self._batches:
            self._kept -= len(self._batches.popleft()[2])

    def since(self, seq: int) -> Changes | None:
        """The records after ``seq`` (empty if none); None if some were dropped already."""
        if seq < self.low or seq > self.seq:
            return None
        parts = [b for b in self._batches if b[0] + len(b[2]) - 1 > seq]
        if not parts:
            return Changes.empty(self.row_bytes)
        skip = seq - parts[0][0] + 1  # records of the first batch the reader has
        kinds, users, items, vids, written, score, rows = [], [], [], [], [], [], []
        for j, (_, kind, u, i, v, w, s, r) in enumerate(parts):
            a = skip if j == 0 and skip > 0 else 0
            kinds.append(np.full(len(u) - a, kind, np.int8))
            users.append(u[a:])
            items.append(i[a:])
            vids.append(v[a:])
            if kind == UPSERT:
                written.append(w[a:])
                score.append(s[a:])
                rows.append(r[a:])
        cat = np.concatenate
        return Changes(cat(kinds), cat(users), cat(items), cat(vids),
                       cat(written) if written else np.zeros(0),
                       cat(score) if score else np.zeros(0, np.float32),
                       cat(rows) if rows else np.zeros((0, self.row_bytes), np.uint8))

    @property
    def nbytes(self) -> int:
        return int(sum(sum(a.nbytes for a in b[2:] if a is not None) for b in self._batches))
