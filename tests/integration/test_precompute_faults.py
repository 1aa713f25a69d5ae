"""Precompute on a local Ray with faults at named points: a worker killed mid-forward or after
its cache write but before its ack, the queue actor killed with pending work. Afterwards every
accepted pair has exactly one live cache entry, none is missing, and the shards count the
duplicate FM evaluations. A flood far above the queue's bound keeps it within the bound.

The workers run the production wiring: the live history held by the cache shards, seeded
from the log (``CacheGroup.history.replay_log``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import RayActorError  # noqa: E402

from tests import tiny  # noqa: E402
from actors.cache import CacheGroup  # noqa: E402
from actors.ledger import LedgerActor  # noqa: E402
from solaris.precompute.ledger import speculation_report  # noqa: E402
from actors.precompute import WorkerPool  # noqa: E402
from actors.queue import create_queue  # noqa: E402
from solaris.artifacts import SideTables  # noqa: E402
from solaris.config import (CacheConfig, EnrichConfig, HistoryConfig,  # noqa: E402
                            PrecomputeConfig, QueueConfig, load_config)
from solaris.data.load import load_dataset  # noqa: E402
from solaris.features import FeatureTables  # noqa: E402
from solaris.tiers import Tier  # noqa: E402
from solaris.train.artifacts import train_artifacts  # noqa: E402

log = logging.getLogger(__name__)

# test_pipeline's TINY sizes, one epoch each: the model's quality is not under test here
TINY = {**tiny.TINY, **tiny.WORLD_400}
REQUESTS, PER_REQUEST = 12, 8  # 96 accepted pairs per test
LEASE_PAIRS = 16  # two requests per lease
LEASE_TIMEOUT_S = 3.0  # short, yet ~100x a step on a loaded 2-core machine
NO_TIMER_S = 3600.0  # queue snapshots only when flushed: the test decides what is durable
HISTORY = HistoryConfig(max_events=64, max_users=1000)  # each cache shard's history bounds


@dataclass
class World:
    artifacts: Path
    version: str
    dim: int
    tables: SideTables
    log: tuple  # (users, items, surfaces, labels, ts) of the logged interactions
    users: np.ndarray  # (n,) accepted pairs, REQUESTS requests of PER_REQUEST candidates
    items: np.ndarray
    now: np.ndarray
    surfaces: np.ndarray
    priorities: np.ndarray


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    art = tmp_path_factory.mktemp("artifacts")
    manifest = train_artifacts(cfg, ds, art, seed=0)
    ft = FeatureTables(ds, cfg.features)
    rng = np.random.default_rng(0)
    t0 = float(ft.ts.max()) + 60.0
    users = rng.choice(np.unique(ft.user), REQUESTS, replace=False)
    u = np.repeat(users, PER_REQUEST)
    items = np.concatenate([rng.choice(ds.num_items, PER_REQUEST, replace=False)
                            for _ in users])
    now = np.repeat(t0 + 10.0 * np.arange(REQUESTS), PER_REQUEST)
    surf = np.repeat(rng.integers(0, ds.spec.num_surfaces, REQUESTS), PER_REQUEST)
    return World(art, manifest["version"], cfg.encoder.width, SideTables.from_features(ft),
                 (ft.user, ft.item, ft.surface, ft.labels, ft.ts), u, items, now, surf,
                 rng.random(len(u)))


@dataclass
class Env:
    queue: Any
    cache: CacheGroup
    ledger: Any
    pool: WorkerPool


@pytest.fixture
def env(ray_local, world, tmp_path):
    cache = CacheGroup.create(CacheConfig(dim=world.dim, num_shards=2, capacity=10_000,
                                          deadline_ms=5000.0), history=HISTORY)
    assert cache.history.replay_log(*world.log) == len(world.log[0])
    queue = create_queue(QueueConfig(capacity=10_000, lease_timeout_s=LEASE_TIMEOUT_S,
                                     lease_pairs=LEASE_PAIRS, snapshot_uri=str(tmp_path / "q"),
                                     snapshot_every_s=NO_TIMER_S))
    ledger = LedgerActor.remote()
    pool = WorkerPool(PrecomputeConfig(workers=2, max_workers=3, scale_up_depth=40, device="cpu"),
                      world.artifacts, world.tables, None, queue, cache, ledger,
                      lease_pairs=LEASE_PAIRS)
    cache.wait_ready()
    pool.wait_ready()
    yield Env(queue, cache, ledger, pool)
    pool.shutdown()
    cache.shutdown()
    for h in (queue, ledger):
        ray.kill(h, no_restart=True)


def put_all(env: Env, w: World) -> int:
    """The verifier's batch: one Ray call; every pair is new."""
    new = ray.get(env.queue.put.remote(w.users, w.items, w.priorities, w.now, w.surfaces,
                                       w.version))
    assert new == len(w.users)
    return new


def assert_each_pair_once(env: Env, w: World) -> None:
    """No accepted pair missing, exactly one live entry each, nothing left in the queue."""
    m = ray.get(env.queue.metrics.remote())
    assert m["depth"] == 0 and m["leased"] == 0
    shards = env.cache.metrics()["shards"]
    assert all(s["up"] for s in shards)
    assert sum(s["entries"] for s in shards) == len(w.users)  # one entry per (user, item)
    ecfg = EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)
    read_at = float(w.now.max()) + 1.0
    for u in np.unique(w.users).tolist():
        items = w.items[w.users == u]
        slots = env.cache.lookup(u, items, read_at, w.version, None, None, ecfg)
        assert (slots.pair_tier == Tier.PAIR).all(), f"user {u}: pairs missing from the cache"


def in_flight(env: Env) -> int:
    return int(ray.get(env.queue.metrics.remote())["leased"])


def costs(env: Env) -> dict:
    """The ledger's evaluations with the shards' duplicates (``speculation_report``)."""
    return speculation_report(ray.get(env.ledger.report.remote()),
                              env.cache.metrics()["shards"], served=0)


def test_worker_killed_mid_forward(env: Env, world: World):
    put_all(env, world)
    victim, other = env.pool.workers
    ray.get(victim.arm.remote("mid_forward"))
    with pytest.raises(RayActorError):
        ray.get(victim.step.remote())
    lost = in_flight(env)
    assert lost == LEASE_PAIRS  # leased, never acked
    env.pool.drain(timeout_s=60)  # the other worker, then both (the victim restarted)
    assert_each_pair_once(env, world)
    q = ray.get(env.queue.metrics.remote())
    assert q["expired_leases"] == 1 and q["expired_pairs"] == lost
    led = costs(env)
    # the killed forward never finished: nothing was evaluated twice, nothing written twice
    assert led["evaluations"] == len(world.users) and led["duplicates"] == 0
    assert ray.get(victim.metrics.remote())["restarted"]


def test_worker_killed_after_write_before_ack(env: Env, world: World):
    put_all(env, world)
    victim = env.pool.workers[0]
    ray.get(victim.arm.remote("after_write_before_ack"))
    with pytest.raises(RayActorError):
        ray.get(victim.step.remote())
    assert in_flight(env) == LEASE_PAIRS
    written = sum(s["entries"] for s in env.cache.metrics()["shards"])
    assert written == LEASE_PAIRS  # in the cache, but not acked
    env.pool.drain(timeout_s=60)
    assert_each_pair_once(env, world)  # evaluated twice, written twice, one live entry
    led = costs(env)
    assert led["duplicates"] == LEASE_PAIRS
    assert led["evaluations"] == len(world.users) + LEASE_PAIRS
    assert led["unique_evaluations"] == len(world.users)


def test_queue_killed_with_pending_work(env: Env, world: World):
    put_all(env, world)
    ray.get(env.queue.flush.remote())  # the accepted batch is durable from here
    acked = sum(r["pairs"] for r in env.pool.step_all() if r)  # acked after the snapshot
    assert acked == 2 * LEASE_PAIRS
    held = ray.get(env.queue.lease.remote(LEASE_PAIRS, world.version))  # a worker's lease
    with pytest.raises(RayActorError):
        ray.get(env.queue.crash.remote())
    q = ray.get(env.queue.metrics.remote())  # retried until the restarted actor answers
    assert q["restored_pairs"] == len(world.users)  # the whole snapshot: nothing lost
    assert q["depth"] == len(world.users) and q["leased"] == 0
    assert not ray.get(env.queue.ack.remote(held.lease_id))  # the old lease is gone
    env.pool.drain(timeout_s=60)
    assert_each_pair_once(env, world)
    led = costs(env)
    # the acks after the last snapshot were lost: those pairs came back and ran again
    assert led["duplicates"] == acked
    assert led["evaluations"] == len(world.users) + acked


def test_pipelined_drain_and_scaling_with_depth(env: Env, world: World):
    put_all(env, world)
    assert env.pool.scale({"depth": 80}) == 0  # 80 pending <= 40 per worker x 2 workers
    assert env.pool.scale() == 1  # the queue's depth, 96 > 80: one more, up to max_workers
    assert env.pool.scale({"depth": 10_000}) == 0 and len(env.pool.workers) == 3
    got = ray.get(env.pool.workers[0].drain.remote())  # lease ahead, write behind
    assert got["pairs"] == len(world.users) and got["late_acks"] == 0
    assert_each_pair_once(env, world)
    led = costs(env)
    assert led["evaluations"] == len(world.users) and led["duplicates"] == 0


def wait_drained(env: Env, timeout_s: float = 60.0) -> dict:
    """Tick the pool (its checks restart a crashed worker's loop) until nothing is queued or
    leased."""
    deadline = time.monotonic() + timeout_s
    while True:
        env.pool.check(timeout_s=1.0)
        m = ray.get(env.queue.metrics.remote())
        if m["depth"] == 0 and m["leased"] == 0:
            return m
        assert time.monotonic() < deadline, f"not drained: {m}"
        time.sleep(0.1)


def test_a_retired_worker_acks_what_it_holds(env: Env, world: World):
    """Removing a worker mid-drain: it stops leasing, writes and acks what it holds, then
    is killed -- no lease is left to expire, no pair computed twice or missing."""
    env.pool.start()
    put_all(env, world)
    deadline = time.monotonic() + 60
    while in_flight(env) == 0 and ray.get(env.queue.metrics.remote())["depth"] > 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim = env.pool.workers[-1]
    assert env.pool.remove_workers(1) == 1 and len(env.pool.workers) == 1
    while env.pool.reap():  # killed once its loop has stopped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # ray.kill is asynchronous: a call sent just after it may still be answered
    with pytest.raises(RayActorError):
        while True:
            ray.get(victim.metrics.remote(), timeout=30)
            assert time.monotonic() < deadline, "the retired worker was never killed"
            time.sleep(0.05)
    q = wait_drained(env)
    assert q["expired_leases"] == 0 and q["late_acks"] == 0 and q["nacks"] == 0
    assert_each_pair_once(env, world)
    assert costs(env)["duplicates"] == 0
    assert env.pool.status() == {"workers": 1, "pending": 0, "retiring": 0, "errors": 0}


def test_a_worker_crashed_in_its_loop_is_counted_and_restarted(env: Env, world: World):
    """A worker that dies mid-lease in its background loop: its lease comes back after the
    lease timeout, the pool counts the error, and starts the restarted worker's loop."""
    env.pool.remove_workers(1)  # one worker: the crash is the first thing it leases
    env.pool.reap()
    (victim,) = env.pool.workers
    assert env.pool.check() == 0  # read once: its process is known
    ray.get(victim.arm.remote("mid_forward"))
    env.pool.start()
    put_all(env, world)
    q = wait_drained(env)
    # the leases the pipeline held (the one computed and up to two ahead), back after
    # LEASE_TIMEOUT_S
    assert 1 <= q["expired_leases"] <= 3 and q["expired_pairs"] == LEASE_PAIRS * q["expired_leases"]
    assert env.pool.errors >= 1 and env.pool.status()["errors"] == env.pool.errors
    m = ray.get(victim.metrics.remote())
    assert m["restarted"] and m["running"]
    assert_each_pair_once(env, world)


def test_queue_snapshot_timer_makes_puts_durable(ray_local, world: World, tmp_path):
    queue = create_queue(QueueConfig(snapshot_uri=str(tmp_path / "q"), snapshot_every_s=0.2))
    try:
        ray.get(queue.put.remote(world.users, world.items, world.priorities, world.now,
                                 world.surfaces, world.version))
        for _ in range(100):  # the write-behind thread, not flush(), makes it durable
            if not ray.get(queue.metrics.remote())["dirty"]:
                break
            time.sleep(0.05)
        with pytest.raises(RayActorError):
            ray.get(queue.crash.remote())
        m = ray.get(queue.metrics.remote())
        assert m["restored_pairs"] == m["depth"] == len(world.users)
        assert m["accepted"] == len(world.users)  # counters travel with the snapshot
    finally:
        ray.kill(queue, no_restart=True)


def test_flood_keeps_the_bound_and_drops_lowest_priority(ray_local):
    cap, batches, per = 200, 20, 500
    queue = create_queue(QueueConfig(capacity=cap, lease_pairs=cap))
    try:
        rng = np.random.default_rng(3)
        keys = rng.permutation(batches * per)  # distinct (user, item) pairs
        users, items = keys // 100, keys % 100
        prios = rng.random(len(keys))
        for b in range(batches):
            s = slice(b * per, (b + 1) * per)
            new = ray.get(queue.put.remote(users[s], items[s], prios[s], float(b),
                                           0, "v1"))
            assert new == per
            m = ray.get(queue.metrics.remote())
            assert m["depth"] + m["leased"] <= cap
        m = ray.get(queue.metrics.remote())
        assert m["depth"] == cap
        assert m["dropped"] == batches * per - cap and m["accepted"] == batches * per
        kept: dict[tuple[int, int], float] = {}
        while (lease := ray.get(queue.lease.remote(cap, "v1"))) is not None:
            for g in lease.groups:
                kept.update({(g.user, int(i)): float(p)
                             for i, p in zip(g.items, g.priorities)})
        top = np.argsort(-prios)[:cap]  # what dropping the lowest first must keep
        assert set(kept) == set(zip(users[top].tolist(), items[top].tolist()))
    finally:
        ray.kill(queue, no_restart=True)
