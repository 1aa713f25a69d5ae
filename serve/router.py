"""The lookup router, the app's HTTP ingress: ``POST /rank`` looks up the request's two
SOLARIS slots in the cache group (one parallel round with a deadline), calls the task's VM
deployment, answers with a score, the tier and the embedding age per candidate and the
versions used, and then -- without making the caller wait -- records the impressions in the
history store and hands the verifier's picks to the precompute queue. Also ``/feedback``,
``/scales``, ``/healthz``, ``/stats``."""

import asyncio
import logging
import threading
import time
import uuid
import zlib
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from fastapi import Depends
from fastapi.responses import JSONResponse
from ray import serve
from ray.util import metrics as ray_metrics
from starlette.background import BackgroundTask

from actors.control import ControlClient, ControlUnavailable
from serve.auth import Credentials, operator_call, read_call, service_call
from serve.backend import QUIET, Backend, Unavailable, knn_tables
from serve.http import (RETRY_AFTER_S, FeedbackRequest, RankRequest, RankResponse,
                        ScaleRequest, api, problem)
from solaris import metrics
from solaris.online import health, verifier
from solaris.cache.query import Slots
from solaris.clock import ClockSkewError, SkewGuard, event_clock
from solaris.config import SolarisConfig, config_to_dict, load_config
from solaris.online.rollout import RolloutPolicy
from solaris.online.control import ControlState, scale_table
from solaris.online.scales import ScaleError, ScaleTable, scale_dict
from solaris.artifact_store import shown
from solaris.artifacts import Artifacts
from solaris.errors import RequestError, SolarisError
from solaris.ids import deployment_ids
from solaris.online.scoring import (InlineFM, PackedSlots, ResidualHead,
                                    ScoreRequest, decode_scores, encode_score_request)
from solaris.knn.neighbours import NeighbourTable
from solaris.online.scoring import request_vector
from solaris.online.newusers import computable_picks
from solaris.online.serving import AfterAnswer, ColdStartMemo, cold_start_inputs, is_cold
from solaris.tiers import LABELS as TIER_LABELS
from solaris.tiers import NUM_TIERS, Tier

log = logging.getLogger("solaris.serve")

GAUGE_EVERY_S = 5.0  # the router's own gauges (shard liveness, KNN table age) are set this often
DEBUG_FIELDS = ("now", "mode", "features_for", "reads")  # request fields of the replay profile only


def _replica_id() -> str | None:
    """This router replica's id (which replica answered, in /stats and /healthz)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica
        return None


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64,
                  max_queued_requests=256, health_check_period_s=2.0, logging_config=QUIET)
@serve.ingress(api)
class LookupRouter:
    """HTTP ingress: enrich via the cache group, call the VM, answer, then speculate."""

    def __init__(self, settings: dict[str, Any], vms: dict[str, Any], precompute: Any = None):
        cfg = load_config(settings.get("config"), settings.get("overrides"))
        self.cfg: SolarisConfig = cfg
        self.settings = settings
        self.vms = vms  # task -> DeploymentHandle
        self.precompute = precompute  # Precompute's handle, or None (no FM workers)
        arts = [Artifacts.open(d) for d in settings["artifact_dirs"]]
        self.arts = {a.version: a for a in arts}
        # the wire's raw ids -> codes, one map for every version served
        self.ids = deployment_ids([(str(a.root), a.ids()) for a in arts])
        for a in arts:  # each version's feature spec (request features), read here once
            _ = a.spec
        # the last surface code every version's tables hold: a request's surface past it is
        # read as it, as the VM reads it (solaris.online.scoring), by the history and the FM
        self._last_surface = min(a.spec.num_surfaces for a in arts) - 1
        self.tasks = sorted({t for a in arts for t in a.tasks})
        # the VMs' scales, live: a tier at 0 in every VM of a version is not looked up
        self._manifests = {a.version: a.manifest for a in arts}
        self.scales = ScaleTable(self._manifests)
        self.policy = RolloutPolicy({t: [a.version for a in arts if t in a.tasks]
                                     for t in self.tasks}, cfg.serve.rollout_threshold,
                                    cfg.serve.rollout_min_lookups)
        # the app's control state (runtime scales, rollout switches), one copy for every
        # replica: read now, so this replica's first request serves the current state, then
        # followed (actors/control.py)
        self._health: tuple[float, dict] | None = None  # (monotonic time, /healthz answer)
        self._control_skipped: list[str] = []
        self.control = ControlClient(settings["app_id"], cfg.serve.control_uri,
                                     self._control_state, cfg.serve.control_wait_s,
                                     detached=cfg.serve.detached_state)
        # each VM's corrections, run here while the VM replica runs the VM alone beside the
        # lookup round (serve.overlap; without it the replica runs both)
        self.heads: dict[tuple[str, str], ResidualHead] = {}
        # why the corrections did not load here (a VM class that does not import): the
        # router stays up to say so in /healthz, which fails readiness with it
        self._load_error: str | None = None
        if cfg.serve.overlap:
            import torch

            torch.set_num_threads(1)  # as the VM replicas: the corrections round as theirs do
            try:
                self.heads = {(a.version, t): ResidualHead(a, t, cfg.cache.read_ttl_s)
                              for a in arts for t in a.tasks}
            except SolarisError as e:
                self._load_error = f"{type(e).__name__}: {e}"
                log.error("router: the VMs' corrections did not load: %s", self._load_error)
        self.backend = Backend(cfg, settings)
        # the lookups' read replica of the cache shards (serve.cache_reads: replica), pulled
        # once here so the first request reads the shards as they are
        self.replica = None
        if cfg.serve.cache_reads == "replica":
            from actors.replica import ReplicaClient

            self.replica = ReplicaClient(self.backend.group, cfg.serve.replica_refresh_s,
                                         cfg.serve.replica_stale_s)
            self.replica.refresh()
        # a published KNN table built from an FM version not served here is disabled
        self.knn = knn_tables(cfg, settings["app_id"], {a.version: a.ids().digest() for a in arts})
        self._knn_poll: Any = None  # the pointer poll running on a thread, if any
        if self.knn is not None:
            self.knn.current()  # the published tables, if any, before the first request
        self._inline: InlineFM | None = None
        # ((FM version, user vector), its encoder, side tables, events read), lazily
        self._user_enc: tuple | None = None
        self._history_timeout_s = cfg.cache.deadline_ms / 1000.0  # request-path history reads
        self._cold_starts = 0
        self._cold_memo = ColdStartMemo(cfg.serve.cold_start_memo)
        self._inline_lock = threading.Lock()
        self._io = ThreadPoolExecutor(4, thread_name_prefix="router-io")
        self._after: set[asyncio.Task] = set()
        self._after_pending = 0  # answered requests whose after-answer work has not run yet
        self.buffer = AfterAnswer(cfg.serve.flush_requests)
        self._flusher: asyncio.Task | None = None
        self._after_calls = {"flushes": 0, "queue_calls": 0}  # actor calls after answers
        self._tier_counts = np.zeros(NUM_TIERS, np.int64)
        self._agg_count = 0
        # seconds of the last requests per mode by phase (enrich, VM call, answer; the lookup
        # round's own steps) -- where the time goes
        self._phases: dict[str, deque] = defaultdict(lambda: deque(maxlen=2000))
        self._shadow_every = int(settings.get("shadow_every", 4))
        # serve.rollout_at_barrier (the replay sets it): rollouts are decided at the barrier,
        # the tick's coverage observations applied in event-time order, shadows chosen by
        # request id, so a replay's switch does not depend on how its concurrent requests
        # interleaved
        self._at_barrier = cfg.serve.rollout_at_barrier
        self._observed: list[tuple[float, str, str, int, int]] = []
        self._requests = 0
        self._budget = verifier.BudgetController(cfg.verifier, time.monotonic)
        api.state.max_body_bytes = cfg.serve.max_body_bytes
        # who may call what (serve/auth.py); the cluster profile needs a service token
        self.credentials = Credentials.from_env(cfg.serve.profile == "cluster")
        api.state.credentials = self.credentials
        # the replay profile takes a request's event time, checked against the latest this
        # router has accepted; the serving profiles stamp requests with the wall clock
        self._replay = cfg.serve.profile == "replay"
        self._clock = SkewGuard(event_clock(cfg.serve)) if self._replay else None
        self._m_latency = metrics.build(metrics.RANK_LATENCY_MS, ray_metrics)
        self._m_tier = metrics.build(metrics.CANDIDATES, ray_metrics)
        self._m_agg = metrics.build(metrics.AGGREGATE_PRESENT, ray_metrics)
        self._m_errors = metrics.build(metrics.RANK_ERRORS, ray_metrics)
        self._m_enqueued = metrics.build(metrics.ENQUEUED_PAIRS, ray_metrics)
        # what a dashboard needs that no request counts: shard liveness, the KNN table's
        # age, the control state's revision (a thread, every GAUGE_EVERY_S; every router
        # replica reports its own view)
        self._m_shard_up = metrics.build(metrics.SHARD_UP, ray_metrics)
        self._m_knn_age = metrics.build(metrics.KNN_TABLE_AGE_S, ray_metrics)
        self._m_control = metrics.build(metrics.CONTROL_REVISION, ray_metrics)
        threading.Thread(target=self._gauge_loop, name="router-gauges", daemon=True).start()
        log.info("router: tasks %s, versions %s, mode %s, knn %s", self.tasks, list(self.arts),
                 cfg.serve.mode, self.knn.version if self.knn else None)

    def _gauge_loop(self) -> None:
        while True:
            try:
                self._set_gauges()
            except Exception:
                log.exception("router gauges failed")
            time.sleep(GAUGE_EVERY_S)

    def _set_gauges(self) -> None:
        budget = self.cfg.serve.health_budget_ms / 1000.0
        for s, up in enumerate(self.backend.group.ping_all(budget)):
            self._m_shard_up.set(1.0 if up else 0.0, tags={"shard": str(s)})
        age = health.knn_age_s(self.knn.version, time.time()) if self.knn else None
        self._m_knn_age.set(-1.0 if age is None else age)
        self._m_control.set(float(self.control.revision))

    # -- helpers
    def _control_state(self, state: dict[str, Any]) -> None:
        """A newer control state (the follower thread, or a change this router made): the
        scales rebuilt from the VMs' own plus every runtime setting, swapped in whole; each
        task moved forward to the version it was switched to."""
        table, skipped = scale_table(self._manifests, ControlState.from_dict(state))
        self.scales = table
        if skipped != self._control_skipped:
            for line in skipped:
                log.warning("control state: a setting for a VM not served here: %s", line)
            self._control_skipped = skipped
        for task, version in state["active"].items():
            self.policy.advance_to(task, version)

    def _switched(self, task: str, before: str) -> None:
        """Record a switch this router decided, if it made one, in the app's control state."""
        after = self.policy.active[task]
        if after != before:
            self.control.promote(task, after)

    def _inline_fm(self) -> InlineFM:
        with self._inline_lock:
            if self._inline is None:
                art = self.arts[self.policy.active[self.tasks[0]]]
                self._inline = InlineFM(art, art.side_tables(),
                                        self.backend.history_provider(self._history_timeout_s),
                                        self.cfg.serve.inline_sharing)
            return self._inline

    def _inline_slots(self, user: int, items: np.ndarray, surface: int, now: float
                      ) -> Slots | None:
        """The inline FM's slots; None (the VM alone) if the user's history is unreadable."""
        try:
            return self._inline_fm().slots(user, items, surface, now)
        except Exception as e:  # e.g. HistoryUnavailable: a shard missed the deadline
            log.warning("inline FM failed for user %s (%s: %s); answering with the VM alone",
                        user, type(e).__name__, e)
            return None

    async def _lookup(self, user: int, items: np.ndarray, now: float, version: str,
                      surface: int = 0, phases: dict[str, float] | None = None,
                      reads: str | None = None) -> Slots:
        """Both SOLARIS slots: from the read replica (no call), or in one awaited round of
        shard calls (cold-start neighbours, which run the user encoder, on a thread first)."""
        knn = self._knn_now()
        users = knn.users if knn else None
        if knn is not None and knn.live is not None and is_cold(users, user):
            cold = await asyncio.get_running_loop().run_in_executor(
                self._io, self._cold_neighbours, user, now, surface, knn)
            users = cold or users
        if self.replica is not None and reads != "shards":
            return self.replica.lookup(user, items, now, version, users,
                                       knn.items if knn else None,
                                       self.scales.enrich_for(version, self.cfg.enrich),
                                       phases=phases)
        return await self.backend.group.lookup_async(user, items, now, version, users,
                                                     knn.items if knn else None,
                                                     self.scales.enrich_for(version,
                                                                            self.cfg.enrich),
                                                     phases=phases)

    def _knn_now(self) -> Any:
        """The KNN tables in use (None: none published). A due poll of the published pointer
        (a call to the app's holder; on a new version, a fetch of its snapshot) runs on a
        thread, never on the event loop: requests go on with the tables in use meanwhile."""
        if self.knn is None:
            return None
        if self._knn_poll is None and self.knn.due():
            self._knn_poll = asyncio.get_running_loop().run_in_executor(self._io,
                                                                        self.knn.current)
            self._knn_poll.add_done_callback(self._knn_polled)
        return self.knn.peek()

    def _knn_polled(self, _: Any) -> None:
        self._knn_poll = None

    def _cold_neighbours(self, user: int, now: float, surface: int, knn: Any
                         ) -> NeighbourTable | None:
        """Neighbours of a user the published table lacks: the user vector the index was
        built with, of the FM it was built from (the request tower of the active version's
        for a table that records neither), over the user's history as of ``now``, queried
        against the live index. None (next tier) on failure."""
        try:
            from solaris.knn.user_encoder import LEGACY_USER_VECTOR, events_read, user_encoder

            built = knn.built_from.get("user")
            version = (built.fm_version if built is not None and built.fm_version in self.arts
                       else self.policy.active[self.tasks[0]])
            kind = (built.user_vector if built is not None and built.user_vector
                    else LEGACY_USER_VECTOR)
            with self._inline_lock:
                if self._user_enc is None or self._user_enc[0] != (version, kind):
                    from solaris.artifacts import load_models

                    art = self.arts[version]
                    fm, _, _ = load_models(art.root)
                    hlen = min(events_read(kind, fm, self.cfg.knn.user_events),
                               self.cfg.history.max_events)
                    self._user_enc = ((version, kind), user_encoder(kind, fm),
                                      art.side_tables(), hlen)
            _, enc, side, hlen = self._user_enc
            req = cold_start_inputs(self.backend.history_provider(self._history_timeout_s),
                                    user, now, surface, hlen, side)
            probe = self.cfg.enrich.user_knn_probe + 1

            def query() -> tuple[np.ndarray, np.ndarray]:
                ids, sims = knn.live.query(enc.encode(req), probe)
                return ids[0], sims[0]

            ids, sims = self._cold_memo.get(knn.version, probe, req, query)
            self._cold_starts += 1
            return NeighbourTable.one(user, ids, sims, knn.version)
        except Exception:
            log.exception("cold-start neighbours for user %s failed; next tier", user)
            return None

    async def _score(self, task: str, version: str, req: ScoreRequest,
                     method: str = "score") -> np.ndarray:
        """The VM replica's answer to ``req``: ``score`` ((2, C) probabilities) or ``base``
        (the VM alone's (C,) logits); one retry, then ``Unavailable``."""
        handle = getattr(self.vms[task], method)
        payload = encode_score_request(version, req)
        for attempt in (0, 1):
            try:
                return decode_scores(await handle.remote(payload))
            except Exception as e:  # replica died mid-call, or none is running: retry once
                if attempt:
                    raise Unavailable(f"no VM replica for task {task!r} answered: "
                                       f"{type(e).__name__}") from e
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    # -- endpoints
    @api.get("/healthz", responses={503: {"description": "unready: no VM replica answers"}})
    async def healthz(self) -> Any:
        """Readiness per dependency, each checked within ``serve.health_budget_ms``: the VM
        replicas (required: without one nothing is served, 503), the cache shards, the
        queue, the FM workers, the KNN table's age, the control state and the read replica
        (each only degrades: the lookups fall back). ``status``: ok | degraded | unready;
        the answer is reused for ``serve.health_cache_s`` (load balancers poll often)."""
        hit = self._health
        if hit is not None and time.monotonic() - hit[0] < self.cfg.serve.health_cache_s:
            body = hit[1]
        else:
            body = await self._health_checks()
            self._health = (time.monotonic(), body)
        return JSONResponse(body, status_code=503 if body["status"] == health.UNREADY else 200)

    async def _timed(self, fn: Any, *args: Any) -> tuple[Any, float, str | None]:
        """(result or None, ms, error name) of ``fn(*args)`` on the router's I/O threads,
        given up after twice the health budget (``fn`` is given the budget itself: a shard
        round names the late shards at the budget, and only a stuck call meets this one)."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            got = await asyncio.wait_for(loop.run_in_executor(self._io, fn, *args),
                                         2 * self.cfg.serve.health_budget_ms / 1000.0)
            return got, (time.perf_counter() - t0) * 1e3, None
        except Exception as e:
            return None, (time.perf_counter() - t0) * 1e3, type(e).__name__

    async def _vm_check(self, task: str) -> health.Check:
        t0 = time.perf_counter()
        budget = self.cfg.serve.health_budget_ms / 1000.0

        async def call() -> Any:
            return await self.vms[task].health.remote()

        try:
            got = await asyncio.wait_for(call(), budget)
            ms = (time.perf_counter() - t0) * 1e3
            if got["error"]:
                return health.loaded_check(f"vm_{task}", got["error"], ms)
            return health.Check(f"vm_{task}", True, True, f"versions {got['versions']}", ms)
        except Exception as e:
            return health.Check(f"vm_{task}", False, True,
                                f"no VM replica answered in {budget * 1000:.0f} ms "
                                f"({type(e).__name__})", (time.perf_counter() - t0) * 1e3)

    async def _fm_check(self) -> health.Check:
        if self.precompute is None:
            return health.Check("fm_workers", True, False, "no FM workers in this app")
        t0 = time.perf_counter()

        async def call() -> Any:
            return await self.precompute.health.remote()

        try:
            got = await asyncio.wait_for(call(), self.cfg.serve.health_budget_ms / 1000.0)
            return health.fm_check(got, (time.perf_counter() - t0) * 1e3)
        except Exception as e:
            return health.fm_check(None, (time.perf_counter() - t0) * 1e3, type(e).__name__)

    async def _health_checks(self) -> dict[str, Any]:
        budget_s = self.cfg.serve.health_budget_ms / 1000.0
        if self.knn is not None:  # a due poll of the published KNN pointer
            await self._timed(self.knn.current)
        (up, ms_sh, _), (q, ms_q, q_err), fm, *vms = await asyncio.gather(
            self._timed(self.backend.group.ping_all, budget_s),
            self._timed(self.backend.queue.metrics, budget_s),
            self._fm_check(), *(self._vm_check(t) for t in self.tasks))
        checks = [health.shards_check(up if up is not None
                                      else [False] * len(self.backend.group.shards), ms_sh),
                  health.Check("queue", q is not None, False,
                               f"depth {q.get('depth', 0)}" if q is not None
                               else f"the queue did not answer ({q_err})", ms_q,
                               {"depth": q.get("depth", 0)} if q is not None else None),
                  fm, *vms,
                  health.knn_check(self.knn is not None, self.knn.version if self.knn else None,
                                   time.time(), self.cfg.serve.health_knn_max_age_s,
                                   self.knn.verdicts if self.knn else ()),
                  self._control_check()]
        if self.replica is not None:
            checks.append(self._replica_check())
        if self._load_error is not None:
            checks.append(health.loaded_check("router", self._load_error))
        status = health.verdict(checks)
        return {"status": status, "ok": status != health.UNREADY,
                "checks": {c.name: c.to_dict() for c in checks},
                "tasks": self.tasks, "versions": self.policy.state(),
                "mode": self.cfg.serve.mode, "knn": self.knn.version if self.knn else None,
                "replica": _replica_id()}

    def _control_check(self) -> health.Check:
        m = self.control.metrics()
        ok = self.control.alive() and m["last_poll_ok"]
        return health.Check("control", ok, False,
                            f"revision {m['revision']}" if ok else
                            f"following the control state failed ({m['last_error']}): "
                            f"serving revision {m['revision']}", data={"revision": m["revision"]})

    def _replica_check(self) -> health.Check:
        ages = self.replica.replica.metrics()["age_s"]
        stale = [s for s, a in enumerate(ages) if a is None or a > self.replica.replica.stale_s]
        return health.Check("cache_replica", self.replica.alive() and not stale, False,
                            f"mirrors of shards {stale} older than {self.replica.replica.stale_s}"
                            " s: they read as misses" if stale else
                            f"mirrors pulled {max(a for a in ages if a is not None):.1f} s ago "
                            "at most" if ages else "no shards", data={"age_s": ages})

    def check_health(self) -> None:
        """Serve's health check of this replica: its own faults only (the threads that
        follow the control state and pull the read replica). A dead shard or queue is not
        this replica's fault, and restarting routers would not fix it (``/healthz``
        reports them)."""
        problems = []
        if not self.control.alive():
            problems.append("the control-state follower thread stopped")
        if self.replica is not None and not self.replica.alive():
            problems.append("the read replica's refresh thread stopped")
        if problems:
            raise RuntimeError("; ".join(problems))

    def _event_time(self, body: RankRequest | FeedbackRequest) -> float | JSONResponse:
        """The request's event time: the wall clock, or in the replay profile the ``now`` it
        carries (checked for skew); a 422 naming the field where the profile refuses it."""
        if not self._replay:
            for name in DEBUG_FIELDS:
                if getattr(body, name, None) is not None:
                    return self._error(422, name, f"not accepted in the "
                                       f"{self.cfg.serve.profile} profile (event time and "
                                       "per-request modes are the server's; "
                                       "serve.profile=replay accepts them)")
            return time.time()
        if body.now is None:
            return time.time()
        try:
            self._clock.check(float(body.now))
        except ClockSkewError as e:
            return self._error(422, "now", str(e))
        return float(body.now)

    def _request_features(self, body: RankRequest, version: str) -> np.ndarray | JSONResponse:
        """The request's real-time ``features`` standardised as ``version``'s VMs were trained
        (``request_vector``; a declared feature it does not carry reads its mean); a 422
        naming a feature the deployment's mapping did not declare or a non-finite value."""
        try:
            return request_vector(self.arts[version].spec, body.features)
        except RequestError as e:
            return self._error(422, "features", str(e))

    @api.post("/rank", response_model=RankResponse, dependencies=[Depends(service_call)],
              responses={401: {"description": "the service token is missing or wrong"},
                         413: {"description": "body too large"},
                         422: {"description": "a field is malformed (named in detail.loc)"},
                         503: {"description": "no VM replica (Retry-After)"}})
    async def rank(self, body: RankRequest) -> Any:
        t0 = time.perf_counter()
        now = self._event_time(body)
        if isinstance(now, JSONResponse):
            return now
        mode = body.mode or self.cfg.serve.mode
        if body.reads == "replica" and self.replica is None:
            return self._error(422, "reads", "this app reads the shards "
                               "(serve.cache_reads=shards): it has no read replica")
        if body.task not in self.vms:
            return self._error(422, "task", f"{body.task!r} is not served (tasks: "
                               f"{', '.join(self.tasks)})")
        if len(body.candidates) > self.cfg.serve.max_candidates:
            return self._error(422, "candidates", f"{len(body.candidates)} candidates; the limit "
                               f"is {self.cfg.serve.max_candidates}")
        coded = self._codes(body, "candidates")  # raw ids -> the deployment's codes
        if isinstance(coded, JSONResponse):
            return coded
        body, items = coded
        if body.surface > self._last_surface:  # a surface the data never held
            body = body.model_copy(update={"surface": self._last_surface})
        if body.features_for is not None and any(
                not 0 <= i < len(items) for i in body.features_for):
            return self._error(422, "features_for", f"positions must be in [0, {len(items)})")
        version = self.policy.active[body.task]
        feats = self._request_features(body, version)
        if isinstance(feats, JSONResponse):
            return feats
        loop = asyncio.get_running_loop()
        slots: Slots | None = None
        steps: dict[str, float] = {}
        extra: dict[str, float] = {}
        head = self.heads.get((version, body.task)) if mode == "solaris" else None
        alone = None
        if head is not None:  # the VM alone's forward runs while the lookup round does
            alone = asyncio.ensure_future(self._score(
                body.task, version, ScoreRequest(body.user_id, items, body.surface, None,
                                                 features=feats), "base"))
        try:
            if mode == "solaris":
                slots = await self._lookup(body.user_id, items, now, version, body.surface,
                                           steps, body.reads)
            elif mode == "inline":
                slots = await loop.run_in_executor(self._io, self._inline_slots, body.user_id,
                                                   items, body.surface, now)
        except BaseException:
            if alone is not None:  # the answer is an error: the VM alone's is not needed
                alone.cancel()
                alone.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        t1 = time.perf_counter()
        try:
            if alone is not None:
                base_logit = await alone
                t_head = time.perf_counter()
                probs, base = head.served(base_logit, slots,
                                          self.scales.array(version, body.task), items)
                extra["head"] = time.perf_counter() - t_head
            else:
                req = ScoreRequest(body.user_id, items, body.surface,
                                   PackedSlots.pack(slots) if slots is not None else None,
                                   self.scales.array(version, body.task), feats)
                probs, base = await self._score(body.task, version, req)
        except Unavailable as e:
            return self._error(503, "task", str(e),
                               headers={"Retry-After": str(RETRY_AFTER_S)})
        t2 = time.perf_counter()
        rid = body.request_id or uuid.uuid4().hex
        tiers = slots.pair_tier if slots is not None else np.zeros(len(items), np.int64)
        # built as RankResponse's JSON directly: validating 3 x 500 values again costs more
        # than the VM (the schema test checks the shape)
        features = None
        if body.features_for is not None:
            pos = np.asarray(body.features_for, np.int64)
            d = self.cfg.cache.dim
            features = {"pair": (slots.pair_emb[pos] if slots is not None
                                 else np.zeros((len(pos), d))).astype(float).tolist(),
                        "user": (slots.agg_emb[pos] if slots is not None
                                 else np.zeros((len(pos), d))).astype(float).tolist()}
        resp = JSONResponse({
            "request_id": rid, "task": body.task, "mode": mode,
            "scores": probs.astype(float).tolist(),
            "tiers": [TIER_LABELS[t] for t in tiers.tolist()],
            "ages_s": slots.pair_age_s.tolist() if slots is not None else [0.0] * len(items),
            "aggregate": slots.agg_present.tolist() if slots is not None else [False] * len(items),
            "versions": {"fm": version if mode != "vm" else "", "vm": version,
                         "knn": (self.knn.version or "") if self.knn else ""},
            "features": features})
        t3 = time.perf_counter()
        # with serve.overlap, "vm" is the wait for the VM alone after the lookup round plus
        # the corrections ("head", also on its own)
        # (a request that chose its lookup path, replay profile: timed apart)
        self._phases[mode if body.reads is None else f"{mode}:{body.reads}"].append({"enrich": t1 - t0, "vm": t2 - t1, "answer": t3 - t2, **extra,
                                   **{f"lookup_{k}": v for k, v in steps.items()}})
        self._m_latency.observe((t3 - t0) * 1000.0,
                                tags={"mode": mode, "task": body.task})
        if mode == "solaris" and slots is not None:
            # a background task runs once the answer's bytes are sent
            self._after_pending += 1
            resp.background = BackgroundTask(self._after_answer, body, items, now, probs, base,
                                             slots)
        return resp

    async def _after_answer(self, body: RankRequest, items: np.ndarray, now: float,
                            probs: np.ndarray, base: np.ndarray, slots: Slots) -> None:
        """Coverage counts, the verifier's picks and the impressions, buffered (``AfterAnswer``)
        and sent every ``serve.flush_ms``; runs after the answer is on its way, never raises.
        The verifier ranks by ``base``, the VM alone inside the residual VM, so what is
        precomputed does not depend on the corrections (nor does a simulation of it)."""
        try:
            self._tier_counts += np.bincount(slots.pair_tier, minlength=NUM_TIERS)
            self._agg_count += int(np.count_nonzero(slots.agg_present))
            found = slots.pair_tier == Tier.PAIR
            version = self.policy.active[body.task]
            self._observe(now, body, version, int(found.sum()), len(items))
            picks = verifier.choose(base, items, found, slots.pair_age_s,
                                    np.zeros(len(items), bool), self.cfg.verifier,
                                    self.cfg.cache.read_ttl_s, self._budget.fraction)
            self._requests += 1
            # the pairs the FM can compute (solaris.online.newusers): items it has a row for,
            # of a user it was trained on, or of any user where it reads users it never saw
            picks = computable_picks(self.arts[version], body.user_id, items, picks)
            versions = [version]
            pending = self.policy.pending(body.task)
            if pending is not None:
                versions.append(pending)
                if self._shadow_due(body):
                    self._spawn(self._shadow(body, items, now, pending))
            # what the user is shown: the top of the ranking (serve.impressions_top_k)
            k = min(self.cfg.serve.impressions_top_k, len(items))
            shown = items[np.argsort(-probs, kind="stable")[:k]]
            queued = {v: computable_picks(self.arts[v], body.user_id, items, picks)
                      for v in versions}
            full = self.buffer.add(body.user_id, shown, body.surface, now,
                                   {v: (items[p], base[p]) for v, p in queued.items()})
            self._budget.record(len(picks))
            if full:
                self._flush()
            elif self._flusher is None:
                self._flusher = self._spawn(self._flush_later())
        except Exception:
            log.exception("after-answer work failed for user %s", body.user_id)
        finally:
            self._after_pending -= 1

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._after.add(task)
        task.add_done_callback(self._after.discard)
        return task

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.cfg.serve.flush_ms / 1000.0)
        self._flusher = None
        self._flush()

    def _flush(self) -> list:
        """Send the buffered impressions (a call per shard) and picks (a call per version);
        returns the queue calls' refs (``flush_now`` waits on them)."""
        refs: list = []
        try:
            impressions, picks = self.buffer.drain()
            self._after_calls["flushes"] += 1
            if self.replica is not None:  # with the replica's reads, a call per shard
                self.replica.flush(impressions)
            else:
                self.backend.record_impressions_many(impressions)
            for version, (users, its, prios, nows, surfaces) in picks.items():
                refs.append(self.backend.queue.put(users, its, prios, nows, surfaces, version))
                self._after_calls["queue_calls"] += 1
                self._m_enqueued.inc(float(len(users)))
            for t, n in enumerate(self._tier_counts.tolist()):
                if n:  # Ray counters take only positive increments
                    self._m_tier.inc(float(n), tags={"tier": TIER_LABELS[t]})
            if self._agg_count:
                self._m_agg.inc(float(self._agg_count))
            self._tier_counts[:] = 0
            self._agg_count = 0
        except Exception:
            log.exception("flushing %d buffered requests failed", len(self.buffer))
        return refs

    async def flush_now(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """A barrier (the replay calls it through a handle between event-time ticks): wait
        for the after-answer work of every answered request, send the buffer, and wait until
        the queue took the picks and the shards took every history write (impressions and
        /feedback labels). Returns the requests seen and the writes still outstanding."""
        deadline = time.monotonic() + timeout_s
        while self._after_pending > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        refs = self._flush()
        if self._after:
            await asyncio.gather(*list(self._after), return_exceptions=True)
        for ref in refs:
            await ref
        if self._at_barrier:
            self._decide_rollouts()
        left = await asyncio.get_running_loop().run_in_executor(
            self._io, self.backend.group.flush_records, max(0.0, deadline - time.monotonic()))
        return {"requests": self._requests, "after_pending": self._after_pending,
                "records_outstanding": left}

    async def refresh_now(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The replay's second barrier, after the FM workers wrote: pull every shard's
        changes into the read replica now and return once applied (no replica: nothing)."""
        if self.replica is None:
            return {"applied": 0, "failed": []}
        return await asyncio.get_running_loop().run_in_executor(
            self._io, self.replica.refresh, timeout_s)

    def _shadow_due(self, body: RankRequest) -> bool:
        """Whether this request also looks up the pending version: every ``shadow_every``-th
        request served, or (``serve.rollout_at_barrier``) every request whose id hashes to 0
        modulo it."""
        if self._at_barrier and body.request_id:
            return zlib.crc32(body.request_id.encode()) % self._shadow_every == 0
        return self._requests % self._shadow_every == 0

    def _observe(self, now: float, body: RankRequest, version: str, hits: int,
                 lookups: int) -> None:
        """A lookup's pair hits for the rollout policy: at once, or
        (``serve.rollout_at_barrier``) kept for the barrier (``_decide_rollouts``)."""
        if self._at_barrier:
            self._observed.append((now, body.request_id or "", version, hits, lookups))
        else:
            self.policy.observe(version, hits, lookups)

    def _decide_rollouts(self) -> None:
        """The replay's barrier: the tick's observations in event-time order (then request
        id), then each task's switch decision."""
        seen, self._observed = self._observed, []
        for _, _, version, hits, lookups in sorted(seen):
            self.policy.observe(version, hits, lookups)
        for task in self.tasks:
            before = self.policy.active[task]
            self.policy.maybe_switch(task)
            self._switched(task, before)

    async def _shadow(self, body: RankRequest, items: np.ndarray, now: float,
                      pending: str) -> None:
        """Look up the pending version (never sent to a VM) to measure its coverage."""
        try:
            shadow = await self._lookup(body.user_id, items, now, pending, body.surface)
            self._observe(now, body, pending, int((shadow.pair_tier == Tier.PAIR).sum()),
                          len(items))
            if not self._at_barrier:
                before = self.policy.active[body.task]
                self.policy.maybe_switch(body.task)
                self._switched(body.task, before)
        except Exception:
            log.exception("shadow lookup of %s failed", pending)

    @api.post("/feedback", dependencies=[Depends(service_call)],
              responses={401: {"description": "the service token is missing or wrong"},
                         422: {"description": "a field is malformed"}})
    async def feedback(self, body: FeedbackRequest) -> Any:
        now = self._event_time(body)
        if isinstance(now, JSONResponse):
            return now
        n, t = len(body.items), len(self.arts[next(iter(self.arts))].tasks)
        if len(body.labels) != n or any(len(row) != t or not set(row) <= {0, 1}
                                        for row in body.labels):
            return problem(422, "labels", f"expected {n} rows (one per item) of {t} values "
                            "in {0, 1}")
        y = np.asarray(body.labels, np.float64)
        coded = self._codes(body, "items")
        if isinstance(coded, JSONResponse):
            return coded
        body, items = coded
        self.backend.record_labels(body.user_id, items, y, now)
        return {"ok": True, "labels": n}

    @api.get("/scales", dependencies=[Depends(read_call)])
    async def get_scales(self) -> dict[str, Any]:
        """Every VM's live scales (by version/task) and the validation curves behind them."""
        return self.scales.state()

    @api.post("/scales", dependencies=[Depends(operator_call)],
              responses={401: {"description": "the operator token is missing or wrong"},
                         403: {"description": "no operator token is configured: calls off"},
                         422: {"description": "a field is malformed (named)"}})
    async def set_scales(self, body: ScaleRequest) -> Any:
        """Set one scale of a residual VM: the next requests use it, no redeploy; a tier at 0
        in every VM of a version is no longer looked up."""
        if body.task not in self.vms:
            return self._error(422, "task", f"{body.task!r} is not served (tasks: "
                               f"{', '.join(self.tasks)})")
        version = body.version or self.policy.active[body.task]
        if body.slot == "pair" and body.tier is None:
            return self._error(422, "tier", "required for slot 'pair'")
        try:  # checked here, on a copy, before the app's state is changed
            ScaleTable(self._manifests).set(version, body.task, body.slot, body.tier,
                                            body.scale)
        except ScaleError as e:
            return self._error(422, e.field, str(e))
        try:
            state = await self.control.set_scale(
                {"version": version, "task": body.task, "slot": body.slot,
                 "tier": body.tier if body.slot == "pair" else None,
                 "scale": float(body.scale)})
        except ControlUnavailable as e:
            return self._error(503, "scale", str(e),
                               headers={"Retry-After": str(RETRY_AFTER_S)})
        row = scale_dict(self.scales.array(version, body.task))
        log.info("scales of %s/%s set: %s (control revision %d)", version, body.task, row,
                 state["revision"])
        return {"version": version, "task": body.task, "scales": row,
                "revision": state["revision"]}

    @api.get("/stats", dependencies=[Depends(read_call)])
    async def stats(self) -> dict[str, Any]:
        """The router's rollout state and the precompute backend's last gauges."""
        phases = {m: {f"{k}_ms": round(float(np.median([r.get(k, 0.0) for r in d])) * 1e3, 3)
                      for k in d[-1]} for m, d in self._phases.items() if d}
        out: dict[str, Any] = {"rollout": self.policy.state(), "mode": self.cfg.serve.mode,
                               "phases_p50": phases,
                               "cache_client": self.backend.group.client_counts(),
                               "cache_replica": (self.replica.metrics()
                                                 if self.replica is not None else None),
                               # the after-answer work: requests, flushes and their actor
                               # calls (history writes: cache_client.history_writes.sent)
                               "after_answer": {"requests": self._requests,
                                                **self._after_calls},
                               # the artifacts served (the app's args or the config;
                               # oldest version first, credentials left out), as the
                               # config field writes them
                               "serve": {**config_to_dict(self.cfg.serve), "artifacts_dir":
                                         ",".join(map(shown, self.settings["artifact_dirs"]))},
                               "auth_refused": dict(self.credentials.refused),
                               "clock": self._clock.metrics() if self._clock else None,
                               "scales": self.scales.state(),
                               "control": self.control.metrics(),
                               "replica": _replica_id(),
                               "knn": {"version": self.knn.version, "swaps": self.knn.swaps,
                                       "errors": self.knn.errors,
                                       "disabled": [v.line() for v in self.knn.verdicts
                                                    if not v.served],
                                       "cold_starts": self._cold_starts,
                                       "cold_start_memo": self._cold_memo.metrics()}
                               if self.knn else None}
        if self.precompute is not None:
            try:
                out["precompute"] = await asyncio.wait_for(
                    self.precompute.summary.remote(self._requests), timeout=10)
            except Exception as e:
                out["precompute"] = {"error": type(e).__name__}
        return out

    def _codes(self, body: Any, field: str) -> tuple[Any, np.ndarray] | JSONResponse:
        """The request with its user's code for ``user_id`` and the codes of its items
        (``field``), from the deployment's id map; a 422 naming the field for an id of the
        wrong kind."""
        try:
            user = int(self.ids.users.codes([body.user_id], "user_id")[0])
            items = self.ids.items.codes(getattr(body, field), field)
        except RequestError as e:
            return self._error(422, str(e).split(":", 1)[0], str(e))
        return body.model_copy(update={"user_id": user}), items

    def _error(self, status: int, field: str, msg: str,
               headers: dict | None = None) -> JSONResponse:
        self._m_errors.inc(tags={"code": str(status)})
        return problem(status, field, msg, headers)
