"""The verifier: which of a served request's candidates are worth a speculative FM pass.

DESIGN.md step 5. After the VM answers, its own scores rank the request's candidates; the
top ``fraction`` of *all* candidates is the bet ("these will be asked for again before the
TTL runs out"), and of those only the pairs whose embedding is missing or about to expire
are enqueued, minus those already queued or being computed.

``BudgetController`` adapts that fraction so the pairs enqueued per second (of an injected
clock: event time in the replay, wall time in production) track a compute budget, with
optional queue-depth feedback, so the FM workers are neither idle nor flooded.

numpy only; every function is batch-first over one request's candidates.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

from solaris.config import VerifierConfig
from solaris.errors import RequestError
from solaris.precompute.speculation import Candidates, VerifierPolicy, admit, top_count

__all__ = ["BudgetController", "choose", "top_count"]

log = logging.getLogger(__name__)


def _vector(x: np.ndarray, name: str, n: int, dtype: type) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != (n,):
        raise RequestError(f"{name}: expected shape ({n},), got {a.shape}")
    return a.astype(dtype, copy=False)


def choose(scores: np.ndarray, items: np.ndarray, found_fresh: np.ndarray, age_s: np.ndarray,
           in_flight: np.ndarray, cfg: VerifierConfig, read_ttl_s: float,
           fraction: float | None = None) -> np.ndarray:
    """Indices of the candidates to enqueue, best VM score first.

    ``scores`` (C,) VM scores; ``items`` (C,) candidate ids (ties in score are broken by
    item id, so the choice is deterministic); ``found_fresh`` (C,) whether a fresh pair of
    the VM's version was in the cache and ``age_s`` (C,) its event-time age (ignored where
    not found); ``in_flight`` (C,) pairs already pending or leased in the queue.

    Takes the top ``fraction`` (default ``cfg.fraction``) of all C candidates, keeps those
    whose pair is missing or expires within ``cfg.horizon_s`` (age > read_ttl_s -
    horizon_s; a horizon at or past the TTL re-enqueues every found pair), and drops those
    in flight.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise RequestError(f"scores: expected a 1-D array, got shape {s.shape}")
    c = len(s)
    if not np.isfinite(s).all():
        raise RequestError(f"scores: {int((~np.isfinite(s)).sum())} non-finite values")
    it = _vector(items, "items", c, np.int64)
    found = _vector(found_fresh, "found_fresh", c, bool)
    age = _vector(age_s, "age_s", c, np.float64)
    busy = _vector(in_flight, "in_flight", c, bool)
    if not math.isfinite(read_ttl_s) or read_ttl_s <= 0:
        raise RequestError(f"read_ttl_s={read_ttl_s!r}: must be a finite number > 0")
    f = cfg.fraction if fraction is None else fraction
    if top_count(c, f) == 0:
        return np.zeros(0, dtype=np.int64)
    # the verifier policy (solaris.precompute.speculation), as the schedule simulation runs it
    top, _ = VerifierPolicy().rank(Candidates(0, 0.0, it, s), f)
    return top[admit(top, found, age, read_ttl_s, cfg.horizon_s) & ~busy[top]]


class BudgetController:
    """Adapts the verifier's fraction so enqueued pair-evaluations track a budget.

    Call ``record(enqueued, depth)`` once per served request with the pairs it enqueued
    (and, when known, the queue's pending depth); use ``fraction`` for the next request.
    Every ``cfg.interval_s`` seconds of ``clock`` the enqueue rate of the interval is
    measured and the fraction is multiplied by ``(target / rate) ** gain``, clamped to
    ``[1 / max_step, max_step]`` per update and to ``[min_fraction, max_fraction]``
    overall. In log space this is an integral controller whose state is the fraction
    itself, so the bounds are also its anti-windup. The target is ``cfg.budget_per_s``,
    scaled down by ``target_depth / depth`` while the queue is deeper than
    ``cfg.target_depth`` (workers falling behind). A budget of 0 disables adaptation.

    Deterministic: the same clock readings and inputs give the same fractions.
    """

    def __init__(self, cfg: VerifierConfig, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self._clock = clock
        self._fraction = float(cfg.fraction)
        self._start: float | None = None  # start of the current measuring interval
        self._count = 0  # pairs enqueued in the current interval
        self._depth = 0  # latest queue depth reported
        self.updates = 0
        self.last_rate: float | None = None  # enqueue rate of the last closed interval
        self.last_target: float | None = None

    @property
    def fraction(self) -> float:
        return self._fraction

    def target_rate(self) -> float:
        """The budget, scaled down while the queue is deeper than ``cfg.target_depth``."""
        b = self.cfg.budget_per_s
        td = self.cfg.target_depth
        if td and self._depth > td:
            return b * td / self._depth
        return b

    def record(self, enqueued: int, depth: int | None = None) -> float:
        """Count ``enqueued`` pairs at ``clock()``; update at interval ends; the new fraction."""
        if enqueued < 0:
            raise RequestError(f"enqueued={enqueued!r}: must be >= 0")
        if depth is not None:
            if depth < 0:
                raise RequestError(f"depth={depth!r}: must be >= 0")
            self._depth = int(depth)
        now = float(self._clock())
        if not math.isfinite(now):
            raise RequestError(f"clock()={now!r}: must be finite")
        if self._start is None or now < self._start:
            self._start, self._count = now, 0  # first call, or the clock was reset
        self._count += int(enqueued)
        elapsed = now - self._start
        if self.cfg.budget_per_s > 0 and elapsed >= self.cfg.interval_s:
            self._update(self._count / elapsed)
            self._start, self._count = now, 0
        return self._fraction

    def _update(self, rate: float) -> None:
        cfg = self.cfg
        target = self.target_rate()
        if rate > 0:
            step = (target / rate) ** cfg.gain
        else:
            step = cfg.max_step  # nothing enqueued: far under budget (or nothing missing)
        step = min(max(step, 1.0 / cfg.max_step), cfg.max_step)
        new = min(max(self._fraction * step, cfg.min_fraction), cfg.max_fraction)
        log.debug("budget: rate %.3g/s target %.3g/s fraction %.4f -> %.4f", rate, target,
                  self._fraction, new)
        self._fraction = new
        self.last_rate, self.last_target = rate, target
        self.updates += 1

    def state(self) -> dict:
        """Fraction and the last interval's measurements (for metrics)."""
        return {"fraction": self._fraction, "updates": self.updates, "last_rate": self.last_rate,
                "last_target": self.last_target, "depth": self._depth}
