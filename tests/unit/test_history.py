"""History store: online history equals the offline FeatureTables history; bounds; late labels."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.config import FeatureConfig, HistoryConfig, SyntheticConfig
from solaris.data.synthetic import generate
from solaris.errors import RequestError
from solaris.features import FeatureTables
from solaris.history import WINDOW_KEYS, HistoryStore, merge_windows, request_inputs
from solaris.models.api import REQUEST_KEYS

L = 8


@pytest.fixture(scope="module")
def tables() -> FeatureTables:
    ds = generate(SyntheticConfig(num_users=200, num_items=300, days=8.0,
                                  target_interactions=6000))
    return FeatureTables(ds, FeatureConfig(history_len=L))


def _online_batch(hs: HistoryStore, ft: FeatureTables, rows: np.ndarray) -> dict:
    return hs.batch(ft.user[rows], ft.ts[rows].astype(np.float64), ft.surface[rows], L,
                    ft.item_cat, ft.user_cat, ft.user_cont)


def _assert_equal(got: dict, ft: FeatureTables, rows: np.ndarray) -> None:
    want = ft.batch(rows)
    assert set(got) == set(REQUEST_KEYS)
    for k in REQUEST_KEYS:
        w = want[k].numpy()
        assert got[k].dtype == w.dtype, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)


def _feed(hs: HistoryStore, ft: FeatureTables, rows: np.ndarray, label_ts: bool) -> None:
    """Impressions of ``rows`` (one timestamp), then their labels, user by user."""
    for u in np.unique(ft.user[rows]).tolist():
        r = rows[ft.user[rows] == u]
        now = float(ft.ts[r[0]])
        hs.record_impressions(u, ft.item[r], ft.surface[r], now)
        hs.record_labels(u, ft.item[r], ft.labels[r], now + 1.0,
                         ts=ft.ts[r].astype(np.float64) if label_ts else None)


@pytest.mark.parametrize("label_ts", [True, False])
def test_online_history_equals_offline_feature_tables(tables, label_ts):
    """Fed in event order (each request's history read before its own events arrive), the
    store gives exactly FeatureTables' request-side keys for every row."""
    ft = tables
    hs = HistoryStore(HistoryConfig(max_events=16, max_users=1000))
    bounds = np.flatnonzero(np.r_[True, ft.ts[1:] != ft.ts[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows = np.arange(lo, hi)
        _assert_equal(_online_batch(hs, ft, rows), ft, rows)
        _feed(hs, ft, rows, label_ts)
    assert hs.counters["labels_appended"] == 0
    assert hs.counters["labels_matched"] == ft.num_rows


def test_history_reads_only_events_strictly_before_now(tables):
    """Every event fed first (future ones included): ``now`` alone cuts the history."""
    ft = tables
    per_user = int(np.bincount(ft.user).max())
    hs = HistoryStore(HistoryConfig(max_events=per_user, max_users=1000))
    bounds = np.flatnonzero(np.r_[True, ft.ts[1:] != ft.ts[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        _feed(hs, ft, np.arange(lo, hi), label_ts=True)
    rows = np.arange(ft.num_rows)
    _assert_equal(_online_batch(hs, ft, rows), ft, rows)


def test_replaying_a_log_gives_the_offline_history(tables):
    """``replay_log`` (how workers and benchmarks fill a store from a logged dataset) ends in
    the same state as feeding it request by request."""
    ft = tables
    per_user = int(np.bincount(ft.user).max())
    hs = HistoryStore(HistoryConfig(max_events=per_user, max_users=1000))
    hs.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    rows = np.arange(ft.num_rows)
    _assert_equal(_online_batch(hs, ft, rows), ft, rows)
    assert hs.counters["labels_matched"] == ft.num_rows


def test_replaying_a_log_twice_or_in_overlapping_parts_adds_nothing_twice(tables):
    """Seeding is idempotent: the whole log again, or a resumed run re-sending a part, leaves
    every window as one replay left it (``seed_present`` counts the skipped events)."""
    ft = tables
    per_user = int(np.bincount(ft.user).max())
    once = HistoryStore(HistoryConfig(max_events=per_user, max_users=1000))
    once.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    again = HistoryStore(HistoryConfig(max_events=per_user, max_users=1000))
    half = ft.num_rows // 2
    again.replay_log(*(a[:half + 100] for a in (ft.user, ft.item, ft.surface, ft.labels,
                                                  ft.ts)))
    again.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    assert again.counters["seed_present"] == half + 100
    assert again.counters["impressions"] == once.counters["impressions"] == ft.num_rows
    users, now = np.unique(ft.user), np.full(len(np.unique(ft.user)), 1e12)
    a, b = once.window(users, now, per_user), again.window(users, now, per_user)
    for k in WINDOW_KEYS:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_history_items_the_fm_lacks_are_left_out_of_its_inputs(tables):
    """An item with no row in the FM's tables (a provisional code: never seen in training)
    in a user's window is dropped and the rest move up: the inputs equal those of the window
    without it, instead of the request failing."""
    ft = tables
    hs = HistoryStore(HistoryConfig(max_events=16, max_users=10))
    hs.record_impressions(7, np.array([3, 5]), 0, 100.0)
    plain = hs.batch(np.array([7]), np.array([300.0]), np.array([0]), L, ft.item_cat,
                     ft.user_cat, ft.user_cont)
    hs.record_impressions(7, np.array([2**61 + 5]), 1, 150.0)  # unknown to the FM
    hs.record_impressions(7, np.array([4]), 0, 200.0)
    got = hs.batch(np.array([7]), np.array([300.0]), np.array([0]), L, ft.item_cat,
                   ft.user_cat, ft.user_cont)
    ref = HistoryStore(HistoryConfig(max_events=16, max_users=10))
    ref.record_impressions(7, np.array([3, 5]), 0, 100.0)
    ref.record_impressions(7, np.array([4]), 0, 200.0)
    want = ref.batch(np.array([7]), np.array([300.0]), np.array([0]), L, ft.item_cat,
                     ft.user_cat, ft.user_cont)
    for k in REQUEST_KEYS:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert int((got["hist_item"] > 0).sum()) == 3 == int((plain["hist_item"] > 0).sum()) + 1


def test_windows_split_by_shard_merge_into_the_whole_batch(tables):
    """What a cache shard returns (``window``, raw events) merged across shards and turned
    into inputs by the worker (``request_inputs``) equals the store's own ``batch``."""
    ft = tables
    hs = HistoryStore(HistoryConfig(max_events=12, max_users=1000))
    hs.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    rows = np.random.default_rng(0).choice(ft.num_rows, 300, replace=False)
    users, now = ft.user[rows], ft.ts[rows].astype(np.float64)
    shard = users % 3  # any placement: rows of one "shard" each
    parts = [(np.flatnonzero(shard == s), hs.window(users[shard == s], now[shard == s], L))
             for s in range(3)]
    win = merge_windows(parts, len(rows), L)
    assert set(win) == set(WINDOW_KEYS) and win["item"].shape == (len(rows), L)
    got = request_inputs(win, users, now, ft.surface[rows], ft.item_cat, ft.user_cat,
                         ft.user_cont)
    want = _online_batch(hs, ft, rows)
    for k in REQUEST_KEYS:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert not win["valid"][users == 10_000].any()
    unknown = hs.window(np.array([10_000]), np.array([1e12]), L)  # never seen: empty
    assert not unknown["valid"].any() and not unknown["item"].any()


def test_ring_keeps_the_newest_events_per_user():
    hs = HistoryStore(HistoryConfig(max_events=4, max_users=10))
    hs.record_impressions(0, np.arange(3), 0, now=10.0)
    hs.record_impressions(0, np.arange(3, 10), 1, now=20.0)  # more than the ring at once
    assert hs.events(0) == 4
    b = hs.batch(np.array([0]), np.array([100.0]), np.array([0]), 6, np.zeros((10, 1), int),
                 np.zeros((1, 0), int), np.zeros((1, 0), np.float32))
    assert b["hist_item"][0].tolist() == [10, 9, 8, 7, 0, 0]  # most recent arrival first
    assert b["hist_surface"][0].tolist() == [2, 2, 2, 2, 0, 0]
    assert b["hist_action"][0].tolist() == [1, 1, 1, 1, 0, 0]  # labels unknown: all zero
    assert hs.counters["overwritten"] == 6


def test_user_bound_evicts_least_recently_active():
    hs = HistoryStore(HistoryConfig(max_events=2, max_users=4, evict_share=0.25))
    for u, t in [(0, 50.0), (1, 10.0), (2, 30.0), (3, 40.0)]:
        hs.record_impressions(u, np.array([u]), 0, now=t)
    hs.record_labels(1, np.array([1]), np.array([[1.0]]), now=60.0)  # user 1 active again
    hs.record_impressions(4, np.array([4]), 0, now=70.0)
    m = hs.metrics()
    assert m["users"] == 4 and m["users_evicted"] == 1
    assert hs.events(2) == 0  # least recently active at t=30
    assert all(hs.events(u) for u in (0, 1, 3, 4))
    for u in range(5, 40):
        hs.record_impressions(u, np.array([0]), 0, now=100.0 + u)
        assert hs.metrics()["users"] <= 4
    assert hs.metrics()["slots"] <= 4


def _one(hs: HistoryStore, now: float, length: int = 4) -> dict:
    return hs.batch(np.array([0]), np.array([now]), np.array([0]), length,
                    np.arange(20).reshape(20, 1) % 3, np.zeros((1, 1), int),
                    np.zeros((1, 1), np.float32))


def test_late_labels_update_the_matching_impression():
    hs = HistoryStore(HistoryConfig(max_events=8, max_users=4))
    hs.record_impressions(0, np.array([5, 6]), 1, now=100.0)
    assert _one(hs, 200.0)["hist_action"][0].tolist() == [1, 1, 0, 0]
    hs.record_labels(0, np.array([6]), np.array([[1.0, 0.0]]), now=300.0)  # a click
    assert _one(hs, 200.0)["hist_action"][0].tolist() == [2, 1, 0, 0]  # 6 arrived after 5
    hs.record_labels(0, np.array([6]), np.array([[0.0, 1.0]]), now=400.0)  # later conversion
    assert _one(hs, 500.0)["hist_action"][0].tolist() == [1 + 0b11, 1, 0, 0]  # OR-ed
    assert hs.counters["labels_matched"] == 2 and hs.counters["labels_appended"] == 0


def test_label_without_impression_is_appended_as_an_event():
    hs = HistoryStore(HistoryConfig(max_events=8, max_users=4))
    hs.record_impressions(0, np.array([5]), 1, now=100.0)
    hs.record_labels(0, np.array([9]), np.array([[1.0]]), now=300.0, ts=np.array([150.0]))
    b = _one(hs, 400.0)
    assert b["hist_item"][0].tolist() == [10, 6, 0, 0]
    assert b["hist_action"][0].tolist() == [2, 1, 0, 0]
    assert b["hist_surface"][0].tolist() == [0, 2, 0, 0]  # surface unknown -> 0
    assert b["hist_item_cat"][0, :, 0].tolist() == [9 % 3 + 1, 5 % 3 + 1, 0, 0]
    np.testing.assert_allclose(b["hist_age"][0, :2], np.log1p([250 / 3600, 300 / 3600]),
                               rtol=1e-6)
    assert _one(hs, 150.0)["hist_item"][0].tolist() == [6, 0, 0, 0]  # strictly before now
    assert hs.counters["labels_appended"] == 1


def test_snapshot_restore_answers_identically(tables):
    ft = tables
    hs = HistoryStore(HistoryConfig(max_events=6, max_users=50, evict_share=0.1))
    rows = np.arange(2000)
    bounds = np.flatnonzero(np.r_[True, ft.ts[1:2000] != ft.ts[:1999], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        _feed(hs, ft, rows[lo:hi], label_ts=True)
    table = hs.snapshot()
    back = HistoryStore(hs.cfg)
    back.restore(table)
    assert back.metrics() == hs.metrics()
    q = np.arange(ft.num_rows)
    a, b = _online_batch(hs, ft, q), _online_batch(back, ft, q)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # the ring continues where it stopped: new events overwrite the same oldest arrivals
    for store in (hs, back):
        store.record_impressions(int(ft.user[0]), np.array([1, 2, 3]), 0, now=1e9)
    a, b = _online_batch(hs, ft, q), _online_batch(back, ft, q)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_bad_inputs_name_the_value():
    hs = HistoryStore(HistoryConfig())
    with pytest.raises(RequestError, match="labels"):
        hs.record_labels(0, np.array([1, 2]), np.array([[1.0]]), now=1.0)
    with pytest.raises(RequestError, match="user=-1"):
        hs.record_impressions(-1, np.array([1]), 0, now=1.0)
    with pytest.raises(RequestError, match="now="):
        hs.record_impressions(0, np.array([1]), 0, now=float("nan"))
    hs.record_labels(0, np.array([1]), np.array([[1.0, 0.0]]), now=1.0)
    with pytest.raises(RequestError, match="3 tasks"):
        hs.record_labels(0, np.array([1]), np.array([[1.0, 0.0, 1.0]]), now=1.0)
    with pytest.raises(RequestError, match="users: id 7"):
        hs.batch(np.array([7]), np.array([2.0]), np.array([0]), 4, np.zeros((3, 1), int),
                 np.zeros((2, 1), int), np.zeros((2, 1), np.float32))


def test_config_errors_name_the_field():
    from solaris.config import ConfigError
    with pytest.raises(ConfigError, match="history.max_events=0"):
        HistoryConfig(max_events=0)
    with pytest.raises(ConfigError, match="history.evict_share=0.0"):
        HistoryConfig(evict_share=0.0)

