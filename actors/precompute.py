"""FM worker actors: lease from the precompute queue, run FM + encoder, write the cache, ack.

``FMWorker`` wraps one ``solaris.precompute.worker.PrecomputeWorker`` built in ``__init__`` from the
artifact files (``fm.pt`` and ``encoder.pt``, read with ``weights_only``; from the worker's
own node's copy where the location is a URI, ``solaris.artifact_store``), the side-feature
tables and a history provider: by default (``history=None``) the live history held by the
cache shards (``WindowHistory`` over ``CacheGroup.history.window``); a static provider
(e.g. a ``HistoryStore`` filled from a log) where a test or benchmark passes one. One
``step()``:

1. ``lease`` whole request groups from the queue actor (one call);
2. the leased requests' histories as of their event times, or as of the lease's
   ``read_at`` (``schedule.history_at: visible``: the replay gate's tick end, or in
   production the worker's clock when it leased; never before a request's own time)
   (live: one parallel round to the owning cache shards; a shard that does not answer
   gives the lease back, ``nack``);
   ``PrecomputeWorker.run``: the FM's request part once per group, the candidate part over
   every leased item in one batch, the encoder (``run_naive``: the plain per-pair forward);
3. report the evaluations to the ``LedgerActor`` (``actors/ledger.py``; the FM's cost) and,
   in parallel,
   write the vectors to the owning cache shards (``CacheGroup.put``, one call per shard) with
   the model version and the verifier scores as eviction ranks;
4. ``ack`` the lease (after the write: a crash before it makes the pairs come back, and the
   retry overwrites the same cache keys -- one live entry; the shard counts the duplicate).

The actor forwards to one part per concern (``actors.fm_cycle``): the models, the lease loop,
the write-back, the fault points, the counters. ``drain`` (and the background loop) pipelines
these cycles: the next lease is in hand
(and its live histories are being read) before the current forward, the one after it is
requested, and one lease's write + ack run in a second thread while the next lease's
forward runs -- at most four leases held, each acked only after its write. A prefetched
history is read one cycle (a few ms) before its forward; it still holds only events before
each request's event time, so the embeddings are the same unless an event of that past
arrives in between.
In the pipeline an ack is sent but its answer (late or not) is read when the next lease
finishes: the round trip would otherwise hold the writer thread, and on 2 cores a shared
forward of a 1,024-pair lease is only a few times longer than these round trips.

A lease's entries are stamped each with its own request's event time (the read TTL and the
age the VM reads count from there, as the schedule simulation counts them), in one ``put``
per lease.

Placement (``solaris.precompute.scaling.worker_resources``): a worker asks for
``PrecomputeConfig.accelerator_resources`` (``{"GPU": 1, "fm_gpu": 1}``) in the cluster
profile whether or not a GPU node is up -- the request Ray's autoscaler answers by
launching a ``cluster.yaml`` gpu_worker node -- and locally only where the cluster has a
GPU when the pool starts (``device: auto``); otherwise it is a CPU worker. Each worker runs
``PrecomputeConfig.threads`` torch threads, on CUDA only where it was given a GPU, CUDA
works and ``device`` is not ``cpu``. Fault injection for tests goes through ``arm(fault)``
with the named points in ``actors.fm_cycle.FAULTS``.

Scaling (``WorkerPool.tick``, called every few seconds by the process that owns the pool;
its members and the watch on their errors are ``actors.pool_members``:
the serve app or a job): ``solaris.precompute.scaling.decide`` reads the queue's depth, its
leased pairs, how long its oldest pending pair has waited and how many workers are still
unplaced, and answers the worker count (bounds, hysteresis, cool-down: that module's
docstring). A worker added while the pool runs starts its loop once placed. A worker
removed first stops leasing: its loop finishes the leases it holds (each written and acked)
and only then is the actor killed; unplaced workers go first, killed at once (they hold
nothing). One that does not stop within ``RETIRE_TIMEOUT_S`` is killed anyway, and its
un-acked leases come back to the queue after ``queue.lease_timeout_s``, as a crashed
worker's do. The pool publishes its worker count, its unplaced workers and the workers'
errors as Ray metrics (``solaris_fm_pool_workers``, ``solaris_fm_pool_pending``,
``solaris_fm_worker_errors``, tagged with the pool's name).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import ray
import torch
from ray.exceptions import RayActorError, RayError
from ray.util import metrics as ray_metrics

from actors.fm_cycle import (FaultPoints, LeaseLoop, ModelHolder, WorkerCounts,
                             WriteBack)
from actors.ledger import LedgerClient
from actors.pool_members import ErrorWatch, PoolMembers
from actors.queue import QueueClient
from solaris import metrics
from solaris.config import PrecomputeConfig, check_history_at
from solaris.precompute.scaling import PoolLoad, ScalingPolicy, resolve, worker_resources
from solaris.artifact_store import canonical
from solaris.artifacts import SideTables
from solaris.precompute.worker import HistoryProvider

log = logging.getLogger(__name__)

WORKER_NUM_CPUS = 0.25  # logical share on the 2-core profile; on a cluster pass threads

def accelerator_request(cfg: PrecomputeConfig, profile: str) -> dict[str, float]:
    """The accelerator resources one worker asks for in ``profile`` ({}: a CPU worker;
    ``scaling.worker_resources``): the cluster's GPUs are read only for a local profile."""
    gpus = 0.0 if profile == "cluster" else ray.cluster_resources().get("GPU", 0)
    return worker_resources(cfg, profile, gpus)


def worker_options(num_cpus: float, res: dict[str, float],
                   actor_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One worker's ``.options``: its CPU share, the accelerator resources ``res``
    (``accelerator_request``), then ``actor_options`` (their ``resources`` merged in)."""
    extra = dict(actor_options or {})
    custom = {k: v for k, v in res.items() if k != "GPU"}
    custom.update(extra.pop("resources", None) or {})
    opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": res.get("GPU", 0)}
    if custom:
        opts["resources"] = custom
    opts.update(extra)
    return opts


# ---- the worker ------------------------------------------------------------------------------
@ray.remote(num_cpus=WORKER_NUM_CPUS, max_restarts=-1, max_task_retries=0, max_concurrency=2)
class FMWorker:
    """One PrecomputeWorker: lease -> FM + encoder -> cache write -> ack.

    ``step`` runs one cycle with nothing overlapped (the fault tests' unit); ``drain`` and the
    background loop (``start``) pipeline cycles. Two call threads: ``metrics``/``stop``
    answer while a loop runs; cycles are serialised by a lock. Calls are not retried: a
    worker that died mid-cycle left its leases un-acked, and the queue hands them out again.
    """

    def __init__(self, cfg: PrecomputeConfig, artifacts_dir: str, tables: SideTables,
                 history: HistoryProvider | None, queue: Any, cache: Any, ledger: Any = None,
                 lease_pairs: int | None = None, worker_id: int = 0,
                 history_at: str = "request", clock: Any = time.time) -> None:
        """``history`` None: the live history of ``cache`` (an ``actors.cache.CacheGroup``).
        ``history_at`` (``ScheduleConfig.history_at``): a lease's histories are read as of
        its ``read_at`` when the replay's gate set one; otherwise "request" reads each group
        as of its request, "visible" as of the lease (``clock``, event time = wall time as
        the router stamps requests; never before a group's own request)."""
        torch.set_num_threads(cfg.threads)
        history_at = check_history_at(history_at, "history_at")
        queue = QueueClient.of(queue)
        self._id = worker_id
        self._model = ModelHolder(cfg, artifacts_dir, tables, history, cache, worker_id)
        self._lease_pairs = lease_pairs if lease_pairs is not None else self._model.lease_pairs
        self._counts = WorkerCounts()
        self._faults = FaultPoints(worker_id)
        back = WriteBack(queue, cache, LedgerClient.of(ledger), self._model.version,
                         self._counts, self._faults, worker_id)
        self._loop = LeaseLoop(cfg, queue, self._model, back, self._counts, self._lease_pairs,
                               history_at, clock, worker_id)
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        log.info("FM worker %d: version %s on %s%s", worker_id, self._model.version,
                 self._model.device, " (restarted)" if self._restarted else "")

    def arm(self, fault: str | None) -> None:
        """Make the next step exit the process at ``fault`` (one of
        ``actors.fm_cycle.FAULTS``; None disarms). A restarted worker starts disarmed (a new
        process runs ``__init__``)."""
        self._faults.arm(fault, self._model.worker.encoder)

    def step(self, max_pairs: int | None = None, naive: bool = False) -> dict[str, Any]:
        """One lease -> compute -> write -> ack cycle, nothing overlapped; ``naive`` runs
        the per-pair forward. ``lease`` is None in the report when the queue was empty."""
        return self._loop.step(max_pairs, naive)

    def drain(self, naive: bool = False, max_leases: int | None = None,
              lease_pairs: int | None = None) -> dict[str, Any]:
        """Process leases (of ``lease_pairs``, default the worker's) until one comes back
        empty (or ``max_leases``), pipelined (module docstring)."""
        return self._loop.drain(naive, max_leases, lease_pairs)

    def start(self) -> bool:
        """Run ``drain`` in a background thread until ``stop``; False if already running."""
        return self._loop.start()

    def stop(self) -> bool:
        """Stop the background loop: it asks for no more leases, and returns once the ones
        it holds are written and acked (what the pool waits for before it kills a worker)."""
        return self._loop.stop()

    def metrics(self) -> dict[str, Any]:
        """Steps, leases, pairs, writes, late acks, FM-seconds, device, pid."""
        m = self._model
        return {**self._counts.metrics(), "worker": self._id, "version": m.version,
                "device": m.device, "blocks": [m.worker.block_requests, m.worker.block_pairs],
                "lease_pairs": self._lease_pairs,
                "history": "live" if m.live_history else "static",
                "pid": os.getpid(), "restarted": self._restarted,
                "running": self._loop.running()}


# ---- the pool --------------------------------------------------------------------------------
_METRICS: dict[str, Any] = {}  # this process's pool metrics, made once (every pool tags its own)
_METRICS_LOCK = threading.Lock()


def _pool_metrics() -> dict[str, Any]:
    with _METRICS_LOCK:
        if not _METRICS:
            _METRICS.update(
                workers=metrics.build(metrics.FM_POOL_WORKERS, ray_metrics),
                pending=metrics.build(metrics.FM_POOL_PENDING, ray_metrics),
                errors=metrics.build(metrics.FM_WORKER_ERRORS, ray_metrics))
        return _METRICS


class WorkerPool:
    """FM workers sharing one queue: started, scaled up and down, watched.

    Lives in the caller's process (driver, job or serve app). The side tables (and a static
    history, if one is given) go to the object store once and are shared by every worker
    (and every restart). ``history=None`` is the production wiring: every worker reads the
    live history from the cache shards of ``cache``. The owner calls ``tick`` every few
    seconds (module docstring: scaling, retiring, metrics).
    """

    def __init__(self, cfg: PrecomputeConfig, artifacts_dir: str | Path, tables: SideTables,
                 history: HistoryProvider | None, queue: Any, cache: Any, ledger: Any = None,
                 lease_pairs: int | None = None, num_cpus: float = WORKER_NUM_CPUS, *,
                 actor_options: dict[str, Any] | None = None,
                 history_at: str = "request", clock: Any = time.time,
                 profile: str = "serving", scale_clock: Callable[[], float] = time.monotonic,
                 name: str = "fm") -> None:
        """``actor_options`` (placement: e.g. ``{"resources": {"fm_host": 1}}``) go to each
        worker's ``.options``, over ``num_cpus`` and the accelerator resources ``profile``
        (``serve.profile``) asks for; ``history_at`` and ``clock``: each ``FMWorker``'s
        (``ScheduleConfig.history_at``); ``scale_clock``: the scaling policy's (wall seconds);
        ``name``: the ``pool`` tag of the pool's metrics (the serve app: the version)."""
        history_at = check_history_at(history_at, "history_at")
        self.cfg = resolve(cfg, profile)  # the profile's pool size where cfg leaves it None
        self.queue = QueueClient.of(queue)
        self.name = str(name)
        self.accelerator = accelerator_request(cfg, profile)  # {}: CPU workers
        self.options = worker_options(num_cpus, self.accelerator, actor_options)
        self.policy = ScalingPolicy(self.cfg, scale_clock, profile)
        # a URI stays one: each worker reads its own node's copy (solaris.artifact_store)
        args = (self.cfg, canonical(artifacts_dir), ray.put(tables),
                None if history is None else ray.put(history), self.queue, cache,
                LedgerClient.of(ledger), lease_pairs)
        self.members = PoolMembers(
            lambda worker_id: FMWorker.options(**self.options).remote(
                *args, worker_id, history_at, clock),
            self.policy.clock, self.name)
        self.watch = ErrorWatch()
        self.errors = 0
        for _ in range(self.cfg.workers):
            self.members.add()

    @property
    def workers(self) -> list[Any]:
        """The pool's workers, placed or not (retiring ones left out)."""
        return self.members.workers

    # -- size
    def remove_workers(self, n: int) -> int:
        """Retire ``n`` workers: unplaced ones first, killed at once (they hold no lease; one
        that raced into a lease gives it back by the lease timeout), then the newest placed
        ones, which stop leasing and are killed once their held leases are written and acked
        (``reap``). Returns how many were retired."""
        keys = self.members.remove(n)
        self.watch.forget(keys)
        self.members.reap()
        return len(keys)

    def reap(self) -> int:
        """Kill the retiring workers whose loop has stopped (every lease they held acked), or
        that ran past ``RETIRE_TIMEOUT_S``; returns how many are still retiring."""
        return self.members.reap()

    def scale(self, queue_metrics: dict[str, Any] | None = None) -> int:
        """Resize to what ``solaris.precompute.scaling`` decides from ``queue_metrics`` (the
        queue actor's ``metrics()``; None: read now) and the unplaced workers; returns the
        workers added (> 0) or retired (< 0)."""
        self.members.reap()
        if queue_metrics is None:
            queue_metrics = self.queue.metrics()
        n = len(self.workers)
        want = self.policy.target(n, PoolLoad.of(queue_metrics, self.members.pending()))
        for _ in range(want - n):
            self.members.add()
        if want < n:
            self.remove_workers(n - want)
        if want != n:
            log.info("precompute %s: depth %s, oldest wait %.1f s -> %d workers", self.name,
                     queue_metrics.get("depth"), queue_metrics.get("oldest_wait_s") or 0.0,
                     want)
        return want - n

    def tick(self, queue_metrics: dict[str, Any] | None = None,
             timeout_s: float = 5.0) -> dict[str, int]:
        """What the owner runs every few seconds: ``check`` the workers, ``scale``, publish
        the metrics; returns ``status``."""
        new_errors = self.check(timeout_s)
        self.scale(queue_metrics)
        st = self.status()
        m, tags = _pool_metrics(), {"pool": self.name}
        m["workers"].set(float(st["workers"]), tags=tags)
        m["pending"].set(float(st["pending"]), tags=tags)
        if new_errors:
            m["errors"].inc(float(new_errors), tags=tags)
        return st

    def status(self) -> dict[str, int]:
        """Workers (placed or not), pending (not answering yet), retiring, errors so far."""
        return {"workers": len(self.workers), "pending": self.members.pending(),
                "retiring": len(self.members.retiring), "errors": self.errors}

    def check(self, timeout_s: float = 5.0) -> int:
        """Read every placed worker's metrics (``ErrorWatch.check``): count in ``errors`` its
        new failed cycles, a restart and a worker that does not answer; while the pool runs,
        start the loop of a worker that has none (a restarted one). Returns the errors found
        now."""
        new = self.watch.check(self.members.placed(), self.members.running, timeout_s)
        if new:
            log.warning("precompute %s: %d FM worker errors", self.name, new)
        self.errors += new
        return new

    # -- work
    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every worker has loaded its models."""
        ray.get([w.metrics.remote() for w in self.workers], timeout=timeout_s)

    def step_all(self, naive: bool = False) -> list[dict[str, Any] | None]:
        """One step on every worker in parallel; None for a worker that died in it (Ray
        restarts it; its lease returns to the queue after the timeout)."""
        return step_workers(self.workers, naive)

    def drain(self, timeout_s: float = 60.0) -> list[dict[str, Any] | None]:
        """Step every worker until the queue holds nothing leasable (pending, under the
        replay's gate if one is set) or leased (leases of dead workers come back after the
        lease timeout); the step reports, in order."""
        return drain_workers(self.workers, self.queue, timeout_s, self.cfg.idle_wait_s)

    def start(self) -> None:
        """Start every worker's background loop, and the loop of every worker added later.
        Waits for the loops to start, except in a pool of accelerator workers (a worker
        may wait minutes for its node: its loop starts once it is placed)."""
        self.members.running = True
        refs = [w.start.remote() for w in self.workers]
        if not self.accelerator:
            ray.get(refs)

    def stop(self) -> None:
        """Stop every worker's background loop (after the leases it holds); waits for the
        placed workers."""
        self.members.running = False
        self.members.pending()
        refs = [(id(w), w.stop.remote()) for w in self.workers]
        ray.get([r for key, r in refs
                 if key not in self.members.unplaced or not self.accelerator])

    def metrics(self, timeout_s: float = 30.0) -> list[dict[str, Any] | None]:
        """Each worker's metrics; None for one that did not answer within ``timeout_s``
        (all asked at once)."""
        refs = [w.metrics.remote() for w in self.workers]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) if refs else ()
        out: list[dict[str, Any] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref) if ref in ready else None)
            except RayError:
                out.append(None)
        return out

    def shutdown(self) -> None:
        """Kill every worker for good (retiring ones included)."""
        self.members.shutdown()


def step_workers(workers: list[Any], naive: bool = False) -> list[dict[str, Any] | None]:
    """One step on each of ``workers`` in parallel; None for a worker that died in it."""
    refs = [w.step.remote(naive=naive) for w in workers]
    out: list[dict[str, Any] | None] = []
    for i, ref in enumerate(refs):
        try:
            out.append(ray.get(ref))
        except RayActorError as exc:
            log.warning("precompute: worker %d died in a step: %s", i, type(exc).__name__)
            out.append(None)
    return out


def drain_workers(workers: list[Any], queue: Any, timeout_s: float = 60.0,
                  idle_wait_s: float = 0.05,
                  by_version: list[list[Any]] | None = None) -> list[dict[str, Any] | None]:
    """Step ``workers`` (of any versions, sharing ``queue``) until nothing is leasable or
    leased; the step reports, in order. TimeoutError past ``timeout_s``.

    ``by_version``: the workers as one list per version (``workers`` is then ignored). Each
    round steps one version's workers after the other's, in this order: each version's
    workers lease only its groups, so versions stepped at once would race for the queue's
    allowance and what is computed would depend on which leased first; one version at a
    time, it depends on the queue's order alone (as with one version's workers at once)."""
    queue = QueueClient.of(queue)
    deadline = time.monotonic() + timeout_s
    reports: list[dict[str, Any] | None] = []
    groups = [g for g in by_version if g] if by_version is not None else [workers]
    while True:
        got = [r for g in groups for r in step_workers(g)]
        reports += got
        if any(r is not None and r["lease"] is not None for r in got):
            continue
        m = queue.metrics()
        if m["eligible"] == 0 and m["leased"] == 0:  # nothing leasable (gate) or pending
            return reports
        if time.monotonic() > deadline:
            raise TimeoutError(f"precompute: queue not drained after {timeout_s} s "
                               f"(eligible {m['eligible']}, leased {m['leased']})")
        time.sleep(max(idle_wait_s, 0.05))
