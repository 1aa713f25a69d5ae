"""One control state per app: the runtime settings every router replica follows.

An operator's scale change (``POST /scales``, the runtime kill switch of a tier) and a
rollout's switch to a new version are decided in one router replica but must hold in all of
them, and in a replica started later. They live here, in one copy held by the app's control
actor (``actors/control.py``): a revision number that grows with every change, the scales set
at runtime (the latest per VM, slot and tier, on top of the VMs' own), and the version each
task was switched to. Routers long-poll it (``wait``) and rebuild their tables from it, so a
change reaches every replica one actor call after it is committed.

The state is written whole (JSON, ``solaris.atomic``) to ``serve.control_uri`` on every
change and read back when the holder starts, so it survives the holder's restart; without a
location it lives as long as the holder does. No Ray here.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from solaris import atomic
from solaris.errors import RequestError

log = logging.getLogger(__name__)

FILE = "control.json"
SLOTS = ("pair", "aggregate")


@dataclass(frozen=True)
class ScaleSetting:
    """One scale set at runtime: (version, task, slot, tier) -> scale in [0, 1]."""

    version: str
    task: str
    slot: str
    tier: str | None
    scale: float

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        return (self.version, self.task, self.slot, self.tier)

    @classmethod
    def parse(cls, d: Any) -> "ScaleSetting":
        """From a JSON object; RequestError naming the bad field."""
        if not isinstance(d, dict):
            raise RequestError(f"scale setting: expected an object, got {type(d).__name__}")
        for k in ("version", "task", "slot"):
            if not isinstance(d.get(k), str) or not d[k]:
                raise RequestError(f"{k}={d.get(k)!r}: must be a non-empty string")
        if d["slot"] not in SLOTS:
            raise RequestError(f"slot={d['slot']!r}: one of {', '.join(SLOTS)}")
        tier = d.get("tier")
        if tier is not None and not isinstance(tier, str):
            raise RequestError(f"tier={tier!r}: must be a string or null")
        s = d.get("scale")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (
                math.isfinite(s) and 0.0 <= s <= 1.0):
            raise RequestError(f"scale={s!r}: must be a number in [0, 1]")
        return cls(d["version"], d["task"], d["slot"], tier, float(s))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "task": self.task, "slot": self.slot,
                "tier": self.tier, "scale": self.scale}


@dataclass
class ControlState:
    """The app's runtime settings at one revision."""

    revision: int = 0
    scales: dict[tuple, ScaleSetting] = field(default_factory=dict)  # key -> latest setting
    active: dict[str, str] = field(default_factory=dict)  # task -> version switched to
    changed_at: float = 0.0  # wall-clock time of the last change

    def to_dict(self) -> dict[str, Any]:
        return {"revision": self.revision, "changed_at": self.changed_at,
                "scales": [s.to_dict() for s in self.scales.values()],
                "active": dict(self.active)}

    @classmethod
    def from_dict(cls, d: Any) -> "ControlState":
        """RequestError naming the bad field for a malformed state."""
        if not isinstance(d, dict):
            raise RequestError(f"control state: expected an object, got {type(d).__name__}")
        rev = d.get("revision")
        if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
            raise RequestError(f"revision={rev!r}: must be an integer >= 0")
        active = d.get("active", {})
        if not isinstance(active, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in active.items()):
            raise RequestError(f"active={active!r}: must map task names to version names")
        scales = [ScaleSetting.parse(s) for s in d.get("scales", [])]
        return cls(rev, {s.key: s for s in scales}, dict(active),
                   float(d.get("changed_at", 0.0)))


class Control:
    """The holder's state: changes bump the revision and are written through to
    ``location`` (a local directory or a ``pyarrow.fs`` URI; None: kept in memory only)."""

    def __init__(self, location: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.path = f"{str(location).rstrip('/')}/{FILE}" if location else None
        self.state = ControlState()
        self.writes = 0
        self.restored = False
        if self.path is not None:
            self._restore()

    def _restore(self) -> None:
        fs, p = atomic.filesystem(self.path)
        try:
            with fs.open_input_stream(p) as f:
                raw = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            if "not found" in str(e).lower() or "no such" in str(e).lower():
                return
            raise
        try:
            self.state = ControlState.from_dict(json.loads(raw))
            self.restored = True
            log.info("control state restored from %s at revision %d", self.path,
                     self.state.revision)
        except (ValueError, RequestError) as e:  # a corrupt file must not crash-loop it
            log.error("control state at %s unreadable (%s): starting empty", self.path, e)

    def _commit(self) -> dict[str, Any]:
        self.state.revision += 1
        self.state.changed_at = self._clock()
        if self.path is not None:
            atomic.save_json(self.path, self.state.to_dict())
            self.writes += 1
        return self.state.to_dict()

    def set_scale(self, setting: dict[str, Any]) -> dict[str, Any]:
        """Record one scale (the latest per key wins); the new state."""
        s = ScaleSetting.parse(setting)
        self.state.scales[s.key] = s
        return self._commit()

    def promote(self, task: str, version: str) -> dict[str, Any]:
        """Record ``task``'s switch to ``version`` (a switch is final: the routers only move
        forward in their own version order); the state, unchanged if already recorded."""
        if not isinstance(task, str) or not isinstance(version, str) or not task or not version:
            raise RequestError(f"promote({task!r}, {version!r}): task and version must be "
                               "non-empty strings")
        if self.state.active.get(task) == version:
            return self.state.to_dict()
        self.state.active[task] = version
        return self._commit()

    def snapshot(self) -> dict[str, Any]:
        return self.state.to_dict()


# ---- the routers' side --------------------------------------------------------------------
def change_lag_s(state: dict[str, Any], now: float, at_start: bool = False) -> float | None:
    """Seconds from ``state``'s commit (its ``changed_at``, wall clock) to ``now``, when a
    router serves it: how long a change took to reach the router. None for a state that was
    never changed (revision 0) and for the state a router found as it started (committed
    before the router followed it: that is the state's age, not a lag)."""
    if at_start or not state.get("revision") or not state.get("changed_at"):
        return None
    return round(max(0.0, now - float(state["changed_at"])), 4)


def scale_table(manifests: dict[str, dict], state: ControlState) -> tuple[Any, list[str]]:
    """The live scales a router serves at ``state``: its VMs' own, then every runtime
    setting in the order they were made; a setting for a VM this deployment does not serve
    is skipped (named in the second element), so one app's state never breaks another
    deployment of it."""
    from solaris.online.scales import ScaleError, ScaleTable

    table = ScaleTable(manifests)
    skipped = []
    for s in state.scales.values():
        try:
            table.set(s.version, s.task, s.slot, s.tier, s.scale)
        except ScaleError as e:
            skipped.append(f"{s.version}/{s.task} {s.slot} {s.tier}: {e}")
    return table, skipped


class LiveScales:
    """The scales a router serves: its VMs' own plus every runtime setting of the app's
    control state, rebuilt and swapped whole on each newer state (``apply``, the control
    follower's callback), which also moves each task forward to the version it was switched
    to. ``table`` is the ``ScaleTable`` in use."""

    def __init__(self, manifests: dict[str, dict], policy: Any):
        from solaris.online.scales import ScaleTable

        self.manifests = manifests
        self.policy = policy  # solaris.online.rollout.RolloutPolicy
        self.table = ScaleTable(manifests)
        self.skipped: list[str] = []

    def apply(self, state: dict[str, Any]) -> None:
        table, skipped = scale_table(self.manifests, ControlState.from_dict(state))
        self.table = table
        if skipped != self.skipped:
            for line in skipped:
                log.warning("control state: a setting for a VM not served here: %s", line)
            self.skipped = skipped
        for task, version in state["active"].items():
            self.policy.advance_to(task, version)

    def check(self, version: str, task: str, slot: str, tier: str | None,
              scale: float) -> None:
        """Raise ``ScaleError`` (naming the field) if the setting cannot be served; checked
        on a copy, before the app's state is changed."""
        from solaris.online.scales import ScaleTable

        ScaleTable(self.manifests).set(version, task, slot, tier, scale)
