"""What a replay's log allows, whatever the speculation: upper bounds on coverage, and how
much the verifier's score knows about which candidates come back.

* ``effective_bounds``: effective coverage if every candidate of every request were
  precomputed ``lag_s`` after its request, with no budget (an oracle speculation). A labelled
  pair at ``t`` can have any of the user's *own* inputs (the pair, an item neighbour's pair,
  the aggregate) only if the user had a request in ``[t - retention_s, t - lag_s]``; otherwise
  only a user-neighbour imputation can reach it, and only if one of the user's ``k`` nearest
  neighbours had that item as a candidate in ``[t - read_ttl_s, t - lag_s]``. The bound
  counts the first kind as covered and the second where such a neighbour exists, per ``k``
  (and for "any other user", the bound of an imputation free to use every user).
* ``speculation_signal``: candidates the same user has labelled again within
  ``[t + lag_s, t + read_ttl_s]`` (the pairs a precompute at ``t`` could serve), the AUC of
  the verifier's score for them over the request's other candidates, and the share of them
  inside the request's top ``fraction`` (what the verifier enqueues): whatever the budget,
  a pair is covered only through a returning candidate inside its request's top fraction.

Pure numpy on a ``RequestLog``; loops over labelled pairs only.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Mapping

import numpy as np

from solaris.errors import ConfigError, DataError
from solaris.eval.metrics import auc
from solaris.simulate.log import RequestLog
from solaris.online.verifier import top_count


def _check_windows(**windows: float) -> None:
    for name, v in windows.items():
        if not v >= 0:
            raise ConfigError(f"{name}={v!r}: must be >= 0")


def _own_history(log: RequestLog, retention_s: float, lag_s: float) -> np.ndarray:
    """(R,) bool: the request's user had a request in ``[t - retention_s, t - lag_s]``
    strictly before this one."""
    out = np.zeros(log.num_requests, bool)
    times: dict[int, list[int]] = defaultdict(list)  # user -> earlier request times (sorted)
    for r, (u, t) in enumerate(zip(log.user.tolist(), log.ts.tolist())):
        past = times[u]
        k = min(bisect.bisect_left(past, t), bisect.bisect_right(past, t - lag_s))
        out[r] = bool(k) and t - past[k - 1] <= retention_s
        past.append(t)
    return out


def effective_bounds(log: RequestLog, neighbours: Mapping[int, np.ndarray], *,
                     read_ttl_s: float, retention_s: float, lag_s: float,
                     probes: tuple[int, ...] = (10, 100)) -> dict:
    """Oracle upper bounds of effective coverage over the log's labelled pairs.

    ``neighbours``: user -> neighbour user ids, nearest first (a user missing has none).
    Returns ``own_history_share`` (labelled pairs whose user had a request in
    ``[t - retention_s, t - lag_s]``), ``effective_oracle`` keyed by ``str(k)`` for each
    ``k`` in ``probes`` and ``"any_user"``, and ``labelled_pairs``.
    """
    _check_windows(read_ttl_s=read_ttl_s, retention_s=retention_s, lag_s=lag_s)
    if any(k < 0 for k in probes):
        raise ConfigError(f"probes={probes!r}: must be >= 0")
    lab = log.labelled
    n_lab = int(lab.sum())
    if n_lab == 0:
        raise DataError("the request log has no labelled pair: no coverage bound to compute")
    own = _own_history(log, retention_s, lag_s)
    # item -> (request times, users), in event order
    at: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for r, (u, t) in enumerate(zip(log.user.tolist(), log.ts.tolist())):
        for it in log.candidates[r].tolist():
            ts_, us = at[it]
            ts_.append(t)
            us.append(u)
    reach = {str(k): 0 for k in probes}
    reach["any_user"] = 0
    sets = {k: {} for k in probes}  # user -> set of its k nearest (built on demand)
    for r in np.flatnonzero(lab.any(axis=1) & ~own):
        u, t = int(log.user[r]), int(log.ts[r])
        for it in log.candidates[r, lab[r]].tolist():
            ts_, us = at[it]
            lo, hi = bisect.bisect_left(ts_, t - read_ttl_s), bisect.bisect_right(ts_, t - lag_s)
            hi = min(hi, bisect.bisect_left(ts_, t))  # strictly earlier requests
            others = {v for v in us[lo:hi] if v != u}
            if not others:
                continue
            reach["any_user"] += 1
            for k in probes:
                near = sets[k].get(u)
                if near is None:
                    near = sets[k][u] = set(np.asarray(neighbours.get(u, ()))[:k].tolist())
                reach[str(k)] += bool(near & others)
    own_pairs = int(lab[own].sum())
    return {"labelled_pairs": n_lab,
            "own_history_share": own_pairs / n_lab,
            "effective_oracle": {k: (own_pairs + v) / n_lab for k, v in reach.items()}}


def speculation_signal(log: RequestLog, scores: np.ndarray, *, read_ttl_s: float,
                       lag_s: float, fraction: float) -> dict:
    """How well the verifier's score (``scores``, (R, C), the served scores) picks the
    candidates that the same user labels again within ``[t + lag_s, t + read_ttl_s]``.

    Returns ``returning`` (how many candidates do), ``auc`` (score vs returning, over all
    candidates) and ``top_fraction_share`` (share of the returning candidates inside their
    request's top ``fraction``, ``verifier.top_count`` per request, as the verifier picks).
    """
    _check_windows(read_ttl_s=read_ttl_s, lag_s=lag_s)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != log.candidates.shape:
        raise DataError(f"scores shape {scores.shape} != candidates {log.candidates.shape}")
    if not np.isfinite(scores).all():
        raise DataError("scores hold NaN or inf: score every candidate of the log")
    lab = log.labelled
    labelled_at: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in np.flatnonzero(lab.any(axis=1)):
        for it in log.candidates[r, lab[r]].tolist():
            labelled_at[(int(log.user[r]), it)].append(int(log.ts[r]))
    back = np.zeros(log.candidates.shape, bool)
    for r, (u, t) in enumerate(zip(log.user.tolist(), log.ts.tolist())):
        for c, it in enumerate(log.candidates[r].tolist()):
            times = labelled_at.get((u, it))
            if times:
                k = bisect.bisect_left(times, max(t + lag_s, t + 1e-9))
                back[r, c] = k < len(times) and times[k] <= t + read_ttl_s
    n_top = top_count(log.num_candidates, fraction)
    top = np.zeros_like(back)
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :n_top]
    np.put_along_axis(top, idx, True, axis=1)
    n_back = int(back.sum())
    return {"returning": n_back, "candidates": int(back.size),
            "auc": auc(back.ravel(), scores.ravel()),
            "top_fraction_share": float((top & back).sum() / n_back) if n_back else float("nan"),
            "fraction": fraction}
