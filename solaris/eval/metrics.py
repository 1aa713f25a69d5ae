"""Metrics reported the same way everywhere (DESIGN.md, "Numbers everyone reports")."""

from __future__ import annotations

import numpy as np

_EPS = 1e-7


def _check(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64).ravel()
    p = np.asarray(p, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} differ in shape")
    if not np.isfinite(p).all():
        raise ValueError("predictions contain NaN or inf")
    return y, p


def bce_rows(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per-row binary cross-entropy of probabilities ``p`` for labels ``y``."""
    y, p = _check(y, p)
    p = np.clip(p, _EPS, 1 - _EPS)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def bce(y: np.ndarray, p: np.ndarray) -> float:
    return float(bce_rows(y, p).mean())


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """ROC AUC by the rank-sum formula, ties counted half (NaN if one class is absent)."""
    y, p = _check(y, p)
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p), dtype=np.float64)
    sp = p[order]
    # average rank over ties
    boundaries = np.flatnonzero(np.diff(sp)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(p)]])
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives exactly 0
        return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def fit_platt(y: np.ndarray, p: np.ndarray, iters: int = 50) -> tuple[float, float]:
    """Platt scaling a * logit(p) + b fitted by Newton's method (on validation rows only)."""
    y, p = _check(y, p)
    return fit_platt_logits(y, logit(p), iters)


def fit_platt_logits(y: np.ndarray, x: np.ndarray, iters: int = 50) -> tuple[float, float]:
    """``fit_platt`` on logits ``x`` (N,) directly: (a, b) minimising BCE(y, sigmoid(a x + b))."""
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if y.shape != x.shape or not np.isfinite(x).all():
        raise ValueError(f"logits: need finite values of shape {y.shape}, got {x.shape}")
    a, b = 1.0, 0.0
    for _ in range(iters):
        q = sigmoid(a * x + b)
        g = np.array([((q - y) * x).sum(), (q - y).sum()])
        w = q * (1 - q)
        h = np.array([[(w * x * x).sum(), (w * x).sum()], [(w * x).sum(), w.sum()]])
        h += 1e-9 * np.eye(2)
        step = np.linalg.solve(h, g)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-10:
            break
    return float(a), float(b)


def point_ci(point: float, draws: np.ndarray, alpha: float = 0.05) -> dict:
    """{"point", "ci": [lo, hi]}: a figure and the percentile interval of its bootstrap
    ``draws`` (non-finite draws dropped; a non-finite point or no finite draw gives None)."""
    d = np.asarray(draws, np.float64)
    d = d[np.isfinite(d)]
    lo, hi = 100 * alpha / 2, 100 * (1 - alpha / 2)
    return {"point": float(point) if np.isfinite(point) else None,
            "ci": [float(np.percentile(d, lo)), float(np.percentile(d, hi))] if len(d)
            else None}


def platt_slope_ci(y: np.ndarray, p: np.ndarray, resamples: int = 200, alpha: float = 0.05,
                   seed: int = 0) -> dict[str, float]:
    """Platt's slope of the label on logit(p) (1: calibrated; < 1: overconfident) with a
    percentile bootstrap interval over rows: {"slope", "ci_low", "ci_high"}."""
    y, p = _check(y, p)
    x = logit(p)
    rng = np.random.default_rng(seed)
    draws = np.array([fit_platt_logits(y[i], x[i])[0]
                      for i in (rng.integers(0, len(y), len(y)) for _ in range(resamples))])
    lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    return {"slope": fit_platt_logits(y, x)[0], "ci_low": float(lo), "ci_high": float(hi)}


def calibrated_slope_band(y: np.ndarray, p: np.ndarray, draws: int = 200, alpha: float = 0.05,
                          seed: int = 0, bar: tuple[float, float] = (0.9, 1.1)) -> dict:
    """What the slope of ``platt_slope_ci`` would be on these rows if ``p`` were perfectly
    calibrated: labels drawn ``Bernoulli(p)`` ``draws`` times, Platt's slope fitted on each.
    On a few hundred rows a calibrated model's slope spreads far beyond 0.9-1.1, so a slope
    outside a fixed bar says little by itself; outside this band it says miscalibration.
    Returns {"ci_low", "ci_high"} (the band), "p_value" (two-sided: the share of calibrated
    draws at least as far out as the observed slope, doubled), "consistent" (p_value >=
    alpha) and "bar_share" (how often a calibrated model lands inside ``bar``)."""
    y, p = _check(y, p)
    x = logit(p)
    rng = np.random.default_rng(seed)
    s = np.array([fit_platt_logits((rng.random(len(p)) < p).astype(np.float64), x)[0]
                  for _ in range(draws)])
    obs = fit_platt_logits(y, x)[0]
    lo, hi = np.quantile(s, [alpha / 2, 1 - alpha / 2])
    pv = float(min(1.0, 2 * min((s <= obs).mean(), (s >= obs).mean())))
    return {"ci_low": float(lo), "ci_high": float(hi), "p_value": pv,
            "consistent": bool(pv >= alpha),
            "bar_share": float(((s >= bar[0]) & (s <= bar[1])).mean())}


def apply_platt(p: np.ndarray, ab: tuple[float, float]) -> np.ndarray:
    return sigmoid(ab[0] * logit(p) + ab[1])


def transfer_ratio(bce_vm: float, bce_vm_x: float, bce_fm: float) -> float:
    """TR(X) = (BCE(VM) - BCE(VM+X)) / (BCE(VM) - BCE(FM)); NaN when there is no gap."""
    gap = bce_vm - bce_fm
    if gap <= 0:
        return float("nan")
    return float((bce_vm - bce_vm_x) / gap)


def paired_bootstrap(loss_a: np.ndarray, loss_b: np.ndarray, resamples: int, alpha: float,
                     seed: int = 0) -> dict[str, float]:
    """Bootstrap over rows of mean(loss_a - loss_b): CI and whether it excludes zero (a > b)."""
    d = np.asarray(loss_a, dtype=np.float64) - np.asarray(loss_b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    n = len(d)
    means = np.empty(resamples)
    for k in range(resamples):
        means[k] = d[rng.integers(0, n, n)].mean()
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return {"mean_diff": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi),
            "significant": bool(lo > 0)}


def tr_bootstrap(loss_vm: np.ndarray, loss_x: np.ndarray, loss_fm: np.ndarray, resamples: int,
                 alpha: float, seed: int = 0) -> dict[str, float]:
    """Paired bootstrap of TR over seeds and rows: each resample draws seeds and rows with
    replacement, the same draws for all three predictors, and computes TR from the seed-mean
    BCEs. ``loss_*`` are per-row losses, (S, N) (one row per seed) or (N,)."""
    a, x, f = (np.atleast_2d(np.asarray(v, np.float64)) for v in (loss_vm, loss_x, loss_fm))
    s, n = a.shape
    rng = np.random.default_rng(seed)
    trs = np.empty(resamples)
    for k in range(resamples):
        si = rng.integers(0, s, s)
        ri = rng.integers(0, n, n)
        trs[k] = transfer_ratio(a[si][:, ri].mean(), x[si][:, ri].mean(), f[si][:, ri].mean())
    ok = trs[np.isfinite(trs)]
    lo, hi = np.quantile(ok, [alpha / 2, 1 - alpha / 2]) if len(ok) else (np.nan, np.nan)
    return {"tr": transfer_ratio(a.mean(), x.mean(), f.mean()), "ci_low": float(lo),
            "ci_high": float(hi), "finite_share": float(len(ok) / resamples)}


def tr_step_bootstrap(loss_vm: np.ndarray, loss_from: np.ndarray, loss_to: np.ndarray,
                      loss_fm: np.ndarray, resamples: int, alpha: float, seed: int = 0
                      ) -> dict[str, float]:
    """What one step adds to TR: (BCE(from) - BCE(to)) / (BCE(VM) - BCE(FM)) = TR(to) -
    TR(from), with ``tr_bootstrap``'s paired resampling of seeds and rows (the same draws
    for all four predictors). ``loss_*``: (S, N) or (N,)."""
    a, b, x, f = (np.atleast_2d(np.asarray(v, np.float64))
                  for v in (loss_vm, loss_from, loss_to, loss_fm))
    s, n = a.shape

    def step(si: np.ndarray | slice, ri: np.ndarray | slice) -> float:
        gap = a[si][:, ri].mean() - f[si][:, ri].mean()
        return float((b[si][:, ri].mean() - x[si][:, ri].mean()) / gap) if gap > 0 \
            else float("nan")

    rng = np.random.default_rng(seed)
    vals = np.array([step(rng.integers(0, s, s), rng.integers(0, n, n))
                     for _ in range(resamples)])
    ok = vals[np.isfinite(vals)]
    lo, hi = np.quantile(ok, [alpha / 2, 1 - alpha / 2]) if len(ok) else (np.nan, np.nan)
    every = slice(None)
    return {"step": step(every, every), "ci_low": float(lo), "ci_high": float(hi),
            "finite_share": float(len(ok) / resamples)}


def clustered_se(d: np.ndarray, groups: np.ndarray | None = None) -> float:
    """Standard error of mean(d) over rows (N,); with ``groups`` (N,) the cluster-robust one:
    rows of one group (a user) are not independent draws -- the aggregate is the same vector
    on every row of a user -- so the group sums of the centred gains are the draws."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n < 2:
        return float("inf")
    if groups is None:
        return float(d.std(ddof=1) / np.sqrt(n))
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    g = int(inv.max()) + 1
    if g < 2:
        return float("inf")
    sums = np.bincount(inv, weights=d - d.mean(), minlength=g)  # (G,)
    return float(np.sqrt(g / (g - 1) * (sums ** 2).sum()) / n)
