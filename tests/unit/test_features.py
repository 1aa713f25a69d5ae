"""History and aggregate features: fast paths checked against slow exact loops."""

import numpy as np
import pytest

from solaris.data.requests import request_times
from solaris.errors import ConfigError
from solaris.features import aggregate_embeddings, history_index


def _events(n=400, users=7, items=15, seed=0):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 5 * 86400, n))
    ts[10:20] = ts[10]  # a block of equal timestamps: order is (ts, row)
    ts = np.sort(ts)
    return rng.integers(0, users, n), rng.integers(0, items, n), ts


@pytest.mark.parametrize("ties", [False, True])
def test_history_index_matches_loop(ties):
    users, _, ts = _events()
    L = 5
    h = history_index(users, ts, L, include_ties=ties)
    for r in range(len(users)):
        prev = [j for j in range(r - 1, -1, -1) if users[j] == users[r]
                and (ties or ts[j] < ts[r])][:L]
        expect = prev + [-1] * (L - len(prev))
        assert h[r].tolist() == expect


def test_history_never_reaches_the_future_nor_the_same_request():
    users, _, ts = _events(seed=3)
    h = history_index(users, ts, 8)
    rows = np.arange(len(users))[:, None]
    valid = h >= 0
    assert valid.any()
    assert (h[valid] < np.broadcast_to(rows, h.shape)[valid]).all()
    # rows sharing a timestamp (one request's candidates) never see each other's labels
    assert (ts[h[valid]] < np.broadcast_to(ts[:, None], h.shape)[valid]).all()


@pytest.mark.parametrize("window", [3600, 86400, 10 * 86400])
@pytest.mark.parametrize("ties", [False, True])
def test_aggregate_matches_loop_and_excludes_current_item(window, ties):
    users, items, ts = _events(seed=1)
    ts[40:60] = ts[40]  # another tie block inside users' windows
    ts = np.sort(ts)
    z = np.random.default_rng(2).normal(size=(len(users), 4)).astype(np.float32)
    agg, present = aggregate_embeddings(users, items, ts, z, window, include_ties=ties)
    for r in range(len(users)):
        js = [j for j in range(r) if users[j] == users[r] and items[j] != items[r]
              and ts[j] >= ts[r] - window and (ties or ts[j] < ts[r])]
        assert present[r] == bool(js)
        if js:
            np.testing.assert_allclose(agg[r], z[js].mean(0), rtol=1e-5, atol=1e-5)
        else:
            assert not agg[r].any()


def test_aggregate_ignores_the_rows_own_pair():
    # one user, the same item twice and one other item: the aggregate of the last row must
    # not contain either earlier row of its own item
    users = np.array([0, 0, 0])
    items = np.array([5, 6, 5])
    ts = np.array([0, 10, 20])
    z = np.array([[100.0], [1.0], [-100.0]], dtype=np.float32)
    agg, present = aggregate_embeddings(users, items, ts, z, 3600)
    assert present.tolist() == [False, True, True]
    assert agg[2, 0] == pytest.approx(1.0)
    assert agg[1, 0] == pytest.approx(100.0)


def _bucketed(seed=5, n=500, users=6, items=20):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 2 * 86400, n))  # dense: users rate several times per bucket
    return rng.integers(0, users, n), rng.integers(0, items, n), ts


def test_request_times_are_the_first_ts_of_a_users_bucket():
    users, _, ts = _bucketed()
    req = request_times(users, ts, 300)
    for r in range(len(ts)):
        same = (users == users[r]) & (ts // 300 == ts[r] // 300)
        assert req[r] == ts[same].min()
    np.testing.assert_array_equal(request_times(users, ts, 0), ts)  # 0: each row its own
    with pytest.raises(ConfigError, match="granularity_s=-1"):
        request_times(users, ts, -1)


def test_history_and_aggregate_as_of_the_request_match_loops():
    users, items, ts = _bucketed()
    req = request_times(users, ts, 300)
    L, window = 5, 3600
    h = history_index(users, ts, L, req_ts=req)
    z = np.random.default_rng(6).normal(size=(len(users), 4)).astype(np.float32)
    agg, present = aggregate_embeddings(users, items, ts, z, window, req_ts=req)
    for r in range(len(users)):
        prev = [j for j in range(r - 1, -1, -1) if users[j] == users[r] and ts[j] < req[r]][:L]
        assert h[r].tolist() == prev + [-1] * (L - len(prev))
        js = [j for j in range(r) if users[j] == users[r] and items[j] != items[r]
              and req[r] - window <= ts[j] < req[r]]
        assert present[r] == bool(js)
        if js:
            np.testing.assert_allclose(agg[r], z[js].mean(0), rtol=1e-5, atol=1e-5)
    # a request time equal to the row's own ts is the old definition, exactly
    np.testing.assert_array_equal(history_index(users, ts, L, req_ts=ts), history_index(users, ts, L))
