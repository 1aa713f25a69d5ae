"""The replay's tick schedule, as pure functions of the log's event times and the queue's
state: which rows each tick sends, how many pair-evaluations its end may release, and which
tick runs next (``jobs/replay.py`` follows it; the module docstring there says why).

Event time is cut into ticks of ``tick_s`` from ``t0`` (the first request's time rounded
down to a tick). Only ticks that send requests or that can release due work run: after a
tick, the next one is the next tick with requests, or the next tick at all when the budget
ran out with work left, or the tick at whose end the oldest pending pair falls due (its
request time + lag). The replay stops when nothing is left to do, or when what is left
would fall due after the window's last request could still read it (``read_ttl_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def tick_allowance(budget_per_hour: float, tick_s: float, k: int) -> int | None:
    """Pair-evaluations tick number ``k`` may release: the whole units B accrues in it
    (units of a tick with no release are lost); None when there is no budget."""
    if budget_per_hour <= 0:
        return None
    rate = budget_per_hour * tick_s / 3600.0
    return int(math.floor(rate * (k + 1) + 1e-9) - math.floor(rate * k + 1e-9))


@dataclass(frozen=True)
class Ticks:
    """The ticks of a log's event times ``ts`` (ascending)."""

    tick_s: float
    t0: float  # start of tick 0
    ticks: np.ndarray  # (m,) int64 the ticks that hold requests, ascending
    starts: np.ndarray  # (m + 1,) row bounds: tick ticks[j] sends rows starts[j]..starts[j+1]-1

    @classmethod
    def of(cls, ts: np.ndarray, tick_s: float) -> "Ticks":
        ts = np.asarray(ts, np.float64)
        if not tick_s > 0:
            raise ValueError(f"tick_s={tick_s!r}: must be > 0")
        if not len(ts) or np.any(np.diff(ts) < 0) or not np.isfinite(ts).all():
            raise ValueError("ts: expected a non-empty ascending array of finite event times")
        t0 = math.floor(float(ts[0]) / tick_s) * tick_s
        k_of = np.floor((ts - t0) / tick_s).astype(np.int64)
        ticks = np.unique(k_of)
        starts = np.append(np.searchsorted(k_of, ticks, side="left"), len(ts))
        return cls(float(tick_s), t0, ticks, starts)

    @property
    def first(self) -> int:
        return int(self.ticks[0])

    @property
    def last(self) -> int:
        return int(self.ticks[-1])

    def end(self, k: int) -> float:
        """Event time at the end of tick ``k``."""
        return self.t0 + (k + 1) * self.tick_s

    def rows(self, k: int) -> tuple[int, int] | None:
        """(a, b): tick ``k`` sends log rows a..b-1; None when it sends none."""
        j = int(np.searchsorted(self.ticks, k))
        if j == len(self.ticks) or self.ticks[j] != k:
            return None
        return int(self.starts[j]), int(self.starts[j + 1])

    def at_fraction(self, f: float) -> int:
        """The request tick a fraction ``f`` (0..1) into the window's request ticks."""
        return int(self.ticks[min(len(self.ticks) - 1, int(f * len(self.ticks)))])

    def next(self, k: int, *, eligible: int, depth: int, oldest_pending: float | None,
             lag_s: float, read_ttl_s: float) -> int | None:
        """The tick after ``k`` that has anything to do, given the queue at the end of ``k``
        (``eligible``: pairs it could release now; ``depth``: pairs pending; the oldest
        pending pair's request time); None: the replay is done."""
        later = self.ticks[np.searchsorted(self.ticks, k, side="right"):][:1]
        nxt = [int(x) for x in later]
        if eligible > 0:  # the allowance ran out with work left
            nxt.append(k + 1)
        elif depth > 0 and oldest_pending is not None:
            due = math.ceil((oldest_pending + lag_s - self.t0) / self.tick_s) - 1
            nxt.append(max(k + 1, due))
        if not nxt:
            return None
        pending = min(nxt)
        if pending > self.last and depth == 0:
            return None
        if pending > self.last + int(read_ttl_s // self.tick_s) + 1:
            return None  # work released after the window could serve nothing
        return pending


def knn_due(t: float, next_at: float, every_s: float) -> float | None:
    """The KNN rebuild a request at event time ``t`` must be served after: the latest
    boundary ``next_at + j * every_s`` (j >= 0) at or before ``t``, the tables being built as
    of it; None when ``t`` is before ``next_at``. Boundaries a gap between requests skips
    are not built (no request would read them). The closed loop's in-process arms and its
    live run both follow it, so they rebuild as of the same times."""
    if not t >= next_at:
        return None
    return next_at + every_s * math.floor((t - next_at) / every_s)

