"""Event time cannot be bent by one call: each store (pairs, history, queue) refuses a time
too far ahead of its reference before it changes anything, never serves an entry from the
reader's future, and does not trust a snapshot written ahead of the clock. The clocks are
scripted (no wall time)."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.cache.query import ShardQuery
from solaris.cache.store import PairStore
from solaris.clock import ClockSkewError, EventClock, SkewGuard, event_clock, replay_skew
from solaris.config import CacheConfig, HistoryConfig, QueueConfig, ServeConfig
from solaris.errors import ConfigError
from solaris.history import HistoryStore
from solaris.precompute.pqueue import PrecomputeQueue

T0 = 1_800_000_000.0  # event time of the scripted clock
SKEW = 300.0
CFG = CacheConfig(dim=4, read_ttl_s=3600, retention_s=4 * 3600, bucket_s=900)


class Wall:
    """A scripted wall clock."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def vecs(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 10


def pairs_state(store: PairStore) -> tuple:
    ages = store.get(np.array([1, 1]), np.array([1, 2]), "v1", T0 + 10)[2].tolist()
    m = store.metrics()
    return m["entries"], m["expired"], store._max_now, store.guard.latest, ages


def test_the_guard_refuses_beyond_the_skew_and_names_the_time_and_limit():
    g = SkewGuard(EventClock(SKEW, Wall(T0)))
    g.check(T0 + SKEW)  # at the limit: accepted
    g.check(np.array([T0 - 10**9, T0]))  # far past: accepted (nothing expires by it)
    with pytest.raises(ClockSkewError, match=r"now=.*ahead of the wall clock.*max_skew_s=300"):
        g.check(T0 + SKEW + 1)
    assert g.refused == 1 and g.latest == T0 + SKEW
    replay = SkewGuard(EventClock(SKEW))  # the latest accepted is the reference
    replay.check(T0)
    replay.check(T0 + 200)
    replay.check(T0 + 450)  # each step within the skew
    with pytest.raises(ClockSkewError, match="latest event time accepted here"):
        replay.check(T0 + 450 + SKEW + 1)
    assert replay.latest == T0 + 450 and replay.metrics()["clock_refused"] == 1


def test_profiles_pick_the_reference():
    assert event_clock(ServeConfig()).wall is not None  # serving: the wall clock
    assert event_clock(ServeConfig(profile="cluster")).wall is not None
    assert event_clock(ServeConfig(profile="replay", max_skew_s=60)) == EventClock(60.0, None)
    with pytest.raises(ConfigError, match="serve.profile='debug'"):
        ServeConfig(profile="debug")
    with pytest.raises(ConfigError, match="serve.max_skew_s=0"):
        ServeConfig(max_skew_s=0)
    assert replay_skew(np.array([5.0, 0.0, 1000.0]), SKEW) == 1990.0  # twice the longest step
    assert replay_skew(np.array([0.0, 10.0]), SKEW) == SKEW
    # a store sees its own group: the steps within each, not between the groups' times
    times, groups = np.array([0.0, 400.0, 500.0, 1200.0]), np.array([0, 1, 0, 1])
    assert replay_skew(times, SKEW, groups) == 1600.0  # group 1: 400 -> 1200
    assert replay_skew(times, SKEW) == 1400.0  # all in one: 500 -> 1200


@pytest.mark.parametrize("wall", [True, False], ids=["serving", "replay"])
def test_a_far_future_write_or_read_changes_nothing_in_the_pair_store(wall):
    store = PairStore(CFG, EventClock(SKEW, Wall(T0 + 10) if wall else None))
    store.put(np.array([1, 1]), np.array([1, 2]), vecs(2), "v1", T0)
    before = pairs_state(store)
    future = T0 + 10**11  # the year 5138
    with pytest.raises(ClockSkewError):
        store.put(np.array([1]), np.array([3]), vecs(1), "v2", future)
    with pytest.raises(ClockSkewError):
        store.get(np.array([1]), np.array([1]), "v1", future)
    with pytest.raises(ClockSkewError):
        store.answer(ShardQuery(user=1, items=np.array([1, 2]), version="v1", now=future))
    with pytest.raises(ClockSkewError):
        store.expire(future)
    assert pairs_state(store) == before  # nothing expired, nothing written, no new version
    assert store.version_id("v2") == 0
    assert store.metrics()["clock_refused"] == 4


def test_an_entry_written_after_the_read_time_is_never_served():
    store = PairStore(CFG)
    store.put(np.array([1]), np.array([1]), vecs(1), "v1", T0 + 100)
    found, _, age = store.get(np.array([1, 1]), np.array([1, 1]), "v1", T0)
    assert not found.any() and (age == 0).all()  # 100 s in the reader's future
    a = store.answer(ShardQuery(user=1, items=np.array([1]), version="v1", now=T0))
    assert not a.own_fresh.any()
    found, _, age = store.get(np.array([1]), np.array([1]), "v1", T0 + 100)
    assert found[0] and age[0] == 0.0  # from its own time on, it is served


def test_a_restored_pair_store_refuses_what_the_first_refused():
    store = PairStore(CFG, EventClock(SKEW))  # the replay profile
    store.put(np.array([1]), np.array([1]), vecs(1), "v1", T0)
    again = PairStore.restore(CFG, store.snapshot(), EventClock(SKEW))
    with pytest.raises(ClockSkewError):
        again.put(np.array([1]), np.array([2]), vecs(1), "v1", T0 + SKEW + 1)
    assert again.live == 1


def test_a_snapshot_from_the_future_is_not_trusted_for_expiry():
    """Written by a store whose clock ran ahead: restored on a machine with a right clock,
    its time does not expire anything, its entries after the clock are dropped, the rest
    serve."""
    ahead = PairStore(CFG)  # no guard: what a clock an hour ahead could have written
    ahead.put(np.array([1]), np.array([1]), vecs(1), "v1", T0)
    ahead.put(np.array([1]), np.array([2]), vecs(1), "v1", T0 + 3600)
    store = PairStore.restore(CFG, ahead.snapshot(), EventClock(SKEW, Wall(T0 + 60)))
    m = store.metrics()
    assert m["clock_untrusted_snapshots"] == 1 and m["dropped_on_restore"] == 1
    assert store.live == 1 and store._max_now == T0 + 60
    found, _, age = store.get(np.array([1]), np.array([1]), "v1", T0 + 60)
    assert found[0] and age[0] == 60.0
    trusted = PairStore.restore(CFG, ahead.snapshot(), EventClock(SKEW, Wall(T0 + 3600)))
    assert trusted.live == 2 and trusted.metrics()["clock_untrusted_snapshots"] == 0


def history_state(h: HistoryStore) -> tuple:
    w = h.window(np.array([1, 2]), np.array([T0 + 50, T0 + 50]), 8)
    return h.metrics()["events"], h._active.tolist(), {k: v.tolist() for k, v in w.items()}


@pytest.mark.parametrize("wall", [True, False], ids=["serving", "replay"])
def test_the_history_refuses_a_far_future_write_whole(wall):
    h = HistoryStore(HistoryConfig(), EventClock(SKEW, Wall(T0 + 10) if wall else None))
    h.record_impressions(1, np.array([5, 6]), 0, T0)
    h.record_labels(1, np.array([5]), np.array([[1, 0]]), T0 + 1)
    before = history_state(h)
    future = T0 + 10**11
    with pytest.raises(ClockSkewError):
        h.record_impressions(2, np.array([7]), 0, future)
    with pytest.raises(ClockSkewError, match="now="):
        h.record_labels(1, np.array([6]), np.array([[1, 1]]), future)
    with pytest.raises(ClockSkewError, match="ts="):
        h.record_labels(1, np.array([6]), np.array([[1, 1]]), T0 + 2, ts=np.array([future]))
    with pytest.raises(ClockSkewError, match="ts="):
        h.replay_log(np.array([2, 2]), np.array([1, 2]), np.array([0, 0]),
                     np.zeros((2, 2)), np.array([T0, future]))
    assert history_state(h) == before  # not one event, label or activity time changed
    assert h.metrics()["clock_refused"] == 4


def test_a_history_snapshot_from_the_future_drops_its_future():
    ahead = HistoryStore(HistoryConfig())
    ahead.record_impressions(1, np.array([5]), 0, T0)
    ahead.record_impressions(2, np.array([6]), 0, T0 + 10 * 86400)
    h = HistoryStore(HistoryConfig(), EventClock(SKEW, Wall(T0 + 60)))
    h.restore(ahead.snapshot())
    assert h.events(1) == 1 and h.events(2) == 0
    assert h._active.max() <= T0 + 60 and h.metrics()["clock_untrusted_snapshots"] == 1
    replay = HistoryStore(HistoryConfig(), EventClock(SKEW))  # the replay profile
    replay.restore(ahead.snapshot())
    with pytest.raises(ClockSkewError):  # the restored latest time is its reference
        replay.record_impressions(1, np.array([5]), 0, T0 + 10 * 86400 + SKEW + 1)


def test_the_queue_refuses_a_batch_with_a_far_future_request():
    q = PrecomputeQueue(QueueConfig(), clock=Wall(0.0), event_clock=EventClock(SKEW, Wall(T0)))
    q.put(np.array([1, 2]), np.array([1, 2]), np.array([0.5, 0.4]), T0, 0, "v1")
    before = q.metrics()["depth"]
    with pytest.raises(ClockSkewError):
        q.put(np.array([3, 4]), np.array([1, 2]), np.array([0.5, 0.4]),
              np.array([T0, T0 + 10**11]), 0, "v1")
    assert q.metrics()["depth"] == before and q.metrics()["clock_refused"] == 1
    again = PrecomputeQueue(QueueConfig(), clock=Wall(0.0), event_clock=EventClock(SKEW))
    again.restore(q.snapshot())  # the replay profile: the snapshot's latest is the reference
    with pytest.raises(ClockSkewError):
        again.put(np.array([5]), np.array([1]), np.array([0.5]), T0 + SKEW + 1, 0, "v1")
    ahead = PrecomputeQueue(QueueConfig(), clock=Wall(0.0))
    ahead.put(np.array([1, 2]), np.array([1, 2]), np.array([0.5, 0.4]),
              np.array([T0, T0 + 86400]), 0, "v1")
    fresh = PrecomputeQueue(QueueConfig(), clock=Wall(0.0), event_clock=EventClock(SKEW, Wall(T0)))
    assert fresh.restore(ahead.snapshot()) == 1  # the pair of the future request is dropped
