"""Speculation policies: each one's bets, and the schedule simulation running them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.config import VerifierConfig
from solaris.errors import ConfigError
from solaris.replay.coverage import coverage_ceiling
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.precompute.speculation import (Candidates, RandomPolicy, VerifierPolicy, admit,
                                            top_count)
from solaris.replay.policies import (FEATURES, LearnedPolicy, OraclePolicy, RecurrencePolicy,
                                     ReturnsOraclePolicy, make_policy)
from solaris.online.verifier import choose
from tests.tiny import request_log
from tests.unit.test_replay_coverage import logs


def _req(user, ts, items, scores=None):
    items = np.asarray(items, np.int64)
    s = np.zeros(len(items)) if scores is None else np.asarray(scores, float)
    return Candidates(user, float(ts), items, s)


def test_the_verifier_policy_is_what_the_router_calls():
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = np.round(rng.random(12), 1)  # ties, broken by item id
        items = rng.permutation(40)[:12]
        found = rng.random(12) < 0.4
        age = rng.random(12) * 100
        busy = rng.random(12) < 0.2
        top, prio = VerifierPolicy().rank(_req(0, 0, items, s), 0.5)
        want = top[admit(top, found, age, 100.0, 30.0) & ~busy[top]]
        got = choose(s, items, found, age, busy, VerifierConfig(fraction=0.5, horizon_s=30.0),
                     100.0)
        assert got.tolist() == want.tolist()
        assert prio.tolist() == s[top].tolist()
        assert len(top) == 6 and (np.diff(s[top]) <= 0).all()


def test_random_bets_as_many_as_the_verifier_and_depends_only_on_its_seed():
    req = _req(0, 0, np.arange(20), np.linspace(0, 1, 20))
    a, b = RandomPolicy(3), RandomPolicy(3)
    ta, pa = a.rank(req, 0.25)
    tb, pb = b.rank(req, 0.25)
    assert len(ta) == 5 and ta.tolist() == tb.tolist() and pa.tolist() == pb.tolist()
    assert len(set(ta.tolist())) == 5


def test_recurrence_counts_earlier_candidates_of_the_same_user_within_the_ttl_only():
    p = RecurrencePolicy(read_ttl_s=100.0)
    for ts, items in ((0, [1, 2, 3]), (50, [1, 2]), (120, [1, 4])):
        p.observe(_req(7, ts, items))
    p.observe(_req(8, 130, [3, 3 + 0]))  # another user: never counted for user 7
    n, since = p.counts(_req(7, 140, [1, 2, 3, 4, 5]))
    # item 1 at 50 and 120 (0 is older than the TTL), item 2 at 50, 3 only at 0, 4 at 120
    assert n.tolist() == [2, 1, 0, 1, 0]
    assert since[:2].tolist() == [20.0, 90.0] and since[3] == 20.0 and np.isinf(since[4])
    # ranked by count, then recency, then score: 1 (2), 4 (1, 20 s), 2 (1, 90 s)
    top, prio = p.rank(_req(7, 140, [1, 2, 3, 4, 5], [0.1, 0.9, 0.8, 0.2, 0.7]), 0.6)
    assert top.tolist() == [0, 3, 1]
    assert prio[0] > prio[1] and prio[0] == pytest.approx(2.0 + 0.1 * 0.999)
    # the same request twice at one time counts only strictly earlier requests
    assert p.counts(_req(7, 120, [4]))[0].tolist() == [0]


def test_the_oracle_bets_exactly_on_pairs_labelled_later_after_the_lag_within_the_ttl():
    lg = request_log([(0, 0, [1, 2, 3], [False, False, False]),
                      (0, 30, [1, 2, 3], [True, False, False]),
                      (1, 40, [3, 5, 6], [True, True, False]),
                      (0, 200, [2, 3, 4], [True, False, False])])
    o = OraclePolicy.from_log(lg, read_ttl_s=100.0, lag_s=10.0)
    top, _ = o.rank(_req(0, 0, [1, 2, 3]), 0.0)
    assert top.tolist() == [0]  # item 1 labelled at 30; item 2 only at 200 (> TTL)
    assert o.rank(_req(0, 25, [1, 2]), 0.0)[0].tolist() == []  # 30 is within the lag
    assert o.rank(_req(1, 0, [3, 5, 6]), 0.0)[0].tolist() == [0, 1]
    assert o.rank(_req(1, 40, [3, 5]), 0.0)[0].tolist() == []  # its own request: not later


def test_the_returns_bound_bets_as_the_verifier_only_where_the_user_comes_back():
    # user 0 asks at 0, 30 and 200; user 1 at 40 only; labels play no part
    lg = request_log([(0, 0, [1, 2, 3], [False, False, False]),
                      (0, 30, [1, 2, 3], [False, False, False]),
                      (1, 40, [3, 5, 6], [True, True, False]),
                      (0, 200, [2, 3, 4], [True, False, False])])
    b = make_policy("returns", read_ttl_s=100.0, lag_s=10.0, request_log=lg)
    assert isinstance(b, ReturnsOraclePolicy)
    s = [0.2, 0.9, 0.5]
    want = VerifierPolicy().rank(_req(0, 0, [1, 2, 3], s), 0.5)
    got = b.rank(_req(0, 0, [1, 2, 3], s), 0.5)  # 30 is 30 s later: after the lag, in the TTL
    assert got[0].tolist() == want[0].tolist() == [1, 2]
    assert got[1].tolist() == want[1].tolist()
    assert b.rank(_req(0, 25, [1, 2, 3], s), 0.5)[0].tolist() == []  # 30 is within the lag
    assert b.rank(_req(0, 30, [1, 2, 3], s), 1.0)[0].tolist() == []  # 200 is past the TTL
    assert b.rank(_req(1, 40, [3, 5, 6], s), 1.0)[0].tolist() == []  # never comes back
    assert b.rank(_req(7, 0, [3], s[:1]), 1.0)[0].tolist() == []  # a user not in the log
    with pytest.raises(ConfigError, match="'returns'.*request log"):
        make_policy("returns")
    from solaris.replay.coverage import returning_share

    # user 0 at 0 comes back at 30 (after the lag of 10, within the TTL of 100); at 30 and
    # 200 and user 1 at 40 do not
    assert returning_share(lg, 100.0, 10.0) == pytest.approx(1 / 4)
    assert returning_share(lg, 200.0, 10.0) == pytest.approx(2 / 4)  # 30 -> 200 now counts
    assert returning_share(lg, 150.0, 40.0) == 0.0  # 0 -> 30 is in the lag, 200 past the TTL


@settings(max_examples=200, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120), lag=st.integers(0, 60), tick=st.integers(1, 30),
       fraction=st.sampled_from([0.3, 1.0]))
def test_the_returns_bound_costs_no_more_than_the_verifier(data, ttl, lag, tick, fraction):
    """With an unbounded budget the returns bound bets at a subset of the verifier's
    requests, so it never costs more FM evaluations. (Its coverage is not always the
    verifier's: ``test_the_returns_bound_can_lose_a_read_to_a_merged_pick``.)"""
    lg, scores = data
    kw = dict(fraction=fraction, horizon_s=float(ttl), read_ttl_s=ttl, lag_s=lag,
              tick_s=tick, budget_per_hour=0, seed=1)
    v = simulate_pair_coverage(lg, scores, policy=make_policy("verifier"), **kw)
    r = simulate_pair_coverage(lg, scores, policy=make_policy(
        "returns", read_ttl_s=ttl, lag_s=lag, request_log=lg), **kw)
    assert r["fm_evals"] <= v["fm_evals"]


def test_the_returns_bound_can_lose_a_read_to_a_merged_pick():
    """The returns bound is not an upper bound on the verifier's coverage when a pick
    waits for its tick: one user at 0 (x20), 13, 49, 64 and 85, TTL 36, lag 22, ticks of 17,
    the last request labelled. The verifier bets at 0 (released at 34), so its bet at 49
    is a pair of its own, released at 85 and read there (age 36). The bound skips 0 (no
    request in [22, 36]) and bets at 13 (49 is in [35, 49]) -- released only at 51, so 49
    does not find it, and its bet at 49 merges into the pending pick of 13, whose entry is
    too old at 85. Found by hypothesis; kept as the case that says what the bound means."""
    ts = [0] * 20 + [13, 49, 64, 85]
    lg = request_log([(0, t, [0, 1, 2], [t == 85] * 3) for t in ts])
    scores = np.zeros((len(ts), 3))
    kw = dict(fraction=1.0, horizon_s=36.0, read_ttl_s=36, lag_s=22, tick_s=17,
              budget_per_hour=0, seed=1)
    v = simulate_pair_coverage(lg, scores, policy=make_policy("verifier"), **kw)
    r = simulate_pair_coverage(lg, scores, policy=make_policy(
        "returns", read_ttl_s=36, lag_s=22, request_log=lg), **kw)
    assert (v["pair"], r["pair"]) == (1.0, 0.0)
    assert r["fm_evals"] < v["fm_evals"]


@settings(max_examples=40, deadline=None)
@given(data=logs(), ttl=st.integers(20, 120), lag=st.integers(0, 10))
def test_compare_policies_reports_the_returns_bound_apart_from_the_policies(data, ttl, lag):
    from solaris.replay.coverage import compare_policies

    lg, scores = data
    got = compare_policies(lg, scores, fraction=0.3, fractions=(0.3, 0.7, 1.0), seed=1,
                           read_ttl_s=ttl, lag_s=lag, horizon_s=0.0, tick_s=5.0,
                           budget_per_hour=0)
    assert "returns" in got["curves"]
    assert "returns" not in got["gap_closed"] and "returns" not in got["cost_to_match_verifier"]
    rb, ver = got["returns_bound"], got["curves"]["verifier"][0]
    assert ver["fraction"] == 0.3
    if not np.isfinite(ver["pair"]):
        return
    # unbounded budget: at the verifier's fraction it covers as much for no more evaluations
    assert rb["pair_within_verifier_cost"] >= ver["pair"] - 1e-12
    assert rb["cost_to_match_verifier"] is None or rb["cost_to_match_verifier"] <= 1 + 1e-12
    gap = got["at_verifier_cost"]["oracle"]["pair"] - ver["pair"]
    if gap > 0:
        assert rb["gap_closed_within_verifier_cost"] == pytest.approx(
            (rb["pair_within_verifier_cost"] - ver["pair"]) / gap)


@settings(max_examples=120, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120))
def test_the_oracle_reaches_the_coverage_ceiling_when_nothing_delays_a_write(data, ttl):
    lg, scores = data
    o = OraclePolicy.from_log(lg, read_ttl_s=ttl, lag_s=0.0)
    got = simulate_pair_coverage(lg, scores, fraction=0.0, horizon_s=ttl, read_ttl_s=ttl,
                                 lag_s=0.0, tick_s=1.0, budget_per_hour=0.0, policy=o)
    want = coverage_ceiling(lg, ttl, 0.0)
    assert got["pair"] == pytest.approx(want, nan_ok=True)


@settings(max_examples=120, deadline=None)
@given(data=logs(), ttl=st.integers(1, 120), lag=st.integers(0, 60), tick=st.integers(1, 30),
       budget=st.sampled_from([0, 360, 5000]), fraction=st.sampled_from([0.3, 1.0]),
       name=st.sampled_from(["verifier", "random", "recurrence", "learned", "returns",
                             "oracle"]))
def test_every_policy_stays_under_the_ceiling_and_the_default_is_the_verifier(
        data, ttl, lag, tick, budget, fraction, name):
    lg, scores = data
    kw = dict(fraction=fraction, horizon_s=0.0, read_ttl_s=ttl, lag_s=lag, tick_s=tick,
              budget_per_hour=budget, seed=1)
    p = make_policy(name, seed=1, read_ttl_s=ttl, lag_s=lag, request_log=lg)
    got = simulate_pair_coverage(lg, scores, policy=p, **kw)
    assert not (got["found"] & ~np.isfinite(got["age_s"])).any()
    if lg.labelled.any():
        assert got["pair"] <= coverage_ceiling(lg, ttl, lag) + 1e-12
    if name in ("verifier", "random"):  # the policy objects are the simulator's own rules
        plain = simulate_pair_coverage(lg, scores, random_picks=name == "random", **kw)
        assert np.array_equal(plain["found"], got["found"])
        assert plain["fm_evals"] == got["fm_evals"]


def test_make_policy_names_what_it_does_not_know():
    with pytest.raises(ConfigError, match="'lru'"):
        make_policy("lru")
    with pytest.raises(ConfigError, match="request log"):
        make_policy("oracle")
    with pytest.raises(ConfigError, match="read_ttl_s"):
        RecurrencePolicy(0.0)


def test_the_learned_policy_bets_as_the_verifier_until_it_has_matured_outcomes():
    p = LearnedPolicy(read_ttl_s=100.0, lag_s=10.0, refit_s=50.0)
    req = _req(0, 0, [5, 6, 7, 8], [0.1, 0.9, 0.5, 0.3])
    top, prio = p.rank(req, 0.5)
    assert top.tolist() == [1, 2] and prio.tolist() == [0.9, 0.5]
    assert p.fits == 0


def test_the_learned_policy_reads_feedback_only_after_the_lag():
    p = LearnedPolicy(read_ttl_s=1000.0, lag_s=300.0)
    first = Candidates(3, 0.0, np.array([1, 2]), np.array([0.5, 0.5]), np.array([True, False]))
    p.rank(first, 1.0)
    p.observe(first)
    col = {name: k for k, name in enumerate(FEATURES)}
    early = p.features(_req(3, 100, [1, 2], [0.5, 0.5]))
    late = p.features(_req(3, 400, [1, 2], [0.5, 0.5]))
    for x, want in ((early, 0.0), (late, 1.0)):
        assert x[0, col["pair_labelled"]] == want
        assert x[0, col["item_labels_day"]] == pytest.approx(np.log1p(want))
        assert x[1, col["pair_labelled"]] == 0.0
    # the recurrence and the user's request history count the first request either way
    assert early[0, col["recurrence"]] == pytest.approx(np.log1p(1))
    assert early[0, col["user_requests"]] == pytest.approx(np.log1p(1))


def _hot_items_log(seed: int = 0):
    # 30 users, a request every 10 minutes for a day, 20 of 60 items as candidates; only the
    # 6 "hot" items are ever labelled; the VM's scores are noise
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(0, 86400, 600):
        for u in range(30):
            items = rng.permutation(60)[:20]
            rows.append((u, t, items.tolist(), (items < 6).tolist()))
    lg = request_log(rows)
    return lg, rng.random(lg.candidates.shape)


def test_the_learned_policy_finds_what_gets_labelled_where_the_vm_score_cannot():
    lg, scores = _hot_items_log()
    kw = dict(fraction=0.2, horizon_s=0.0, read_ttl_s=3600.0, lag_s=300.0, tick_s=60.0,
              budget_per_hour=0.0)
    learned = LearnedPolicy(read_ttl_s=3600.0, lag_s=300.0, refit_s=3600.0)
    got = simulate_pair_coverage(lg, scores, policy=learned, **kw)
    base = simulate_pair_coverage(lg, scores, **kw)
    assert learned.fits > 0
    assert got["pair"] > 2.0 * base["pair"]
    assert got["fm_evals"] <= 1.05 * base["fm_evals"]  # no more FM work for it


def test_the_allocated_policy_spends_on_the_users_who_come_back():
    # 20 busy users (a request every 20 minutes) and 40 who come about once a day; every
    # user's top candidates by the VM are labelled, but only a busy user's come back labelled
    # within the TTL
    from solaris.replay.policies import AllocatedPolicy

    rng = np.random.default_rng(1)
    rows = []
    for t in range(0, 2 * 86400, 1200):
        for u in range(60):
            if u >= 20 and (t // 1200 + u) % 72:
                continue
            items = rng.permutation(80)[:20]
            rows.append((u, t, items.tolist(), (items < 8).tolist()))
    rows.sort(key=lambda r: (r[1], r[0]))
    lg = request_log(rows)
    scores = np.where(lg.candidates < 8, 0.8, 0.2) + 0.01 * rng.random(lg.candidates.shape)
    kw = dict(fraction=0.1, horizon_s=0.0, read_ttl_s=4 * 3600.0, lag_s=300.0, tick_s=60.0,
              budget_per_hour=0.0)
    per_request = simulate_pair_coverage(lg, scores, policy=LearnedPolicy(
        read_ttl_s=4 * 3600.0, lag_s=300.0, refit_s=3600.0), **kw)
    alloc = AllocatedPolicy(read_ttl_s=4 * 3600.0, lag_s=300.0, refit_s=3600.0)
    got = simulate_pair_coverage(lg, scores, policy=alloc, **kw)
    assert alloc.fits > 0
    # more of what is labelled later, for fewer FM evaluations
    assert got["pair"] > per_request["pair"] + 0.02
    assert got["fm_evals"] < 0.8 * per_request["fm_evals"]


def test_policy_curves_and_coverage_at_equal_cost(tmp_path):
    from solaris.replay.coverage import cost_at_coverage, coverage_at_cost, policy_curves
    from solaris.replay.plots import policy_cost_plot

    curve = [{"fm_evals": 100, "pair": 0.1}, {"fm_evals": 300, "pair": 0.2}]
    assert coverage_at_cost(curve, 200) == pytest.approx(0.15)
    assert coverage_at_cost(curve, 100) == pytest.approx(0.1)
    assert coverage_at_cost(curve, 99) is None and coverage_at_cost(curve, 301) is None
    assert cost_at_coverage(curve, 0.15) == pytest.approx(200.0)
    assert cost_at_coverage(curve, 0.25) is None and cost_at_coverage(curve, 0.05) is None
    lg = request_log([(0, 0, [1, 2, 3], None), (0, 50, [1, 2, 3], None),
                      (1, 60, [1, 4, 5], None), (0, 90, [2, 3, 4], None)])
    scores = np.tile([0.9, 0.5, 0.1], (4, 1))
    kw = dict(horizon_s=0.0, read_ttl_s=100.0, lag_s=0.0, tick_s=10.0, budget_per_hour=0.0)
    curves = policy_curves(lg, scores, {
        "verifier": VerifierPolicy,
        "oracle": lambda: OraclePolicy.from_log(lg, read_ttl_s=100.0, lag_s=0.0)},
        (0.3, 1.0), **kw)
    assert [p["fraction"] for p in curves["verifier"]] == [0.3, 1.0]
    assert [p["fraction"] for p in curves["oracle"]] == [0.0]  # its cost is its own
    full = curves["verifier"][1]
    assert full["fm_evals"] == simulate_pair_coverage(lg, scores, fraction=1.0, **kw)["fm_evals"]
    assert full["fm_evals_per_1k"] == pytest.approx(1000.0 * full["fm_evals"] / 4)
    # the oracle computes only what is read, and reaches the ceiling here
    assert curves["oracle"][0]["pair"] == pytest.approx(coverage_ceiling(lg, 100.0, 0.0))
    assert curves["oracle"][0]["fm_evals"] <= full["fm_evals"]
    png = policy_cost_plot({"a": curves, "b": curves}, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_learned_policy_keeps_bounded_state_with_the_same_features() -> None:
    """Its per-user request times and per-item label times are pruned by time; the features
    that read them (requests in the TTL, time since the last, labels of the last day) are
    those of the whole stream."""
    rng = np.random.default_rng(5)
    ttl, lag = 3600.0, 300.0
    pol = LearnedPolicy(read_ttl_s=ttl, lag_s=lag)
    ts, seen_req, seen_lab = 0.0, {}, {}
    cols = {name: FEATURES.index(name) for name in ("user_requests", "since_user_request",
                                                   "item_labels_day")}
    for _ in range(400):
        ts += float(rng.choice([0.0, 60.0, 900.0, 5000.0, 40000.0]))
        user = int(rng.integers(0, 4))
        items = rng.choice(30, size=6, replace=False).astype(np.int64)
        req = Candidates(user, ts, items, rng.random(6), rng.random(6) < 0.3)
        x = pol.features(req)
        past = [t for t in seen_req.get(user, []) if t < ts]
        recent = sum(1 for t in past if ts - t <= ttl)
        last = ts - past[-1] if past else 1e7
        assert np.allclose(x[:, cols["user_requests"]], np.log1p(recent))
        assert np.allclose(x[:, cols["since_user_request"]], np.log1p(min(last, 1e7)))
        day = [sum(1 for t in seen_lab.get(int(it), []) if ts - 86400 <= t <= ts - lag)
               for it in items]
        assert np.allclose(x[:, cols["item_labels_day"]], np.log1p(day))
        pol.observe(req)
        seen_req.setdefault(user, []).append(ts)
        for it in items[req.labelled]:
            seen_lab.setdefault(int(it), []).append(ts)
    assert max(len(v) for v in pol.user_ts.values()) < max(len(v) for v in seen_req.values())
    assert all(v[-1] - v[0] <= 86400 for v in pol.item_labels.values())


def test_fit_logistic_recovers_a_planted_model_and_leaves_a_constant_feature_at_zero():
    from solaris.replay.policies import fit_logistic, predict_logistic

    rng = np.random.default_rng(3)
    X = np.column_stack([rng.normal(2.0, 3.0, 20000), rng.normal(size=20000),
                         np.full(20000, 7.0)])
    z = 0.5 * (X[:, 0] - 2.0) / 3.0 - 1.0 * X[:, 1] - 0.3  # in standardised units
    y = (rng.random(20000) < 1.0 / (1.0 + np.exp(-z))).astype(float)
    w, mu, sd = fit_logistic(X, y)
    assert w[:2] == pytest.approx([0.5, -1.0], abs=0.06)
    assert w[2] == 0.0 and sd[2] == 1.0  # the constant feature: no weight, no blow-up
    assert w[3] == pytest.approx(-0.3, abs=0.06)
    p = predict_logistic(X, w, mu, sd)
    assert p.shape == (20000,) and np.all((p > 0) & (p < 1))
    assert np.corrcoef(p, 1.0 / (1.0 + np.exp(-z)))[0, 1] > 0.99


def test_the_hindsight_bound_ranks_with_the_learned_features_fitted_in_sample():
    from solaris.replay.policies import HindsightPolicy

    lg, scores = _hot_items_log()
    ttl, lag = 3600.0, 300.0
    hind = HindsightPolicy.from_log(lg, scores, ttl, lag)
    assert hind.prob.shape == lg.candidates.shape
    # in sample it learns what a pair labelled before says: hot pairs rank above the rest
    hot = lg.candidates < 6
    assert hind.prob[hot].min() > np.median(hind.prob[~hot])
    kw = dict(horizon_s=0.0, read_ttl_s=ttl, lag_s=lag, tick_s=60.0, budget_per_hour=0.0)
    # allocated over the whole log: the top fraction of all its candidates
    bets = {}

    class Spy(HindsightPolicy):
        def rank(self, req, fraction):
            top, prio = super().rank(req, fraction)
            bets[len(bets)] = top
            assert np.all(np.diff(prio) <= 0)  # best bet first
            return top, prio

    spy = Spy(hind.prob, hind.users, hind.ts)
    got = simulate_pair_coverage(lg, scores, fraction=0.1, policy=spy, **kw)
    n = lg.candidates.size
    thr = np.sort(hind.prob, axis=None)[n - top_count(n, 0.1)]
    assert sum(len(b) for b in bets.values()) == int((hind.prob >= thr).sum())
    learned = simulate_pair_coverage(lg, scores, fraction=0.1, policy=LearnedPolicy(
        read_ttl_s=ttl, lag_s=lag, refit_s=3600.0), **kw)
    assert got["pair"] >= learned["pair"]  # foresight of its own outcomes does no worse
    assert got["fm_evals"] <= 1.05 * learned["fm_evals"]


def test_the_hindsight_bound_refuses_a_request_of_another_log():
    from solaris.errors import RequestError
    from solaris.replay.policies import HindsightPolicy

    lg, scores = _hot_items_log()
    hind = HindsightPolicy.from_log(lg, scores, 3600.0, 300.0)
    first = _req(int(lg.user[0]), float(lg.ts[0]), lg.candidates[0], scores[0])
    hind.rank(first, 0.2)
    with pytest.raises(RequestError, match="not the next request"):
        hind.rank(first, 0.2)  # the same request again: not the log's next
    with pytest.raises(RequestError, match=r"scores: shape"):
        HindsightPolicy.from_log(lg, scores[:, :3], 3600.0, 300.0)
