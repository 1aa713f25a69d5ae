"""Verifier: top fraction of all candidates, missing/expiring only, in-flight skipped; budget."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.config import VerifierConfig
from solaris.errors import ConfigError, RequestError
from solaris.online.verifier import BudgetController, choose, top_count

TTL = 4 * 3600.0
CFG = VerifierConfig(fraction=0.2, horizon_s=1800.0)


def _choose(scores, found, age, busy=None, fraction=None, items=None):
    c = len(scores)
    items = np.arange(c) if items is None else np.asarray(items)
    busy = np.zeros(c, bool) if busy is None else np.asarray(busy)
    return choose(np.asarray(scores, float), items, np.asarray(found), np.asarray(age, float),
                  busy, CFG, TTL, fraction)


def test_top_fraction_is_taken_of_all_candidates_not_of_the_missing_ones():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0])
    found = np.array([True, True] + [False] * 8)  # the top 2 are cached and fresh
    assert _choose(scores, found, np.zeros(10)).tolist() == []
    found[1] = False
    assert _choose(scores, found, np.zeros(10)).tolist() == [1]
    assert _choose(scores, np.zeros(10, bool), np.zeros(10)).tolist() == [0, 1]


def test_missing_or_expiring_within_the_horizon():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    found = np.array([True, True, True, False, True])
    age = np.array([TTL - 1800 + 1, TTL - 1800, 10.0, 0.0, TTL - 1])
    got = _choose(scores, found, age, fraction=1.0)
    assert got.tolist() == [0, 3, 4]  # expiring (strictly), missing, expiring
    # a horizon past the TTL re-enqueues every found pair of the top fraction
    wide = VerifierConfig(fraction=1.0, horizon_s=2 * TTL)
    assert choose(scores, np.arange(5), found, age, np.zeros(5, bool), wide, TTL).tolist() == \
        [0, 1, 2, 3, 4]


def test_by_default_a_found_pair_is_computed_again_once_5_minutes_old():
    # the default horizon is 5 min short of the default read TTL: a found pair of the top
    # fraction is re-enqueued, as of this request's history, once it is older than 300 s
    from solaris.config import CacheConfig

    ttl = float(CacheConfig().read_ttl_s)
    assert ttl - VerifierConfig().horizon_s == 300.0
    scores = np.array([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    found = np.array([True, True, True, True, False, True])
    age = np.array([301.0, 3600.0, 300.0, 10.0, 0.0, ttl - 1])
    got = choose(scores, np.arange(6), found, age, np.zeros(6, bool),
                 VerifierConfig(fraction=1.0), ttl)
    assert got.tolist() == [0, 1, 4, 5]


def test_pairs_in_flight_are_skipped():
    scores = np.linspace(1, 0, 10)
    busy = np.zeros(10, bool)
    busy[0] = True
    assert _choose(scores, np.zeros(10, bool), np.zeros(10), busy).tolist() == [1]


def test_ties_break_by_item_and_counts_are_robust():
    scores = np.array([1.0, 1.0, 1.0, 0.0])
    assert _choose(scores, np.zeros(4, bool), np.zeros(4), fraction=0.5,
                   items=[30, 10, 20, 0]).tolist() == [1, 2]
    assert top_count(30, 0.1) == 3 and top_count(7, 0.2) == 2 and top_count(0, 0.2) == 0
    assert top_count(5, 0.0) == 0 and top_count(5, 1.0) == 5


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_choose_matches_a_plain_loop(data):
    c = data.draw(st.integers(0, 60))
    rng = np.random.default_rng(data.draw(st.integers(0, 10_000)))
    scores = np.round(rng.random(c), 1)  # many ties
    items = rng.permutation(1000)[:c]
    found = rng.random(c) < 0.5
    age = rng.random(c) * TTL
    busy = rng.random(c) < 0.2
    frac = data.draw(st.floats(0.0, 1.0))
    got = choose(scores, items, found, age, busy, CFG, TTL, frac)
    ranked = sorted(range(c), key=lambda j: (-scores[j], items[j]))
    k = top_count(c, frac)
    want = [j for j in ranked[:k]
            if (not found[j] or age[j] > TTL - CFG.horizon_s) and not busy[j]]
    assert got.tolist() == want


def test_bad_inputs_name_the_value():
    with pytest.raises(RequestError, match="found_fresh"):
        _choose([1.0, 2.0], [True], [0.0, 0.0])
    with pytest.raises(RequestError, match="non-finite"):
        _choose([1.0, np.nan], [True, True], [0.0, 0.0])
    with pytest.raises(RequestError, match="fraction=1.5"):
        _choose([1.0], [True], [0.0], fraction=1.5)
    with pytest.raises(ConfigError, match="verifier.fraction=0.9"):
        VerifierConfig(fraction=0.9, max_fraction=0.5)


# ---------------------------------------------------------------- budget controller

class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _simulate(ctl: BudgetController, clock: FakeClock, seconds: float, req_per_s: float,
              miss: float, rng: np.random.Generator, depth: int | None = None,
              c: int = 100) -> tuple[list[float], list[float]]:
    """Serve requests through ``choose`` at the controller's fraction; per-interval enqueue
    rates and the fractions used."""
    fractions, rates = [], []
    end = clock.t + seconds
    updates = ctl.updates
    while clock.t < end:
        clock.t += 1.0 / req_per_s
        found = rng.random(c) >= miss
        chosen = choose(rng.random(c), np.arange(c), found, np.zeros(c), np.zeros(c, bool),
                        ctl.cfg, TTL, ctl.fraction)
        f = ctl.record(len(chosen), depth)
        assert ctl.cfg.min_fraction <= f <= ctl.cfg.max_fraction
        fractions.append(f)
        if ctl.updates > updates:
            updates = ctl.updates
            rates.append(ctl.last_rate)
    return rates, fractions


def test_budget_controller_converges_to_the_budget_and_follows_the_load():
    cfg = VerifierConfig(fraction=0.2, budget_per_s=30.0, interval_s=10.0, gain=0.5,
                         min_fraction=0.01, max_fraction=1.0)
    clock, rng = FakeClock(), np.random.default_rng(0)
    ctl = BudgetController(cfg, clock)
    rates, _ = _simulate(ctl, clock, 300, req_per_s=5, miss=0.6, rng=rng)
    assert rates[0] > 45  # starts well over budget (fraction 0.2 -> ~60 pairs/s)
    assert np.mean(rates[-10:]) == pytest.approx(30.0, rel=0.1)
    assert ctl.fraction == pytest.approx(0.1, rel=0.2)
    # traffic doubles: the fraction halves to stay on budget
    rates, _ = _simulate(ctl, clock, 300, req_per_s=10, miss=0.6, rng=rng)
    assert np.mean(rates[-10:]) == pytest.approx(30.0, rel=0.1)
    assert ctl.fraction == pytest.approx(0.05, rel=0.25)


def test_budget_controller_stays_within_bounds():
    clock, rng = FakeClock(), np.random.default_rng(1)
    hi = BudgetController(VerifierConfig(budget_per_s=1e6, max_fraction=0.5), clock)
    _simulate(hi, clock, 200, req_per_s=5, miss=0.5, rng=rng)
    assert hi.fraction == 0.5
    lo = BudgetController(VerifierConfig(budget_per_s=1e-3, min_fraction=0.02), clock)
    _simulate(lo, clock, 200, req_per_s=5, miss=0.5, rng=rng)
    assert lo.fraction == 0.02
    off = BudgetController(VerifierConfig(fraction=0.3), clock)  # no budget: fixed
    _simulate(off, clock, 100, req_per_s=5, miss=0.5, rng=rng)
    assert off.fraction == 0.3 and off.updates == 0


def test_queue_depth_feedback_lowers_the_target():
    cfg = VerifierConfig(fraction=0.2, budget_per_s=30.0, target_depth=1000)
    clock, rng = FakeClock(), np.random.default_rng(2)
    ctl = BudgetController(cfg, clock)
    rates, _ = _simulate(ctl, clock, 300, req_per_s=5, miss=0.6, rng=rng, depth=4000)
    assert ctl.last_target == pytest.approx(7.5)
    assert np.mean(rates[-10:]) == pytest.approx(7.5, rel=0.15)


def test_budget_controller_is_deterministic():
    runs = []
    for _ in range(2):
        clock = FakeClock()
        ctl = BudgetController(VerifierConfig(budget_per_s=20.0), clock)
        runs.append(_simulate(ctl, clock, 120, 5, 0.5, np.random.default_rng(3))[1])
    assert runs[0] == runs[1]
