"""Replay preparation: the window check, the seed history, the row map, the tick allowance."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pytest

from solaris.data.schema import Dataset, FeatureSpec, interaction_schema
from solaris.errors import DataError
from solaris.replay.prepare import check_trained_before, seed_history
from solaris.simulate.log import row_index



def _ds(users, items, ts) -> Dataset:
    n = len(users)
    inter = pa.table({"seq": np.arange(n), "user_id": np.asarray(users, np.int64),
                      "item_id": np.asarray(items, np.int64), "ts": np.asarray(ts, np.int64),
                      "surface": np.zeros(n, np.int32),
                      "click": (np.arange(n) % 2).astype(np.float32)},
                     schema=interaction_schema(("click",)))
    return Dataset("t", inter, pa.table({"user_id": np.arange(3), "raw_id": np.arange(3)}),
                   pa.table({"item_id": np.arange(9), "raw_id": np.arange(9)}), ("click",),
                   FeatureSpec())


def test_models_trained_inside_the_window_are_refused() -> None:
    m = {"periods": {"fm": {"ts_max": 10}, "vm": {"ts_max": 20}, "val": {"ts_max": 30}}}
    check_trained_before(m, 31)
    with pytest.raises(DataError, match="val period ends at ts=30"):
        check_trained_before(m, 30)


def test_seed_history_keeps_each_users_last_events_before_the_window() -> None:
    ds = _ds([0, 1, 0, 0, 1, 0], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 9])
    users, items, surfaces, labels, ts = seed_history(ds, start_ts=9, max_events=2)
    # user 0's last two before ts 9 are items 3 and 4; user 1 keeps both; event order kept
    assert list(zip(users.tolist(), items.tolist())) == [(1, 2), (0, 3), (0, 4), (1, 5)]
    assert ts.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert labels.shape == (4, 1)


def test_row_index_finds_the_row_of_a_labelled_pair_within_the_bucket() -> None:
    ds = _ds([0, 0, 1, 0], [5, 5, 5, 7], [10, 500, 20, 30])
    got = row_index(ds, np.array([0, 0, 1, 2]), np.array([5, 7, 5, 5]),
                    np.array([400, 25, 20, 20]), within_s=300)
    assert got.tolist() == [1, 3, 2, -1]  # (0,5) at 500 (<400+300), (0,7) at 30, unknown -1


def test_tick_allowance_spends_the_budget_exactly_over_ticks() -> None:
    from solaris.replay.schedule import tick_allowance

    got = [tick_allowance(90.0, 60.0, k) for k in range(40)]  # 1.5 per tick
    assert sum(got) == 60 and set(got) == {1, 2}
    assert tick_allowance(0.0, 60.0, 3) is None


def test_knn_due_rebuilds_as_of_the_last_boundary_a_request_reaches() -> None:
    from solaris.replay.schedule import knn_due

    start, every = 1000.0, 100.0
    nxt, got = start + every, []
    for t in (1050.0, 1099.0, 1100.0, 1150.0, 1199.9, 1450.0, 1460.0, 1500.0):
        if (as_of := knn_due(t, nxt, every)) is not None:
            got.append((t, as_of))
            nxt = as_of + every
    # on the boundary itself it is due; a gap of several periods rebuilds once, as of the
    # last boundary before the request (1200 and 1300 are skipped: no request read them)
    assert got == [(1100.0, 1100.0), (1450.0, 1400.0), (1500.0, 1500.0)]
    assert knn_due(5.0, float("inf"), every) is None  # rebuilds off
