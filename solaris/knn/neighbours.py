"""KNN data as the request path holds it (``solaris.knn.tables`` builds, stores and loads it):

- ``NeighbourTable``: neighbour lists, row r = id ``first + r``: a published table (dense
  over ids, ``first`` 0) or a cold-start user's query (one row);
- ``KnnSnapshot``: one published build: the user and item tables, the live user index and
  what each table was built from (``solaris.knn.provenance``).

``solaris.knn.tables.KnnTable`` is the build record on disk (the rows of the ids the build
held, with its recall check); ``KnnTable.neighbour_table`` turns it into a ``NeighbourTable``.
No faiss, no Ray here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solaris.errors import DataError


@dataclass
class NeighbourTable:
    """Neighbour lists as the request path reads them: row r lists the neighbours of id
    ``first + r``, nearest first (a published table: ``first`` 0, row r = id r; a cold-start
    user's query: one row, ``first`` the user).

    Ids outside ``[first, first + n)`` have no neighbours. A row's own id and -1 pads are
    skipped.
    """

    ids: np.ndarray  # (n, K) int64, -1 = pad
    sims: np.ndarray  # (n, K) float32 similarity of each neighbour
    version: str  # the KNN build that made the table
    first: int = 0  # the id of row 0

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        self.sims = np.asarray(self.sims, dtype=np.float32)
        if self.ids.ndim != 2 or self.ids.shape != self.sims.shape:
            raise DataError(f"NeighbourTable ids shape={self.ids.shape}, sims shape="
                            f"{self.sims.shape}: expected two equal (n, K) shapes")
        if self.first < 0:
            raise DataError(f"NeighbourTable first={self.first}: must be >= 0")

    @classmethod
    def one(cls, key: int, ids: np.ndarray, sims: np.ndarray, version: str
            ) -> "NeighbourTable":
        """The one-row table of ``key``'s neighbours ``ids`` (K,) with ``sims`` (K,)."""
        return cls(np.asarray(ids)[None, :], np.asarray(sims)[None, :], version, int(key))

    def has(self, key: int) -> bool:
        """Whether ``key`` has at least one real neighbour here."""
        r = key - self.first
        return 0 <= r < len(self.ids) and bool((self.ids[r] >= 0).any())

    def neighbours(self, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (len, k) int64 with -1 pad, sims (len, k) float32 with 0 pad) of each key."""
        ids, sims = self._select(keys, k, True)
        assert sims is not None
        return ids, sims

    def nearest(self, key: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (<= k,) int64, sims float32) of one key's k nearest real neighbours: pads and
        the key itself skipped, no padding (``neighbours`` of one key, without its pads)."""
        r = key - self.first
        if not 0 <= r < len(self.ids) or k == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        ids = self.ids[r]
        keep = np.flatnonzero((ids >= 0) & (ids != key))[:k]
        return ids[keep], self.sims[r, keep]

    def neighbour_ids(self, keys: np.ndarray, k: int) -> np.ndarray:
        """``neighbours(keys, k)[0]`` without gathering the similarities."""
        return self._select(keys, k, False)[0]

    def _select(self, keys: np.ndarray, k: int, with_sims: bool
                ) -> tuple[np.ndarray, np.ndarray | None]:
        keys = np.asarray(keys, dtype=np.int64)
        n, width = self.ids.shape
        out_ids = np.full((len(keys), k), -1, dtype=np.int64)
        out_sims = np.zeros((len(keys), k), dtype=np.float32) if with_sims else None
        if k == 0 or width == 0 or len(keys) == 0:
            return out_ids, out_sims
        at = keys - self.first if self.first else keys  # each key's row
        known = (at >= 0) & (at < n)
        everything = bool(known.all())
        rows = None if everything else np.flatnonzero(known)
        kk = keys if everything else keys[rows]
        rk = at if everything else at[rows]
        ids = self.ids[rk, :k]  # (r, min(k, K)): only the first k of each row are copied
        valid = (ids >= 0) & (ids != kk[:, None])
        if valid.all() and width >= k:  # the usual case: the first k are real neighbours
            if everything:
                out_ids = ids
            else:
                out_ids[rows] = ids
            if with_sims:
                out_sims[slice(None) if everything else rows] = self.sims[rk, :k]
            return out_ids, out_sims
        # pads or the key itself among the first k: compact each row's valid neighbours
        ids = self.ids.take(rk, axis=0)  # (r, K)
        valid = (ids >= 0) & (ids != kk[:, None])
        rows = np.arange(len(keys)) if everything else rows
        rank = np.cumsum(valid, axis=1) - 1  # position among the row's valid neighbours
        src = np.flatnonzero(valid & (rank < k))  # flat (row, column) of the kept ones
        dst = rows[src // width] * k + rank.ravel()[src]  # flat (key, rank) in the output
        out_ids.ravel()[dst] = ids.ravel()[src]
        if with_sims:
            out_sims.ravel()[dst] = self.sims.take(rk, axis=0).ravel()[src]
        return out_ids, out_sims


@dataclass(frozen=True)
class KnnSnapshot:
    """One published KNN build as the request path holds it: the user and item neighbour
    tables and the user index for cold-start queries."""

    version: str
    users: NeighbourTable | None
    items: NeighbourTable | None
    live: Any = None  # solaris.knn.tables.LiveIndex | None, or (index bytes, ids, version) in transit
    # kind ("user", "item") -> solaris.knn.provenance.BuiltFrom of that table; a kind
    # missing here was published without a record
    built_from: dict[str, Any] = field(default_factory=dict)

    def shareable(self) -> "KnnSnapshot":
        """This snapshot with the faiss index as bytes: plain arrays, so one copy in Ray's
        object store serves every router replica (numpy arrays are read zero-copy)."""
        live = self.live
        if live is not None and not isinstance(live, tuple):
            live = (live.to_bytes(), live.ids, live.version)
        return dataclasses.replace(self, live=live)

    def usable(self) -> "KnnSnapshot":
        """``shareable``'s inverse: the faiss index rebuilt from its bytes (per replica; the
        neighbour tables stay shared)."""
        if not isinstance(self.live, tuple):
            return self
        from solaris.knn.tables import LiveIndex

        return dataclasses.replace(self, live=LiveIndex.from_bytes(*self.live))
