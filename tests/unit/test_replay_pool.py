"""Pooled TR over seeds: exact end points, request-level draws, errors, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.eval import metrics as M
from solaris.replay.pool import (
    RunProbs,
    fit_platt_weighted,
    paired_difference,
    pooled_tr,
    pooled_tr_base_calibrated,
)


def _probs(n_req: int = 60, per_req: int = 8, seed: int = 0) -> RunProbs:
    """A run where the FM beats the VM alone and the served VM sits between them."""
    rng = np.random.default_rng(seed)
    req = np.repeat(np.arange(n_req), per_req)
    n = len(req)
    z = rng.normal(size=n) + np.repeat(rng.normal(size=n_req), per_req)
    y = (rng.random(n) < M.sigmoid(z)).astype(np.float64)
    p_fm = M.sigmoid(z + rng.normal(0, 0.3, n))
    p_alone = M.sigmoid(0.4 * z + rng.normal(0, 0.8, n))
    p_served = M.sigmoid(0.6 * z + rng.normal(0, 0.6, n))
    return RunProbs(y=y, p_alone=p_alone, p_served=p_served, p_fm=p_fm, request=req,
                    first=req < n_req // 2)


def _width(r: dict) -> float:
    return r["ci_high"] - r["ci_low"]


def test_served_equal_to_the_vm_alone_gives_zero_and_to_the_fm_one() -> None:
    runs = [_probs(seed=s) for s in range(3)]
    alone = [(a, a.copy(), f, q) for a, _, f, q in (r.losses() for r in runs)]
    r = pooled_tr(alone, 300, 0.05, 0)
    assert r["tr"] == 0.0 and r["per_seed"] == [0.0] * 3
    assert r["ci_low"] <= 0.0 <= r["ci_high"]
    fm = [(a, f.copy(), f, q) for a, _, f, q in (r.losses() for r in runs)]
    r = pooled_tr(fm, 300, 0.05, 0)
    assert r["tr"] == 1.0 and r["per_seed"] == [1.0] * 3
    assert r["ci_low"] == 1.0 == r["ci_high"]
    # base-calibrated: the VM alone's Platt map serves both, so served == alone stays 0
    same = [RunProbs(y=p.y, p_alone=p.p_alone, p_served=p.p_alone.copy(), p_fm=p.p_fm,
                     request=p.request, first=p.first) for p in runs]
    r = pooled_tr_base_calibrated(same, 100, 0.05, 0)
    assert r["tr"] == 0.0 and r["ci_low"] == 0.0 == r["ci_high"]


def test_paired_difference_of_arms_pooled_with_the_same_draws() -> None:
    runs = [_probs(seed=s) for s in range(3)]
    # the same arm against itself: exactly 0, every draw
    a = pooled_tr([p.losses() for p in runs], 200, 0.05, 0, keep_draws=True)
    b = pooled_tr([p.losses() for p in runs], 200, 0.05, 0, keep_draws=True)
    d = paired_difference(a, b, 0.05)
    assert d["diff"] == 0.0 and d["ci_low"] == 0.0 == d["ci_high"]
    assert d["per_seed"] == [0.0] * 3
    # served = the FM (TR 1) against served = the VM alone (TR 0): 1, every draw
    fm = pooled_tr([(a_, f.copy(), f, q) for a_, _, f, q in (p.losses() for p in runs)],
                   200, 0.05, 0, keep_draws=True)
    alone = pooled_tr([(a_, a_.copy(), f, q) for a_, _, f, q in (p.losses() for p in runs)],
                      200, 0.05, 0, keep_draws=True)
    d = paired_difference(fm, alone, 0.05)
    assert d["diff"] == 1.0 and d["ci_low"] == 1.0 == d["ci_high"]
    # a small change of the served score: the paired interval is far narrower than either
    # arm's own, since both arms meet the same draws
    nudged = [(a_, s_ * 0.999 + a_ * 0.001, f, q) for a_, s_, f, q in
              (p.losses() for p in runs)]
    c = pooled_tr(nudged, 200, 0.05, 0, keep_draws=True)
    d = paired_difference(c, a, 0.05)
    assert d["ci_low"] <= d["diff"] <= d["ci_high"] < 0
    assert d["ci_high"] - d["ci_low"] < 0.05 * _width(a)
    cal_a = pooled_tr_base_calibrated(runs, 50, 0.05, 0, keep_draws=True)
    cal_b = pooled_tr_base_calibrated(runs, 50, 0.05, 0, keep_draws=True)
    assert paired_difference(cal_a, cal_b, 0.05)["ci_high"] == 0.0
    with pytest.raises(Exception, match="not pooled alike"):
        paired_difference(a, pooled_tr([p.losses() for p in runs], 100, 0.05, 0,
                                       keep_draws=True), 0.05)


def test_pooled_tr_is_tr_of_the_seed_mean_bces() -> None:
    runs = [_probs(seed=s, n_req=40 + 10 * s) for s in range(3)]  # unequal row counts
    r = pooled_tr([p.losses() for p in runs], 50, 0.1, 0)
    b = np.array([[M.bce(p.y, q) for q in (p.p_alone, p.p_served, p.p_fm)] for p in runs])
    assert r["per_seed"] == pytest.approx([M.transfer_ratio(*row) for row in b], abs=1e-12)
    num, den = (b[:, 0] - b[:, 1]).sum(), (b[:, 0] - b[:, 2]).sum()
    assert r["tr"] == pytest.approx(num / den, abs=1e-12)
    assert r["tr"] == pytest.approx(M.transfer_ratio(*b.mean(0)), abs=1e-12)
    assert r["seeds"] == 3 and r["resamples"] == 50 and r["rows"] == [320, 400, 480]


def test_base_calibrated_point_matches_the_transfer_report_formula() -> None:
    runs = [_probs(seed=s) for s in range(2)]
    r = pooled_tr_base_calibrated(runs, 50, 0.05, 0)
    for p, tr in zip(runs, r["per_seed"]):
        f, s = p.first, ~p.first
        ab, fab = M.fit_platt(p.y[f], p.p_alone[f]), M.fit_platt(p.y[f], p.p_fm[f])
        b = [M.bce(p.y[s], M.apply_platt(q[s], a))
             for q, a in ((p.p_alone, ab), (p.p_served, ab), (p.p_fm, fab))]
        assert tr == M.transfer_ratio(*b)
    assert r["rows_second_half"] == [int((~p.first).sum()) for p in runs]


def test_weighted_platt_matches_a_fit_on_repeated_rows() -> None:
    p = _probs(n_req=30, per_req=10)
    rng = np.random.default_rng(1)
    w = rng.integers(0, 3, (4, len(p.y)))  # (B, N) counts
    a, b = fit_platt_weighted(M.logit(p.p_alone), p.y, w, start=(0.5, 0.1))
    for k in range(len(w)):
        idx = np.repeat(np.arange(len(p.y)), w[k])
        ref = M.fit_platt(p.y[idx], p.p_alone[idx])
        assert (a[k], b[k]) == pytest.approx(ref, abs=1e-9)


def test_the_interval_widens_with_fewer_requests() -> None:
    full = [_probs(n_req=400, seed=s).losses() for s in range(2)]
    few = [tuple(v[t[3] < 40] for v in t) for t in full]  # the first 40 requests
    wide = pooled_tr(few, 400, 0.05, 0)
    narrow = pooled_tr(full, 400, 0.05, 0)
    assert _width(wide) > 2 * _width(narrow)


def test_resampling_draws_whole_requests() -> None:
    # rows of one request share a large offset in the served loss: a draw by requests keeps
    # it whole, a draw by rows (every row its own request) averages it away
    rng = np.random.default_rng(3)
    n_req, per = 50, 20
    req = np.repeat(np.arange(n_req), per)
    a = 1.0 + 0.01 * rng.random(len(req))
    f = a - 0.5
    x = a - 0.25 + np.repeat(rng.normal(0, 0.5, n_req), per) + 0.01 * rng.random(len(req))
    cluster = pooled_tr([(a, x, f, req)], 500, 0.05, 0)
    rows = pooled_tr([(a, x, f, np.arange(len(req)))], 500, 0.05, 0)
    assert _width(cluster) > 2 * _width(rows)
    # one request's rows repeated: a draw by requests sees the same draws as with one row
    one = pooled_tr([(a[::per], x[::per], f[::per], req[::per])], 500, 0.05, 0)
    dup = pooled_tr([(np.repeat(a[::per], per), np.repeat(x[::per], per),
                      np.repeat(f[::per], per), req)], 500, 0.05, 0)
    assert (dup["ci_low"], dup["ci_high"]) == pytest.approx((one["ci_low"], one["ci_high"]),
                                                            abs=1e-12)


def test_one_request_draw_is_shared_by_every_seed() -> None:
    p = _probs(n_req=200)
    one = pooled_tr([p.losses()], 2000, 0.05, 7)
    copies = pooled_tr([p.losses()] * 3, 2000, 0.05, 7)
    assert (copies["ci_low"], copies["ci_high"]) == pytest.approx(
        (one["ci_low"], one["ci_high"]), abs=1e-12)
    assert copies["requests"] == 200
    # drawn apart, three copies look like three samples of requests: a narrower interval
    # (a seed-mean of draws with multiplicities m ~ Multinomial(3, 1/3) has sd sqrt(5/9)
    # = 0.75 of one draw's)
    apart = pooled_tr([p.losses()] * 3, 2000, 0.05, 7, share_requests=False)
    assert apart["requests"] == [200] * 3
    assert _width(apart) < 0.9 * _width(copies)


def test_a_fixed_seed_gives_the_same_interval() -> None:
    losses = [_probs(seed=s).losses() for s in range(3)]
    assert pooled_tr(losses, 200, 0.05, 11) == pooled_tr(losses, 200, 0.05, 11)
    assert pooled_tr(losses, 200, 0.05, 11)["ci_low"] != pooled_tr(losses, 200, 0.05, 12
                                                                    )["ci_low"]
    runs = [_probs(seed=s) for s in range(2)]
    assert pooled_tr_base_calibrated(runs, 64, 0.05, 3) == \
        pooled_tr_base_calibrated(runs, 64, 0.05, 3)


def test_bad_input_names_the_argument() -> None:
    a, x, f, q = _probs().losses()
    with pytest.raises(ValueError, match=r"losses: expected a non-empty list"):
        pooled_tr([], 10, 0.05, 0)
    with pytest.raises(ValueError, match=r"losses\[1\] \(loss_served\): shape \(3,\)"):
        pooled_tr([(a, x, f, q), (a, x[:3], f, q)], 10, 0.05, 0)
    with pytest.raises(ValueError, match=r"losses\[0\] \(request_id\): shape"):
        pooled_tr([(a, x, f, q[1:])], 10, 0.05, 0)
    nan = f.copy()
    nan[5] = np.nan
    with pytest.raises(ValueError, match=r"losses\[0\] \(loss_fm\): 1 NaN or inf.*row 5"):
        pooled_tr([(a, x, nan, q)], 10, 0.05, 0)
    e = np.zeros(0)
    with pytest.raises(ValueError, match=r"losses\[0\] \(loss_vm_alone\): no rows"):
        pooled_tr([(e, e, e, e.astype(int))], 10, 0.05, 0)
    with pytest.raises(ValueError, match=r"request_id\): dtype float64"):
        pooled_tr([(a, x, f, q.astype(float))], 10, 0.05, 0)
    with pytest.raises(ValueError, match=r"resamples: .* got 0"):
        pooled_tr([(a, x, f, q)], 0, 0.05, 0)
    with pytest.raises(ValueError, match=r"alpha: .* got 1.5"):
        pooled_tr([(a, x, f, q)], 10, 1.5, 0)
    p = _probs()
    kw = {k: getattr(p, k) for k in ("y", "p_alone", "p_served", "p_fm", "request", "first")}
    with pytest.raises(ValueError, match=r"RunProbs.p_fm: shape \(4,\), but RunProbs.y"):
        RunProbs(**{**kw, "p_fm": kw["p_fm"][:4]})
    bad = kw["p_served"].copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"RunProbs.p_served: 1 NaN"):
        RunProbs(**{**kw, "p_served": bad})
    over = kw["p_alone"].copy()
    over[0] = 1.5
    with pytest.raises(ValueError, match=r"RunProbs.p_alone: value 1.5 outside \[0, 1\]"):
        RunProbs(**{**kw, "p_alone": over})
    with pytest.raises(ValueError, match=r"RunProbs.first: .*both halves"):
        RunProbs(**{**kw, "first": np.ones(len(bad), bool)})
    with pytest.raises(ValueError, match=r"runs: expected a non-empty list"):
        pooled_tr_base_calibrated([], 10, 0.05, 0)
    with pytest.raises(ValueError, match=r"runs\[0\]: expected RunProbs"):
        pooled_tr_base_calibrated([p.losses()], 10, 0.05, 0)
