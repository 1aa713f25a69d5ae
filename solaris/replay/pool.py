"""Online transfer ratio pooled over several training seeds' replays of one window, with a
paired cluster-bootstrap interval.

Pooling: each seed's BCE per arm (VM alone, served, FM) is the mean over its rows; the pooled
BCE of an arm is the mean of the seeds' BCEs (every seed weighs the same, whatever its row
count), and the pooled TR is the TR of those means -- which is the same number as the sum of
the seeds' numerators over the sum of their denominators, since the 1/S cancels.

Interval: each resample draws seeds with replacement and requests with replacement -- whole
requests, since the rows of one request share a user, a moment and the cache state they were
served with -- and recomputes the pooled TR; the same draws serve the three arms (paired).
Replays of one window serve the same requests, so by default one request draw (keyed by
request id) applies to every seed (the seeds are crossed with one sample of requests: the
"pigeonhole" bootstrap, slightly conservative); ``share_requests=False`` draws each seed's
requests on their own (as if every seed had seen its own sample of requests: narrower).
Seeds and requests come from two generators spawned from ``seed``, so the request draws do
not depend on the number of seeds.

Draws where the pooled gap BCE(VM alone) - BCE(FM) is not positive have no TR
(``M.transfer_ratio``); they are left out of the quantiles and ``finite_share`` says how many
remained. Pure numpy: every resample at once as a (resamples, requests) count matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from solaris.errors import DataError
from solaris.eval import metrics as M

_EPS = 1e-7  # the clip of M.bce_rows
_ZMIN = float(np.log(_EPS) - np.log1p(-_EPS))  # logit(_EPS)
ARMS = ("vm_alone", "served", "fm")
LOSS_NAMES = ("loss_vm_alone", "loss_served", "loss_fm", "request_id")
_CHUNK = 64  # resamples per block in the base-calibrated path: (chunk, rows) float64 blocks


@dataclass(frozen=True, eq=False)
class RunProbs:
    """One run's labelled rows (N): the three arms' probabilities, as ``transfer_report``
    has them (rows without an interaction row already dropped)."""

    y: np.ndarray  # (N,) float64 label in [0, 1]
    p_alone: np.ndarray  # (N,) the VM alone re-scored without SOLARIS inputs
    p_served: np.ndarray  # (N,) the served score
    p_fm: np.ndarray  # (N,) the teacher's probability
    request: np.ndarray  # (N,) int request id (the same id in every run of one window)
    first: np.ndarray  # (N,) bool: the calibration half (``evaluate.halves``)

    def __post_init__(self) -> None:
        n = _length("RunProbs.y", self.y)
        for name in ("p_alone", "p_served", "p_fm", "request", "first"):
            _same_length(f"RunProbs.{name}", getattr(self, name), "RunProbs.y", n)
        for name in ("y", "p_alone", "p_served", "p_fm"):
            v = _finite(f"RunProbs.{name}", getattr(self, name))
            if ((v < 0) | (v > 1)).any():
                bad = v[(v < 0) | (v > 1)][0]
                raise DataError(f"RunProbs.{name}: value {float(bad):g} outside [0, 1]")
        _ids("RunProbs.request", self.request)
        first = np.asarray(self.first)
        if first.dtype != bool:
            raise DataError(f"RunProbs.first: dtype {first.dtype}, expected bool")
        if first.all() or not first.any():
            raise DataError(f"RunProbs.first: {int(first.sum())} of {n} rows in the first "
                            "half; both halves need rows")

    def losses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-row BCE of the three arms and the request ids: one ``pooled_tr`` entry."""
        return (M.bce_rows(self.y, self.p_alone), M.bce_rows(self.y, self.p_served),
                M.bce_rows(self.y, self.p_fm), np.asarray(self.request))


def pooled_tr(losses: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
              resamples: int, alpha: float, seed: int, share_requests: bool = True,
              keep_draws: bool = False) -> dict[str, Any]:
    """Pooled raw TR over runs, each given as per-row (loss_vm_alone, loss_served, loss_fm,
    request_id), with a ``1 - alpha`` paired cluster-bootstrap interval (module docstring).

    Returns ``tr`` (pooled), ``ci_low``/``ci_high``, ``per_seed`` (TR of each run) and
    ``per_seed_ci`` (each run's own request-level interval, from the same request draws),
    ``bce``/``per_seed_bce`` (vm_alone, served, fm), ``resamples``, ``alpha``, ``seeds``,
    ``finite_share`` (draws with a positive gap), ``rows``, ``requests`` (drawn per
    resample: one count when shared, else one per run) and ``share_requests``."""
    _params(resamples, alpha)
    if not isinstance(losses, (list, tuple)) or not losses:
        raise DataError(f"losses: expected a non-empty list of runs, got {losses!r}")
    runs = [_check_losses(i, t) for i, t in enumerate(losses)]
    rng_seed, rng_req = _generators(seed)
    groups, n_req = _request_groups([r for _, r in runs], share_requests)
    s = len(runs)
    # per request and seed: the three arms' loss sums and the row count
    sums = [np.stack([np.bincount(g, l[:, k], minlength=n)
                      for k in range(3)], axis=1) for (l, _), (g, n) in zip(runs, groups)]
    counts = [np.bincount(g, minlength=n).astype(np.float64) for g, n in groups]
    bce = np.stack([l.mean(0) for l, _ in runs])  # (S, 3)
    draws = np.empty((resamples, s, 3))  # per draw and seed: the three arms' BCE
    w_shared = _counts(rng_req, resamples, n_req) if share_requests else None
    for i in range(s):
        w = w_shared if share_requests else _counts(rng_req, resamples, groups[i][1])
        with np.errstate(invalid="ignore", divide="ignore"):
            draws[:, i] = (w @ sums[i]) / (w @ counts[i])[:, None]
    return _summary(bce, draws, _counts(rng_seed, resamples, s), alpha,
                    rows=[len(l) for l, _ in runs], requests=n_req,
                    share_requests=share_requests, keep_draws=keep_draws)


def pooled_tr_base_calibrated(runs: list[RunProbs], resamples: int, alpha: float, seed: int,
                              share_requests: bool = True, keep_draws: bool = False
                              ) -> dict[str, Any]:
    """Pooled base-calibrated TR (``tr_online_base_calibrated`` of ``transfer_report``): per
    run, one Platt fit of the VM alone on the first half applied to the VM alone and to the
    served scores, the FM Platt-fitted on its own first half, BCE on the second half. Every
    resample refits both Platt maps on its drawn first-half requests (Newton, vectorised
    over resamples, from the full-sample fit), so the interval carries the calibration's
    own noise too."""
    _params(resamples, alpha)
    if not isinstance(runs, (list, tuple)) or not runs:
        raise DataError(f"runs: expected a non-empty list of RunProbs, got {runs!r}")
    for i, r in enumerate(runs):
        if not isinstance(r, RunProbs):
            raise DataError(f"runs[{i}]: expected RunProbs, got {type(r).__name__}")
    rng_seed, rng_req = _generators(seed)
    groups, n_req = _request_groups([np.asarray(r.request) for r in runs], share_requests)
    s = len(runs)
    bce = np.empty((s, 3))
    draws = np.empty((resamples, s, 3))
    w_shared = _counts(rng_req, resamples, n_req) if share_requests else None
    for i, (r, (g, n)) in enumerate(zip(runs, groups)):
        w_req = w_shared if share_requests else _counts(rng_req, resamples, n)
        y = np.asarray(r.y, np.float64)
        p = {k: np.asarray(v, np.float64)
             for k, v in zip(ARMS, (r.p_alone, r.p_served, r.p_fm))}
        first = np.asarray(r.first)
        second = ~first
        ab = M.fit_platt(y[first], p["vm_alone"][first])
        fab = M.fit_platt(y[first], p["fm"][first])
        # the point estimate exactly as transfer_report computes it
        bce[i] = [M.bce(y[second], M.apply_platt(p[k][second], a))
                  for k, a in (("vm_alone", ab), ("served", ab), ("fm", fab))]
        x1 = {k: M.logit(p[k][first]) for k in ("vm_alone", "fm")}
        x2 = {k: M.logit(v[second]) for k, v in p.items()}
        y1, y2 = y[first], y[second]
        g1, g2 = g[first], g[second]
        for lo in range(0, resamples, _CHUNK):
            w = w_req[lo:lo + _CHUNK]
            w1, w2 = w[:, g1], w[:, g2]  # (B, rows of each half): each row's request count
            a_vm, b_vm = fit_platt_weighted(x1["vm_alone"], y1, w1, ab)
            a_fm, b_fm = fit_platt_weighted(x1["fm"], y1, w1, fab)
            n2 = w2.sum(1)
            for k, (name, a, b) in enumerate((("vm_alone", a_vm, b_vm),
                                              ("served", a_vm, b_vm), ("fm", a_fm, b_fm))):
                loss = _bce_logits(a[:, None] * x2[name] + b[:, None], y2)  # (B, rows)
                with np.errstate(invalid="ignore", divide="ignore"):
                    draws[lo:lo + _CHUNK, i, k] = np.einsum("bn,bn->b", w2, loss) / n2
    out = _summary(bce, draws, _counts(rng_seed, resamples, s), alpha,
                   rows=[int(np.asarray(r.first).size) for r in runs], requests=n_req,
                   share_requests=share_requests, keep_draws=keep_draws)
    out["rows_second_half"] = [int((~np.asarray(r.first)).sum()) for r in runs]
    return out


def paired_difference(a: dict[str, Any], b: dict[str, Any], alpha: float) -> dict[str, Any]:
    """TR(a) - TR(b) of two arms pooled with the same draws -- ``pooled_tr`` (or
    ``pooled_tr_base_calibrated``) of each arm's runs with ``keep_draws`` and the same
    ``seed``, ``resamples`` and ``share_requests``, the runs of one seed scoring the same
    rows -- with the interval of the
    per-draw differences (draws where either TR is undefined left out). Per seed as well."""
    da, db = np.asarray(a["draw_trs"]), np.asarray(b["draw_trs"])
    if da.shape != db.shape or a["seeds"] != b["seeds"] or a["rows"] != b["rows"] \
            or a["resamples"] != b["resamples"]:
        raise DataError(f"paired_difference: the arms were not pooled alike (seeds "
                        f"{a['seeds']} / {b['seeds']}, rows {a['rows']} / {b['rows']}, "
                        f"resamples {a['resamples']} / {b['resamples']})")
    diff = da - db
    lo, hi = _interval(diff, alpha)
    per_seed = [x - y for x, y in zip(a["per_seed"], b["per_seed"])]
    return {"diff": a["tr"] - b["tr"], "ci_low": lo, "ci_high": hi,
            "finite_share": float(np.isfinite(diff).mean()), "per_seed": per_seed,
            "alpha": float(alpha)}


def fit_platt_weighted(x: np.ndarray, y: np.ndarray, w: np.ndarray,
                       start: tuple[float, float] = (1.0, 0.0), iters: int = 50,
                       tol: float = 1e-7) -> tuple[np.ndarray, np.ndarray]:
    """``M.fit_platt`` for B weightings of the same rows at once: the Platt map a * x + b
    (``x`` = logit(p), (N,)) minimising sum_i w[k, i] * BCE_i for every k of ``w`` (B, N); an
    integer weight counts a row that many times. Newton with ``M.fit_platt``'s ridge; a
    weighting stops moving after a step below ``tol`` (Newton converges quadratically, so
    what that leaves is of the order of tol squared). Returns (a, b), each (B,)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    w = np.asarray(w, np.float64)
    a = np.full(len(w), float(start[0]))
    b = np.full(len(w), float(start[1]))
    live = np.ones(len(w), bool)
    xx = x * x
    # reductions by einsum, not BLAS: a threaded gemv on these thin blocks is several times
    # slower than one core whenever another process holds a core
    wy, wyx = np.einsum("bn,n->b", w, y), np.einsum("bn,n->b", w, y * x)  # fixed
    q, h = np.empty_like(w), np.empty_like(w)  # (B, N) each
    for _ in range(iters):
        np.multiply(a[:, None], x, out=q)
        q += b[:, None]
        _sigmoid_(q)
        np.multiply(q, w, out=h)  # w q
        ga, gb = np.einsum("bn,n->b", h, x) - wyx, h.sum(1) - wy
        np.multiply(h, q, out=q)
        np.subtract(h, q, out=h)  # w q (1 - q): the curvature
        haa = np.einsum("bn,n->b", h, xx) + 1e-9
        hab, hbb = np.einsum("bn,n->b", h, x), h.sum(1) + 1e-9
        det = haa * hbb - hab * hab
        sa = np.where(live, (hbb * ga - hab * gb) / det, 0.0)
        sb = np.where(live, (haa * gb - hab * ga) / det, 0.0)
        a -= sa
        b -= sb
        live &= np.maximum(np.abs(sa), np.abs(sb)) >= tol
        if not live.any():
            break
    return a, b


def _sigmoid_(z: np.ndarray) -> np.ndarray:
    """sigmoid(z) in place (no new (B, N) buffers: these blocks are the hot loop)."""
    with np.errstate(over="ignore"):
        np.negative(z, out=z)
        np.exp(z, out=z)
    z += 1.0
    np.reciprocal(z, out=z)
    return z


def _bce_logits(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``M.bce_rows(y, sigmoid(z))`` for a (B, N) block of logits: the probability clip of
    ``M.bce_rows`` is a clip of the logit, and BCE = softplus(z) - y * z. Overwrites z."""
    np.clip(z, _ZMIN, -_ZMIN, out=z)
    out = np.abs(z)
    np.negative(out, out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)
    out += np.maximum(z, 0.0)
    z *= y
    out -= z
    return out


def _summary(bce: np.ndarray, draws: np.ndarray, seed_counts: np.ndarray, alpha: float, *,
             rows: list[int], requests: int | list[int], share_requests: bool,
             keep_draws: bool = False) -> dict[str, Any]:
    """TR per seed and pooled, from the point BCEs (S, 3), each draw's per-seed BCEs
    (B, S, 3) and each draw's seed multiplicities (B, S)."""
    s = len(bce)
    # a seed drawn 0 times counts 0 even where it had no rows in the draw (NaN BCE)
    kept = np.where(seed_counts[..., None] > 0, draws, 0.0)
    pooled = np.einsum("bs,bsk->bk", seed_counts, kept) / s  # (B, 3) seed-mean BCEs
    trs = _tr(pooled)
    ok = np.isfinite(trs)
    lo, hi = _interval(trs, alpha)
    seed_ci = [list(_interval(_tr(draws[:, i]), alpha)) for i in range(s)]
    mean = bce.mean(0)
    out = {"tr": float(_tr(mean[None])[0]), "ci_low": lo, "ci_high": hi,
            "per_seed": [float(t) for t in _tr(bce)], "per_seed_ci": seed_ci,
            "bce": dict(zip(ARMS, mean.tolist())),
            "per_seed_bce": [dict(zip(ARMS, b.tolist())) for b in bce],
            "resamples": len(draws), "alpha": float(alpha), "seeds": s,
            "finite_share": float(ok.mean()), "rows": rows, "requests": requests,
            "share_requests": bool(share_requests), "pooling": "tr_of_seed_mean_bce"}
    if keep_draws:
        out["draw_trs"] = trs
    return out


def _tr(bce: np.ndarray) -> np.ndarray:
    """TR of (..., 3) BCEs (vm alone, served, fm); NaN where the gap is not positive, as
    ``M.transfer_ratio``."""
    gap = bce[..., 0] - bce[..., 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(gap > 0, (bce[..., 0] - bce[..., 1]) / np.where(gap > 0, gap, 1.0),
                        np.nan)


def _interval(trs: np.ndarray, alpha: float) -> tuple[float, float]:
    ok = trs[np.isfinite(trs)]
    if not len(ok):
        return float("nan"), float("nan")
    lo, hi = np.quantile(ok, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"seed: expected an integer >= 0, got {seed!r}")
    a, b = np.random.SeedSequence(int(seed)).spawn(2)
    return np.random.default_rng(a), np.random.default_rng(b)


def _counts(rng: np.random.Generator, resamples: int, n: int) -> np.ndarray:
    """(resamples, n) float64: how often each of n units is drawn, n draws with replacement
    per resample."""
    idx = rng.integers(0, n, (resamples, n))
    flat = (idx + n * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def _request_groups(requests: list[np.ndarray], shared: bool
                    ) -> tuple[list[tuple[np.ndarray, int]], int | list[int]]:
    """Per run: each row's request index and the number of indices. Shared: indices into the
    union of every run's request ids (one draw for all); else into the run's own ids."""
    if shared:
        keys, inv = np.unique(np.concatenate(requests), return_inverse=True)
        cuts = np.cumsum([len(r) for r in requests])[:-1]
        return [(g, len(keys)) for g in np.split(inv.ravel(), cuts)], len(keys)
    out = []
    for r in requests:
        keys, inv = np.unique(r, return_inverse=True)
        out.append((inv.ravel(), len(keys)))
    return out, [n for _, n in out]


def _check_losses(i: int, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """One run's entry: (N, 3) float64 losses and (N,) request ids."""
    if not isinstance(t, (tuple, list)) or len(t) != 4:
        raise DataError(f"losses[{i}]: expected a tuple ({', '.join(LOSS_NAMES)}), got "
                        f"{type(t).__name__} of length {len(t) if hasattr(t, '__len__') else '?'}")
    names = [f"losses[{i}] ({n})" for n in LOSS_NAMES]
    n = _length(names[0], t[0])
    if n == 0:
        raise DataError(f"{names[0]}: no rows")
    for name, v in zip(names[1:], t[1:]):
        _same_length(name, v, names[0], n)
    cols = [_finite(name, v) for name, v in zip(names[:3], t[:3])]
    _ids(names[3], t[3])
    return np.stack(cols, axis=1), np.asarray(t[3])


def _length(name: str, v: Any) -> int:
    a = np.asarray(v)
    if a.ndim != 1:
        raise DataError(f"{name}: expected a 1-d array, got shape {a.shape}")
    if not len(a):
        raise DataError(f"{name}: no rows")
    return len(a)


def _same_length(name: str, v: Any, ref: str, n: int) -> None:
    a = np.asarray(v)
    if a.ndim != 1 or len(a) != n:
        raise DataError(f"{name}: shape {a.shape}, but {ref} has {n} rows")


def _finite(name: str, v: Any) -> np.ndarray:
    try:
        a = np.asarray(v, np.float64)
    except (TypeError, ValueError) as e:
        raise DataError(f"{name}: not numeric ({e})") from e
    bad = ~np.isfinite(a)
    if bad.any():
        raise DataError(f"{name}: {int(bad.sum())} NaN or inf values (first at row "
                        f"{int(np.flatnonzero(bad)[0])})")
    return a


def _ids(name: str, v: Any) -> None:
    a = np.asarray(v)
    if not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"{name}: dtype {a.dtype}, expected integer request ids")


def _params(resamples: int, alpha: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) \
            or resamples < 1:
        raise DataError(f"resamples: expected an integer >= 1, got {resamples!r}")
    if not isinstance(alpha, (int, float, np.floating)) or not 0 < alpha < 1:
        raise DataError(f"alpha: expected a number in (0, 1), got {alpha!r}")
