"""Cache shards on a local Ray: one-round lookups equal the in-process path; a dead, slow or
restarting shard reads as misses within the deadline; a restarted shard serves its snapshot."""

from __future__ import annotations

import asyncio

import logging
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from actors.cache import CacheGroup  # noqa: E402  (after the importorskip)
from solaris.cache.query import Slots  # noqa: E402
from solaris.cache.snapshot import snapshot_location  # noqa: E402
from solaris.cache.store import PairStore  # noqa: E402
from solaris.config import CacheConfig, EnrichConfig  # noqa: E402
from solaris.knn.neighbours import NeighbourTable  # noqa: E402
from solaris.online.enrich import enrich_local  # noqa: E402
from solaris.tiers import Tier  # noqa: E402

DIM = 8
V = "fm1+enc8"
NOW = 100_000.0
USERS, ITEMS = 60, 90
MARGIN_S = 0.25  # scheduling slack on a busy 2-core machine, on top of the deadline
log = logging.getLogger(__name__)


def cache_cfg(tmp_path: Path, **kw) -> CacheConfig:
    base = dict(dim=DIM, num_shards=3, capacity=20_000, read_ttl_s=4 * 3600,
                retention_s=24 * 3600, bucket_s=900, deadline_ms=2000.0,
                snapshot_uri=str(tmp_path / "snap"), snapshot_every_s=3600.0)
    base.update(kw)
    return CacheConfig(**base)


def world(seed: int = 0) -> dict:
    """Pairs of two versions, some past the read TTL, plus user and item KNN tables."""
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(USERS):
        held = rng.choice(ITEMS, size=30, replace=False)
        users.append(np.full(30, u))
        items.append(held)
    users, items = np.concatenate(users), np.concatenate(items)
    n = len(users)
    vecs = rng.normal(size=(n, DIM)).astype(np.float32)
    written = NOW - rng.uniform(0, 5 * 3600, size=n)  # about a fifth past the 4 h read TTL
    version = np.where(rng.random(n) < 0.9, V, "fm0+enc8")
    uk = np.stack([rng.permutation(USERS)[:12] for _ in range(USERS)])
    ik = np.stack([rng.permutation(ITEMS)[:6] for _ in range(ITEMS)])
    return {"users": users, "items": items, "vecs": vecs, "written": written,
            "version": version, "scores": rng.random(n).astype(np.float32),
            "user_knn": NeighbourTable(uk, np.sort(rng.random(uk.shape))[:, ::-1], "knn1"),
            "item_knn": NeighbourTable(ik, np.sort(rng.random(ik.shape))[:, ::-1], "knn1")}


def fill(put, w: dict) -> None:
    """Write ``w`` in event-time order through ``put`` (a store's or a group's)."""
    order = np.argsort(w["written"], kind="stable")
    for chunk in np.array_split(order, 20):
        for v in np.unique(w["version"][chunk]):
            sel = chunk[w["version"][chunk] == v]
            put(w["users"][sel], w["items"][sel], w["vecs"][sel], str(v),
                float(w["written"][sel].max()), w["scores"][sel])


def assert_same_slots(a: Slots, b: Slots) -> None:
    """Bit for bit: the answers cross the wire losslessly and assemble with the same code."""
    for name in a.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("mode", ["nearest", "weighted"])
def test_group_lookup_equals_in_process_enrichment(ray_local, tmp_path: Path, mode: str):
    cfg = cache_cfg(tmp_path)
    w = world()
    group = CacheGroup.create(cfg)
    try:
        group.wait_ready()
        store = PairStore(cfg)
        fill(store.put, w)
        fill(group.put, w)
        ecfg = EnrichConfig(user_knn_probe=5, user_knn_mode=mode, item_knn_probe=4)
        rng = np.random.default_rng(1)
        tiers = set()
        for user in rng.choice(USERS, size=15, replace=False):
            cands = rng.choice(ITEMS + 10, size=40)  # some unknown items, some repeats
            remote = group.lookup(int(user), cands, NOW, V, w["user_knn"], w["item_knn"], ecfg)
            local = enrich_local(store, int(user), cands, NOW, V, w["user_knn"], w["item_knn"],
                                 ecfg)
            assert_same_slots(remote, local)
            awaited = asyncio.run(group.lookup_async(int(user), cands, NOW, V, w["user_knn"],
                                                     w["item_knn"], ecfg))
            assert_same_slots(awaited, local)  # the event-loop round answers the same
            tiers |= set(local.pair_tier.tolist())
        assert tiers == {0, 1, 2, 3}, "the data should exercise every tier"
        m = group.metrics()
        assert m["client"]["late"] == [0, 0, 0] and m["client"]["failed"] == [0, 0, 0]
        assert sum(s["entries"] for s in m["shards"]) == store.metrics()["entries"]
        assert all(s["up"] for s in m["shards"])
        # one answer with the user's part per lookup, on the user's shard
        assert sum(s["answers"]["user"]["calls"] for s in m["shards"]) == 30  # 15 x 2 ways
    finally:
        group.shutdown()


def two_users_on_two_shards(group: CacheGroup) -> tuple[int, int, int]:
    shard = group.shard_of(np.arange(USERS))
    a = 0
    b = int(np.flatnonzero(shard != shard[a])[0])
    return a, b, int(shard[a])


def own_pairs(w: dict, user: int) -> np.ndarray:
    """Items ``user`` holds fresh in version V at NOW."""
    m = (w["users"] == user) & (w["version"] == V) & (NOW - w["written"] <= 4 * 3600)
    return w["items"][m]


def test_dead_shard_reads_as_misses_then_serves_its_snapshot(ray_local, tmp_path: Path):
    cfg = cache_cfg(tmp_path, deadline_ms=100.0)
    w = world(seed=2)
    group = CacheGroup.create(cfg)
    try:
        group.wait_ready()
        fill(group.put, w)
        a, b, victim = two_users_on_two_shards(group)
        ca, cb = own_pairs(w, a), own_pairs(w, b)
        ecfg = EnrichConfig()
        # a pair written after the snapshot: lost with the process, not restored
        late_user = int(np.flatnonzero(group.shard_of(np.arange(USERS)) == victim)[-1])
        snaps = group.snapshot_now()
        assert snaps[victim]["rows"] > 0
        group.put([late_user], [ITEMS + 5], np.ones((1, DIM), np.float32), V, NOW)

        def look(user: int, cands: np.ndarray) -> tuple[Slots, float]:
            t0 = time.monotonic()
            s = group.lookup(user, cands, NOW, V, None, None, ecfg)
            return s, time.monotonic() - t0

        before, _ = look(a, ca)
        assert (before.pair_tier == Tier.PAIR).all() and before.agg_present.all()

        group.shards[victim].crash.remote()
        saw_down = saw_back = False
        worst, downs, rounds = 0.0, 0, 0
        t_end = time.monotonic() + 40
        while time.monotonic() < t_end and not saw_back:
            sa, ta = look(a, ca)
            sb, tb = look(b, cb)
            rounds += 1
            worst = max(worst, ta, tb)
            assert (sb.pair_tier == Tier.PAIR).all() and sb.agg_present.all()
            if not sa.pair_present.any():  # the victim is down: all of a's keys miss
                assert (sa.pair_tier == Tier.NONE).all() and not sa.agg_present.any()
                assert sa.missing.all()
                saw_down = True
                downs += 1
            else:  # up again (or not yet down): everything hits
                assert_same_slots(sa, before)
                saw_back = saw_down
        log.info("crash: %d rounds, %d with the shard down, worst lookup %.3f s", rounds, downs,
                 worst)
        assert saw_down, "the crashed shard never read as misses"
        assert saw_back, "the restarted shard never served its snapshot"
        assert worst <= cfg.deadline_ms / 1000 + MARGIN_S, f"a lookup took {worst:.3f} s"

        group.wait_ready()
        m = group.metrics()["shards"][victim]
        assert m["restarted"] and m["restored_entries"] == snaps[victim]["rows"]
        s = group.lookup(late_user, np.array([ITEMS + 5]), NOW, V, None, None, ecfg)
        assert not s.pair_present.any(), "a write after the last snapshot cannot survive a crash"
        assert group.metrics()["client"]["failed"][victim] + \
            group.metrics()["client"]["late"][victim] > 0
    finally:
        group.shutdown()


def test_a_restarted_shard_refuses_a_time_beyond_the_skew_as_before(ray_local, tmp_path: Path):
    """The replay profile: a shard's reference is the latest event time it has seen, and a
    shard restored from its snapshot keeps it, so a far-future write is refused after a crash
    as before it (``solaris/clock.py``)."""
    from solaris.clock import EventClock

    cfg = cache_cfg(tmp_path, num_shards=1)
    group = CacheGroup.create(cfg, clock=EventClock(300.0))
    one = (np.array([1]), np.array([2]), np.ones((1, DIM), np.float32), V)
    try:
        group.wait_ready()
        assert group.put(*one, NOW) == 1
        assert group.put(*one, NOW + 1e9) == 0  # refused: the shard's part is lost, logged
        group.snapshot_now()
        group.shards[0].crash.remote()
        # the crash is asynchronous: the shard may still answer before it goes down, so wait
        # (bounded) until the restarted one answers
        deadline, m = time.monotonic() + 60, {}
        while time.monotonic() < deadline and not m.get("restarted"):
            try:
                group.wait_ready(timeout_s=5)
                m = group.metrics()["shards"][0]
            except Exception:
                pass
            if not m.get("restarted"):
                time.sleep(0.5)
        assert m["restarted"] and m["entries"] == 1 and m["latest_event_s"] == NOW
        assert group.put(*one, NOW + 1e9) == 0  # refused again, by the restored reference
        m = group.metrics()["shards"][0]
        assert m["clock_refused"] == 1 and m["entries"] == 1
        assert group.put(*one, NOW + 200) == 1  # a step within the skew goes on
    finally:
        group.shutdown()


def test_slow_shard_reads_as_misses_within_deadline(ray_local, tmp_path: Path):
    cfg = cache_cfg(tmp_path, deadline_ms=50.0, snapshot_uri=None)
    w = world(seed=3)
    group = CacheGroup.create(cfg)
    try:
        group.wait_ready()
        fill(group.put, w)
        a, b, victim = two_users_on_two_shards(group)
        ca, cb = own_pairs(w, a), own_pairs(w, b)
        ecfg = EnrichConfig()
        stall = group.shards[victim].stall.remote(1.5)
        time.sleep(0.1)  # let the stall take the lock first
        t0 = time.monotonic()
        sa = group.lookup(a, ca, NOW, V, None, None, ecfg)
        took = time.monotonic() - t0
        sb = group.lookup(b, cb, NOW, V, None, None, ecfg)
        assert took <= cfg.deadline_ms / 1000 + MARGIN_S
        assert not sa.pair_present.any() and not sa.agg_present.any()
        assert (sb.pair_tier == Tier.PAIR).all()
        t0 = time.monotonic()  # the awaited round keeps the same deadline
        sa = asyncio.run(group.lookup_async(a, ca, NOW, V, None, None, ecfg))
        assert time.monotonic() - t0 <= cfg.deadline_ms / 1000 + MARGIN_S
        assert not sa.pair_present.any()
        ray.get(stall)
        assert group.metrics()["client"]["late"][victim] == 2
        # a group that travelled through the object store (an actor's argument) counts too
        copy = ray.get(ray.put(group))
        stall = group.shards[victim].stall.remote(1.0)
        time.sleep(0.1)
        assert not copy.lookup(a, ca, NOW, V, None, None, ecfg).pair_present.any()
        assert copy.metrics()["client"]["late"][victim] == 3
        ray.get(stall)
        sa = group.lookup(a, ca, NOW, V, None, None, ecfg)
        assert (sa.pair_tier == Tier.PAIR).all()
    finally:
        group.shutdown()


def test_idle_shard_expires_by_event_clock_and_snapshots_periodically(ray_local, tmp_path: Path):
    import functools

    import pyarrow.parquet as pq

    cfg = cache_cfg(tmp_path, num_shards=1, snapshot_every_s=0.2)
    later = NOW + cfg.retention_s + 2 * cfg.bucket_s  # past retention for anything written NOW
    group = CacheGroup.create(cfg, event_clock=functools.partial(float, later))
    try:
        group.wait_ready()
        n = group.put(np.arange(10), np.arange(10), np.ones((10, DIM), np.float32), V, NOW)
        assert n in (0, 10)  # 0 if the first expiry tick ran before the put (dropped as old)
        _, path = snapshot_location(cfg.snapshot_uri, group.group_id, 0, 1)
        rows = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and rows != 0:
            time.sleep(0.1)
            m = group.metrics()["shards"][0]
            if m["entries"] == 0 and m["snapshots"] >= 1:  # moved into place whole: readable
                rows = pq.read_table(path).num_rows
        assert m["entries"] == 0 and m["expired"] + m["dropped_on_put"] == 10
        assert m["snapshots"] >= 1 and rows == 0, "no periodic snapshot of the expired store"
    finally:
        group.shutdown()


def test_request_path_pickles_nothing(ray_local, tmp_path: Path, monkeypatch):
    """Every call the router and the FM workers make to shards, queue and ledger carries a
    SOLARIS frame or plain scalars, and every answer comes back the same way: with Ray's
    pickle path patched to record what it is handed in this process (both directions),
    a session of writes, reads, picks, a lease and its ack records nothing."""
    from ray._private.serialization import SerializationContext

    from actors.ledger import LedgerActor
    from actors.queue import PrecomputeQueueActor, QueueClient
    from solaris import wire
    from solaris.config import QueueConfig

    cfg = cache_cfg(tmp_path, snapshot_uri=None)
    w = world()
    group = CacheGroup.create(cfg)
    queue = PrecomputeQueueActor.remote(QueueConfig())
    ledger = LedgerActor.remote()
    pickled: list[str] = []
    to_pickle5 = SerializationContext._serialize_to_pickle5
    from_pickle5 = SerializationContext._deserialize_pickle5_data

    def record_out(self, metadata, value):
        pickled.append(f"sent {[type(v).__name__ for v in value]}")
        return to_pickle5(self, metadata, value)

    def record_in(self, *args, **kw):
        obj = from_pickle5(self, *args, **kw)
        pickled.append(f"received {type(obj).__name__}")
        return obj

    try:
        group.wait_ready()
        ray.get([queue.metrics.remote(), ledger.report.remote()])  # started before the watch
        monkeypatch.setattr(SerializationContext, "_serialize_to_pickle5", record_out)
        monkeypatch.setattr(SerializationContext, "_deserialize_pickle5_data", record_in)
        fill(group.put, w)  # the FM workers' writes
        ecfg = EnrichConfig(user_knn_probe=5, item_knn_probe=4)
        slots = group.lookup(3, np.arange(40), NOW, V, w["user_knn"], w["item_knn"], ecfg)
        asyncio.run(group.lookup_async(4, np.arange(40), NOW, V, w["user_knn"], w["item_knn"],
                                       ecfg))
        group.history.record_impressions_many([(3, np.arange(5), 1, NOW), (7, np.arange(3), 0, NOW)])
        group.history.record_impressions(4, np.arange(2), np.array([1, 2]), NOW)
        group.history.record_labels(3, np.arange(2), np.array([[1, 0], [0, 1]]), NOW + 1)
        assert group.flush_records(timeout_s=30.0) == 0  # every write landed
        window = group.history.window(np.array([3, 7]), np.array([NOW + 2, NOW + 2]), 8)
        assert window["valid"].sum(1).tolist() == [5, 3]
        users = np.repeat(np.array([3, 7]), 2)
        new = ray.get(queue.put_frame.remote(wire.encode("picks", (
            users, np.array([50, 51, 52, 53]), np.array([0.9, 0.8, 0.7, 0.6]),
            np.full(4, NOW), np.zeros(4, np.int64), V))))
        assert new == 4
        lease = QueueClient.lease_of(ray.get(queue.lease_frame.remote(10, V)))
        assert lease.num_pairs == 4
        ray.get(ledger.evaluated_frame.remote(wire.encode("evaluated", (
            users, np.array([50, 51, 52, 53]), 0.01))))
        assert ray.get(queue.ack.remote(lease.lease_id)) is True
        monkeypatch.undo()
        assert slots.pair_present.any()
        assert pickled == [], f"pickled on the request path: {pickled}"
        writes = group.metrics()["client"]["history_writes"]
        batch_calls = len(set(group.shard_of(np.array([3, 7])).tolist()))  # one per shard
        assert (writes["sent"], writes["failed"]) == (batch_calls + 2, 0)

    finally:  # the patch is undone by the fixture as well, should an assertion fail first
        ray.kill(queue)
        ray.kill(ledger)
        group.shutdown()


def test_an_awaited_round_sorts_each_ref_into_values_late_or_failed(ray_local):
    """``collect_async`` (one future per round): values in time, a raising call and a dead
    actor as failed, a call past the deadline as late; a late answer arriving after the
    round is over is dropped."""
    from ray.exceptions import ActorDiedError, RayError, RayTaskError

    from actors.cache import collect_async

    @ray.remote(num_cpus=0)
    class Echo:
        def ok(self, x):
            return x

        def bad(self):
            raise ValueError("boom")

        def slow(self):
            time.sleep(3.0)
            return b"late"

    a, b, c = Echo.remote(), Echo.remote(), Echo.remote()
    ray.get([a.ok.remote(0), b.ok.remote(0), c.ok.remote(0)])
    ray.kill(c)
    time.sleep(0.5)

    async def rounds():
        whole = await collect_async({0: a.ok.remote(b"x"), 1: b.ok.remote(b"y")},
                                    time.monotonic() + 5)
        mixed = await collect_async({0: a.ok.remote(b"x"), 1: b.bad.remote(),
                                     2: c.ok.remote(b"z")}, time.monotonic() + 5)
        late = await collect_async({0: a.ok.remote(b"x"), 1: b.slow.remote()},
                                   time.monotonic() + 1.0)
        return whole, mixed, late

    whole, mixed, late = asyncio.run(rounds())
    assert whole == ({0: b"x", 1: b"y"}, [], {})
    got, lt, failed = mixed
    assert got == {0: b"x"} and lt == [] and set(failed) == {1, 2}
    assert isinstance(failed[1], RayTaskError) and isinstance(failed[2], ActorDiedError)
    assert all(isinstance(e, RayError) for e in failed.values())
    assert late == ({0: b"x"}, [1], {})
    assert asyncio.run(collect_async({}, time.monotonic() + 1)) == ({}, [], {})
