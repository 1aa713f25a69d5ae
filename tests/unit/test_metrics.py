import numpy as np
import pytest

from solaris.eval import metrics as M


def test_auc_matches_pairwise_count():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300).astype(float)
    p = np.round(rng.random(300), 1)  # many ties
    pos, neg = p[y == 1], p[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert M.auc(y, p) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_bce_rejects_nan_and_shape_mismatch():
    with pytest.raises(ValueError, match="NaN"):
        M.bce(np.array([1.0, 0.0]), np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match="shape"):
        M.bce(np.array([1.0, 0.0]), np.array([0.5]))


def test_platt_fixes_a_miscalibrated_predictor():
    rng = np.random.default_rng(1)
    true = rng.random(20000) * 0.6 + 0.2
    y = (rng.random(20000) < true).astype(float)
    skewed = M.sigmoid(2.5 * M.logit(true) - 1.0)
    ab = M.fit_platt(y, skewed)
    assert M.bce(y, M.apply_platt(skewed, ab)) < M.bce(y, skewed) - 0.01
    assert M.bce(y, M.apply_platt(skewed, ab)) == pytest.approx(M.bce(y, true), abs=2e-3)


def test_transfer_ratio():
    assert M.transfer_ratio(0.5, 0.45, 0.4) == pytest.approx(0.5)
    assert np.isnan(M.transfer_ratio(0.4, 0.39, 0.45))  # FM worse than VM: no gap, no TR


def test_paired_bootstrap_detects_a_real_gap_only():
    rng = np.random.default_rng(2)
    a = rng.random(3000)
    assert M.paired_bootstrap(a + 0.05, a, 300, 0.05)["significant"]
    noise = rng.normal(0, 0.1, 3000)
    assert not M.paired_bootstrap(a + noise - noise.mean(), a, 300, 0.05)["significant"]


def test_platt_slope_interval_covers_the_true_slope_and_flags_overconfidence():
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.5, 6000)
    y = (rng.random(6000) < M.sigmoid(x)).astype(np.float64)
    calibrated = M.platt_slope_ci(y, M.sigmoid(x), resamples=100)
    assert calibrated["ci_low"] < 1.0 < calibrated["ci_high"]
    assert calibrated["ci_low"] <= calibrated["slope"] <= calibrated["ci_high"]
    over = M.platt_slope_ci(y, M.sigmoid(2.0 * x), resamples=100)  # logits twice too spread
    assert over["ci_high"] < 1.0 and over["slope"] == pytest.approx(0.5, abs=0.05)


def test_calibrated_slope_band_tells_noise_from_miscalibration():
    """A calibrated model's slope on a few hundred rows strays far from 1; the band says how
    far, and an overconfident model (slope 0.5) falls outside it."""
    from solaris.eval.metrics import calibrated_slope_band, sigmoid

    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, 4000)
    p = sigmoid(x)
    y = (rng.random(len(p)) < p).astype(float)
    ok = calibrated_slope_band(y, p)
    assert ok["ci_low"] < 1.0 < ok["ci_high"] and ok["consistent"]
    over = sigmoid(2.0 * x)  # scores twice as sure as the labels
    bad = calibrated_slope_band(y, over)
    assert not bad["consistent"] and bad["p_value"] < 0.01
    # fewer rows, a wider band: 300 rows rarely land inside 0.9-1.1 even when calibrated
    few = calibrated_slope_band(y[:300], p[:300])
    assert few["ci_high"] - few["ci_low"] > 2 * (ok["ci_high"] - ok["ci_low"])
    assert few["bar_share"] < 0.6 < ok["bar_share"]
    with pytest.raises(ValueError, match="shape"):
        calibrated_slope_band(y[:10], p[:11])
