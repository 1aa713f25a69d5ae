"""Replay coverage: cumulative tiers, the ceiling, and the key-level precompute simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.errors import ConfigError, DataError
from solaris.replay.coverage import (ceiling_mask, coverage_by_tier, coverage_ceiling,
                                     coverage_over_time, time_bin_s)
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.replay.plots import coverage_time_plot, rollover_plot, sweep_plot
from solaris.replay.schedule import Ticks
from tests.tiny import request_log

_log = request_log


def _sim(lg, scores=None, **kw):
    args = dict(fraction=1.0, horizon_s=0.0, read_ttl_s=100.0, lag_s=0.0, tick_s=10.0,
                budget_per_hour=0.0)
    args.update(kw)
    if scores is None:
        scores = np.zeros(lg.candidates.shape)
    return simulate_pair_coverage(lg, np.asarray(scores, float), **args)


# ------------------------------------------------------------ tiers
def test_tier_coverage_is_cumulative_in_the_fixed_order():
    tiers = np.array([0, 1, 2, 3, 1, 0])
    agg = np.array([True, False, False, True, False, False])
    got = coverage_by_tier(tiers, agg)
    assert got == {"pair": 2 / 6, "user_neighbour": 3 / 6, "item_neighbour": 4 / 6,
                   "aggregate": 2 / 6, "effective": 5 / 6, "count": 6}
    empty = coverage_by_tier(np.zeros(0, int), np.zeros(0, bool))
    assert empty["count"] == 0 and np.isnan(empty["pair"])
    with pytest.raises(DataError, match="tier codes"):
        coverage_by_tier(np.array([4]), np.array([False]))


def test_coverage_over_time_bins_and_leaves_empty_bins_nan():
    ts = np.array([100, 150, 400, 420])
    tiers = np.array([1, 0, 2, 3])
    agg = np.array([False, False, True, False])
    got = coverage_over_time(ts, tiers, agg, bin_s=100, start=100)
    assert got["t"].tolist() == [100, 200, 300, 400]
    assert got["count"].tolist() == [2, 0, 0, 2]
    assert got["pair"][0] == 0.5 and got["pair"][3] == 0.0
    assert got["user_neighbour"][3] == 0.5 and got["item_neighbour"][3] == 1.0
    assert got["effective"][3] == 1.0 and got["aggregate"][3] == 0.5
    assert np.isnan(got["pair"][1:3]).all()


def test_a_window_is_cut_into_several_bins_each_holding_enough_rows():
    rng = np.random.default_rng(0)
    start, span = 1_000, 5 * 3600  # a window of hours: one 6-hour bin would be one point
    ts = np.sort(rng.integers(start, start + span + 1, 3000))
    ts[0], ts[-1] = start, start + span  # its first and last events
    tiers = rng.integers(0, 4, len(ts))
    agg = rng.random(len(ts)) < 0.5
    got = coverage_over_time(ts, tiers, agg, time_bin_s(span, len(ts)), start=start)
    assert len(got["t"]) == 20 and (got["count"] > 0).all()  # the last event in bin 19
    assert got["count"].sum() == len(ts)
    sub = slice(None, None, 30)  # 100 rows over the window: 3 bins of about 33
    few = coverage_over_time(ts[sub], tiers[sub], agg[sub], time_bin_s(span, 100), start=start)
    assert len(few["t"]) == 3 and (few["count"] >= 30).all()
    assert time_bin_s(span, 5) == span + 1.0  # too few rows to cut: the whole window
    assert time_bin_s(0.0, 1000) == pytest.approx(1 / 20)  # one instant: never 0
    with pytest.raises(ConfigError, match="span_s"):
        time_bin_s(float("nan"), 10)


# ------------------------------------------------------------ ceiling
def test_ceiling_on_a_hand_computed_log():
    lg = _log([
        (0, 0, [1, 2, 3], [False, False, False]),
        (0, 100, [2, 4, 5], [True, True, False]),  # 2 was a candidate at ts 0: covered
        (1, 150, [2, 6, 7], [True, False, False]),  # another user's candidate: not covered
        (0, 5000, [3, 8, 9], [True, False, False]),  # 3: 5000 s after ts 0
    ])
    assert coverage_ceiling(lg, read_ttl_s=3600) == 1 / 4
    assert coverage_ceiling(lg, read_ttl_s=5000) == 2 / 4
    assert coverage_ceiling(lg, read_ttl_s=3600, lag_s=100) == 1 / 4  # 100 - 0 >= lag
    assert coverage_ceiling(lg, read_ttl_s=3600, lag_s=101) == 0.0
    # a request at the same ts, earlier in the log, does not count
    same = _log([(0, 10, [1, 2], [False, False]), (0, 10, [1, 3], [True, False])])
    assert coverage_ceiling(same, read_ttl_s=100) == 0.0


# ------------------------------------------------------------ simulator, by hand
BASIC = [(0, 0, [1, 2], None), (0, 5, [1, 3], None), (0, 20, [1, 2], None)]


def test_writes_land_at_the_end_of_the_tick_with_the_request_time():
    got = _sim(_log(BASIC), record_writes=True)
    # tick [0, 10): nothing found yet (ts 5 is served before the tick ends); at its end 1
    # (merged, kept with the request at ts 0), 2 and 3 are written
    assert got["found"].tolist() == [[False, False], [False, False], [True, True]]
    assert got["age_s"][2].tolist() == [20.0, 20.0]  # items 1 and 2 written as of ts 0
    w = got["writes"]
    assert dict(zip(w["item"].tolist(), w["written_at"].tolist())) == {1: 0.0, 2: 0.0, 3: 5.0}
    # both released at the end of the first tick (10): read 10 s after their release
    assert got["visible_age_s"][2].tolist() == [10.0, 10.0]
    assert np.isnan(got["visible_age_s"][:2]).all()
    assert got["fm_evals"] == 3 and got["merged"] == 1
    assert got["per_request_enqueued"].tolist() == [2, 2, 0]  # found and not expiring
    assert got["precision"] == pytest.approx(2 / 3)  # item 3 is never read
    assert got["pair"] == pytest.approx(2 / 6)


def test_entries_past_the_read_ttl_are_not_found():
    # both pairs read at ts 20 were written as of ts 0: age 20, found up to a TTL of 20
    assert _sim(_log(BASIC), read_ttl_s=10)["found"][2].tolist() == [False, False]
    assert _sim(_log(BASIC), read_ttl_s=19)["found"][2].tolist() == [False, False]
    assert _sim(_log(BASIC), read_ttl_s=20)["found"][2].tolist() == [True, True]
    # a horizon reaching the TTL re-enqueues every found pair
    assert _sim(_log(BASIC), horizon_s=100)["per_request_enqueued"].tolist() == [2, 2, 2]


def test_lag_delays_eligibility_by_whole_ticks():
    # lag 15: at the end of tick [10, 20) pairs requested at ts <= 5 are eligible (all)
    got = _sim(_log(BASIC), lag_s=15, record_writes=True)
    assert got["found"][2].tolist() == [True, True]
    assert got["writes"]["visible_at"].tolist() == [20.0, 20.0, 20.0]
    # lag 16: only those requested at ts <= 4 (items 1 and 2); item 3 (ts 5) waits a tick
    got = _sim(_log(BASIC), lag_s=16, record_writes=True)
    assert got["found"][2].tolist() == [True, True]
    w = got["writes"]
    assert dict(zip(w["item"].tolist(), w["visible_at"].tolist())) == {1: 20.0, 2: 20.0,
                                                                        3: 30.0}
    # lag 20: due at exactly the end of tick [10, 20); lag 21: a tick later, after ts 20
    # is served: nothing is found
    assert _sim(_log(BASIC), lag_s=20)["found"][2].tolist() == [True, True]
    assert not _sim(_log(BASIC), lag_s=21)["found"].any()


def test_the_budget_takes_the_highest_priority_first_and_carries_fractions_only():
    lg = _log([(0, 0, [1, 2, 3], None), (0, 25, [1, 2, 3], None)])
    scores = [[0.9, 0.5, 0.7], [0.0, 0.0, 0.0]]
    # 1 evaluation per 10 s tick: item 1 (0.9) at the end of tick 0, item 3 (0.7) at tick 1
    got = _sim(lg, scores, budget_per_hour=360)
    assert got["found"][1].tolist() == [True, False, True]
    # 0.5 per tick: the first whole evaluation comes at the end of tick 1
    got = _sim(lg, scores, budget_per_hour=180)
    assert got["found"][1].tolist() == [True, False, False]
    # unlimited
    assert _sim(lg, scores)["found"][1].tolist() == [True, True, True]


def test_an_unused_allowance_is_not_banked():
    lg = _log([(0, 0, [1, 7, 8], None), (1, 50, [1, 2, 3], None), (1, 65, [1, 2, 3], None)])
    scores = [[0.0, 0.0, 0.0], [0.2, 0.9, 0.5], [0.0, 0.0, 0.0]]
    got = _sim(lg, scores, budget_per_hour=360)
    # user 0's three pairs take ticks 0-2; ticks 3-4 have nothing to evaluate and their
    # allowance is gone: one pair (item 2, the best) at tick 5's end, not three
    assert got["found"][2].tolist() == [False, True, False]
    assert got["fm_evals"] == 3 + 1 + 1  # then one more at the end of tick 6


def test_duplicates_merge_keeping_the_higher_priority_and_their_place():
    lg = _log([(0, 0, [1, 2], None), (0, 5, [1, 3], None), (0, 104, [1, 2], None)])
    scores = [[0.2, 0.5], [0.9, 0.1], [0.0, 0.0]]
    got = _sim(lg, scores, budget_per_hour=360, record_writes=True)
    # one evaluation per tick. Item 1 merged: priority 0.9, its place (request ts 0) kept ->
    # first out, written as of ts 0; then item 2 (0.5, ts 0), then item 3 (0.1, ts 5); at
    # ts 104 (TTL 100) items 1 and 2 have expired
    assert got["merged"] == 1
    w = got["writes"]
    assert w["item"].tolist()[:3] == [1, 2, 3]
    assert w["written_at"].tolist()[:3] == [0.0, 0.0, 5.0]
    assert w["visible_at"].tolist()[:3] == [10.0, 20.0, 30.0]
    assert got["found"][2].tolist() == [False, False]
    # dropping pending pairs at the verifier instead: item 1 keeps priority 0.2 and goes
    # after item 2
    got = _sim(lg, scores, budget_per_hour=360, skip_pending=True, record_writes=True)
    assert got["merged"] == 0 and got["per_request_enqueued"][1] == 1
    assert got["writes"]["item"].tolist()[:3] == [2, 1, 3]


def test_random_picks_spend_the_same_evaluations_on_other_pairs():
    rng = np.random.default_rng(0)
    # one request per user, one every tick: no pair is ever found, so both kinds of picks
    # enqueue k = 3 per request; unlimited, all are evaluated; at one per tick, one a tick
    fresh = _log([(u, 10 * u, rng.permutation(50)[:10].tolist(), None) for u in range(8)])
    scores = rng.random((8, 10))
    for budget, evals in ((0, 8 * 3), (360, 8)):
        by_score = _sim(fresh, scores, fraction=0.3, budget_per_hour=budget)
        by_random = _sim(fresh, scores, fraction=0.3, budget_per_hour=budget,
                         random_picks=True, seed=3)
        assert by_score["fm_evals"] == by_random["fm_evals"] == evals
        assert by_score["per_request_enqueued"].tolist() == [3] * 8
        assert by_random["per_request_enqueued"].tolist() == [3] * 8
    # each user twice, 20 s apart, same candidates: the second request finds the 3 pairs
    # the first one picked -- its top 3 by score, or 3 random ones
    rows, scores = [], []
    for u in range(8):
        cands = rng.permutation(50)[:10].tolist()
        rows += [(u, 100 * u, cands, None), (u, 100 * u + 20, cands, None)]
        s = rng.random(10)
        scores += [s, s]
    lg = _log(rows)
    scores = np.array(scores)
    by_score = _sim(lg, scores, fraction=0.3)
    by_random = _sim(lg, scores, fraction=0.3, random_picks=True, seed=3)
    assert by_score["found"].sum() == by_random["found"].sum() == 8 * 3
    top = np.argsort(-scores, axis=1)[:, :3]
    for r in range(1, 16, 2):
        assert set(np.flatnonzero(by_score["found"][r])) == set(top[r])
    assert not np.array_equal(by_score["found"], by_random["found"])


def test_bad_arguments_are_named():
    lg = _log(BASIC)
    with pytest.raises(DataError, match="scores: shape"):
        _sim(lg, np.zeros((2, 2)))
    with pytest.raises(ConfigError, match="tick_s=0"):
        _sim(lg, tick_s=0)
    with pytest.raises(ConfigError, match="lag_s=-1"):
        _sim(lg, lag_s=-1)


# ------------------------------------------------------------ simulator vs ceiling
@st.composite
def logs(draw):
    n = draw(st.integers(1, 25))
    steps = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    rows = []
    for t in np.cumsum(steps).tolist():
        u = draw(st.integers(0, 2))
        cands = draw(st.permutations(range(6)))[:3]
        lab = draw(st.lists(st.booleans(), min_size=3, max_size=3))
        rows.append((u, t, cands, lab))
    rows.sort(key=lambda r: (r[1], r[0]))
    scores = draw(st.lists(st.floats(0, 1), min_size=3 * n, max_size=3 * n))
    return _log(rows), np.array(scores).reshape(n, 3)


@settings(max_examples=150, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120), lag=st.integers(0, 60), tick=st.integers(1, 30),
       budget=st.sampled_from([0, 360, 1000, 5000]), fraction=st.sampled_from([0.3, 0.7, 1.0]),
       horizon=st.integers(0, 120), random_picks=st.booleans(), skip=st.booleans())
def test_a_found_pair_always_meets_the_ceiling(data, ttl, lag, tick, budget, fraction, horizon,
                                               random_picks, skip):
    lg, scores = data
    got = simulate_pair_coverage(lg, scores, fraction=fraction, horizon_s=horizon,
                                 read_ttl_s=ttl, lag_s=lag, tick_s=tick,
                                 budget_per_hour=budget, random_picks=random_picks,
                                 skip_pending=skip)
    ceiling = ceiling_mask(lg, ttl, lag)
    assert not (got["found"] & ~ceiling).any()
    if lg.labelled.any():
        assert got["pair"] <= coverage_ceiling(lg, ttl, lag)


@settings(max_examples=100, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120))
def test_every_candidate_computed_at_once_reaches_the_ceiling(data, ttl):
    # one tick per second of integer event time, no lag, no budget limit, every candidate
    # picked and re-picked: exactly the pairs the ceiling counts are found
    lg, scores = data
    got = simulate_pair_coverage(lg, scores, fraction=1.0, horizon_s=ttl, read_ttl_s=ttl,
                                 lag_s=0, tick_s=1, budget_per_hour=0)
    assert np.array_equal(got["found"], ceiling_mask(lg, ttl, 0))


def _ceiling_brute(lg, ttl, lag):
    out = np.zeros(lg.candidates.shape, bool)
    for r in range(lg.num_requests):
        for q in range(r):
            dt = lg.ts[r] - lg.ts[q]
            if lg.user[q] == lg.user[r] and 0 < dt and dt >= lag and dt <= ttl:
                out[r] |= np.isin(lg.candidates[r], lg.candidates[q])
    return out


@settings(max_examples=100, deadline=None)
@given(data=logs(), ttl=st.integers(0, 120), lag=st.integers(0, 60))
def test_ceiling_matches_brute_force(data, ttl, lag):
    lg, _ = data
    assert np.array_equal(ceiling_mask(lg, ttl, lag), _ceiling_brute(lg, ttl, lag))


# ------------------------------------------------------------ plots
def test_plots_write_png_files(tmp_path):
    curve = coverage_over_time(np.arange(0, 10 * 86_400, 3600), np.arange(240) % 4,
                               np.arange(240) % 3 == 0, bin_s=86_400)
    rows = [{"budget_per_hour": b, "read_ttl_s": ttl, "coverage_pair": 0.1 * i,
             "coverage_effective": 0.2 * i, "tr_online": None if b == 0 else 0.05 * i}
            for i, b in enumerate((100, 1000, 0)) for ttl in (3600, 14400)]
    roll = {"t": np.arange(0, 7200, 600.0), "old": np.linspace(0.5, 0.0, 12),
            "new": np.linspace(0.0, 0.4, 12), "switch_t": 3600.0}
    for p in (coverage_time_plot(curve, tmp_path / "a" / "time.png", "coverage"),
              sweep_plot(rows, tmp_path / "sweep.png"),
              rollover_plot(roll, tmp_path / "roll.png")):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------ simulator vs the live queue
def _live_rules(lg, scores, *, fraction, horizon, ttl, lag, tick, budget, skip=False):
    """The live path on keys, from its own parts: ``verifier.choose`` as the router calls it,
    ``PrecomputeQueue`` with the replay's gate and ``tick_allowance``, a dict as the cache.
    Every tick in turn, or (``skip``) only the ticks ``Ticks.next`` says have anything to
    do, as ``jobs/replay.py`` runs them; also returns the ticks run and the pairs written."""
    import math

    from solaris.config import QueueConfig, VerifierConfig
    from solaris.precompute.pqueue import PrecomputeQueue
    from solaris.online.verifier import choose

    from solaris.replay.schedule import tick_allowance

    q = PrecomputeQueue(QueueConfig(capacity=10**6, lease_pairs=4), clock=lambda: 0.0)
    vcfg = VerifierConfig(fraction=fraction, horizon_s=float(horizon))
    store: dict[tuple[int, int], float] = {}
    found = np.zeros(lg.candidates.shape, bool)
    t0 = math.floor(lg.ts[0] / tick) * tick
    ks = np.floor((lg.ts - t0) / tick).astype(int)
    plan = Ticks.of(lg.ts, tick)
    run = []
    k = plan.first if skip else 0
    while k is not None and (skip or k <= ks[-1]):
        run.append(k)
        for r in np.flatnonzero(ks == k):
            u, t, items = int(lg.user[r]), float(lg.ts[r]), lg.candidates[r]
            w = np.array([store.get((u, int(i)), -np.inf) for i in items])
            fnd = t - w <= ttl
            found[r] = fnd
            picks = choose(scores[r], items, fnd, np.where(fnd, t - w, 0.0),
                           np.zeros(len(items), bool), vcfg, float(ttl))
            if len(picks):
                q.put(np.full(len(picks), u), items[picks], scores[r][picks], t, 0, "v")
        q.set_gate(t0 + (k + 1) * tick - lag, tick_allowance(budget, tick, k))
        while (lease := q.lease()) is not None:
            for g in lease.groups:
                for i in g.items.tolist():
                    if store.get((g.user, i), -np.inf) <= g.now:
                        store[(g.user, i)] = g.now
            q.ack(lease.lease_id)
        if skip:
            m = q.metrics()
            k = plan.next(k, eligible=m["eligible"], depth=m["depth"],
                          oldest_pending=m["oldest_pending"], lag_s=lag, read_ttl_s=ttl)
        else:
            k += 1
    return found, run, dict(store)


@settings(max_examples=120, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120), lag=st.integers(0, 60), tick=st.integers(1, 30),
       budget=st.sampled_from([0, 1800, 3600]), fraction=st.sampled_from([0.3, 0.7, 1.0]),
       horizon=st.integers(0, 120))
def test_the_simulation_follows_the_live_queue_pair_for_pair(data, ttl, lag, tick, budget,
                                                             fraction, horizon):
    lg, scores = data
    sim = simulate_pair_coverage(lg, scores, fraction=fraction, horizon_s=horizon,
                                 read_ttl_s=ttl, lag_s=lag, tick_s=tick,
                                 budget_per_hour=budget)
    live, _, _ = _live_rules(lg, scores, fraction=fraction, horizon=horizon, ttl=ttl,
                             lag=lag, tick=tick, budget=budget)
    assert np.array_equal(sim["found"], live)


@settings(max_examples=80, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120), lag=st.integers(0, 60), tick=st.integers(1, 30),
       budget=st.sampled_from([0, 1800, 3600]), horizon=st.integers(0, 120))
def test_the_replay_tick_schedule_skips_only_ticks_with_nothing_to_do(data, ttl, lag, tick,
                                                                      budget, horizon):
    """``Ticks.next`` (the replay's schedule) runs fewer ticks than every tick in turn and
    gives the same coverage; the ticks it runs include every tick with requests."""
    lg, scores = data
    kw = dict(fraction=0.7, horizon=horizon, ttl=ttl, lag=lag, tick=tick, budget=budget)
    every, ran_all, _ = _live_rules(lg, scores, **kw)
    skipping, ran, _ = _live_rules(lg, scores, skip=True, **kw)
    assert np.array_equal(every, skipping)
    plan = Ticks.of(lg.ts, tick)
    assert set(plan.ticks.tolist()) <= set(ran) and ran == sorted(set(ran))
    assert [k for k in ran if k <= plan.last] == [k for k in ran_all if k in set(ran)]


def test_tick_plan_rows_and_next_tick():
    plan = Ticks.of(np.array([10.0, 12.0, 31.0, 95.0]), 10.0)  # ticks 0, 0, 2, 8 from t0=10
    assert (plan.t0, plan.first, plan.last) == (10.0, 0, 8)
    assert [plan.rows(k) for k in range(4)] == [(0, 2), None, (2, 3), None]
    assert plan.rows(8) == (3, 4) and plan.end(2) == 40.0 and plan.at_fraction(0.5) == 2
    idle = dict(eligible=0, depth=0, oldest_pending=None, lag_s=5.0, read_ttl_s=30.0)
    assert plan.next(0, **idle) == 2 and plan.next(8, **idle) is None  # gaps skipped; done
    assert plan.next(0, **{**idle, "eligible": 3, "depth": 3}) == 1  # budget ran out
    # work still pending after the last request tick: the tick after runs
    assert plan.next(8, **{**idle, "depth": 1, "oldest_pending": 95.0}) == 9
    assert plan.next(0, **{**idle, "depth": 1, "oldest_pending": 60.0}) == 2  # next requests
    # still pending after tick 2 (the allowance), due at 36 s: the next tick, 3
    assert plan.next(2, **{**idle, "depth": 1, "oldest_pending": 31.0}) == 3
    assert plan.next(2, **{**idle, "depth": 1, "oldest_pending": 51.0}) == 4  # due at 56 s: tick 4 ends at 60 s
    # work due after the last request could read it (ttl 30 s = 3 ticks) ends the replay
    assert plan.next(8, **{**idle, "depth": 1, "oldest_pending": 200.0}) is None
    with pytest.raises(ValueError, match="ascending"):
        Ticks.of(np.array([3.0, 1.0]), 10.0)


def test_a_binding_budget_takes_request_groups_in_order_of_their_best_pair():
    # request A (user 0) picks items 1 (0.9) and 2 (0.1); request B (user 1) item 3 (0.5);
    # an allowance of 2 per tick takes A whole (its best pair leads), not 0.9 and 0.5
    lg = _log([(0, 0, [1, 2, 3], [False] * 3), (1, 0, [3, 4, 5], [False] * 3),
               (0, 10, [1, 2, 3], None), (1, 10, [3, 4, 5], None)])
    scores = np.array([[0.9, 0.1, 0.0], [0.5, 0.0, 0.0], [0, 0, 0], [0, 0, 0.]])
    got = _sim(lg, scores, fraction=0.7, budget_per_hour=720.0)  # 2 per 10 s tick
    assert got["found"][2].tolist() == [True, True, False]
    assert got["found"][3].tolist() == [False, False, False]
