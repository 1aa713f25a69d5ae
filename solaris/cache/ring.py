"""Consistent hashing of user ids onto cache shards, so a user's pairs and aggregate live on
one shard and a resize from N to N + 1 shards moves about 1 / (N + 1) of the users.

Each shard owns ``virtual_nodes`` points on a 64-bit ring; a user belongs to the first point
clockwise of its hash. Hashes are splitmix64 of the integers (not Python's salted ``hash``),
so every process, replica and restart computes the same placement.
"""

from __future__ import annotations

import numpy as np

from solaris.cache.index import mix64
from solaris.cache.inputs import check_ids
from solaris.config import CacheConfig
from solaris.errors import RequestError

_USER_SALT = np.uint64(0x5BD1E9955BD1E995)
_NODE_SALT = np.uint64(0x2545F4914F6CDD1D)


class HashRing:
    """Users -> shard ids in [0, num_shards), vectorised."""

    def __init__(self, num_shards: int, virtual_nodes: int = 128) -> None:
        if num_shards < 1:
            raise RequestError(f"num_shards={num_shards!r}: must be >= 1")
        if virtual_nodes < 1:
            raise RequestError(f"virtual_nodes={virtual_nodes!r}: must be >= 1")
        self.num_shards = num_shards
        self.virtual_nodes = virtual_nodes
        shard = np.repeat(np.arange(num_shards, dtype=np.uint64), virtual_nodes)
        vnode = np.tile(np.arange(virtual_nodes, dtype=np.uint64), num_shards)
        # a point depends only on (shard, vnode): adding a shard adds points, moves none
        points = mix64(mix64((shard << np.uint64(32)) | vnode) ^ _NODE_SALT)
        order = np.lexsort((shard, points))
        self._points = points[order]  # (S * V,) sorted ring positions
        self._owner = shard[order].astype(np.int64)  # (S * V,) shard of each point

    @classmethod
    def from_config(cls, cfg: CacheConfig) -> "HashRing":
        return cls(cfg.num_shards, cfg.virtual_nodes)

    def shard_of(self, users: np.ndarray) -> np.ndarray:
        """(n,) int64 shard of each user id."""
        u = check_ids(users, "users")
        h = mix64(u.astype(np.uint64) ^ _USER_SALT)
        idx = np.searchsorted(self._points, h, side="right")
        idx[idx == len(self._points)] = 0  # past the last point: wrap to the first
        return self._owner[idx]

    __call__ = shard_of
