"""Coverage of the replay's labelled pairs (DESIGN.md, "Numbers everyone reports the same
way"): tier coverage as served, the coverage ceiling, and a key-level simulator of the
precompute schedule.

* ``coverage_by_tier`` / ``coverage_over_time``: cumulative tier shares of served rows
  (``time_bin_s``: a bin width that cuts a window into several points).
* ``coverage_ceiling``: share of labelled pairs that were a candidate of an earlier request
  of the same user within the TTL (and at least ``lag_s`` earlier): no speculation that only
  ever computes pairs it has seen as candidates can do better.
* the policies at equal FM cost, each run through ``simulate_pair_coverage``
  (``solaris/simulate/coverage.py``: the simulator training also reads).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from solaris.errors import ConfigError, DataError
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.simulate.log import RequestLog
from solaris.tiers import LABELS, Tier

LEVELS = LABELS[Tier.PAIR:]  # cumulative tier order: pair, user_neighbour, item_neighbour
SHARES = (*LEVELS, "aggregate", "effective")


def _shares(tiers: np.ndarray, aggregate: np.ndarray) -> dict[str, float]:
    n = len(tiers)
    if n == 0:
        return {**dict.fromkeys(SHARES, float("nan")), "count": 0}
    out = {top.label: float(np.count_nonzero((tiers >= Tier.PAIR) & (tiers <= top))) / n
           for top in Tier if top > Tier.NONE}  # the LEVELS, in order
    out["aggregate"] = float(np.count_nonzero(aggregate)) / n
    out["effective"] = float(np.count_nonzero((tiers > Tier.NONE) | aggregate)) / n
    out["count"] = n
    return out


def _check_tiers(tiers: np.ndarray, aggregate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(tiers)
    a = np.asarray(aggregate)
    if t.ndim != 1 or a.shape != t.shape:
        raise DataError(f"tiers / aggregate: shapes {t.shape} / {a.shape}, expected (N,) both")
    if len(t) and (t.min() < Tier.NONE or t.max() > Tier.ITEM_NEIGHBOUR):
        raise DataError(f"tiers: values must be tier codes 0..{int(Tier.ITEM_NEIGHBOUR)}")
    return t.astype(np.int64), a.astype(bool)


def coverage_by_tier(tiers: np.ndarray, aggregate: np.ndarray) -> dict:
    """Cumulative tier coverage over labelled rows.

    ``tiers`` (N,) tier codes as served, ``aggregate`` (N,) whether the aggregate slot was
    present. ``pair`` share at tier 1; ``user_neighbour`` at 1-2; ``item_neighbour`` at 1-3;
    ``aggregate`` with the aggregate; ``effective`` with any SOLARIS input; ``count`` N
    (shares are NaN when N = 0).
    """
    return _shares(*_check_tiers(tiers, aggregate))


def time_bin_s(span_s: float, rows: int, bins: int = 20, min_rows: int = 30) -> float:
    """A bin width for ``coverage_over_time`` over a window of ``span_s`` seconds holding
    ``rows`` labelled rows: the window cut into ``bins`` equal bins, fewer where a bin would
    hold under ``min_rows`` rows on average (a share of a handful of rows is noise), one
    (the whole window) at the least. The width is ``(span_s + 1) / n``, so the window's last
    event (at ``start + span_s``) falls in bin ``n - 1``, not in a bin of its own."""
    if not (math.isfinite(span_s) and span_s >= 0):
        raise ConfigError(f"span_s={span_s!r}: must be a finite number >= 0")
    if not (bins >= 1 and min_rows >= 1):
        raise ConfigError(f"bins={bins!r}, min_rows={min_rows!r}: each must be >= 1")
    n = max(1, min(int(bins), int(rows) // int(min_rows)))
    return (float(span_s) + 1.0) / n


def coverage_over_time(ts: np.ndarray, tiers: np.ndarray, aggregate: np.ndarray,
                       bin_s: float, start: float | None = None) -> dict:
    """``coverage_by_tier`` per event-time bin, for plotting.

    Bins are ``[start + k * bin_s, start + (k + 1) * bin_s)`` (``start`` defaults to the first
    ts). Returns ``t`` (bin starts), one array per share (NaN in empty bins), ``count`` and
    ``start``.
    """
    t, a = _check_tiers(tiers, aggregate)
    ts = np.asarray(ts, np.float64)
    if ts.shape != t.shape:
        raise DataError(f"ts: shape {ts.shape}, expected {t.shape}")
    if not bin_s > 0:
        raise ConfigError(f"bin_s={bin_s!r}: must be > 0")
    if len(ts) == 0:
        return {"t": np.zeros(0), **{k: np.zeros(0) for k in SHARES},
                "count": np.zeros(0, np.int64), "start": start}
    start = float(ts.min()) if start is None else float(start)
    b = np.floor((ts - start) / bin_s).astype(np.int64)
    if b.min() < 0:
        raise DataError(f"ts: {int((b < 0).sum())} rows before start={start}")
    nb = int(b.max()) + 1
    out = {"t": start + bin_s * np.arange(nb), **{k: np.full(nb, np.nan) for k in SHARES},
           "count": np.bincount(b, minlength=nb), "start": start}
    order = np.argsort(b, kind="stable")
    edges = np.searchsorted(b[order], np.arange(nb + 1))
    for k in range(nb):
        rows = order[edges[k]:edges[k + 1]]
        if len(rows):
            s = _shares(t[rows], a[rows])
            for name in SHARES:
                out[name][k] = s[name]
    return out


def coverage_ceiling(request_log: RequestLog, read_ttl_s: float, lag_s: float = 0.0) -> float:
    """Share of labelled pairs (user, item at request r, ts) that were a candidate of an
    earlier request of the same user at ts' with ts' < ts, ts' <= ts - lag_s and
    ts - ts' <= read_ttl_s. NaN when the log has no labelled pair."""
    return float(ceiling_mask(request_log, read_ttl_s, lag_s)[request_log.labelled].mean()
                 if request_log.labelled.any() else float("nan"))


def ceiling_mask(request_log: RequestLog, read_ttl_s: float, lag_s: float = 0.0) -> np.ndarray:
    """(R, C) bool: the coverage ceiling's condition per candidate (``coverage_ceiling``)."""
    if not read_ttl_s >= 0 or not lag_s >= 0:
        raise ConfigError(f"read_ttl_s={read_ttl_s!r} / lag_s={lag_s!r}: must be >= 0")
    r, c = request_log.candidates.shape
    out = np.zeros((r, c), bool)
    seen: dict[tuple[int, int], list[int]] = {}  # (user, item) -> request times, ascending
    users, ts, cand = request_log.user.tolist(), request_log.ts.tolist(), request_log.candidates
    for i in range(r):
        u, t = users[i], ts[i]
        row = cand[i].tolist()
        for j, it in enumerate(row):
            past = seen.get((u, it))
            if past is None:
                continue
            # latest ts' < ts with ts' <= ts - lag
            k = min(bisect.bisect_left(past, t), bisect.bisect_right(past, t - lag_s))
            if k and t - past[k - 1] <= read_ttl_s:
                out[i, j] = True
        for it in row:
            seen.setdefault((u, it), []).append(t)
    return out


# ------------------------------------------------------------ policies at equal FM cost
RECURRENCE_S = 6 * 3600.0  # the paper's recurrence window: candidates of the past 6 h


def candidate_recurrence(request_log: RequestLog, read_ttl_s: float) -> float:
    """Share of the log's candidates that were a candidate of an earlier request of the same
    user within ``read_ttl_s`` (what a recurrence-aware policy can feed on)."""
    r, c = request_log.candidates.shape
    if r == 0:
        return float("nan")
    return float(ceiling_mask(request_log, read_ttl_s, 0.0).sum()) / (r * c)


def policy_curves(request_log: RequestLog, scores: np.ndarray, policies: dict,
                  fractions: tuple[float, ...], masks: dict[str, np.ndarray] | None = None,
                  **kw) -> dict[str, list[dict]]:
    """Each policy's cost curve on the schedule simulation: {name: [{fraction, pair,
    fm_evals, fm_evals_per_1k, precision}, ...]} over ``fractions`` (a policy that ignores the
    fraction -- the oracle -- is run once, at fraction 0). ``policies``: name -> a zero-argument
    factory of a fresh policy (a stateful policy must not carry state from one run to the
    next); ``masks``: name -> (R, C) bool, each point also gets the share of the mask's
    candidates found under that name (None where the mask is empty); ``kw``:
    ``simulate_pair_coverage``'s schedule arguments."""
    r = max(1, request_log.num_requests)
    out: dict[str, list[dict]] = {}
    for name, make in policies.items():
        rows = []
        first = make()
        fr = (0.0,) if getattr(first, "name", "") == "oracle" else fractions
        for n, f in enumerate(fr):
            pol = first if n == 0 else make()
            sim = simulate_pair_coverage(request_log, scores, fraction=f, policy=pol, **kw)
            rows.append({"fraction": f, "pair": sim["pair"], "fm_evals": sim["fm_evals"],
                         "fm_evals_per_1k": 1000.0 * sim["fm_evals"] / r,
                         "precision": sim["precision"],
                         **{k: float(sim["found"][m].mean()) if m.any() else None
                            for k, m in (masks or {}).items()}})
        out[name] = rows
    return out


def coverage_at_cost(curve: list[dict], fm_evals: float) -> float | None:
    """A cost curve's pair coverage at ``fm_evals`` FM evaluations, linear between its points
    (ordered by cost); None outside the range it spans (no extrapolation)."""
    pts = sorted((float(p["fm_evals"]), float(p["pair"])) for p in curve
                 if math.isfinite(p["pair"]))
    if not pts or not pts[0][0] <= fm_evals <= pts[-1][0]:
        return None
    x, y = zip(*pts)
    return float(np.interp(fm_evals, x, y))


def cost_at_coverage(curve: list[dict], pair: float) -> float | None:
    """The FM evaluations at which a cost curve first reaches pair coverage ``pair``, linear
    between its points (ordered by cost); None where it never does or starts above it."""
    pts = sorted((float(p["fm_evals"]), float(p["pair"])) for p in curve
                 if math.isfinite(p["pair"]))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y0 <= pair <= y1:
            return x0 if y1 == y0 else x0 + (pair - y0) / (y1 - y0) * (x1 - x0)
    return None


def returning_share(request_log: RequestLog, read_ttl_s: float, lag_s: float) -> float:
    """The share of requests whose user comes back: a later request at least ``lag_s`` and at
    most ``read_ttl_s`` after (``ReturnsOraclePolicy.returns``); only there can an entry
    written for the request be read."""
    from solaris.replay.policies import ReturnsOraclePolicy

    bound = ReturnsOraclePolicy.from_log(request_log, read_ttl_s, lag_s)
    n = request_log.num_requests
    hits = sum(bound.returns(u, t)
               for u, t in zip(request_log.user.tolist(), request_log.ts.tolist()))
    return hits / n if n else float("nan")


def _share_of_cost(fm_evals: float | None, ver: dict) -> float | None:
    """``fm_evals`` as a share of the verifier point ``ver``'s (None where either is
    missing or the verifier computed nothing)."""
    if fm_evals is None or not ver["fm_evals"]:
        return None
    return fm_evals / ver["fm_evals"]


def _returns_bound(curve: list[dict], ver: dict, oracle_pair: float) -> dict:
    """The returns bound against the verifier point ``ver``: the FM evaluations it needs to
    match the verifier's coverage (share of the verifier's), and the best coverage of its
    curve points at no more than the verifier's cost (a lower bound of its coverage at equal
    cost) with the share of the verifier-to-oracle gap that closes."""
    within = [p["pair"] for p in curve if p["fm_evals"] <= ver["fm_evals"]
              and math.isfinite(p["pair"])]
    best = max(within) if within else None
    gap = oracle_pair - ver["pair"]
    return {"cost_to_match_verifier": _share_of_cost(cost_at_coverage(curve, ver["pair"]),
                                                     ver),
            "pair_within_verifier_cost": best,
            "gap_closed_within_verifier_cost": (None if best is None or gap <= 0
                                                else (best - ver["pair"]) / gap)}


def compare_policies(request_log: RequestLog, scores: np.ndarray, *, fraction: float,
                     fractions: tuple[float, ...], seed: int, read_ttl_s: float, lag_s: float,
                     **kw) -> dict:
    """Every policy of ``solaris.replay.policies`` on the schedule simulation at equal FM cost:
    cost curves over ``fractions`` (and ``fraction``, the verifier's own), each policy's
    coverage interpolated at the verifier's cost, the FM evaluations each needs to match
    the verifier (as a share of the verifier's), ``verifier_over_random`` and the share of
    the verifier-to-oracle gap each closes; the bounds that foresee the log (``BOUNDS``) are
    reported apart (``returns_bound``: the verifier's bet at returning users only); plus the
    log's candidate recurrence. ``kw``: the
    other schedule arguments of ``simulate_pair_coverage``."""
    from solaris.replay.policies import BOUNDS, POLICIES, make_policy

    fr = tuple(sorted(set(fractions) | {fraction}))
    makers = {name: (lambda name=name: make_policy(name, seed=seed, read_ttl_s=read_ttl_s,
                                                   lag_s=lag_s, request_log=request_log))
              for name in POLICIES}
    curves = policy_curves(request_log, scores, makers, fr, read_ttl_s=read_ttl_s,
                           lag_s=lag_s, seed=seed, **kw)
    ver = next(p for p in curves["verifier"] if p["fraction"] == fraction)
    at = {name: coverage_at_cost(c, ver["fm_evals"]) for name, c in curves.items()}
    orc = curves["oracle"][0]
    gap = orc["pair"] - ver["pair"]
    return {
        "candidate_recurrence": candidate_recurrence(request_log, read_ttl_s),
        "candidate_recurrence_6h": candidate_recurrence(request_log, RECURRENCE_S),
        "curves": curves,
        "at_verifier_cost": {"fm_evals": ver["fm_evals"],
                             "fm_evals_per_1k": ver["fm_evals_per_1k"], "pair": at,
                             "oracle": {"pair": orc["pair"], "fm_evals": orc["fm_evals"]}},
        "cost_to_match_verifier": {
            name: _share_of_cost(cost_at_coverage(c, ver["pair"]), ver)
            for name, c in curves.items() if name != "verifier" and name not in BOUNDS},
        # what knowing which users come back would give: the verifier's bet at those
        # requests only (``ReturnsOraclePolicy``), within the verifier's cost and to match it
        "returns_bound": {**_returns_bound(curves["returns"], ver, orc["pair"]),
                          "requests_returning": returning_share(request_log, read_ttl_s,
                                                                lag_s)},
        "verifier_over_random": ver["pair"] / at["random"] if at.get("random") else None,
        "gap_closed": {name: ((at[name] - ver["pair"]) / gap
                              if at.get(name) is not None and gap > 0 else None)
                       for name in POLICIES if name != "verifier" and name not in BOUNDS}}
