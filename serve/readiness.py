"""The router's readiness (``GET /healthz``), dependency by dependency, and Serve's health
check of the router replica itself. The verdicts are ``solaris.online.health``'s; this
module only calls the dependencies, each within ``serve.health_budget_ms``."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Any

from ray import serve

from solaris.online import health


def replica_id() -> str | None:
    """This router replica's id (which replica answered, in /stats and /healthz)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica
        return None


class Readiness:
    """``/healthz``'s answer: the VM replicas (required: without one nothing is served,
    503), the cache shards, the queue, the FM workers, the KNN table's age, the control
    state and the read replica (each only degrades: the lookups fall back); reused for
    ``serve.health_cache_s`` (load balancers poll often)."""

    def __init__(self, router: Any, io: Executor):
        self.r = router  # serve.router.Router: its parts, read at check time
        self.io = io
        self.budget_s = router.served.cfg.serve.health_budget_ms / 1000.0
        self.last: tuple[float, dict] | None = None  # (monotonic time, answer)

    async def answer(self) -> dict[str, Any]:
        hit = self.last
        if hit is not None and time.monotonic() - hit[0] < self.r.served.cfg.serve.health_cache_s:
            return hit[1]
        body = await self._checks()
        self.last = (time.monotonic(), body)
        return body

    async def _timed(self, fn: Any, *args: Any) -> tuple[Any, float, str | None]:
        """(result or None, ms, error name) of ``fn(*args)`` on the I/O threads, given up
        after twice the budget (``fn`` is given the budget itself: a shard round names the
        late shards at the budget, and only a stuck call meets this one)."""
        t0 = time.perf_counter()
        try:
            got = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(self.io, fn, *args),
                2 * self.budget_s)
            return got, (time.perf_counter() - t0) * 1e3, None
        except Exception as e:
            return None, (time.perf_counter() - t0) * 1e3, type(e).__name__

    async def _called(self, call: Any) -> tuple[Any, float, str | None]:
        """(answer or None, ms, error name) of a deployment call within the budget."""
        async def run() -> Any:
            return await call()

        t0 = time.perf_counter()
        try:
            got = await asyncio.wait_for(run(), self.budget_s)
            return got, (time.perf_counter() - t0) * 1e3, None
        except Exception as e:
            return None, (time.perf_counter() - t0) * 1e3, type(e).__name__

    async def _vm_check(self, task: str) -> health.Check:
        got, ms, err = await self._called(lambda: self.r.calls.vms[task].health.remote())
        name = f"vm_{task}"
        if err is not None:
            return health.Check(name, False, True, f"no VM replica answered in "
                                f"{self.budget_s * 1000:.0f} ms ({err})", ms)
        if got["error"]:
            return health.loaded_check(name, got["error"], ms)
        return health.Check(name, True, True, f"versions {got['versions']}", ms)

    async def _fm_check(self) -> health.Check:
        if self.r.calls.precompute is None:
            return health.Check("fm_workers", True, False, "no FM workers in this app")
        got, ms, err = await self._called(lambda: self.r.calls.precompute.health.remote())
        return health.fm_check(got, ms) if err is None else health.fm_check(None, ms, err)

    async def _checks(self) -> dict[str, Any]:
        r, cfg = self.r, self.r.served.cfg.serve
        knn = r.lookups.knn.tables
        if knn is not None:  # a due poll of the published KNN pointer
            await self._timed(knn.current)
        group, queue = r.backend.group, r.backend.queue
        (up, ms_sh, _), (q, ms_q, q_err), fm, *vms = await asyncio.gather(
            self._timed(group.ping_all, self.budget_s),
            self._timed(queue.metrics, self.budget_s),
            self._fm_check(), *(self._vm_check(t) for t in r.served.tasks))
        checks = [health.shards_check(up if up is not None else [False] * len(group.shards),
                                      ms_sh),
                  health.Check("queue", q is not None, False,
                               f"depth {q.get('depth', 0)}" if q is not None
                               else f"the queue did not answer ({q_err})", ms_q,
                               {"depth": q.get("depth", 0)} if q is not None else None),
                  fm, *vms,
                  health.knn_check(knn is not None, knn.version if knn else None, time.time(),
                                   cfg.health_knn_max_age_s, knn.verdicts if knn else ()),
                  self._control_check()]
        if r.replica is not None:
            checks.append(self._replica_check())
        if r.load_error is not None:
            checks.append(health.loaded_check("router", r.load_error))
        status = health.verdict(checks)
        return {"status": status, "ok": status != health.UNREADY,
                "checks": {c.name: c.to_dict() for c in checks},
                "tasks": r.served.tasks, "versions": r.rollouts.policy.state(),
                "mode": cfg.mode, "knn": knn.version if knn else None,
                "replica": replica_id()}

    def _control_check(self) -> health.Check:
        control = self.r.control
        m = control.metrics()
        ok = control.alive() and m["last_poll_ok"]
        return health.Check("control", ok, False,
                            f"revision {m['revision']}" if ok else
                            f"following the control state failed ({m['last_error']}): "
                            f"serving revision {m['revision']}", data={"revision": m["revision"]})

    def _replica_check(self) -> health.Check:
        mirror = self.r.replica
        ages = mirror.replica.metrics()["age_s"]
        stale_s = mirror.replica.stale_s
        stale = [s for s, a in enumerate(ages) if a is None or a > stale_s]
        return health.Check("cache_replica", mirror.alive() and not stale, False,
                            f"mirrors of shards {stale} older than {stale_s}"
                            " s: they read as misses" if stale else
                            f"mirrors pulled {max(a for a in ages if a is not None):.1f} s ago "
                            "at most" if ages else "no shards", data={"age_s": ages})

    def own_faults(self) -> list[str]:
        """Serve's health check of this replica: its own faults only (the threads that
        follow the control state and pull the read replica). A dead shard or queue is not
        this replica's fault, and restarting routers would not fix it (``/healthz``
        reports them)."""
        problems = []
        if not self.r.control.alive():
            problems.append("the control-state follower thread stopped")
        if self.r.replica is not None and not self.r.replica.alive():
            problems.append("the read replica's refresh thread stopped")
        return problems
