"""Live history on the cache shards (local Ray): impressions and labels recorded through
``CacheGroup`` reach the FM worker, which computes the embeddings an in-process
``HistoryStore`` fed the same events gives; a restarted shard restores its history from its
snapshot; a dead shard never makes a write raise, and a history read from it does."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import RayActorError  # noqa: E402

from tests import tiny  # noqa: E402
from actors.cache import CacheGroup, HistoryUnavailable  # noqa: E402
from actors.ledger import LedgerActor  # noqa: E402
from actors.precompute import WorkerPool  # noqa: E402
from actors.queue import create_queue  # noqa: E402
from solaris.config import (CacheConfig, EnrichConfig, HistoryConfig,  # noqa: E402
                            PrecomputeConfig, QueueConfig, load_config)
from solaris.data.load import load_dataset  # noqa: E402
from solaris.features import FeatureTables  # noqa: E402
from solaris.history import HistoryStore  # noqa: E402
from solaris.precompute.pqueue import Group  # noqa: E402
from solaris.artifacts import SideTables, load_models  # noqa: E402
from solaris.precompute.worker import PrecomputeWorker  # noqa: E402
from solaris.tiers import Tier  # noqa: E402
from solaris.train.artifacts import train_artifacts  # noqa: E402

# test_precompute_faults' TINY sizes: the model's quality is not under test here
TINY = {**tiny.TINY, **tiny.WORLD_400}
HCFG = HistoryConfig(max_events=24, max_users=1000)  # fewer than some users' events: rings wrap
USERS = 10  # users whose logged requests are recorded live
REQUESTS, PER_REQUEST = 10, 6  # precompute requests after the recorded events


@dataclass
class World:
    artifacts: Path
    version: str
    dim: int
    tables: SideTables
    events: list[tuple]  # ("imp", user, items, surfaces, now) / ("lab", user, items, y, now)
    users: np.ndarray  # the recorded users
    t_end: float  # after every recorded event
    num_items: int


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    art = tmp_path_factory.mktemp("artifacts")
    manifest = train_artifacts(cfg, ds, art, seed=0)
    ft = FeatureTables(ds, cfg.features)
    rng = np.random.default_rng(0)
    users = rng.choice(np.unique(ft.user), USERS, replace=False)
    rows = np.flatnonzero(np.isin(ft.user, users))  # event order
    key = np.stack([ft.user[rows], ft.ts[rows]], 1)
    _, start, count = np.unique(key, axis=0, return_index=True, return_counts=True)
    events = []
    for s in np.sort(start):  # requests in event order; labels 30 s after their impressions
        r = rows[s:s + count[start == s][0]]
        u, t = int(ft.user[r[0]]), float(ft.ts[r[0]])
        events.append(("imp", u, ft.item[r], ft.surface[r], t))
        events.append(("lab", u, ft.item[r], ft.labels[r], t + 30.0))
    return World(art, manifest["version"], cfg.encoder.width, SideTables.from_features(ft),
                 events, users, float(ft.ts[rows].max()) + 60.0, ds.num_items)


def record(group: CacheGroup, local: HistoryStore, events: list[tuple]) -> None:
    """The same events through the group (fire-and-forget) and into ``local``.

    Waits for a request's impressions before sending its labels: Ray does not promise the
    order of two calls to a threaded actor (in production the labels come seconds later).
    """
    for kind, user, items, x, now in events:
        if kind == "imp":
            group.history.record_impressions(user, items, x, now)
            local.record_impressions(user, items, x, now)
        else:
            group.history.record_labels(user, items, x, now)
            local.record_labels(user, items, x, now)
        assert group.flush_records(timeout_s=30) == 0


def requests(w: World, seed: int = 1) -> list[Group]:
    """Precompute requests of the recorded users after their events, distinct items each."""
    rng = np.random.default_rng(seed)
    users = rng.choice(w.users, REQUESTS)
    return [Group(int(u), w.t_end + 10.0 * j, int(rng.integers(0, 2)), w.version,
                  rng.choice(w.num_items, PER_REQUEST, replace=False), rng.random(PER_REQUEST))
            for j, u in enumerate(users)]


@pytest.fixture
def group(ray_local, world, tmp_path):
    g = CacheGroup.create(CacheConfig(dim=world.dim, num_shards=2, capacity=10_000,
                                      deadline_ms=5000.0, snapshot_uri=str(tmp_path / "snap"),
                                      snapshot_every_s=3600.0), history=HCFG)
    g.wait_ready()
    yield g
    g.shutdown()


def test_recorded_history_gives_the_in_process_embeddings(group, world: World):
    local = HistoryStore(HCFG)
    record(group, local, world.events)
    m = group.metrics()
    assert sum(s["history"]["events"] for s in m["shards"]) == local.metrics()["events"]
    assert all(s["history"]["users"] for s in m["shards"]), "both shards hold some users"
    hw = m["client"]["history_writes"]
    assert hw["sent"] == len(world.events) and hw["failed"] == 0 and hw["pending"] == 0

    queue = create_queue(QueueConfig(capacity=1000, lease_pairs=4 * PER_REQUEST))
    ledger = LedgerActor.remote()
    pool = WorkerPool(PrecomputeConfig(workers=1, device="cpu"), world.artifacts,
                      world.tables, None, queue, group, ledger)  # None: the live history
    try:
        groups = requests(world)
        users = np.concatenate([np.full(PER_REQUEST, g.user) for g in groups])
        items = np.concatenate([g.items for g in groups])
        now = np.repeat([g.now for g in groups], PER_REQUEST)
        surf = np.repeat([g.surface for g in groups], PER_REQUEST)
        prio = np.concatenate([g.priorities for g in groups])
        assert ray.get(queue.put.remote(users, items, prio, now, surf, world.version)) == \
            len(users)
        # pipelined: each next lease's histories are read while the current one computes
        got = ray.get(pool.workers[0].drain.remote())
        assert got["pairs"] == len(users) and got["leases"] >= 3
        assert ray.get(pool.workers[0].metrics.remote())["history"] == "live"

        fm, enc, version = load_models(world.artifacts)
        _, _, want, _ = PrecomputeWorker(fm, enc, local, world.tables, version).run(groups)
        ecfg = EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)
        read_at = float(now.max()) + 1.0
        for j, g in enumerate(groups):
            slots = group.lookup(g.user, g.items, read_at, version, None, None, ecfg)
            assert (slots.pair_tier == Tier.PAIR).all()
            np.testing.assert_allclose(slots.pair_emb,
                                       want[j * PER_REQUEST:(j + 1) * PER_REQUEST],
                                       atol=1e-5, rtol=0)
        # the history mattered: without it the same requests give other vectors
        _, _, blank, _ = PrecomputeWorker(fm, enc, HistoryStore(HCFG), world.tables,
                                          version).run(groups)
        assert not np.allclose(blank, want, atol=1e-3)
    finally:
        pool.shutdown()
        for h in (queue, ledger):
            ray.kill(h, no_restart=True)


def _cached(group: CacheGroup, groups: list[Group], version: str, dim: int) -> np.ndarray:
    """The own-pair vectors the cache holds for ``groups``' pairs, in group order."""
    ecfg = EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)
    read_at = max(g.now for g in groups) + 1.0
    out = []
    for g in groups:
        slots = group.lookup(g.user, g.items, read_at, version, None, None, ecfg)
        assert (slots.pair_tier == Tier.PAIR).all()
        out.append(slots.pair_emb)
    return np.concatenate(out).reshape(-1, dim)


@pytest.mark.parametrize("how", ["gate", "clock"])
def test_the_workers_read_the_history_as_of_the_release(group, world: World, how: str):
    """``schedule.history_at=visible`` live: requests made midway through the recorded history are
    computed with the history as of the replay gate's ``read_at`` (``gate``), or, with no
    gate, as of the lease on the worker's clock (``clock``, production); the cache entries
    keep their request's time. The request-time vectors differ, so the setting is read."""
    local = HistoryStore(HCFG)
    record(group, local, world.events)
    rng = np.random.default_rng(2)
    mid = float(np.median([e[4] for e in world.events]))  # half the events come later
    groups = [Group(int(u), mid + 10.0 * j, 0, world.version,
                    rng.choice(world.num_items, PER_REQUEST, replace=False),
                    rng.random(PER_REQUEST)) for j, u in enumerate(world.users)]
    queue = create_queue(QueueConfig(capacity=1000, lease_pairs=2 * PER_REQUEST))
    read_at = world.t_end + (0.0 if how == "gate" else 50.0)  # the gate's, or the clock's
    pool = WorkerPool(PrecomputeConfig(workers=1, device="cpu"), world.artifacts,
                      world.tables, None, queue, group, None,
                      history_at="request" if how == "gate" else "visible",
                      clock=lambda: read_at)
    try:
        for g in groups:
            ray.get(queue.put.remote(np.full(PER_REQUEST, g.user), g.items, g.priorities,
                                     g.now, g.surface, world.version))
        if how == "gate":
            ray.get(queue.set_gate.remote(max(g.now for g in groups), None, read_at))
        got = ray.get(pool.workers[0].drain.remote())
        assert got["pairs"] == len(groups) * PER_REQUEST
        fm, enc, version = load_models(world.artifacts)
        worker = PrecomputeWorker(fm, enc, local, world.tables, version)
        _, _, want, _ = worker.run(groups, read_at=read_at)
        _, _, at_request, _ = worker.run(groups)
        cached = _cached(group, groups, version, world.dim)
        np.testing.assert_allclose(cached, want, atol=1e-5, rtol=0)
        assert not np.allclose(at_request, want, atol=1e-3)
        # each entry is as old as its own request, not as the read nor as the lease's other
        # requests: the read TTL and the age the VM reads count from the request
        last = max(g.now for g in groups)
        assert last + 5.0 < world.t_end
        ages = np.concatenate([group.lookup(
            g.user, g.items, last + 5.0, version, None, None,
            EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)).pair_age_s
            for g in groups])
        np.testing.assert_array_equal(ages, np.repeat([last + 5.0 - g.now for g in groups],
                                                      PER_REQUEST))
    finally:
        pool.shutdown()
        ray.kill(queue, no_restart=True)


def test_restarted_shard_restores_its_history(group, world: World):
    local = HistoryStore(HCFG)
    record(group, local, world.events)
    snaps = group.snapshot_now()
    shard = group.shard_of(world.users)
    victim = int(shard[0])
    assert snaps[victim]["history_rows"] == \
        group.metrics()["shards"][victim]["history"]["events"] > 0
    at_snapshot = HistoryStore(HCFG)
    at_snapshot.restore(local.snapshot())
    # an impression after the snapshot: lost with the process
    late_user = int(world.users[0])
    group.history.record_impressions(late_user, np.array([1, 2]), 0, world.t_end)
    assert group.flush_records() == 0

    users = world.users
    now = np.full(len(users), world.t_end + 100.0)
    before = group.history.window(users, now, 16)
    with pytest.raises(RayActorError):
        ray.get(group.shards[victim].crash.remote())
    group.wait_ready()
    m = group.metrics()["shards"][victim]
    assert m["restarted"] and m["restored_events"] == snaps[victim]["history_rows"]
    after = group.history.window(users, now, 16)
    want = at_snapshot.window(users, now, 16)
    for k in want:
        np.testing.assert_array_equal(after[k], want[k], err_msg=k)
    lost = shard == victim
    if shard[0] == victim:  # the late impression was on the victim: gone
        assert not np.array_equal(before["item"][0], after["item"][0])
    for k in want:  # the other shard's users did not move
        np.testing.assert_array_equal(after[k][~lost], before[k][~lost], err_msg=k)


def test_dead_shard_never_raises_on_writes_and_fails_reads(group, world: World):
    shard = group.shard_of(world.users)
    victim = int(shard[0])
    ray.kill(group.shards[victim], no_restart=True)
    # ray.kill returns before the actor is gone: a ping sent at once may still be answered
    deadline = time.monotonic() + 30
    while True:
        try:
            ray.get(group.shards[victim].ping.remote(), timeout=30)
        except RayActorError:
            break
        assert time.monotonic() < deadline, "the killed shard still answers after 30 s"
        time.sleep(0.05)
    user = int(world.users[0])
    group.history.record_impressions(user, np.array([3, 4]), np.array([0, 1]), world.t_end)
    group.history.record_labels(user, np.array([3]), np.array([[1, 0]]), world.t_end + 1)
    assert group.flush_records(timeout_s=30) == 0
    hw = group.metrics(timeout_s=2.0)["client"]["history_writes"]
    assert hw["failed"] == 2 and hw["failed_by_shard"][victim] == 2
    with pytest.raises(HistoryUnavailable):
        group.history.window(world.users, np.full(len(world.users), world.t_end), 8,
                             timeout_s=5.0)
    alive = world.users[shard != victim]  # the other shard still answers
    group.history.record_impressions(int(alive[0]), np.array([5]), 0, world.t_end)
    assert group.flush_records() == 0
    win = group.history.window(alive, np.full(len(alive), world.t_end + 1), 8)
    assert win["item"][0, 0] == 5 and win["valid"].sum() == 1
