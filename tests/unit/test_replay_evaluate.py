"""Re-scoring the replay's feature log: tier masks, the tier-aware start, TR halves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from solaris.config import VMConfig
from solaris.data.schema import FeatureSpec
from solaris.models.vm import VerticalModel
from solaris.replay.evaluate import ServedRows, _tiers_start_as_pair, halves, transfer
from solaris.tiers import Tier

D = 4


def _rows(n: int = 6) -> ServedRows:
    rng = np.random.default_rng(0)
    tier = np.array([Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR, Tier.NONE, Tier.PAIR,
                     Tier.ITEM_NEIGHBOUR])[:n]
    emb = rng.normal(size=(n, D)).astype(np.float32) * (tier != Tier.NONE)[:, None]
    return ServedRows(req=np.repeat(np.arange(3), 2)[:n], ts=np.repeat([10., 20., 30.], 2)[:n],
                      user=np.zeros(n, np.int64), item=np.arange(n), surface=np.zeros(n, np.int64),
                      y=np.array([1, 0, 1, 0, 1, 0.])[:n], score=np.full(n, 0.5),
                      tier=tier, age_s=np.full(n, 60.0) * (tier != Tier.NONE), pair_emb=emb,
                      agg_emb=np.ones((n, D), np.float32), agg_present=np.ones(n, bool))


def test_slots_keep_only_the_tiers_switched_on() -> None:
    rows = _rows()
    z = rows.slots(np.arange(6), tiers={Tier.PAIR, Tier.USER_NEIGHBOUR}, agg=False)
    assert z.pair_tier.tolist() == [1, 2, 0, 0, 1, 0]
    assert not z.pair_emb[[2, 3, 5]].any() and (z.pair_age_s[[2, 5]] == 0).all()
    assert not z.agg_present.any() and not z.agg_emb.any()
    real = np.full((6, D), 7.0)
    full = rows.slots(np.arange(6), pair=real)
    assert full.pair_present.all() and (full.pair_tier == Tier.PAIR).all()
    assert (full.pair_emb == 7.0).all() and (full.pair_age_s == 0).all()


def test_a_tier_aware_copy_starts_out_scoring_like_the_offline_vm() -> None:
    torch.manual_seed(0)
    vm = VerticalModel(VMConfig(use_pair=True, use_agg=True), FeatureSpec(), 3, 5, D).eval()
    n = 4
    base = {"user": torch.zeros(n, dtype=torch.long), "item": torch.arange(n),
            "surface": torch.zeros(n, dtype=torch.long),
            "user_cat": torch.zeros(n, 0, dtype=torch.long),
            "item_cat": torch.zeros(n, 0, dtype=torch.long), "item_cont": torch.zeros(n, 0),
            "pair_emb": torch.randn(n, D), "pair_present": torch.ones(n),
            "agg_emb": torch.randn(n, D), "agg_present": torch.ones(n)}
    as_pair = {**base, "pair_tier": torch.full((n,), Tier.PAIR), "pair_age": torch.zeros(n)}
    served = {**base, "pair_tier": torch.tensor([1, 2, 3, 2]), "pair_age": torch.rand(n)}
    with torch.no_grad():
        before = vm(as_pair)
        assert not torch.allclose(vm(served), before)  # untrained tier/age weights matter
        _tiers_start_as_pair(vm)
        assert torch.allclose(vm(served), before, atol=1e-6)


def test_halves_split_by_request_time_and_transfer_uses_the_second() -> None:
    rows = _rows()
    first, second = halves(rows)
    assert first.tolist() == [True, True, False, False, False, False]  # ts < median 20
    assert (second == ~first).all()
    y = np.array([1, 0, 1, 0, 1, 0.] * 20)
    f = np.arange(120) < 60
    p_vm, p_fm = np.full(120, 0.5), np.where(y == 1, 0.8, 0.2)
    r = transfer(y, p_vm, p_fm, p_fm, f, ~f)  # X as good as the FM: TR 1
    assert abs(r["tr_raw"] - 1.0) < 1e-9 and abs(r["tr_cal"] - 1.0) < 1e-9


def _world(n_req: int = 600, per: int = 8, seed: int = 0):
    """Rows of ``n_req`` requests: a truth, an FM close to it, a VM alone far from it, and a
    served VM that moved part of the way on a fifth of the rows (miscalibrated, as models are)."""
    rng = np.random.default_rng(seed)
    req = np.repeat(np.arange(n_req), per)
    n = len(req)
    signal = rng.normal(0, 1.2, n)
    truth = 1 / (1 + np.exp(-(signal - 1.0)))
    y = (rng.random(n) < truth).astype(np.float64)
    p_vm = 1 / (1 + np.exp(-(0.4 * signal + 0.5 * rng.normal(0, 1, n) - 0.7)))
    p_fm = 1 / (1 + np.exp(-(1.3 * (signal + 0.3 * rng.normal(0, 1, n)) - 1.1)))
    present = rng.random(n) < 0.2
    p_x = np.where(present, 1 / (1 + np.exp(-(0.5 * np.log(p_vm / (1 - p_vm))
                                               + 0.5 * np.log(p_fm / (1 - p_fm))))), p_vm)
    first = req < n_req // 2
    return y, p_vm, p_x, p_fm, first, req


def test_crossfit_tr_measures_both_halves_with_the_fit_of_the_other() -> None:
    from solaris.eval import metrics as M
    from solaris.replay.evaluate import crossfit_tr

    y, p_vm, p_x, p_fm, first, _ = _world()
    gain = gap = 0.0
    for fit in (first, ~first):  # by hand
        ev = ~fit
        c = {k: M.bce_rows(y[ev], M.apply_platt(p[ev], M.fit_platt(y[fit], p[fit])))
             for k, p in (("vm", p_vm), ("x", p_x), ("fm", p_fm))}
        gain += (c["vm"] - c["x"]).sum()
        gap += (c["vm"] - c["fm"]).sum()
    tr = crossfit_tr(y, p_vm, p_x, p_fm, first)
    assert tr == pytest.approx(gain / gap, rel=1e-12)
    assert 0.0 < tr < 1.0
    # the ends of the scale: nothing moved, or the FM itself served
    assert crossfit_tr(y, p_vm, p_vm, p_fm, first) == 0.0
    assert crossfit_tr(y, p_vm, p_fm, p_fm, first) == pytest.approx(1.0)
    # the halves enter symmetrically, and a one-sided split has nothing to measure
    assert crossfit_tr(y, p_vm, p_x, p_fm, ~first) == pytest.approx(tr, rel=1e-12)
    assert np.isnan(crossfit_tr(y, p_vm, p_x, p_fm, np.ones_like(first)))
    # no FM edge: no ratio
    assert np.isnan(crossfit_tr(y, p_vm, p_x, p_vm, first))


def test_crossfit_tr_is_steadier_than_one_half_over_requests() -> None:
    from solaris.replay.evaluate import calibrated_tr_ci, transfer

    y, p_vm, p_x, p_fm, first, req = _world()
    one = calibrated_tr_ci(y, p_vm, p_x, p_fm, first, req, 200, seed=1)
    both = calibrated_tr_ci(y, p_vm, p_x, p_fm, first, req, 200, seed=1, crossfit=True)
    assert one["draws"] == both["draws"] == 200
    # the same estimand: each interval holds the other's point estimate
    from solaris.replay.evaluate import crossfit_tr

    t_one = transfer(y, p_vm, p_x, p_fm, first, ~first)["tr_cal"]
    t_both = crossfit_tr(y, p_vm, p_x, p_fm, first)
    assert one["ci"][0] <= t_both <= one["ci"][1]
    assert both["ci"][0] <= t_one <= both["ci"][1]
    # measuring twice the rows: a clearly smaller spread over the same resamples
    assert both["sd"] < 0.85 * one["sd"]
    assert both["ci"][1] - both["ci"][0] < one["ci"][1] - one["ci"][0]
    # too few usable resamples: no interval rather than a made-up one
    assert calibrated_tr_ci(y, p_vm, p_x, p_fm, np.ones_like(first), req, 20) is None


def test_gain_per_row_splits_each_sides_gain_by_presence() -> None:
    from solaris.eval import metrics as M
    from solaris.replay.evaluate import gain_per_row

    y, p_vm, p_x, p_fm, _, _ = _world()
    present = p_x != p_vm
    g = gain_per_row(y, p_vm, p_x, p_fm, present)
    la = M.bce_rows(y, p_vm)
    assert g["fm"]["present"] == pytest.approx((la - M.bce_rows(y, p_fm))[present].mean())
    assert g["fm"]["missing"] == pytest.approx((la - M.bce_rows(y, p_fm))[~present].mean())
    assert g["served"]["present"] == pytest.approx((la - M.bce_rows(y, p_x))[present].mean())
    assert g["served"]["missing"] == 0.0  # the VM alone's own scores there
    none = gain_per_row(y, p_vm, p_x, p_fm, np.zeros(len(y), bool))
    assert none["fm"]["present"] is None and none["served"]["present"] is None


def test_within_bar_share_counts_draws_inside_the_prediction_bar() -> None:
    from solaris.replay.evaluate import tr_tolerance, within_bar_share

    assert tr_tolerance(0.05) == 0.03 and tr_tolerance(-0.5) == pytest.approx(0.15)
    # around 0.05 the bar is 0.03: 0.021 and 0.079 inside, 0.081 and 0.0 outside
    draws = np.array([0.05, 0.021, 0.079, 0.081, 0.0])
    assert within_bar_share(draws, 0.05) == pytest.approx(3 / 5)
    # around 0.5 it is 0.15 wide
    assert within_bar_share(np.array([0.36, 0.64, 0.7]), 0.5) == pytest.approx(2 / 3)
    assert within_bar_share(draws, float("nan")) is None
    assert within_bar_share(np.zeros(0), 0.05) is None


class _StrengthScorer:
    """A scorer whose probability of row ``item`` is 0.5 + (y - 0.5) * s, s by what is served:
    the own pair 0.6, a user neighbour 0.3, an item neighbour 0.15, the aggregate alone 0.1,
    nothing 0 -- so each row's BCE is -log(0.5 + s / 2) whatever its label."""

    S = {Tier.PAIR: 0.6, Tier.USER_NEIGHBOUR: 0.3, Tier.ITEM_NEIGHBOUR: 0.15}

    def __init__(self, y: np.ndarray):
        self.y = y

    def score(self, reqs):
        out = []
        for r in reqs:
            z = r.slots
            s = np.array([self.S.get(Tier(int(t)), 0.0) if p else (0.1 if a else 0.0)
                          for t, p, a in zip(z.pair_tier, z.pair_present, z.agg_present)])
            out.append(0.5 + (self.y[r.items] - 0.5) * s)
        return out


def _four_tier_rows(n_req: int, seed: int) -> tuple[int, ServedRows, np.random.Generator]:
    """``n_req`` requests of four rows each: a pair, a user neighbour, an item neighbour and
    nothing in the pair slot, the aggregate everywhere; labels Bernoulli(0.3)."""
    per = 4
    n = n_req * per
    rng = np.random.default_rng(seed)
    tier = np.tile([Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR, Tier.NONE], n_req)
    rows = ServedRows(req=np.repeat(np.arange(n_req), per),
                      ts=np.repeat(np.arange(n_req, dtype=np.float64), per),
                      user=np.zeros(n, np.int64), item=np.arange(n),
                      surface=np.zeros(n, np.int64), y=(rng.random(n) < 0.3).astype(float),
                      score=np.full(n, 0.5), tier=tier.astype(np.int64),
                      age_s=np.zeros(n), pair_emb=np.ones((n, D), np.float32),
                      agg_emb=np.ones((n, D), np.float32), agg_present=np.ones(n, bool))
    return n, rows, rng


def test_tier_worth_is_each_input_s_share_of_the_real_pair_s_gain() -> None:
    from solaris.replay.evaluate import tier_worth

    n_req = 240
    n, rows, _ = _four_tier_rows(n_req, 3)
    w = tier_worth(_StrengthScorer(rows.y), rows, np.ones((n, D), np.float32), resamples=50)

    def loss(s: float) -> float:
        return -np.log(0.5 + s / 2)

    want = {"user_neighbour": (loss(0.1) - loss(0.3)) / (loss(0.1) - loss(0.6)),
            "item_neighbour": (loss(0.1) - loss(0.15)) / (loss(0.1) - loss(0.6)),
            "aggregate": (loss(0.0) - loss(0.1)) / (loss(0.0) - loss(0.6))}
    for name, v in want.items():
        rec = w[name]
        assert rec["rows"] == n_req and rec["share"] == pytest.approx(0.25)
        assert rec["raw"]["worth"] == pytest.approx(v, rel=1e-9) == rec["worth"]
        lo, hi = rec["raw"]["worth_ci"]
        assert lo == pytest.approx(v, rel=1e-9) and hi == pytest.approx(v, rel=1e-9)
        assert rec["raw"]["real_gain_ci"][0] > 0
        assert rec["calibrated"]["rows"] == n_req // 2  # the second half's rows
    few = tier_worth(_StrengthScorer(rows.y), rows, np.ones((n, D), np.float32),
                     resamples=10, min_rows=n_req + 1)
    assert few["aggregate"]["worth"] is None and few["aggregate"]["rows"] == n_req


def test_an_input_that_changes_nothing_is_worth_exactly_nothing_calibrated_too() -> None:
    """A user neighbour served at scale 0 scores as if absent: its worth is 0 raw and
    calibrated (each arm differs from the served scores on the input's rows alone, so the
    calibrators cannot differ through the other rows)."""
    from solaris.replay.evaluate import tier_worth

    class Inert(_StrengthScorer):
        S = {Tier.PAIR: 0.6, Tier.USER_NEIGHBOUR: 0.1, Tier.ITEM_NEIGHBOUR: 0.15}  # 0.1: as absent

    n_req = 240
    n, rows, rng = _four_tier_rows(n_req, 5)
    # the scorer believes labels with a quarter flipped: informative, not separable (a Platt
    # fit on separable scores goes to certainty and every calibrated loss to 0)
    belief = np.where(rng.random(n) < 0.25, 1.0 - rows.y, rows.y)
    w = tier_worth(Inert(belief), rows, np.ones((n, D), np.float32), resamples=20)
    un = w["user_neighbour"]
    assert un["raw"]["worth"] == 0.0 and un["raw"]["real_gain"] > 0
    assert un["calibrated"]["worth"] == 0.0 and un["calibrated"]["real_gain"] > 0
    assert w["item_neighbour"]["calibrated"]["worth"] > 0  # an input that gains still shows it
