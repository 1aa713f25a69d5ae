"""The app's readiness, dependency by dependency (``GET /healthz``).

A router answers a request while its cache shards, queue, FM workers or KNN tables are
down: a dead shard's keys read as misses and fall back, a dead queue loses only speculation.
So those dependencies make the app *degraded*, never *unready*; only a VM that does not
answer makes a router unable to serve (*unready*, HTTP 503). Each check runs inside a time
budget and reports what it found, so an operator reads which shard is down, how old the KNN
table is, or that the FM workers have work and no worker.

Serve's own ``check_health`` is kept to a replica's own faults (``LookupRouter``): if it
looked at the shards, one dead shard would make Serve restart every router, which the
lookups' fallbacks make needless.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass
from typing import Any, Iterable

OK, DEGRADED, UNREADY = "ok", "degraded", "unready"
_STAMP = re.compile(r"(\d{8}T\d{6}Z)")


@dataclass(frozen=True)
class Check:
    """One dependency's state: ``required`` checks failing make the router unready."""

    name: str
    ok: bool
    required: bool = False
    detail: str = ""
    ms: float = 0.0
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "required": self.required, "detail": self.detail,
                "ms": round(self.ms, 2), **(self.data or {})}


def verdict(checks: Iterable[Check]) -> str:
    """``unready`` if a required check failed, ``degraded`` if any other did, else ``ok``."""
    checks = list(checks)
    if any(c.required and not c.ok for c in checks):
        return UNREADY
    return DEGRADED if any(not c.ok for c in checks) else OK


def knn_age_s(version: str | None, now: float) -> float | None:
    """Seconds since the KNN tables ``version`` was built (the build's UTC stamp,
    ``YYYYmmddTHHMMSSZ``, in its name; the oldest if it names several); None if it has none."""
    if not version:
        return None
    stamps = _STAMP.findall(version)
    if not stamps:
        return None
    built = min(calendar.timegm(time.strptime(s, "%Y%m%dT%H%M%SZ")) for s in stamps)
    return max(0.0, now - built)


def loaded_check(name: str, error: str | None, ms: float = 0.0,
                 data: dict[str, Any] | None = None) -> Check:
    """A deployment's plug-ins (its model classes) as it loaded them: ``error`` (why they did
    not load) fails readiness; nothing serves until the app is fixed and redeployed."""
    if error:
        return Check(name, False, True, f"did not load: {error}", ms, data)
    return Check(name, True, True, "loaded", ms, data)


def shards_check(up: list[bool], ms: float) -> Check:
    down = [s for s, u in enumerate(up) if not u]
    detail = (f"shards {down} did not answer in time: their keys read as misses"
              if down else f"{len(up)} shards answered")
    return Check("shards", not down, False, detail, ms, {"down": down, "shards": len(up)})


def knn_check(configured: bool, version: str | None, now: float, max_age_s: float,
              verdicts: Iterable[Any] = ()) -> Check:
    """The KNN tables' age and, from ``verdicts`` (``solaris.knn.provenance.Verdict`` of
    each published table), which are disabled (built from an FM version this app does not
    serve: not ok) or served unchecked (no record of their FM version: said, still ok)."""
    if not configured:
        return Check("knn", True, False, "no knn.table_uri: neighbour tiers off")
    age = knn_age_s(version, now)
    if version is None:
        return Check("knn", False, False, "no table published yet: neighbour tiers miss",
                     data={"version": None, "age_s": None, "max_age_s": max_age_s})
    fresh = age is None or age <= max_age_s
    detail = (f"table {version} is {age / 3600:.1f} h old (budget {max_age_s / 3600:.1f} h)"
              if age is not None else f"table {version} (no build time in its name)")
    detail = detail if fresh else f"stale: {detail}"
    verdicts = list(verdicts)
    disabled = {v.kind: v.line() for v in verdicts if not v.served}
    notes = [v.line() for v in verdicts if not v.served] + \
        [v.line() for v in verdicts if v.served and v.reason]
    return Check("knn", fresh and not disabled, False, "; ".join([detail, *notes]),
                 data={"version": version, "age_s": None if age is None else round(age, 1),
                       "max_age_s": max_age_s, "disabled": disabled})


def fm_check(summary: dict[str, Any] | None, ms: float, error: str | None = None) -> Check:
    """From the Precompute deployment's ``health``: workers, queue depth and lag. Its
    ``error`` (the FM did not load where the app runs: a deployment that cannot work until
    it is fixed and redeployed) fails readiness."""
    if summary is None:
        return Check("fm_workers", False, False,
                     f"the precompute deployment did not answer ({error})", ms)
    if summary.get("error"):
        return Check("fm_workers", False, True,
                     f"no FM worker can start: {summary['error']}", ms, dict(summary))
    workers, depth = int(summary.get("workers", 0)), int(summary.get("queue_depth", 0))
    ok = workers > 0 or depth == 0
    detail = (f"{workers} FM workers, {depth} pairs queued"
              + ("" if ok else ": work queued and no worker to do it"))
    return Check("fm_workers", ok, False, detail, ms, dict(summary))
