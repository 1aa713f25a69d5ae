"""How far ahead of its reference a store takes an event time (DESIGN.md, two clocks).

Event time drives a store's TTL, retention and eviction, and expiry follows the largest time
a store has seen: one write or read stamped far in the future would expire everything and
poison the store until it is rebuilt. So every store (pairs, history, queue) checks each
event time against a reference before it changes anything:

- the serving profile: the reference is the wall clock (``EventClock.wall``), since the app
  stamps each request with its own time;
- the replay / debug profile: the reference is the latest time the store has accepted, so a
  logged stream moves it forward step by step and no single call jumps it far ahead.

A time more than ``max_skew_s`` ahead of the reference is refused with ``ClockSkewError``
(naming the time, the reference and the limit) and counted. A snapshot written ahead of the
restoring machine's clock by more than the skew is reported and not trusted for expiry.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from solaris.config import PROFILES, ServeConfig
from solaris.errors import ConfigError, RequestError

log = logging.getLogger(__name__)


class ClockSkewError(RequestError):
    """An event time too far ahead of a store's reference (the value and the limit named)."""

    def __init__(self, message: str, field: str = "now") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class EventClock:
    """What a store measures event times against; picklable (it travels to the actors)."""

    max_skew_s: float = math.inf  # how far ahead of the reference a time may be; inf: any
    # the reference: this clock (the serving profile: ``time.time``), or None -- the latest
    # time the store has accepted (the replay profile)
    wall: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_skew_s, (int, float)) and self.max_skew_s > 0):
            raise ConfigError(f"max_skew_s={self.max_skew_s!r}: must be > 0 seconds")


def event_clock(cfg: ServeConfig) -> EventClock:
    """The clock the stores of an app with ``cfg`` (its ``profile`` and ``max_skew_s``)
    measure event times against."""
    if cfg.profile not in PROFILES:
        raise ConfigError(f"serve.profile={cfg.profile!r}: must be one of {', '.join(PROFILES)}")
    return EventClock(cfg.max_skew_s, None if cfg.profile == "replay" else time.time)


class SkewGuard:
    """One store's check of the event times it is given. Not thread-safe (its store isn't)."""

    def __init__(self, clock: EventClock | None = None) -> None:
        self.clock = clock if clock is not None else EventClock()
        self.latest = -math.inf  # the latest time accepted
        self.refused = 0  # calls refused for a time too far ahead
        self.untrusted_snapshots = 0  # restores whose time was too far ahead

    def reference(self) -> float:
        """The time skew is measured from now: the wall clock, or the latest accepted."""
        return float(self.clock.wall()) if self.clock.wall is not None else self.latest

    def check(self, t: float | np.ndarray, field: str = "now") -> None:
        """Accept ``t`` (one time or many), or raise ``ClockSkewError`` naming the latest of
        them, the reference and the limit; an accepted time moves ``latest`` forward."""
        if np.ndim(t):
            if not np.size(t):
                return
            t = float(np.max(t))
        t = float(t)
        ref = self.reference()
        if math.isfinite(ref) and t - ref > self.clock.max_skew_s:  # ref -inf: nothing seen
            self.refused += 1
            what = "the wall clock" if self.clock.wall is not None else \
                "the latest event time accepted here"
            raise ClockSkewError(f"{field}={t!r}: {t - ref:.0f} s ahead of {what} ({ref!r}); "
                                 f"the limit is serve.max_skew_s={self.clock.max_skew_s:g}",
                                 field)
        if t > self.latest:
            self.latest = t

    def restored(self, latest: float, what: str) -> float | None:
        """Take a snapshot's latest time. Returns the time the snapshot can be trusted up to:
        None if all of it (within the skew), else the reference -- the snapshot is reported
        and the caller drops what lies beyond and does not expire by its time."""
        if not math.isfinite(latest):
            return None
        ref = self.reference()
        if self.clock.wall is not None and latest - ref > self.clock.max_skew_s:
            self.untrusted_snapshots += 1
            log.warning("%s: the snapshot's latest event time %r is %.0f s ahead of this "
                        "machine's clock (the limit is %g s): not trusted for expiry; what it "
                        "holds beyond the clock is dropped", what, latest, latest - ref,
                        self.clock.max_skew_s)
            self.latest = max(self.latest, ref)
            return ref
        self.latest = max(self.latest, latest)
        return None

    def metrics(self) -> dict[str, int]:
        return {"clock_refused": self.refused,
                "clock_untrusted_snapshots": self.untrusted_snapshots}


def replay_skew(times: np.ndarray, floor: float, groups: np.ndarray | None = None) -> float:
    """The skew a replay of events at ``times`` needs: twice the longest step between
    consecutive times of one group (a store's reference is the latest time it has seen, and a
    store sees only its group -- e.g. a cache shard its own users' requests), at least
    ``floor``."""
    t = np.asarray(times, np.float64)
    g = np.zeros(len(t), np.int64) if groups is None else np.asarray(groups, np.int64)
    if g.shape != t.shape:
        raise ConfigError(f"groups: shape {g.shape} != times shape {t.shape}")
    o = np.lexsort((t, g))
    t, g = t[o], g[o]
    same = g[1:] == g[:-1]
    step = float(np.diff(t)[same].max()) if same.any() else 0.0
    return max(float(floor), 2.0 * step)
