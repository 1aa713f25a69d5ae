"""A shard count change on a local Ray: a 2-shard group's snapshots restore into a 3-shard
group of the same id (every pair and every user's history read back from the shard the
3-shard ring names), the 2-shard files stay in place, and a rollback to 2 shards restores
what the 3-shard group wrote since (its set is newer than the 2-shard files)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from actors.cache import CacheGroup  # noqa: E402  (after the importorskip)
from actors.shard import shard_name  # noqa: E402
from solaris.cache.query import Slots  # noqa: E402
from solaris.config import CacheConfig, EnrichConfig, HistoryConfig  # noqa: E402
from solaris.tiers import Tier  # noqa: E402

DIM, V, NOW = 8, "fm1+enc8", 100_000.0
USERS, ITEMS, PER_USER = 40, 60, 12
HCFG = HistoryConfig(max_events=16, max_users=1000)
GROUP = "reshard"


def cfg(tmp_path: Path, num_shards: int) -> CacheConfig:
    return CacheConfig(dim=DIM, num_shards=num_shards, capacity=20_000, deadline_ms=5000.0,
                       snapshot_uri=str(tmp_path / "snap"), snapshot_every_s=3600.0)


def start(tmp_path: Path, num_shards: int) -> CacheGroup:
    group = CacheGroup.create(cfg(tmp_path, num_shards), GROUP, history=HCFG)
    group.wait_ready()
    return group


def stop(group: CacheGroup) -> None:
    """Kill the group and wait until its names are free (a new group starts fresh shards)."""
    group.shutdown()
    t_end = time.monotonic() + 60
    for s in range(len(group.shards)):
        while time.monotonic() < t_end:
            try:
                ray.get_actor(shard_name(GROUP, s))
            except ValueError:
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"shard {s} of {GROUP} still named after 60 s")


def read_all(group: CacheGroup, items: dict[int, np.ndarray]) -> dict[int, Slots]:
    ecfg = EnrichConfig()
    return {u: group.lookup(u, c, NOW, V, None, None, ecfg) for u, c in items.items()}


def windows(group: CacheGroup) -> dict[str, np.ndarray]:
    users = np.arange(USERS)
    return group.history.window(users, np.full(USERS, NOW + 1.0), 16)


def same(a: dict, b: dict) -> None:
    for u in a:
        for name in a[u].__dataclass_fields__:
            np.testing.assert_array_equal(getattr(a[u], name), getattr(b[u], name),
                                          err_msg=f"user {u} {name}")


def test_a_new_shard_count_restores_the_old_snapshots_and_a_rollback_keeps_the_new(
        ray_local, tmp_path: Path):
    rng = np.random.default_rng(0)
    items = {u: rng.choice(ITEMS, PER_USER, replace=False) for u in range(USERS)}
    users = np.repeat(np.arange(USERS), PER_USER)
    flat = np.concatenate([items[u] for u in range(USERS)])
    two = start(tmp_path, 2)
    try:
        two.put(users, flat, rng.normal(size=(len(users), DIM)).astype(np.float32), V,
                NOW - 60.0, rng.random(len(users)).astype(np.float32))
        for u in range(USERS):
            two.history.record_impressions(u, items[u][:4], 0, NOW - 30.0)
        assert two.flush_records(timeout_s=30) == 0
        before, hist = read_all(two, items), windows(two)
        assert all((s.pair_tier == Tier.PAIR).all() for s in before.values())
        snaps = two.snapshot_now()
        assert all(s is not None and s["rows"] > 0 for s in snaps)
    finally:
        stop(two)
    folder = tmp_path / "snap" / GROUP
    old_files = sorted(p.name for p in folder.iterdir())
    assert old_files == ["shard-000-of-002.history.parquet", "shard-000-of-002.parquet",
                         "shard-001-of-002.history.parquet", "shard-001-of-002.parquet"]

    three = start(tmp_path, 3)
    try:
        m = three.metrics()["shards"]
        # every old entry on exactly one new shard: the counts add up, and each user's pairs
        # come back from the shard the 3-shard ring names (a lookup asks only that shard)
        assert sum(s["restored_entries"] for s in m) == USERS * PER_USER
        assert all(s["restored_entries"] > 0 for s in m)
        assert {s["restored_from"] for s in m} == {"the 2-shard snapshots"}
        assert sum(s["entries"] for s in m) == USERS * PER_USER
        same(before, read_all(three, items))
        for k, v in windows(three).items():
            np.testing.assert_array_equal(v, hist[k], err_msg=k)
        # a pair written under 3 shards, then snapshotted
        three.put([0], [ITEMS + 1], np.ones((1, DIM), np.float32), V, NOW - 10.0)
        after = read_all(three, {**items, 0: np.append(items[0], ITEMS + 1)})
        assert after[0].pair_present.all()
        time.sleep(0.05)  # the 3-shard files are written after the 2-shard ones on any clock
        assert all(s is not None for s in three.snapshot_now())
    finally:
        stop(three)
    names = sorted(p.name for p in folder.iterdir())
    assert set(old_files) < set(names) and len(names) == 10  # the 2-shard files left in place

    back = start(tmp_path, 2)  # a rollback: the 3-shard set is newer than the 2-shard files
    try:
        m = back.metrics()["shards"]
        assert sum(s["restored_entries"] for s in m) == USERS * PER_USER + 1
        assert {s["restored_from"] for s in m} == {"the 3-shard snapshots"}
        same(after, read_all(back, {**items, 0: np.append(items[0], ITEMS + 1)}))
        for k, v in windows(back).items():
            np.testing.assert_array_equal(v, hist[k], err_msg=k)
    finally:
        stop(back)
