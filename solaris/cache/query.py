"""The contract between the router (enrichment), the cache client and one shard's store.

A request's lookup is planned once (``solaris.online.enrich.plan``), split by shard into one
``ShardQuery`` each, answered by each shard's ``PairStore.answer`` in one call, and the
``ShardAnswer``s are assembled into the VM's slots (``solaris.online.enrich.assemble``). A shard that
did not answer in time contributes ``None`` (or ``ShardAnswer.empty``): all its keys miss.

The reduction happens on the shard, so an answer carries only what was found, at most one
row per candidate and tier: the user's own pairs of the candidates, the nearest probed user
neighbour holding each candidate, and the nearest item neighbour the user holds for each
candidate still missing. The aggregate travels as the user's running sum and count; the
client subtracts each candidate's own retained pair (sent with the own pairs), so excluding
the current item costs O(d) per candidate on either side of the wire.

Everything is numpy, batch-first, and plain data; ``solaris.cache.wire`` packs a query and an
answer into one byte string each for the trip through Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _i64(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


def _grid() -> np.ndarray:
    return np.zeros((0, 0), dtype=np.int64)


@dataclass
class ShardQuery:
    """Everything one request needs from one shard, answered in one call."""

    version: str  # the FM+encoder version the VM was trained on; other versions are misses
    now: float  # event time (seconds) of the request
    items: np.ndarray = field(default_factory=_i64)  # (U,) int64 the candidates
    # the user's own part, asked of the shard that owns the user only (user = -1 elsewhere):
    # own pairs of the items, the item-neighbour tier and the aggregate
    user: int = -1
    # (U, ki) int64 each item's neighbours, nearest first, -1 pad; ki = 0: no item tier
    item_nbrs: np.ndarray = field(default_factory=_grid)
    aggregate: bool = False  # send the user's running sum and retained candidates
    # user-neighbour probe: which of these users (owned by this shard, nearest first) hold a
    # fresh pair of which item (skipping items the user holds fresh, when this is its shard)
    nbr_users: np.ndarray = field(default_factory=_i64)  # (k,) int64
    nbr_all: bool = False  # every hit (similarity-weighted mean), else the nearest per item


@dataclass
class ShardAnswer:
    """A shard's reply: only what was found. Vectors are decoded float32 of width d;
    ``*_idx`` index ``ShardQuery.items``; ages are event-time seconds."""

    # the user's pairs of the items: fresh ones, plus (aggregate asked) retained stale ones
    own_idx: np.ndarray  # (h,) int64
    own_fresh: np.ndarray  # (h,) bool: within the read TTL (a pair-tier hit)
    own_vectors: np.ndarray  # (h, d) float32
    own_age_s: np.ndarray  # (h,) float64
    # the aggregate: float64 sum and count of the user's retained pairs (zeros: none / not asked)
    agg_sum: np.ndarray  # (d,) float64
    agg_count: int
    # user-neighbour hits, ordered by item then rank (nearest mode: one per item, the nearest)
    nbr_idx: np.ndarray  # (g,) int64
    nbr_rank: np.ndarray  # (g,) int64 index into ShardQuery.nbr_users
    nbr_vectors: np.ndarray  # (g, d) float32
    nbr_age_s: np.ndarray  # (g,) float64
    # item-neighbour tier: for items with no fresh own pair and no user-neighbour hit here, the
    # user's fresh pair of the nearest item neighbour holding one
    inbr_idx: np.ndarray  # (f,) int64
    inbr_vectors: np.ndarray  # (f, d) float32
    inbr_age_s: np.ndarray  # (f,) float64

    @classmethod
    def empty(cls, dim: int) -> "ShardAnswer":
        """The answer of a shard that is down or late, or holds nothing: every key a miss.
        Its arrays are shared and read-only (a shard fills an answer by replacing them)."""
        return cls(*_EMPTY[dim]) if dim in _EMPTY else cls(*_empty_fields(dim))


def _empty_fields(dim: int) -> tuple:
    idx, vec, age = _i64(), np.zeros((0, dim), np.float32), np.zeros(0)
    fields = (idx, np.zeros(0, bool), vec, age, np.zeros(dim), 0, idx, idx, vec, age, idx, vec,
              age)
    for a in fields:
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
    _EMPTY[dim] = fields
    return fields


_EMPTY: dict[int, tuple] = {}


@dataclass
class Slots:
    """The VM's two SOLARIS inputs for one request's candidates (DESIGN.md step 3)."""

    pair_emb: np.ndarray  # (C, d) float32
    pair_present: np.ndarray  # (C,) bool
    pair_tier: np.ndarray  # (C,) int64 ``Tier`` codes (solaris/tiers.py)
    pair_age_s: np.ndarray  # (C,) float64 age of the embedding used (0 where none)
    agg_emb: np.ndarray  # (C, d) float32 the user's aggregate excluding each candidate
    agg_present: np.ndarray  # (C,) bool
    missing: np.ndarray  # (C,) bool: no fresh own pair -> a precompute candidate
