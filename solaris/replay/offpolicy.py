"""Off-policy estimates of another ranker's clicks from a log with propensities.

A logged request showed the logging policy's top ``k`` plus ``e`` exploration slots drawn
uniformly from the ranks below (``closed_loop.choose_shown``), each shown item with its
propensity: 1 for the top slots, the chance of the draw for an exploration slot. Another
ranker (the *target*: SOLARIS, or the FM inline) would show its own top ``k`` plus ``e``
uniform draws from its ranks below, so item ``j`` of request ``i`` is shown by it with chance

    pi_t(i, j) = 1 if j is in the target's top k, else e / (C - k).

Where clicks add over the shown items (an item's click probability does not depend on what
else the request shows, as in both ground truths here), the target's expected clicks per
request are estimated from the logged shown items alone with weights
``w = pi_t / propensity``:

* IPS: ``mean_i sum_j w_ij y_ij`` (unbiased, high variance);
* SNIPS (self-normalised): ``(k + e) * sum w y / sum w`` -- the weights' sum over the log has
  expectation ``(k + e)`` per request, so dividing by it trades a small bias for much less
  variance.

The click lift of a target is its estimate minus the logged policy's own realised clicks;
``click_lift`` = (SOLARIS - logged) / (FM - logged). Intervals: bootstrap over requests, one
draw shared by every target. What a log cannot show: a target's effect through its own later
history (what it shows feeds back into later requests); the estimate is of the target ranking
the logged requests as they were.

numpy only; no Ray.
"""

from __future__ import annotations

import functools

import numpy as np

from solaris.eval.metrics import point_ci


def target_exposure(scores: np.ndarray, pos: np.ndarray, shown: int, explore: int
                    ) -> np.ndarray:
    """(R, S) the chance that a target ranking by ``scores`` (R, C) shows each logged item at
    positions ``pos`` (R, S): 1 in its top ``shown`` (ties: earlier position, as
    ``choose_shown``), else ``explore / (C - shown)``."""
    scores = np.asarray(scores, np.float64)
    r, c = scores.shape
    order = np.argsort(-scores, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(c)[None, :].repeat(r, 0), axis=1)
    top = np.take_along_axis(rank, pos, axis=1) < shown
    below = explore / max(c - shown, 1)
    return np.where(top, 1.0, below)


def counterfactual_clicks(scores: np.ndarray, p_true: np.ndarray, shown: int, explore: int
                          ) -> np.ndarray:
    """(R,) what the estimates estimate, where the truth is known: the expected clicks a
    ranking by ``scores`` (R, C) earns on requests whose candidates' true click probabilities
    are ``p_true`` (R, C) -- its top ``shown`` plus ``explore`` times the mean of the ranks
    below (ties: earlier position)."""
    order = np.argsort(-np.asarray(scores, np.float64), axis=1, kind="stable")
    ranked = np.take_along_axis(np.asarray(p_true, np.float64), order, axis=1)
    below = ranked[:, shown:]
    return ranked[:, :shown].sum(1) + (explore * below.mean(1) if below.shape[1] else 0.0)


def estimate_clicks(y: np.ndarray, propensity: np.ndarray, exposure: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """Per request (R,): the IPS terms ``sum_j w y`` and the weights' sums ``sum_j w`` (SNIPS
    is ``slots * sum(terms) / sum(weights)`` over any set of requests)."""
    w = exposure / propensity
    return {"ips": (w * y).sum(1), "weight": w.sum(1)}


def _snips(ips: np.ndarray, weight: np.ndarray, slots: int) -> float:
    s = weight.sum()
    return float(slots * ips.sum() / s) if s > 0 else float("nan")


def off_policy_lift(y: np.ndarray, pos: np.ndarray, propensity: np.ndarray,
                    targets: dict[str, np.ndarray], shown: int, explore: int,
                    resamples: int = 2000, alpha: float = 0.05, seed: int = 0) -> dict:
    """The off-policy estimates of each target's clicks per request and its gain over the
    logged policy (IPS and SNIPS, bootstrap intervals over requests), and where both
    ``solaris`` and ``fm`` are targets, ``click_lift`` = gain(solaris) / gain(fm).

    ``y`` (R, S) the logged clicks of the shown items at positions ``pos`` with their
    ``propensity``; ``targets``: name -> (R, C) scores of every candidate."""
    y = np.asarray(y, np.float64)
    r = len(y)
    slots = shown + explore
    logged = y.sum(1)
    exposure = {t: target_exposure(s, pos, shown, explore) for t, s in targets.items()}
    parts = {t: estimate_clicks(y, propensity, e) for t, e in exposure.items()}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, r, size=(resamples, r))

    summ = functools.partial(point_ci, alpha=alpha)

    out: dict = {"logged_clicks_per_request": float(logged.mean()), "requests": r,
                 "targets": {}}
    boot_logged = logged[idx].mean(1)
    gains = {}
    for t, p in parts.items():
        ips_pt = float(p["ips"].mean())
        snips_pt = _snips(p["ips"], p["weight"], slots)
        b_ips = p["ips"][idx].mean(1)
        b_snips = slots * p["ips"][idx].sum(1) / p["weight"][idx].sum(1)
        gains[t] = (snips_pt - float(logged.mean()), b_snips - boot_logged)
        out["targets"][t] = {
            "ips": summ(ips_pt, b_ips), "snips": summ(snips_pt, b_snips),
            "gain_ips": summ(ips_pt - float(logged.mean()), b_ips - boot_logged),
            "gain_snips": summ(*gains[t]),
            "mean_weight_per_slot": float(p["weight"].mean() / slots),
            "explored_differently": int(((propensity < 1) & (exposure[t] == 1)).sum())}
    if "solaris" in gains and "fm" in gains:
        with np.errstate(divide="ignore", invalid="ignore"):
            out["click_lift_snips"] = summ(
                np.float64(gains["solaris"][0]) / np.float64(gains["fm"][0]),
                gains["solaris"][1] / gains["fm"][1])
    return out
