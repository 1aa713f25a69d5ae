"""Event-time replay of a request log through the live system.

    python jobs/replay.py --dataset synthetic --out runs/replay
    python jobs/replay.py --dataset movielens --data-dir DIR --out runs/replay-ml [--sweep]
    solaris replay ...                       # the same command

The live pieces are the production ones: the Serve app (``serve_app.py``: lookup router and
VMs over HTTP on loopback, the cache shards with their history stores, the precompute queue,
the FM workers) and the KNN rebuild job (``jobs/rebuild_knn.py``, Ray Data), all on a local
Ray. The protocol (``docs/guides/replay.md``):

1. The window is the split's test period; the FM, encoder, VMs (and the VM alone the
   transfer ratio compares against) train on earlier periods only, checked before serving.
2. Event time advances in ticks (``--tick-s``, 60). A tick's requests go to ``POST /rank``
   concurrently with their event time, then, once all are answered, their logged labels to
   ``POST /feedback`` (each user's in event order, ``post_feedback``); the
   router's after-answer work (verifier picks to the queue, history writes) is awaited
   (``ReplayRouter.flush_now``, the replay profile's router).
3. At the end of tick T the queue releases work whose request time is <= T + tick - lag
   (``--lag-s``, 300), best verifier score first, within an allowance of
   floor(B (k+1) tick / 3600) - floor(B k tick / 3600) pair-evaluations for tick number k
   (``--budget``, B per event-hour; 0: no limit); the FM workers run until nothing is
   leasable (``Precompute.step_until``). Written pairs carry their request's event time;
   the workers read each request's history as of that time, or as of T + tick, the write's
   release (``schedule.history_at``: request / visible). The router's read replica then
   pulls what they wrote (``ReplayRouter.refresh_now``, the replay profile's router), so
   the next tick reads it.
   What is computed depends on the queue's order only, so coverage does not depend on
   machine speed or on how many workers share the queue.
4. The KNN job rebuilds the user and item tables every ``--knn-every-h`` event hours as of
   that event time; the next tick waits until the router serves the new version.

Writes ``OUT/replay.json`` (coverage by tier, ceiling, random-speculation baseline, online
transfer, costs), ``OUT/served.npz`` (what was served), and the plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python jobs/replay.py` from anywhere
    sys.path.insert(0, str(ROOT))

from solaris import atomic  # noqa: E402
from solaris.artifacts import Artifacts  # noqa: E402
from solaris.clock import event_clock, replay_skew  # noqa: E402
from solaris.config import (ScheduleConfig, SolarisConfig, config_to_dict,  # noqa: E402
                            load_config, parse_overrides, with_overrides)
from solaris.errors import SolarisError  # noqa: E402
from solaris.precompute.ledger import speculation_report  # noqa: E402
from solaris.replay.closed_loop import SHOWN  # noqa: E402
from solaris.replay.schedule import Ticks, tick_allowance  # noqa: E402
from solaris.tiers import Tier  # noqa: E402

log = logging.getLogger("jobs.replay")


@dataclass
class ReplayOptions:
    # the schedule's defaults are the config's (the transfer report simulates the same one)
    tick_s: float = ScheduleConfig.tick_s  # event seconds per tick
    lag_s: float = ScheduleConfig.lag_s  # work enqueued at t is written no earlier than t + lag
    budget_per_hour: float = ScheduleConfig.budget_per_hour  # FM evaluations per event hour
    workers: int = 1  # FM worker actors
    knn_every_h: float = 72.0  # KNN rebuild period in event hours (0: only the initial build)
    num_candidates: int = 100  # candidates per request of logs without candidate lists
    max_requests: int | None = None  # replay only the first N requests (tests, quick looks)
    # the read replica pulls at each tick's barrier (exact); false: on its own timer only
    refresh_barrier: bool = True
    concurrency: int = 4  # client threads sending a tick's requests
    port: int = 8000  # Serve's HTTP port on loopback
    num_cpus: int = 4  # logical CPUs of the local Ray
    seed: int = 0
    progress: bool = True
    rollover_at: float | None = None  # share of the window at which FM v2 is rolled out
    closed_loop: bool = False  # rank, show and label with the ground truth
    predict: bool = True  # predict TR, coverage and FM cost from the data before the window
    shown: int = 6  # closed loop: top-ranked candidates shown per request (MovieLens: 10)
    explore: int = 1  # closed loop: uniform exploration slots below them
    verbose: bool = False  # Ray's own logs on the console too (actors.local.start)
    extra: dict[str, Any] = field(default_factory=dict)  # config overrides for the app

    def schedule(self, cfg: SolarisConfig) -> SolarisConfig:
        """``cfg`` with this replay's schedule (tick, lag, budget): what the in-process
        simulations of it (the closed loop, the prediction) run."""
        return with_overrides(cfg, {"schedule.tick_s": self.tick_s, "schedule.lag_s": self.lag_s,
                                    "schedule.budget_per_hour": self.budget_per_hour})


# ---------------------------------------------------------------------------------- HTTP
class Client:
    """POSTs with one retry; counts retries and final failures."""

    def __init__(self, base: str, timeout_s: float = 60.0) -> None:
        import requests

        self.base = base
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._requests = requests
        self.retries = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self._lock = threading.Lock()

    def _session(self):
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = self._requests.Session()
        return s

    def post(self, path: str, body: dict) -> dict | None:
        last = ""
        for attempt in (0, 1):
            try:
                r = self._session().post(self.base + path, json=body, timeout=self.timeout_s)
                if r.status_code < 300:
                    return r.json()
                last = f"{r.status_code} {r.text[:200]}"
            except Exception as e:  # connection reset, timeout
                last = f"{type(e).__name__}: {e}"
            if attempt == 0:
                with self._lock:
                    self.retries += 1
                time.sleep(0.2)
        with self._lock:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{path}: {last}")
        return None


# ---------------------------------------------------------------------------------- the run
class LiveReplay:
    """One replay run: prepare, serve, drive, collect. ``run`` returns the served arrays."""

    def __init__(self, cfg: SolarisConfig, ds: Any, out: Path, opts: ReplayOptions,
                 say: Callable[[str], None] = print, truth: Any = None) -> None:
        self.cfg, self.ds, self.out, self.opts, self.say = cfg, ds, Path(out), opts, say
        self.truth = truth  # the closed loop's MovieLens ground truth
        self.out.mkdir(parents=True, exist_ok=True)
        from solaris.ids import IdMap

        self.wire = IdMap.from_dataset(ds)  # codes -> the raw ids requests carry

    # -- preparation (no Ray)
    def prepare(self) -> dict[str, Any]:
        from solaris.simulate.log import build_request_log
        from solaris.replay.prepare import check_trained_before, window, write_data_dir
        from solaris.artifacts import served_unlike_trained
        from solaris.train.artifacts import train_artifacts

        cfg, ds, o = self.cfg, self.ds, self.opts
        self.periods, self.start = window(ds, cfg)
        t0 = time.perf_counter()
        self.art_dirs = [self.out / "artifacts"]
        if o.rollover_at is not None:
            self.art_dirs.append(self.out / "artifacts-v2")
        for i, d in enumerate(self.art_dirs):
            if not ((d / "manifest.json").exists() and (d / "teacher.npz").exists()):
                c = cfg if i == 0 else with_overrides(cfg, {"fm.version": "fm-v2"})
                self.say(f"training artifacts{' (v2, for the rollover)' if i else ''} "
                         f"on the periods before the window")
                # a rollover keeps the VMs alone and retrains what reads the FM
                train_artifacts(c, ds, d, seed=o.seed + i, evaluation=True,
                                base_dir=self.art_dirs[0] if i else None)
        self.artifacts_seconds = round(time.perf_counter() - t0, 1)
        self.manifests = [Artifacts.open(d).manifest for d in self.art_dirs]
        for m in self.manifests:
            check_trained_before(m, self.start)
            if (why := served_unlike_trained(m, cfg)):
                self.say(f"note: {why}")
        self.log = build_request_log(ds, self.start, num_candidates=o.num_candidates,
                                     granularity_s=cfg.features.request_granularity_s,
                                     seed=o.seed)
        if o.max_requests is not None:
            self.log = self.log.slice(np.arange(min(o.max_requests, self.log.num_requests)))
        if o.closed_loop:
            from solaris.replay.closed_loop import LoopOptions, empty_log, explore_uniforms
            from solaris.replay.closed_loop import prepare as loop_prepare

            if o.rollover_at is not None:
                raise SolarisError("--closed-loop with --rollover-at: not supported")
            self.loop_opts = LoopOptions(shown=o.shown, explore=o.explore, seed=o.seed,
                                         candidates=o.num_candidates,
                                         knn_every_h=o.knn_every_h)
            self.loop = loop_prepare(o.schedule(cfg), ds, self.art_dirs[0], self.loop_opts,
                                     o.max_requests, truth=self.truth)
            self.log = self.loop.lg  # the same requests and candidates, no labels yet
            self.loop_truth = self.loop.make_truth()
            self.loop_explore = explore_uniforms(self.loop, self.loop_opts)
            self.loop_log = empty_log(self.log.num_requests,
                                      self.loop_opts.shown + self.loop_opts.explore)
        self.data_dir = write_data_dir(ds, self.out / "data")
        self.knn_uri = str((self.out / "knn").resolve())
        overrides = {
            # the replay profile: requests carry the log's event times (and the debug fields)
            # and each store measures skew from the latest time it has seen, widened to the
            # log's longest step so no logged request is refused
            "serve.profile": "replay",
            "serve.max_skew_s": self._skew(cfg),
            "serve.impressions_top_k": 0,  # the log's labels feed the history (/feedback)
            "serve.max_candidates": max(1000, self.log.num_candidates),
            "serve.rollout_min_lookups": 2000,
            "knn.table_uri": self.knn_uri, "knn.poll_s": 0.2,
            "precompute.workers": o.workers, "precompute.max_workers": o.workers,
            "verifier.budget_per_s": 0.0,  # the replay's budget is the queue's allowance
            "queue.capacity": 10_000_000, "queue.lease_timeout_s": 3600.0,
            "cache.deadline_ms": 5000.0,  # a loaded machine must not turn into misses
            # nor a read replica pulled late: the barrier pulls before every tick
            "serve.replica_stale_s": 1e9,
            # a rollover switches at a tick's barrier, whatever the requests' interleaving
            "serve.rollout_at_barrier": True,
            "cache.snapshot_uri": None, "queue.snapshot_uri": None,
            **o.extra}
        self.app_cfg = with_overrides(cfg, overrides)
        self.cfg_path = self.out / "replay-config.yaml"
        import yaml

        self.cfg_path.write_text(yaml.safe_dump(config_to_dict(self.app_cfg), sort_keys=False))
        return {"artifacts_seconds": self.artifacts_seconds, "requests": self.log.num_requests,
                "window_start": self.start}

    def _skew(self, cfg: SolarisConfig) -> float:
        """``serve.max_skew_s`` for this replay: twice the longest step between the event
        times one store sees -- a cache shard its own users' requests after the history
        seeding's last event (the queue and the router see every request: shorter steps)."""
        from solaris.cache.ring import HashRing
        from solaris.replay.prepare import seed_history

        ring = HashRing.from_config(cfg.cache)
        users, _, _, _, ts = seed_history(self.ds, self.start, cfg.history.max_events)
        shard = ring.shard_of(users)
        seeded = [(s, ts[shard == s].max()) for s in np.unique(shard)]
        times = np.r_[self.log.ts, [t for _, t in seeded]]
        groups = np.r_[ring.shard_of(self.log.user), [s for s, _ in seeded]]
        return replay_skew(times, cfg.serve.max_skew_s, groups)

    # -- the live part
    def run(self) -> dict[str, Any]:
        import os

        import ray
        from ray import serve

        from actors import local

        o = self.opts
        t_start = time.perf_counter()

        attached = bool(os.environ.get("RAY_ADDRESS"))  # `ray job submit`: the job's cluster
        if attached:
            local.start(verbose=o.verbose)
        else:
            local.start(num_cpus=o.num_cpus, object_store_bytes=400 * 1024 ** 2,
                        verbose=o.verbose, include_dashboard=False,
                        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": o.port})
            return self._serve_and_drive(t_start)
        finally:
            try:  # the replay's own app goes; a local Ray goes whole with ray.shutdown (Serve's
                # controller with it: serve.shutdown would kill it under the handles' polls,
                # which Ray reports as failed tasks)
                serve.delete("replay")
            except Exception as e:  # Serve never started: nothing to delete
                log.debug("serve.delete('replay'): %s", e)
            finally:
                ray.shutdown()

    def _knn(self, as_of: float, data: Path | None = None) -> dict[str, Any]:
        """A KNN job run as of ``as_of`` over ``data`` (default: the dataset's log). The
        closed loop's tables hold the users with events then, as its in-process arms'."""
        from jobs.rebuild_knn import rebuild

        return rebuild(data or self.data_dir, self.art_dirs[0], self.knn_uri,
                       self.app_cfg.knn, as_of=as_of, encoders=1, encoder_cpus=0.25,
                       task_cpus=0.25, use_gpu=False, all_users=not self.opts.closed_loop)

    def _loop_knn(self, as_of: float, upto: int, answered: np.ndarray) -> dict[str, Any]:
        """Closed loop: the KNN job rebuilds as of ``as_of`` from the arm's own log -- the
        interactions before the window and what the arm showed at its answered rows before
        ``upto``, with their labels -- and the router loads the tables."""
        from solaris.replay.closed_loop import arm_interactions
        from solaris.replay.prepare import write_data_dir

        rows = np.flatnonzero(answered[:upto])
        table = arm_interactions(self.loop.log0, self.log, self.loop_log, rows,
                                 tuple(self.ds.tasks))
        data = write_data_dir(dataclasses.replace(self.ds, interactions=table),
                              self.out / "loop_data")
        run = self._knn(as_of, data)
        self._wait_knn(run["version"])
        return run

    def _segments(self, a: int, b: int) -> list[tuple[int, int, float | None]]:
        """Rows a..b-1 of one tick as (a', b', KNN as_of) runs: in a closed loop cut where a
        request reaches a rebuild boundary (``knn_due``), which is built first, as of that
        boundary, as the in-process arms do; else one run, no rebuild."""
        from solaris.replay.schedule import knn_due

        if not self.opts.closed_loop:
            return [(a, b, None)]
        out, lo, due = [], a, None
        for r in range(a, b):
            as_of = knn_due(float(self.log.ts[r]), self._next_knn, self._knn_every)
            if as_of is not None:
                if r > lo:  # the rows before the boundary, on the tables they had
                    out.append((lo, r, due))
                lo, due, self._next_knn = r, as_of, as_of + self._knn_every
        out.append((lo, b, due))
        return out

    def _deploy(self, dirs: list[Path], app_id: str) -> None:
        from ray import serve

        import serve_app

        app = serve_app.build_app({"config": str(self.cfg_path), "app_id": app_id,
                                   "artifacts": ",".join(str(d) for d in dirs)})
        serve.run(app, name="replay", route_prefix="/", blocking=False)
        self._wait_healthy()
        self._wait_replaced()

    def _wait_replaced(self, timeout_s: float = 300.0) -> None:
        """Until every replica of the app is of this deployment and running (a redeploy's
        old router gone): the barrier's calls and the requests then reach one router, and
        no request is answered by the version being replaced."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while True:
            app = serve.status().applications.get("replay")
            deps = app.deployments if app is not None else {}
            if app is not None and str(app.status).endswith("RUNNING") and deps and all(
                    set(d.replica_states) <= {"RUNNING"} for d in deps.values()):
                return
            if time.monotonic() > deadline:
                raise SolarisError(f"replay: the app's replicas were not all replaced in "
                                   f"{timeout_s} s")
            time.sleep(0.2)

    def _wait_healthy(self, timeout_s: float = 300.0) -> dict:
        import requests

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = requests.get(self.base + "/healthz", timeout=5)
                if r.status_code == 200:
                    return r.json()
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise SolarisError(f"replay: the app did not answer /healthz in {timeout_s} s")
            time.sleep(0.5)

    def _wait_knn(self, version: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        # the router names its tables "<user version>|<item version>"
        while set(str(self._wait_healthy().get("knn") or "").split("|")) != {version}:
            if time.monotonic() > deadline:
                raise SolarisError(f"replay: the router did not load KNN {version} in "
                                   f"{timeout_s} s")
            time.sleep(0.1)

    def _serve_and_drive(self, t_start: float) -> dict[str, Any]:
        from ray import serve

        from actors import names
        from actors.cache import CacheGroup
        from solaris.replay.prepare import seed_history

        o, lg, cfg = self.opts, self.log, self.app_cfg
        self.base = f"http://127.0.0.1:{o.port}"
        app_id = "replay-" + uuid.uuid4().hex[:6]
        self.say("building the KNN tables as of the window start")
        knn_runs = [self._knn(float(self.start))]
        # the app's stateful actors, owned by this driver: the app's replicas attach to them
        # by name, and a redeploy (the rollover) replaces replicas without losing them
        from actors.knn import create_knn_holder
        from actors.ledger import LedgerClient
        from actors.queue import QueueClient

        clock = event_clock(cfg.serve)
        group = CacheGroup.create(cfg.cache, group_id=app_id, history=cfg.history, clock=clock)
        self._owned = [  # held for the whole run
            QueueClient.create(cfg.queue, queue_id=app_id, name=names.queue(app_id),
                               clock=clock),
            LedgerClient.create(names.ledger(app_id)), create_knn_holder(cfg.knn, app_id)]
        group.wait_ready()
        self._deploy(self.art_dirs[:1], app_id)
        pre = serve.get_deployment_handle("Precompute", app_name="replay")
        router = serve.get_deployment_handle("LookupRouter", app_name="replay")
        pre.pause.remote().result()
        seeded = group.history.replay_log(*seed_history(self.ds, self.start, cfg.history.max_events))
        self._wait_knn(knn_runs[0]["version"])
        self.say(f"serving {lg.num_requests} requests (history seeded with {seeded} events)")

        task = self.ds.tasks[0]
        R, C = lg.num_requests, lg.num_candidates
        scores = np.full((R, C), np.nan, np.float32)
        tiers = np.full((R, C), -1, np.int8)
        ages = np.zeros((R, C), np.float32)
        agg = np.zeros((R, C), bool)
        vm_version = np.empty(R, object)
        labelled = lg.labelled
        feats: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        client = Client(self.base)

        def one(r: int) -> dict | None:
            """Rank request ``r``; its labels' ``/feedback`` body (None: nothing labelled)."""
            pos = np.flatnonzero(labelled[r])
            body = {"user_id": self.wire.raw_user(lg.user[r]),
                    "candidates": self.wire.raw_items(lg.candidates[r]),
                    "task": task, "surface": int(lg.surface[r]), "now": float(lg.ts[r]),
                    "request_id": f"r{r}", "features_for": pos.tolist()}
            got = client.post("/rank", body)
            if got is not None:
                scores[r] = got["scores"]
                tiers[r] = [Tier.from_label(t) for t in got["tiers"]]
                ages[r] = got["ages_s"]
                agg[r] = got["aggregate"]
                vm_version[r] = got["versions"]["vm"]
                f = got.get("features") or {}
                feats[r] = (np.asarray(f.get("pair", []), np.float32),
                            np.asarray(f.get("user", []), np.float32))
            if not len(pos):
                return None
            return {"user_id": self.wire.raw_user(lg.user[r]),
                    "items": self.wire.raw_items(lg.candidates[r, pos]),
                    "labels": lg.labels[r, pos].astype(int).tolist(), "now": float(lg.ts[r])}

        plan = Ticks.of(lg.ts, o.tick_s)
        knn_every = o.knn_every_h * 3600.0
        next_knn = float(self.start) + knn_every if knn_every > 0 else math.inf
        self._knn_every, self._next_knn = knn_every, next_knn  # the closed loop's (_segments)
        answered = np.zeros(R, bool)
        roll_k = None
        if o.rollover_at is not None:
            roll_k = plan.at_fraction(o.rollover_at)
        rolled = False
        versions = [m["version"] for m in self.manifests]
        from solaris.config import EnrichConfig

        probe = EnrichConfig(user_knn_probe=0, item_knn_probe=0, item_tier=False,
                             aggregate=False)
        steps, evaluated, curve = 0, 0, []
        visible = cfg.schedule.history_at == "visible"  # the FM reads as of the release
        bar = _bar(R, "replay", o.progress)
        pool = ThreadPoolExecutor(o.concurrency, thread_name_prefix="replay-client")
        k: int | None = plan.first
        try:
            while k is not None:
                T_end = plan.end(k)
                if roll_k is not None and not rolled and k >= roll_k:
                    self.say("rolling out FM v2 (both versions precomputed from now on)")
                    self._deploy(self.art_dirs, app_id)
                    pre = serve.get_deployment_handle("Precompute", app_name="replay")
                    router = serve.get_deployment_handle("LookupRouter", app_name="replay")
                    pre.pause.remote().result()
                    rolled = True
                if (rows := plan.rows(k)) is not None:
                    for a, b, as_of in self._segments(*rows):
                        if as_of is not None:  # closed loop: from the arm's own log
                            knn_runs.append(self._loop_knn(as_of, a, answered))
                        bodies = list(pool.map(one, range(a, b)))
                        answered[a:b] = np.isfinite(scores[a:b]).all(1)
                        if o.closed_loop:  # show, label with the ground truth, feed back
                            self._label(a, b, scores, tiers, agg, client, pool)
                        else:  # the tick's labels, once its requests are answered
                            post_feedback(client, pool, [x for x in bodies if x is not None])
                    a, b = rows
                    router.flush_now.remote().result()
                    bar.update(b - a)
                    if o.rollover_at is not None:  # own-pair coverage of every version
                        curve += [(float(lg.ts[r]), *[
                            float(np.mean(group.lookup(int(lg.user[r]), lg.candidates[r],
                                                       float(lg.ts[r]), v, None, None,
                                                       probe).pair_tier == Tier.PAIR))
                            for v in versions]) for r in range(a, b)]
                allowance = tick_allowance(o.budget_per_hour, o.tick_s, k)
                got = pre.step_until.remote(T_end - o.lag_s, allowance,
                                            read_at=T_end if visible else None).result()
                steps += 1
                evaluated += got["pairs"]
                q = got["queue"]
                if T_end >= next_knn and not o.closed_loop:
                    run = self._knn(T_end)
                    knn_runs.append(run)
                    self._wait_knn(run["version"])
                    next_knn += knn_every
                # the router's read replica takes what the FM workers wrote before the
                # next tick's requests read it (serve.cache_reads: replica); without the
                # barrier it pulls on its own timer, as in live serving
                if o.refresh_barrier:
                    router.refresh_now.remote().result()
                k = plan.next(k, eligible=q["eligible"], depth=q["depth"],
                              oldest_pending=q["oldest_pending"], lag_s=o.lag_s,
                              read_ttl_s=self.app_cfg.cache.read_ttl_s)
        finally:
            pool.shutdown(wait=True)
            bar.close()
        summary = pre.summary.remote().result()
        shards = group.metrics()
        ledger = _ledger_report(app_id)
        return {"scores": scores, "tiers": tiers, "ages": ages, "agg": agg, "feats": feats,
                "vm_version": vm_version, "client": client, "steps": steps,
                "evaluated": evaluated, "knn_runs": knn_runs, "summary": summary,
                "shards": shards, "ledger": ledger, "seconds": time.perf_counter() - t_start,
                "curve": curve}


    def _label(self, a: int, b: int, scores: np.ndarray, tiers: np.ndarray, agg: np.ndarray,
               client: Client, pool: ThreadPoolExecutor) -> None:
        """Closed loop: log rows a..b-1 (one tick, answered) show their top items plus the
        exploration slot by the served scores, in event order the ground truth labels them,
        and the labels go back through ``POST /feedback``."""
        from solaris.replay.closed_loop import show_and_label

        lg, out, bodies = self.log, self.loop_log, []
        for r in range(a, b):
            if not np.isfinite(scores[r]).all():  # not answered: counted as an error
                continue
            pos, prop, shown, pc, click, conv = show_and_label(
                self.loop, self.loop_opts, self.loop_truth, r, scores[r].astype(np.float64),
                self.loop_explore[r])
            out.record(r, pos, prop, shown, scores[r], pc, click, conv, tiers[r], agg[r])
            bodies.append({"user_id": self.wire.raw_user(lg.user[r]),
                           "items": self.wire.raw_items(shown),
                           "labels": np.stack([click, conv], 1).astype(int).tolist(),
                           "now": float(lg.ts[r])})
        post_feedback(client, pool, bodies)


def post_feedback(client: Any, pool: ThreadPoolExecutor, bodies: list[dict]) -> None:
    """``POST /feedback`` of ``bodies`` (in event order): users in parallel, each user's in
    order. A label matches an earlier impression of its item at or before its time, so a
    user's labels arriving out of order would build another history -- and another FM
    input -- from one run to the next."""
    by_user: dict[int, list[dict]] = {}
    for body in bodies:
        by_user.setdefault(body["user_id"], []).append(body)
    list(pool.map(lambda mine: [client.post("/feedback", x) for x in mine], by_user.values()))


def _clock_refused(live: dict) -> int:
    """Calls the stores refused for an event time too far ahead (``solaris/clock.py``): 0 in
    a sound replay; anything else is logged, since each refused read is a miss."""
    shards = live["shards"]["shards"]
    n = sum(s.get("clock_refused", 0) + s.get("history", {}).get("clock_refused", 0)
            for s in shards if s.get("up"))
    n += int(((live["summary"] or {}).get("queue") or {}).get("clock_refused", 0))
    if n:
        log.warning("replay: the stores refused %d calls for an event time beyond "
                    "serve.max_skew_s; their reads were misses", n)
    return n


def _ledger_report(app_id: str) -> dict | None:
    import ray

    from actors import names
    from actors.ledger import LedgerClient

    try:
        return LedgerClient(ray.get_actor(names.ledger(app_id))).report()
    except Exception:
        return None


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, desc: str, on: bool):
    if not on:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True)


def replay(cfg: SolarisConfig, ds: Any, out: str | Path, opts: ReplayOptions,
           say: Callable[[str], None] = print, truth: Any = None) -> dict[str, Any]:
    """One replay: prepare, serve, drive, measure; writes OUT/replay.json and the plots.
    ``truth``: the closed loop's MovieLens ground truth (``ds`` relabelled by it)."""
    from solaris.replay.coverage import (RECURRENCE_S, candidate_recurrence, coverage_over_time,
                                         time_bin_s)
    from solaris.replay.plots import coverage_time_plot, rollover_plot
    from solaris.knn.tables import load_current
    from solaris.replay.report import (bounds_report, coverage_report, json_default,
                                       save_feature_log, served_rows, served_scores, take_rows,
                                       transfer_from_log)

    from solaris.replay.prepare import check_no_request_features

    check_no_request_features(ds, "the replay")
    out = Path(out)
    lr = LiveReplay(cfg, ds, out, opts, say, truth)
    prep = lr.prepare()
    pred = None
    if opts.predict and not opts.closed_loop:
        from solaris.replay.predict import predict

        say("predicting the window's TR, coverage and FM cost from the data before it")
        try:
            pred = predict(lr.art_dirs[0], ds, start_ts=lr.start,
                           num_candidates=opts.num_candidates, seed=opts.seed,
                           cfg=opts.schedule(cfg))
        except Exception as e:  # the replay goes on: the prediction is a figure, not a step
            log.warning("prediction from the past failed (%s: %s); replaying without it",
                        type(e).__name__, e)
            pred = {"error": f"{type(e).__name__}: {e}"}
    live = lr.run()
    if opts.closed_loop:
        return closed_loop_report(lr, live, prep)
    lg, acfg = lr.log, lr.app_cfg
    live["base_scores"] = base_scores(lg, live, lr.art_dirs, ds.tasks[0])
    client = live["client"]
    rep: dict[str, Any] = {"dataset": ds.name, "requests": int(lg.num_requests),
                           "candidates_per_request": int(lg.num_candidates),
                           "labelled_pairs": int(lg.labelled.sum())}
    rep.update(coverage_report(lg, live, acfg, lag_s=opts.lag_s, tick_s=opts.tick_s,
                               budget_per_hour=opts.budget_per_hour, seed=opts.seed))
    rep.update(bounds_report(lg, live, acfg, load_current(lr.knn_uri, "user")[1],
                             lag_s=opts.lag_s))
    evals = int(live["evaluated"])
    spec = speculation_report(live["ledger"],
                              [s for s in live["shards"]["shards"] if s.get("up")],
                              int(lg.num_requests))
    rep.update({
        "speculation_precision": spec["speculation_precision"],
        "speculation_precision_entries": spec["ended"],
        "expired_unread_share": spec["expired_unread_share"],
        "fm_evals": evals,
        "fm_evals_per_1k_requests": 1000.0 * evals / max(1, lg.num_requests),
        "fm_duplicates": spec["duplicates"],
        "fm_seconds_per_1k_requests": spec["fm_seconds_per_1k"],
        "lag_s": opts.lag_s, "budget_per_hour": opts.budget_per_hour, "tick_s": opts.tick_s,
        "read_ttl_s": acfg.cache.read_ttl_s, "retention_s": acfg.cache.retention_s,
        "fraction": acfg.verifier.fraction, "workers": opts.workers,
        "fm_devices": (live["summary"] or {}).get("fm_devices"),
        "errors": client.errors, "retries": client.retries,
        "error_samples": client.error_samples, "clock_refused": _clock_refused(live),
        "precompute_steps": live["steps"],
        "knn_rebuilds": [{k: r.get(k) for k in ("version", "as_of", "seconds")}
                         for r in live["knn_runs"]],
        "seconds": round(live["seconds"], 1), "artifacts_seconds": prep["artifacts_seconds"],
        "window_start": prep["window_start"], "window_end": float(lg.ts[-1]),
        # share of the window's candidates that were the same user's candidates within the
        # read TTL / within 6 h (the paper's measure) before, in the window
        "candidate_recurrence": candidate_recurrence(lg, float(acfg.cache.read_ttl_s)),
        "candidate_recurrence_6h": candidate_recurrence(lg, RECURRENCE_S),
        "fm_evals_per_event_hour": evals * 3600.0 / max(1.0, float(lg.ts[-1] - lg.ts[0])),
        "speculation": spec,
    })
    task = ds.tasks[0]
    within = cfg.features.request_granularity_s if ds.requests is None else 1.0
    rows, row, _ = served_rows(lg, live, ds, within)
    v1 = lr.manifests[0]["version"]
    own = np.asarray([live["vm_version"][r] == v1 for r in rows.req.tolist()], bool)
    save_feature_log(out / "feature_log.npz", take_rows(rows, np.flatnonzero(own)), row[own])
    rep.update(transfer_from_log(out / "feature_log.npz", lr.art_dirs[0], task,
                                 float(acfg.cache.read_ttl_s)))
    lab = lg.labelled & (live["tiers"] >= 0)
    r_i, _ = np.nonzero(lab)
    span = float(lg.ts[-1] - lg.ts[0])
    curve = coverage_over_time(lg.ts[r_i].astype(np.float64), live["tiers"][lab].astype(np.int64),
                               live["agg"][lab], time_bin_s(span, len(r_i)),
                               start=float(lg.ts[0]))
    plots = [coverage_time_plot(curve, out / "coverage_over_time.png",
                                f"{ds.name}: coverage of labelled pairs by tier")]
    if opts.rollover_at is not None and live["curve"]:
        v2 = lr.manifests[1]["version"]
        cv = np.array(live["curve"], np.float64)  # (n, 3): ts, old share, new share
        hour = np.floor((cv[:, 0] - cv[0, 0]) / 3600.0)
        bins = np.unique(hour)
        ts = cv[0, 0] + 3600.0 * bins
        old = np.array([cv[hour == h, 1].mean() for h in bins])
        new = np.array([cv[hour == h, 2].mean() for h in bins])
        served_v2 = np.flatnonzero(live["vm_version"] == v2)
        switch_t = float(lg.ts[served_v2[0]]) if len(served_v2) else None
        mixed = sum(1 for v in live["vm_version"] if v not in (v1, v2, None))
        half = len(cv) // 2
        rep["rollover"] = {"old": v1, "new": v2, "switch_t": switch_t,
                           "old_coverage_first_half": float(cv[:half, 1].mean()),
                           "old_coverage_last_tenth": float(cv[-max(1, len(cv) // 10):, 1].mean()),
                           "new_coverage_last_tenth": float(cv[-max(1, len(cv) // 10):, 2].mean()),
                           "requests_served_by_new": int(len(served_v2)),
                           "mixed_version_requests": mixed}
        plots.append(rollover_plot({"t": ts, "old": old, "new": new, "switch_t": switch_t},
                                   out / "rollover.png"))
    if pred is not None:
        rep["prediction"] = pred
    if pred is not None and "error" not in pred:
        from solaris.replay.plots import estimate_plot
        from solaris.replay.predict import compare

        rep["prediction_check"] = compare(pred, rep)
        plots.append(estimate_plot(pred, out / "estimate.png", rep))
    rep["plots"] = [str(p) for p in plots]
    # the verifier's scores and the log's candidates too: bench/policies.py replays other
    # speculation policies on them
    atomic.save(out / "served.npz", lambda f: np.savez_compressed(
        f, scores=live["scores"], tiers=live["tiers"], ages=live["ages"], agg=live["agg"],
        base_scores=served_scores(live), candidates=lg.candidates, user=lg.user, ts=lg.ts))
    atomic.save_json(out / "replay.json", rep, default=json_default)
    return rep


# ---------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ReplayOptions()
    p.add_argument("--dataset", choices=["synthetic", "movielens", "generic"],
                   default="synthetic")
    p.add_argument("--data-dir", type=Path, help="MovieLens-100K directory; generic: the "
                   "mapping YAML (or its directory)")
    p.add_argument("--fetch", action="store_true", help="movielens without --data-dir: fetch it")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", help="YAML config tree")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    p.add_argument("--tick-s", type=float, default=d.tick_s)
    p.add_argument("--lag-s", type=float, default=d.lag_s)
    p.add_argument("--budget", type=float, default=d.budget_per_hour,
                   help="FM pair-evaluations per event hour (0: no limit)")
    p.add_argument("--workers", type=int, default=d.workers, help="FM worker actors")
    p.add_argument("--knn-every-h", type=float, default=d.knn_every_h)
    p.add_argument("--granularity-s", type=int,
                   help="logs without candidate lists (MovieLens): one request per user and "
                   "time bucket of this many seconds, offline and in the replay alike "
                   "(sets features.request_granularity_s; default 300)")
    p.add_argument("--max-requests", type=int)
    p.add_argument("--seed", type=int, default=d.seed,
                   help="training seed of the artifacts (and the request log's draws)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--rollover-at", type=float,
                   help="roll out FM v2 at this share of the window (e.g. 0.5)")
    p.add_argument("--sweep", action="store_true",
                   help="also replay at other budgets and TTLs and plot coverage and TR")
    p.add_argument("--closed-loop", action="store_true",
                   help="the system ranks, shows its top --shown plus --explore uniform "
                   "slots, a ground truth labels them (synthetic: the world's click model; "
                   "movielens: a like-model fitted on every period, OUT/ground_truth.npz, by "
                   "which the log before the window is relabelled); solaris simulate's arms "
                   "run beside it; writes OUT/closed_loop.json")
    p.add_argument("--shown", type=int,
                   help="closed loop: top-ranked candidates shown (default: synthetic "
                   f"{SHOWN['synthetic']}, movielens {SHOWN['movielens']})")
    p.add_argument("--explore", type=int, default=d.explore)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-refresh-barrier", action="store_true",
                   help="the router's read replica pulls on its own timer only "
                   "(serve.replica_refresh_s), not at each tick's barrier: what a live "
                   "replica's staleness costs (coverage, duplicate FM evaluations)")
    p.add_argument("--no-predict", action="store_true",
                   help="skip the prediction from the data before the window")
    p.add_argument("--evaluate-only", action="store_true",
                   help="recompute the transfer figures of OUT from its feature log (no replay)")


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    return ReplayOptions(tick_s=args.tick_s, lag_s=args.lag_s, budget_per_hour=args.budget,
                         workers=args.workers,
                         max_requests=args.max_requests, port=args.port, seed=args.seed,
                         rollover_at=args.rollover_at, progress=not args.no_progress,
                         closed_loop=args.closed_loop, explore=args.explore,
                         predict=not args.no_predict, verbose=getattr(args, "verbose", False),
                         refresh_barrier=not getattr(args, "no_refresh_barrier", False),
                         shown=args.shown if args.shown is not None else SHOWN.get(args.dataset, 10),
                         # in a closed loop the KNN job reads the arm's own interactions
                         knn_every_h=args.knn_every_h)


def run_from_args(args: argparse.Namespace) -> int:
    from solaris.data.load import load_dataset
    from solaris.replay.report import json_default, summary_table

    ov = parse_overrides(args.set or [])
    if args.granularity_s is not None:
        ov["features.request_granularity_s"] = args.granularity_s
    ov["data.dataset"] = args.dataset
    if args.data_dir:
        ov["data.data_dir"] = str(args.data_dir)
    cfg = load_config(args.config, ov)
    if args.evaluate_only:
        return evaluate_only(Path(args.out))
    if args.closed_loop and args.dataset == "generic":
        raise SolarisError("--dataset generic --closed-loop: a closed loop needs a ground "
                           "truth; use synthetic or movielens")
    ds = load_dataset(cfg.data, fetch=args.fetch)
    opts = options_from_args(args)
    truth = None
    if opts.closed_loop and args.dataset == "movielens":
        from solaris.data.rating_truth import relabelled

        truth, ds = relabelled(ds, Path(args.out) / "ground_truth.npz", opts.seed)
    rep = replay(cfg, ds, args.out, opts, truth=truth)
    if opts.closed_loop:
        print(rep.pop("table"))
        print(f"wrote {Path(args.out) / 'closed_loop.json'} and {', '.join(rep['plots'])}")
        return 0
    print(summary_table(rep))
    if args.sweep:
        rep["sweep"] = sweep(cfg, ds, Path(args.out), opts, rep)
        atomic.save_json(Path(args.out) / "replay.json", rep, default=json_default)
    print(f"wrote {Path(args.out) / 'replay.json'} and {', '.join(rep['plots'])}")
    return 0


def closed_loop_report(lr: LiveReplay, live: dict, prep: dict) -> dict[str, Any]:
    """The closed loop's report: the live system's arm (``solaris_live``) beside the
    in-process arms of the same seed (the VM alone as the shadow arm, the served VM on the
    simulated cache, the FM inline, the oracle), on the same arrivals and random numbers;
    writes OUT/closed_loop.json, OUT/arms.npz and OUT/closed_loop.png."""
    from solaris.replay.closed_loop import report_table, run_world, write_outputs

    out, ctx, o = lr.out, lr.loop, lr.opts
    live_log = lr.loop_log
    live_log.fm_evals = int(live["evaluated"])
    live_log.knn_as_of = [float(r["as_of"]) for r in live["knn_runs"][1:]]  # after the first
    lr.say("running the in-process arms on the same arrivals")
    bar = _bar(ctx.lg.num_requests * len(lr.loop_opts.arms), "in-process arms", o.progress)
    try:
        rep, logs = run_world(ctx, lr.loop_opts, progress=bar.update,
                              extra={"solaris_live": live_log})
    finally:
        bar.close()
    sim, lv = logs["solaris"], live_log
    client = live["client"]
    rep["live"] = {
        "errors": client.errors, "retries": client.retries,
        "clock_refused": _clock_refused(live),
        "error_samples": client.error_samples, "workers": o.workers,
        "fm_evals_live": int(live["evaluated"]), "fm_evals_sim": ctx.fm_evals,
        "pair_shown_live": float((lv.tier == Tier.PAIR).mean()),
        "pair_shown_sim": float((sim.tier == Tier.PAIR).mean()),
        "clicks_live": float(lv.p_true.sum(1).mean()),
        "clicks_sim": float(sim.p_true.sum(1).mean()),
        "same_shown": float((np.sort(lv.item, 1) == np.sort(sim.item, 1)).all(1).mean()),
        # the served scores of the shown items, bit for bit (float32, as the router answers)
        "same_scores": float((lv.p_arm.astype(np.float32)
                              == sim.p_arm.astype(np.float32)).all(1).mean()),
        "knn_rebuilds": [{k: r.get(k) for k in ("version", "as_of", "seconds")}
                         for r in live["knn_runs"]],
        # the user table's rebuilds after the window start's build, as of these event times
        "knn_as_of_live": live_log.knn_as_of, "knn_as_of_sim": sim.knn_as_of,
        "seconds": round(live["seconds"], 1), "artifacts_seconds": prep["artifacts_seconds"]}
    rep["dataset"] = lr.ds.name
    rep["artifacts"] = str(lr.art_dirs[0])
    write_outputs(out, ctx, logs, rep)
    rep["table"] = report_table(rep)
    return rep


def base_scores(lg: Any, live: dict, art_dirs: list[Path], task: str) -> np.ndarray:
    """(R, C) the scores the verifier ranked by: the VM alone inside each request's served
    VM (the same weights, ``vm_<task>_alone.pt``), re-scored in process; NaN where the
    request was not served."""
    from solaris.online.scoring import ScoreRequest, VMScorer

    out = np.full(lg.candidates.shape, np.nan, np.float32)
    for d in art_dirs:
        art = Artifacts.open(d)
        alone = VMScorer(art, task, art.side_tables(), alone=True)
        rows = [r for r in range(lg.num_requests) if live["vm_version"][r] == art.version]
        for lo in range(0, len(rows), 256):
            part = rows[lo:lo + 256]
            reqs = [ScoreRequest(int(lg.user[r]), lg.candidates[r], int(lg.surface[r]), None)
                    for r in part]
            for r, p in zip(part, alone.score(reqs)):
                out[r] = p
    return out


def evaluate_only(out: Path) -> int:
    """Recompute the transfer figures of a finished replay from ``OUT/feature_log.npz`` and
    rewrite them into ``OUT/replay.json``."""
    from solaris.replay.report import json_default, summary_table, transfer_from_log

    path = out / "replay.json"
    if not path.exists() or not (out / "feature_log.npz").exists():
        raise SolarisError(f"{out}: no replay.json / feature_log.npz (run the replay first)")
    rep = json.loads(path.read_text())
    art = out / "artifacts"
    rep.update(transfer_from_log(out / "feature_log.npz", art, Artifacts.open(art).tasks[0],
                                 float(rep["read_ttl_s"])))
    atomic.save_json(path, rep, default=json_default)
    print(summary_table(rep))
    return 0


def sweep(cfg: SolarisConfig, ds: Any, out: Path, opts: ReplayOptions, base: dict
          ) -> list[dict[str, Any]]:
    """Live replays at other budgets and read TTLs (the base run is one point)."""
    from solaris.replay.plots import sweep_plot

    rows = [_sweep_row(base)]
    # budgets below the rate the base run actually used, so that they bind
    hours = max(1e-9, (base["window_end"] - base["window_start"]) / 3600.0)
    used = base["fm_evals"] / hours
    for share in (0.125, 0.25, 0.5):
        rows.append(_sweep_point(cfg, ds, out, opts, round(used * share, 1),
                                 cfg.cache.read_ttl_s))
    for ttl in (3600, 12 * 3600):
        rows.append(_sweep_point(cfg, ds, out, opts, opts.budget_per_hour, ttl))
    base["plots"].append(str(sweep_plot(rows, out / "sweep.png")))
    return rows


def _sweep_point(cfg: SolarisConfig, ds: Any, out: Path, opts: ReplayOptions, budget: float,
                 ttl: int) -> dict[str, Any]:
    import dataclasses
    import shutil

    sub = out / f"sweep-b{int(budget)}-ttl{int(ttl)}"
    sub.mkdir(parents=True, exist_ok=True)
    if not (sub / "artifacts").exists():  # the same models: share the base run's
        shutil.copytree(out / "artifacts", sub / "artifacts")
    c = with_overrides(cfg, {"cache.read_ttl_s": int(ttl),
                             "cache.retention_s": max(int(ttl), cfg.cache.retention_s),
                             "cache.bucket_s": min(cfg.cache.bucket_s, int(ttl))})
    o = dataclasses.replace(opts, budget_per_hour=budget, rollover_at=None, progress=False)
    return _sweep_row(replay(c, ds, sub, o, say=lambda m: None))


def _sweep_row(rep: dict[str, Any]) -> dict[str, Any]:
    return {"budget_per_hour": rep["budget_per_hour"], "read_ttl_s": rep["read_ttl_s"],
            "coverage_pair": rep["coverage"]["pair"],
            "coverage_effective": rep["coverage"]["effective"],
            "tr_online": rep["tr_online"], "fm_evals_per_1k_requests":
            rep["fm_evals_per_1k_requests"]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run_from_args(args)
    except SolarisError as e:
        print(f"replay: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
