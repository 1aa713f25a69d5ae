"""Consistent hashing of users onto shards: moves on resize, balance, stable across processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from solaris.cache.ring import HashRing
from solaris.config import CacheConfig
from solaris.errors import RequestError

USERS = np.arange(100_000, dtype=np.int64)


def test_resize_8_to_9_moves_about_a_ninth_and_only_to_the_new_shard():
    before = HashRing(8, 128).shard_of(USERS)
    after = HashRing(9, 128).shard_of(USERS)
    moved = before != after
    assert moved.mean() <= 0.15  # ideal: 1/9 = 0.111
    assert moved.mean() >= 0.07
    assert (after[moved] == 8).all()  # nobody moves between old shards


@pytest.mark.parametrize("n", [2, 4, 8])
def test_balance(n):
    share = np.bincount(HashRing(n, 128).shard_of(USERS), minlength=n) / len(USERS) * n
    assert share.min() >= 0.8 and share.max() <= 1.2


def test_large_and_sparse_ids_balance_too():
    users = np.random.default_rng(0).integers(0, 2**62, 50_000)
    share = np.bincount(HashRing(4, 128).shard_of(users), minlength=4) / len(users) * 4
    assert share.min() >= 0.8 and share.max() <= 1.2


def test_same_placement_in_another_process_with_another_hash_seed():
    code = ("import json, numpy as np; from solaris.cache.ring import HashRing; "
            "print(json.dumps(HashRing(5, 64).shard_of(np.arange(2000)).tolist()))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == HashRing(5, 64).shard_of(np.arange(2000)).tolist()


def test_from_config_and_bad_input():
    ring = HashRing.from_config(CacheConfig(num_shards=3, virtual_nodes=16))
    s = ring(np.array([0, 1, 2**40]))
    assert s.dtype == np.int64 and set(s.tolist()) <= {0, 1, 2}
    assert ring.shard_of(np.zeros(0, np.int64)).shape == (0,)
    with pytest.raises(RequestError, match="num_shards=0"):
        HashRing(0)
    with pytest.raises(RequestError, match="users"):
        ring.shard_of(np.array([0.5]))
