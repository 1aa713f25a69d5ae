"""Replay bounds: oracle effective coverage and the verifier's signal on returning pairs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.errors import ConfigError, DataError
from solaris.replay.bounds import effective_bounds, speculation_signal
from solaris.replay.coverage import coverage_ceiling
from tests.tiny import request_log

_log = request_log


W = dict(read_ttl_s=100.0, retention_s=1000.0, lag_s=10.0)


def test_own_history_within_retention_and_lag_counts_as_covered():
    lg = _log([(1, 0, [5, 6], [False, False]),     # unlabelled: only history
               (1, 5, [7, 8], None),              # 5 s later: inside the lag, not covered
               (1, 500, [9, 10], None),           # the user's requests at 0 and 5 count
               (1, 2000, [11, 12], None)])        # 1,500 s after the last: past retention
    got = effective_bounds(lg, {}, probes=(10,), **W)
    assert got["labelled_pairs"] == 6
    assert got["own_history_share"] == pytest.approx(2 / 6)
    assert got["effective_oracle"] == {"10": pytest.approx(2 / 6), "any_user": pytest.approx(2 / 6)}


def test_first_session_pairs_count_only_through_a_near_neighbour_that_had_the_item():
    lg = _log([(2, 0, [5, 6], [False, False]),    # user 2 saw items 5 and 6
               (3, 20, [7, 8], [False, False]),   # user 3 saw items 7 and 8
               (1, 50, [5, 7], None),             # user 1's first request: items 5, 7
               (4, 200, [6, 9], None)])           # user 4: item 6 at 200 s is past the TTL
    nbrs = {1: np.array([9, 3, 2]), 4: np.array([2])}
    got = effective_bounds(lg, nbrs, probes=(0, 1, 2, 3), **W)
    assert got["own_history_share"] == 0.0
    eo = got["effective_oracle"]
    assert eo["0"] == 0.0
    assert eo["1"] == 0.0            # neighbour 9 had nothing
    assert eo["2"] == pytest.approx(1 / 4)  # + neighbour 3 had item 7
    assert eo["3"] == pytest.approx(2 / 4)  # + neighbour 2 had item 5
    assert eo["any_user"] == pytest.approx(2 / 4)


def test_a_neighbour_inside_the_lag_or_at_the_same_time_does_not_count():
    lg = _log([(2, 45, [5], [False]), (3, 50, [5], None), (4, 50, [5], [False])])
    got = effective_bounds(lg, {3: np.array([2, 4])}, probes=(2,), **W)
    assert got["effective_oracle"]["2"] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_bounds_are_ordered_and_above_the_ceiling(seed):
    rng = np.random.default_rng(seed)
    r, c = int(rng.integers(2, 30)), int(rng.integers(1, 6))
    ts = np.sort(rng.integers(0, 3000, r))
    rows = [(int(rng.integers(0, 6)), int(t), rng.choice(12, c, replace=False).tolist(),
             (rng.random(c) < 0.6).tolist()) for t in ts]
    rows.sort(key=lambda x: (x[1], x[0]))
    lg = _log(rows)
    if not lg.labelled.any():
        return
    nbrs = {u: rng.permutation([v for v in range(6) if v != u]) for u in range(6)}
    got = effective_bounds(lg, nbrs, probes=(0, 2, 5), **W)
    eo = got["effective_oracle"]
    assert got["own_history_share"] == eo["0"] <= eo["2"] <= eo["5"] == eo["any_user"] <= 1.0
    # the pair ceiling needs the same user's earlier request within the TTL (<= retention)
    assert coverage_ceiling(lg, W["read_ttl_s"], W["lag_s"]) <= got["own_history_share"] + 1e-12


def test_signal_of_a_score_that_ranks_the_returning_candidates_first():
    # user 1 asks at 0 with items 1..5; items 2 and 4 come back labelled at 50 (in the TTL);
    # item 5 comes back at 500 (past it), item 1 at 5 (inside the lag)
    lg = _log([(1, 0, [1, 2, 3, 4, 5], [False] * 5),
               (1, 5, [1, 6, 7, 8, 9], [True, False, False, False, False]),
               (1, 50, [2, 4, 6, 7, 8], [True, True, False, False, False]),
               (1, 500, [5, 6, 7, 8, 9], [True, False, False, False, False])])
    good = np.zeros((4, 5))
    good[0] = [0.9, 0.8, 0.1, 0.7, 0.95]  # items 2 and 4 are not the top two: 5 and 1 are
    got = speculation_signal(lg, good, read_ttl_s=100.0, lag_s=10.0, fraction=0.4)
    assert got["returning"] == 2
    assert got["top_fraction_share"] == 0.0
    best = good.copy()
    best[0] = [0.1, 0.9, 0.0, 0.8, 0.2]
    got = speculation_signal(lg, best, read_ttl_s=100.0, lag_s=10.0, fraction=0.4)
    assert got["top_fraction_share"] == 1.0
    assert got["auc"] == 1.0


def test_bad_input_names_the_problem():
    lg = _log([(1, 0, [1, 2], None)])
    with pytest.raises(ConfigError, match="lag_s"):
        effective_bounds(lg, {}, read_ttl_s=1.0, retention_s=1.0, lag_s=-1.0)
    with pytest.raises(ConfigError, match="probes"):
        effective_bounds(lg, {}, probes=(-1,), **W)
    with pytest.raises(DataError, match="no labelled pair"):
        effective_bounds(_log([(1, 0, [1, 2], [False, False])]), {}, **W)
    with pytest.raises(DataError, match="shape"):
        speculation_signal(lg, np.zeros((1, 3)), read_ttl_s=1.0, lag_s=0.0, fraction=0.2)
    with pytest.raises(DataError, match="NaN"):
        speculation_signal(lg, np.array([[np.nan, 0.0]]), read_ttl_s=1.0, lag_s=0.0,
                           fraction=0.2)
