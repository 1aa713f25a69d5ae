"""The contract between the router (enrichment), the cache client and one shard's store.

A request's lookup is planned once (``solaris.enrich.plan``), split by shard into one
``ShardQuery`` each, answered by each shard's ``PairStore.answer`` in one call, and the
``ShardAnswer``s are assembled into the VM's slots (``solaris.enrich.assemble``). A shard that
did not answer in time contributes ``None``: all of its keys read as misses.

Everything is numpy, batch-first, and plain data (picklable, cheap to ship through Ray).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TIER_NONE, TIER_PAIR, TIER_USER_NBR, TIER_ITEM_NBR = 0, 1, 2, 3
TIER_NAMES = ("none", "pair", "user_neighbour", "item_neighbour")


def _i64(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


@dataclass
class ShardQuery:
    """Everything one request needs from one shard, answered in one call."""

    version: str  # the FM+encoder version the VM was trained on; other versions are misses
    now: float  # event time (seconds) of the request
    # direct gets: the user's own pairs and the user's item-neighbour pairs (read TTL applies)
    pair_users: np.ndarray = field(default_factory=_i64)  # (n,) int64
    pair_items: np.ndarray = field(default_factory=_i64)  # (n,) int64
    # aggregated user embedding: mean over the user's retained pairs, excluding one item each
    agg_users: np.ndarray = field(default_factory=_i64)  # (a,) int64
    agg_exclude: np.ndarray = field(default_factory=_i64)  # (a,) int64 item to leave out
    # user-neighbour probe: which of these users (owned by this shard) hold a fresh pair for
    # which of these items (inverted index item -> holders, intersected with nbr_users)
    nbr_users: np.ndarray = field(default_factory=_i64)  # (k,) int64
    nbr_items: np.ndarray = field(default_factory=_i64)  # (m,) int64


@dataclass
class ShardAnswer:
    """A shard's reply; vectors are decoded float32 of width d."""

    pair_found: np.ndarray  # (n,) bool
    pair_vectors: np.ndarray  # (n, d) float32, zeros where not found
    pair_age_s: np.ndarray  # (n,) float64 event-time age, 0 where not found
    agg_vectors: np.ndarray  # (a, d) float32
    agg_present: np.ndarray  # (a,) bool
    agg_count: np.ndarray  # (a,) int64 pairs averaged
    nbr_item_idx: np.ndarray  # (h,) int64 index into ShardQuery.nbr_items of each hit
    nbr_user_idx: np.ndarray  # (h,) int64 index into ShardQuery.nbr_users of each hit
    nbr_vectors: np.ndarray  # (h, d) float32
    nbr_age_s: np.ndarray  # (h,) float64

    @classmethod
    def empty(cls, q: ShardQuery, dim: int) -> "ShardAnswer":
        """The answer of a shard that is down or late: every key a miss."""
        n, a = len(q.pair_users), len(q.agg_users)
        return cls(
            pair_found=np.zeros(n, bool), pair_vectors=np.zeros((n, dim), np.float32),
            pair_age_s=np.zeros(n), agg_vectors=np.zeros((a, dim), np.float32),
            agg_present=np.zeros(a, bool), agg_count=_i64(a), nbr_item_idx=_i64(),
            nbr_user_idx=_i64(), nbr_vectors=np.zeros((0, dim), np.float32), nbr_age_s=np.zeros(0))


@dataclass
class Slots:
    """The VM's two SOLARIS inputs for one request's candidates (DESIGN.md step 3)."""

    pair_emb: np.ndarray  # (C, d) float32
    pair_present: np.ndarray  # (C,) bool
    pair_tier: np.ndarray  # (C,) int64: TIER_NONE / TIER_PAIR / TIER_USER_NBR / TIER_ITEM_NBR
    pair_age_s: np.ndarray  # (C,) float64 age of the embedding used (0 where none)
    agg_emb: np.ndarray  # (C, d) float32 the user's aggregate excluding each candidate
    agg_present: np.ndarray  # (C,) bool
    missing: np.ndarray  # (C,) bool: no fresh own pair -> a precompute candidate
