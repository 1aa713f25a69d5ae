"""Version rollout (DESIGN.md step 8): when VMs switch to a new FM/encoder version.

During a rollout both versions are precomputed. The router looks up the active version for
the VM and, on a share of requests, the pending one as a shadow (never sent to a VM), and
feeds both lookups' pair hits here. A task's VM switches to the pending version once that
version's pair coverage reaches ``threshold`` x the active version's (over a decaying window
of lookups, after ``min_lookups``); a switch is final. Only whole versions reach a VM: the
lookup for a VM asks for exactly its version, and any other version reads as a miss.
"""

from __future__ import annotations

import logging
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from solaris.errors import ConfigError
from solaris.tiers import Tier

log = logging.getLogger(__name__)


@dataclass
class _Coverage:
    hits: float = 0.0
    lookups: float = 0.0
    seen: int = 0  # candidates looked up, undecayed (for min_lookups)

    @property
    def share(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass
class RolloutPolicy:
    """Per task: the active version and, at most, one pending newer version."""

    versions: dict[str, list[str]]  # task -> versions with a VM, oldest first
    threshold: float = 0.8  # pending coverage / active coverage at which a task switches
    min_lookups: int = 2000  # candidates looked up under the pending version before a switch
    decay: float = 0.999  # per-observation decay of the coverage counts (a moving window)
    active: dict[str, str] = field(default_factory=dict)
    _cov: dict[str, _Coverage] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"threshold={self.threshold!r}: must be in (0, 1]")
        for task, vs in self.versions.items():
            if not vs:
                raise ConfigError(f"task {task!r}: no versions")
            self.active.setdefault(task, vs[0])

    def pending(self, task: str) -> str | None:
        """The newest version after the active one, if any."""
        vs = self.versions[task]
        i = vs.index(self.active[task])
        return vs[-1] if i < len(vs) - 1 else None

    def live_versions(self) -> list[str]:
        """Versions to precompute: every task's active and pending version."""
        out: list[str] = []
        for task in self.versions:
            for v in (self.active[task], self.pending(task)):
                if v is not None and v not in out:
                    out.append(v)
        return out

    def observe(self, version: str, pair_hits: int, lookups: int) -> None:
        """One lookup under ``version``: ``pair_hits`` of ``lookups`` candidates had a fresh
        own pair embedding of that version."""
        with self._lock:
            c = self._cov.setdefault(version, _Coverage())
            c.hits = c.hits * self.decay + pair_hits
            c.lookups = c.lookups * self.decay + lookups
            c.seen += lookups

    def coverage(self, version: str) -> float:
        with self._lock:
            c = self._cov.get(version)
            return c.share if c else 0.0

    def maybe_switch(self, task: str) -> bool:
        """Switch ``task`` to its pending version if it has caught up; True if it switched."""
        new = self.pending(task)
        if new is None:
            return False
        with self._lock:
            cn = self._cov.get(new, _Coverage())
            co = self._cov.get(self.active[task], _Coverage())
            if cn.seen < self.min_lookups or cn.share < self.threshold * co.share or cn.share == 0:
                return False
            old, self.active[task] = self.active[task], new
        log.info("task %s: switched from %s to %s (coverage %.3f vs %.3f)", task, old, new,
                 cn.share, co.share)
        return True

    def advance_to(self, task: str, version: str) -> bool:
        """Switch ``task`` to ``version`` if it is newer than the active one (another router
        decided the switch: the app's control state); True if it switched. An unknown task or
        version, or an older one, changes nothing (a switch is final)."""
        vs = self.versions.get(task)
        if not vs or version not in vs:
            return False
        with self._lock:
            if vs.index(version) <= vs.index(self.active[task]):
                return False
            old, self.active[task] = self.active[task], version
        log.info("task %s: switched from %s to %s (the app's control state)", task, old,
                 version)
        return True

    def state(self) -> dict:
        with self._lock:
            return {"active": dict(self.active),
                    "coverage": {v: round(c.share, 4) for v, c in self._cov.items()}}


class Rollouts:
    """A router's side of the rollout: it feeds the policy each lookup's pair hits, looks up
    the pending version on a share of requests (a shadow, never sent to a VM) and records
    a switch it decides in the app's control state (``promote(task, version)``).

    With ``at_barrier`` (``serve.rollout_at_barrier``; the replay sets it) observations wait
    for the barrier and are applied in event-time order (then request id), shadows are
    chosen by request id, and switches are decided at the barrier, so a replay's switch does
    not depend on how its concurrent requests interleaved."""

    def __init__(self, policy: RolloutPolicy, tasks: list[str], lookup: Any, promote: Any,
                 shadow_every: int = 4, at_barrier: bool = False):
        self.policy = policy
        self.tasks = tasks
        self.lookup = lookup  # async (user, items, now, version, surface) -> Slots
        self.promote = promote
        self.shadow_every = shadow_every
        self.at_barrier = at_barrier
        self.observed: list[tuple[float, str, str, int, int]] = []

    def observe(self, now: float, request_id: str | None, version: str, hits: int,
                lookups: int) -> None:
        """A lookup's pair hits: to the policy at once, or kept for the barrier."""
        if self.at_barrier:
            self.observed.append((now, request_id or "", version, hits, lookups))
        else:
            self.policy.observe(version, hits, lookups)

    def shadow_due(self, request_id: str | None, served: int) -> bool:
        """Whether this request (the ``served``-th) also looks up the pending version: every
        ``shadow_every``-th, or at the barrier every request whose id hashes to 0 modulo it."""
        if self.at_barrier and request_id:
            return zlib.crc32(request_id.encode()) % self.shadow_every == 0
        return served % self.shadow_every == 0

    async def shadow(self, body: Any, items: Any, now: float, pending: str) -> None:
        """Look up the pending version to measure its coverage; never raises."""
        try:
            shadow = await self.lookup(body.user_id, items, now, pending, body.surface)
            self.observe(now, body.request_id, pending,
                         int((shadow.pair_tier == Tier.PAIR).sum()), len(items))
            if not self.at_barrier:
                self._decide(body.task)
        except Exception:
            log.exception("shadow lookup of %s failed", pending)

    def decide_at_barrier(self) -> None:
        """The tick's observations in event-time order (then request id), then each task's
        switch decision."""
        seen, self.observed = self.observed, []
        for _, _, version, hits, lookups in sorted(seen):
            self.policy.observe(version, hits, lookups)
        for task in self.tasks:
            self._decide(task)

    def _decide(self, task: str) -> None:
        before = self.policy.active[task]
        self.policy.maybe_switch(task)
        after = self.policy.active[task]
        if after != before:
            self.promote(task, after)
