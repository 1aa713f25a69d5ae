"""The lookup router, the app's HTTP ingress: wiring only. ``POST /rank`` looks up the
request's two SOLARIS slots in the cache group (the read replica, or one parallel round of
shard calls with a deadline), calls the task's VM deployment, answers with a score, the tier
and the embedding age per candidate and the versions used, and then -- without making the
caller wait -- records the impressions in the history store and hands the verifier's picks
to the precompute queue. Also ``/feedback``, ``/scales``, ``/healthz``, ``/stats``.

Each concern is its own part, built here and handed the others it needs:

- the rank pipeline (validate → look up or compute → score → answer):
  ``solaris.online.rank``, over the lookups (``solaris.online.lookup``: KNN tables, cold
  starts, the read replica or the shard round, the inline FM) and the VM calls
  (``serve.backend.Calls``);
- the after-answer work (buffer, flushes, the verifier's picks): ``solaris.online.after_answer``;
- rollout and shadow lookups: ``solaris.online.rollout.Rollouts``; the live scales and the
  app's control state: ``solaris.online.control.LiveScales``, ``actors.control``;
- readiness: ``serve.readiness``; metrics and gauges: ``serve.meters``;
- the routes: ``serve.routes`` (the FastAPI app each replica builds for itself).

``LookupRouter`` serves the ``serving`` and ``cluster`` profiles; the replay profile's router
(``ReplayLookupRouter``) adds the two barriers the replay calls between event-time ticks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve

from actors.control import ControlClient
from serve.auth import Credentials
from serve.backend import QUIET, Backend, Calls, knn_tables
from serve.meters import RouterMeters
from serve.readiness import Readiness
from serve.routes import build_api
from solaris.config import SolarisConfig, load_config
from solaris.errors import SolarisError
from solaris.online import verifier
from solaris.online.after_answer import AfterAnswerWork, Senders
from solaris.online.control import LiveScales
from solaris.online.lookup import KnnView, Lookups
from solaris.online.rank import EventTime, RankPipeline, Served, Stages
from solaris.online.rollout import RolloutPolicy, Rollouts
from solaris.online.scoring import ResidualHead

log = logging.getLogger("solaris.serve")

OPTIONS = dict(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64,
               max_queued_requests=256, health_check_period_s=2.0, logging_config=QUIET)


def corrections(cfg: SolarisConfig, served: Served) -> tuple[dict, str | None]:
    """Each VM's corrections (``ResidualHead``), run in the router while the VM replica runs
    the VM alone beside the lookup round (``serve.overlap``; without it the replica runs
    both), and why they did not load, if so (a VM class that does not import: the router
    stays up to say so in /healthz, which fails readiness with it)."""
    if not cfg.serve.overlap:
        return {}, None
    import torch

    torch.set_num_threads(1)  # as the VM replicas: the corrections round as theirs do
    try:
        return {(v, t): ResidualHead(a, t, cfg.cache.read_ttl_s)
                for v, a in served.arts.items() for t in a.tasks}, None
    except SolarisError as e:
        error = f"{type(e).__name__}: {e}"
        log.error("router: the VMs' corrections did not load: %s", error)
        return {}, error


class Router:
    """The parts of one router replica, and its FastAPI app (``__serve_build_asgi_app__``)."""

    def __init__(self, settings: dict[str, Any], vms: dict[str, Any], precompute: Any = None):
        cfg = load_config(settings.get("config"), settings.get("overrides"))
        served = self.served = Served.open(cfg, settings["artifact_dirs"])
        self.calls = Calls(vms, precompute)
        policy = RolloutPolicy({t: [v for v, a in served.arts.items() if t in a.tasks]
                                for t in served.tasks}, cfg.serve.rollout_threshold,
                               cfg.serve.rollout_min_lookups)
        # the VMs' scales, live: a tier at 0 in every VM of a version is not looked up. The
        # app's control state (runtime scales, rollout switches), one copy for every
        # replica: read now, so this replica's first request serves the current state, then
        # followed (actors/control.py)
        self.live = LiveScales(served.manifests, policy)
        self.control = ControlClient(settings["app_id"], cfg.serve.control_uri, self.live.apply,
                                     cfg.serve.control_wait_s, detached=cfg.serve.detached_state)
        heads, self.load_error = corrections(cfg, served)
        self.backend = Backend(cfg, settings)
        # the lookups' read replica of the cache shards (serve.cache_reads: replica), pulled
        # once here so the first request reads the shards as they are
        self.replica = None
        if cfg.serve.cache_reads == "replica":
            from actors.replica import ReplicaClient

            self.replica = ReplicaClient(self.backend.group, cfg.serve.replica_refresh_s,
                                         cfg.serve.replica_stale_s)
            self.replica.refresh()
        io = ThreadPoolExecutor(4, thread_name_prefix="router-io")
        history_s = cfg.cache.deadline_ms / 1000.0  # request-path history reads
        first_task = served.tasks[0]
        # a published KNN table built from an FM version not served here is disabled
        knn = KnnView(knn_tables(cfg, settings["app_id"],
                                 {v: a.ids().digest() for v, a in served.arts.items()}), io)
        self.lookups = Lookups(served, self.backend.group, self.replica, knn,
                               lambda: self.live.table,
                               lambda: self.backend.history_provider(history_s),
                               lambda: policy.active[first_task], io)
        self.rollouts = Rollouts(policy, served.tasks, self.lookups.lookup, self.control.promote,
                                 int(settings.get("shadow_every", 4)),
                                 cfg.serve.rollout_at_barrier)
        from fastapi.responses import JSONResponse

        self.pipeline = RankPipeline(
            served, Stages(self.lookups.lookup, self.lookups.inline, self.calls.score,
                           JSONResponse),
            lambda: self.live.table, policy.active.__getitem__, lambda: knn.version,
            EventTime(cfg), heads, self.replica is not None)
        self.meters = RouterMeters()
        self.after = AfterAnswerWork(served, self.rollouts, Senders(
            self.replica.flush if self.replica is not None
            else self.backend.record_impressions_many,
            self._enqueue, self.meters.counted),
            verifier.BudgetController(cfg.verifier, time.monotonic))
        # who may call what (serve/auth.py); the cluster profile needs a service token
        self.credentials = Credentials.from_env(cfg.serve.profile == "cluster")
        self.readiness = Readiness(self, io)
        self.meters.start_gauges(self)
        log.info("router: tasks %s, versions %s, mode %s, knn %s", served.tasks,
                 list(served.arts), cfg.serve.mode, knn.tables.version if knn.tables else None)

    def _enqueue(self, version: str, users: Any, items: Any, prios: Any, nows: Any,
                 surfaces: Any) -> Any:
        return self.backend.queue.put(users, items, prios, nows, surfaces, version)

    def __serve_build_asgi_app__(self) -> Any:
        return build_api(self)

    def check_health(self) -> None:
        """Serve's health check of this replica: its own faults only (``serve.readiness``)."""
        problems = self.readiness.own_faults()
        if problems:
            raise RuntimeError("; ".join(problems))


class ReplayRouter(Router):
    """The replay profile's router: the barriers ``jobs/replay.py`` calls through a handle
    between event-time ticks."""

    async def flush_now(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Wait for the after-answer work of every answered request, send the buffer, and
        wait until the queue took the picks and the shards took every history write
        (impressions and /feedback labels); decide the tick's rollouts. Returns the
        requests seen and the writes still outstanding."""
        deadline = time.monotonic() + timeout_s
        await self.after.barrier(deadline)
        if self.rollouts.at_barrier:
            self.rollouts.decide_at_barrier()
        left = await asyncio.get_running_loop().run_in_executor(
            self.lookups.io, self.backend.group.flush_records, max(0.0, deadline - time.monotonic()))
        return {"requests": self.after.counts["requests"], "after_pending": self.after.pending,
                "records_outstanding": left}

    async def refresh_now(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """After the FM workers wrote: pull every shard's changes into the read replica now
        and return once applied (no replica: nothing)."""
        if self.replica is None:
            return {"applied": 0, "failed": []}
        return await asyncio.get_running_loop().run_in_executor(self.lookups.io,
                                                                self.replica.refresh, timeout_s)


LookupRouter = serve.deployment(name="LookupRouter", **OPTIONS)(serve.ingress()(Router))
ReplayLookupRouter = serve.deployment(name="LookupRouter", **OPTIONS)(serve.ingress()(ReplayRouter))


def router_for(profile: str) -> Any:
    """The router deployment of a ``serve.profile``."""
    return ReplayLookupRouter if profile == "replay" else LookupRouter
