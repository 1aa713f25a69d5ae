"""Precompute queue: bound, drops by priority, merges, grouped leases, timeouts, snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.config import QueueConfig
from solaris.errors import RequestError
from solaris.precompute.pqueue import PrecomputeQueue

V = "fm-v1"


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_queue(capacity: int = 100, timeout: float = 10.0, lease_pairs: int = 16
               ) -> tuple[PrecomputeQueue, FakeClock]:
    clock = FakeClock()
    cfg = QueueConfig(capacity=capacity, lease_timeout_s=timeout, lease_pairs=lease_pairs)
    return PrecomputeQueue(cfg, clock), clock


def put(q: PrecomputeQueue, user: int, items, prios, now: float = 0.0, surface: int = 0,
        version: str = V) -> int:
    items = np.asarray(items, np.int64)
    return q.put(np.full(len(items), user), items, np.asarray(prios, float), now, surface,
                 version)


def _pairs(q: PrecomputeQueue) -> set:
    t = q.snapshot()
    return set(zip(t.column("user").to_pylist(), t.column("item").to_pylist(),
                   t.column("version").to_pylist()))


op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.lists(st.integers(0, 30), max_size=25),
              st.floats(0, 1), st.integers(0, 3)),
    st.tuples(st.just("lease"), st.integers(1, 20)),
    st.tuples(st.just("ack"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.floats(0, 8)),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=40), capacity=st.integers(1, 40))
def test_bound_and_conservation_always_hold(ops, capacity):
    q, clock = make_queue(capacity=capacity, timeout=10.0)
    leases: list[str] = []
    for o in ops:
        if o[0] == "put":
            _, user, items, base, t = o
            prios = base + np.arange(len(items)) / 100.0
            put(q, user, items, prios, now=float(t))
        elif o[0] == "lease":
            ls = q.lease(o[1])
            if ls is not None:
                leases.append(ls.lease_id)
                assert ls.num_pairs <= o[1] or len(ls.groups) == 1
        elif o[0] == "ack" and leases:
            q.ack(leases.pop(o[1] % len(leases)))
        elif o[0] == "tick":
            clock.t += o[1]
        m = q.metrics()
        assert m["depth"] + m["leased"] <= capacity
        # every accepted pair is pending, leased, dropped or acked (exactly one of them)
        assert m["accepted"] == m["depth"] + m["leased"] + m["dropped"] + m["acked_pairs"]
        assert m["put"] == m["accepted"] + m["merged"]


def test_flood_far_above_the_bound_drops_lowest_priority_first():
    q, _ = make_queue(capacity=100)
    rng = np.random.default_rng(0)
    prios = rng.permutation(10_000) / 10_000.0
    assert q.lease(10) is None  # nothing yet
    for b in range(200):  # 200 requests of 50 pairs each
        sl = slice(50 * b, 50 * (b + 1))
        put(q, b, np.arange(50), prios[sl], now=float(b))
        assert q.metrics()["depth"] <= 100
    m = q.metrics()
    assert m["depth"] == 100 and m["dropped"] == 9_900
    t = q.snapshot()
    kept = np.sort(t.column("priority").to_numpy())
    np.testing.assert_array_equal(kept, np.sort(prios)[-100:])


def test_flood_keeps_leased_work_and_the_bound():
    q, _ = make_queue(capacity=20)
    put(q, 0, np.arange(8), np.full(8, 0.01), now=1.0)
    ls = q.lease(8)
    assert ls.num_pairs == 8
    put(q, 1, np.arange(100), np.linspace(0.5, 1.0, 100), now=2.0)
    m = q.metrics()
    assert m["leased"] == 8 and m["depth"] == 12 and m["dropped"] == 88
    assert min(t for t in q.snapshot().column("priority").to_pylist() if t > 0.1) >= \
        np.linspace(0.5, 1.0, 100)[88]
    assert q.ack(ls.lease_id)


def test_identical_pairs_merge_keeping_the_max_priority_and_the_earlier_request():
    q, _ = make_queue()
    assert put(q, 7, [1, 2], [0.3, 0.9], now=100.0) == 2
    assert put(q, 7, [1], [0.7], now=200.0, surface=1) == 0  # later request: stays at 100
    assert put(q, 7, [1, 1], [0.1, 0.2], now=150.0) == 0  # later too: stays at 100
    assert put(q, 7, [1], [0.5], now=100.0, version="fm-v2") == 1  # other version: distinct
    m = q.metrics()
    assert m["depth"] == 3 and m["merged"] == 3 and m["accepted"] == 3
    ls = q.lease(10, version=V)
    got = {(g.now, g.surface): dict(zip(g.items.tolist(), g.priorities.tolist()))
           for g in ls.groups}
    assert got == {(100.0, 0): {2: 0.9, 1: 0.7}}
    # a pair in flight is not queued again
    assert put(q, 7, [2], [0.99], now=300.0) == 0
    assert q.contains(np.array([7, 7, 7]), np.array([2, 1, 3]), V).tolist() == [True, True, False]
    assert q.metrics()["depth"] == 1  # only the fm-v2 pair


def test_a_merged_pair_lands_in_the_same_group_whatever_order_the_puts_came_in():
    """A router's concurrent requests flush in the order they finish: the request that owns
    a pair bet on by several is chosen by event time (the earliest), not by arrival."""
    import itertools

    for order in itertools.permutations([100.0, 200.0, 300.0]):
        q, _ = make_queue()
        for t in order:
            put(q, 7, [1], [t / 1000], now=t)
        (g,) = q.lease(10, version=V).groups
        assert (g.now, g.items.tolist(), g.priorities.tolist()) == (100.0, [1], [0.3]), order


def test_lease_returns_whole_request_groups_best_first():
    q, _ = make_queue()
    put(q, 1, [10, 11, 12], [0.2, 0.5, 0.1], now=1.0)
    put(q, 2, [20, 21, 22, 23], [0.9, 0.3, 0.3, 0.3], now=2.0)
    put(q, 3, np.arange(30, 50), np.full(20, 0.4), now=3.0)
    a = q.lease(6)
    assert [g.user for g in a.groups] == [2]  # 4 pairs; the next group (20) does not fit
    assert a.groups[0].items.tolist() == [20, 21, 22, 23]  # priority, then item id
    b = q.lease(6)
    assert [g.user for g in b.groups] == [1] and b.groups[0].items.tolist() == [11, 10, 12]
    c = q.lease(6)
    assert [g.user for g in c.groups] == [3] and c.num_pairs == 20  # never split a group
    assert q.lease(6) is None


def test_unacked_lease_returns_after_the_timeout_on_a_fake_clock():
    q, clock = make_queue(timeout=10.0)
    put(q, 1, [1, 2, 3], [0.5, 0.6, 0.7], now=5.0)
    first = q.lease(10)
    clock.t = 9.99
    assert q.lease(10) is None and q.metrics()["leased"] == 3
    clock.t = 10.0
    m = q.metrics()
    assert m["expired_leases"] == 1 and m["expired_pairs"] == 3
    assert m["depth"] == 3 and m["leased"] == 0
    second = q.lease(10)
    assert second.groups[0].items.tolist() == [3, 2, 1] and second.groups[0].now == 5.0
    assert not q.ack(first.lease_id)  # late: its pairs were handed out again
    assert q.ack(second.lease_id)
    m = q.metrics()
    assert m["late_acks"] == 1 and m["acks"] == 1 and m["depth"] == 0 and m["leased"] == 0


def test_nack_returns_pairs_at_once():
    q, _ = make_queue()
    put(q, 1, [1, 2], [0.5, 0.6])
    ls = q.lease(10)
    assert q.nack(ls.lease_id) and not q.nack(ls.lease_id)
    assert q.metrics()["depth"] == 2


@settings(max_examples=30, deadline=None)
@given(n_put=st.integers(0, 60), n_lease=st.integers(0, 4), seed=st.integers(0, 1000))
def test_snapshot_restore_keeps_all_pending_and_leased_work(n_put, n_lease, seed):
    rng = np.random.default_rng(seed)
    q, _ = make_queue(capacity=50, lease_pairs=5)
    for r in range(0, n_put, 6):
        put(q, int(rng.integers(0, 8)), rng.integers(0, 40, 6), rng.random(6), now=float(r))
    for _ in range(n_lease):
        q.lease()
    before = _pairs(q)
    m = q.metrics()
    assert len(before) == m["depth"] + m["leased"]
    q2, _ = make_queue(capacity=50)
    q2.restore(q.snapshot())
    assert _pairs(q2) == before
    m2 = q2.metrics()
    assert m2["depth"] == len(before) and m2["leased"] == 0
    assert m2["dropped"] == m["dropped"] and m2["merged"] == m["merged"]
    got = []
    while (ls := q2.lease(7)) is not None:
        got += [(g.user, i, g.version) for g in ls.groups for i in g.items.tolist()]
    assert sorted(got) == sorted(before)


def test_bad_inputs_name_the_value():
    q, _ = make_queue()
    with pytest.raises(RequestError, match="priorities"):
        q.put(np.array([1]), np.array([1]), np.array([0.1, 0.2]), 0.0, 0, V)
    with pytest.raises(RequestError, match="negative id"):
        q.put(np.array([-1]), np.array([1]), np.array([0.1]), 0.0, 0, V)
    with pytest.raises(RequestError, match="version"):
        q.put(np.array([1]), np.array([1]), np.array([0.1]), 0.0, 0, "")
    with pytest.raises(RequestError, match="max_pairs=0"):
        q.lease(0)


def test_config_errors_name_the_field():
    from solaris.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="queue.capacity=0"):
        QueueConfig(capacity=0)
    with pytest.raises(ConfigError, match="queue.lease_timeout_s=-1"):
        load_config(None, {"queue.lease_timeout_s": -1})
    assert load_config(None, {"queue.capacity": 5}).queue.capacity == 5


def test_gate_leases_only_old_enough_groups_within_the_allowance() -> None:
    q, _ = make_queue(lease_pairs=100)
    put(q, 1, [10, 11, 12], [0.9, 0.8, 0.1], now=100.0)  # group A, best priority
    put(q, 2, [20, 21], [0.5, 0.4], now=100.0)  # group B
    put(q, 3, [30], [0.99], now=500.0)  # too recent for the gate below
    q.set_gate(until=200.0, allowance=4)
    assert q.metrics()["eligible"] == 4
    got = []
    while (lease := q.lease(max_pairs=2)) is not None:
        got += [(g.user, int(i)) for g in lease.groups for i in g.items]
        q.ack(lease.lease_id)
    # A whole (3 pairs), then the best pair of B; the allowance ends inside B
    assert got == [(1, 10), (1, 11), (1, 12), (2, 20)]
    m = q.metrics()
    assert m["eligible"] == 0 and m["depth"] == 2 and m["allowance"] == 0
    q.set_gate(until=600.0, allowance=None)  # later tick: the rest, best first
    lease = q.lease(max_pairs=10)
    assert [(g.user, g.items.tolist()) for g in lease.groups] == [(3, [30]), (2, [21])]
    with pytest.raises(RequestError, match="allowance"):
        q.set_gate(0.0, -1)


def test_gate_leases_carry_its_history_time_and_only_its_own() -> None:
    """``read_at``: every lease issued under the gate reads its groups' histories as of it
    (``schedule.history_at=visible``); a gate without it, or no gate, leaves each group at
    its own request time (None); a history time before the gate's cut-off is refused."""
    q, _ = make_queue(lease_pairs=1)
    put(q, 1, [10], [0.9], now=100.0)
    put(q, 2, [20], [0.8], now=150.0)
    put(q, 3, [30], [0.7], now=400.0)
    q.set_gate(until=200.0, allowance=None, read_at=260.0)
    assert q.metrics()["gate_read_at"] == 260.0
    leases = [q.lease(), q.lease()]
    assert [(le.groups[0].user, le.groups[0].now, le.read_at) for le in leases] == [
        (1, 100.0, 260.0), (2, 150.0, 260.0)]
    assert q.lease() is None  # user 3 is after the cut-off
    q.set_gate(until=500.0, allowance=None)
    assert q.lease().read_at is None
    for bad in (np.nan, np.inf):
        with pytest.raises(RequestError, match="read_at"):
            q.set_gate(500.0, None, read_at=bad)
    with pytest.raises(RequestError, match="read_at=499.0: before"):
        q.set_gate(500.0, None, read_at=499.0)
