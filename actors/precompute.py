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

``drain`` (and the background loop) pipelines these cycles: the next lease is in hand
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
with the named points in ``FAULTS``.

Scaling (``WorkerPool.tick``, called every few seconds by the process that owns the pool:
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
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError, RayError
from ray.util import metrics as ray_metrics

from actors.cache import HistoryUnavailable
from actors.ledger import LedgerClient
from actors.queue import QueueClient
from solaris import metrics
from solaris.config import PrecomputeConfig, check_history_at
from solaris.errors import ConfigError
from solaris.precompute.pqueue import Lease
from solaris.precompute.scaling import PoolLoad, ScalingPolicy, resolve, worker_resources
from solaris.artifact_store import canonical
from solaris.artifacts import SideTables, load_models
from solaris.precompute.worker import (HistoryProvider, PrecomputeWorker, WindowHistory,
                                describe_device, device_sizes)

log = logging.getLogger(__name__)

WORKER_NUM_CPUS = 0.25  # logical share on the 2-core profile; on a cluster pass threads
FAULTS = ("mid_forward", "after_write_before_ack")
# wall seconds a removed worker gets to finish and ack its leases before it is killed anyway
# (then its leases come back after the queue's lease timeout)
RETIRE_TIMEOUT_S = 60.0


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


class _EncodeFault:
    """The encoder's ``encode`` replaced by ``fire`` until ``remove``: a point inside the
    worker's forward, after the FM's request part ran (whatever the FM's layers)."""

    def __init__(self, encoder: Any, fire: Callable[[], None]) -> None:
        self._encoder = encoder
        encoder.encode = lambda *_a, **_k: fire()

    def remove(self) -> None:
        del self._encoder.encode  # the class's own method again


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
        self._history_at, self._clock = check_history_at(history_at, "history_at"), clock
        self._cfg = cfg
        self._queue = QueueClient.of(queue)
        self._cache = cache  # actors.cache.CacheGroup
        self._ledger = LedgerClient.of(ledger)
        self._id = worker_id
        # device cpu runs on the CPU whatever resources the worker holds (e.g. the fake GPU
        # node of the autoscaling test)
        use_gpu = cfg.device != "cpu" and bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        if cfg.device == "cuda" and not use_gpu:
            raise ConfigError("precompute.device='cuda': this worker got no usable GPU")
        device = "cuda" if use_gpu else "cpu"
        b_req, b_pairs, dev_lease = device_sizes(cfg, device)  # a GPU's own, larger sizes
        self._lease_pairs = lease_pairs if lease_pairs is not None else dev_lease
        fm, enc, version = load_models(artifacts_dir)
        if history is None:
            history = WindowHistory(cache.history.window, cache.history.window_start)
        self._live_history = isinstance(history, WindowHistory)
        self._worker = PrecomputeWorker(fm, enc, history, tables, version, device,
                                        block_requests=b_req, block_pairs=b_pairs)
        self.version = version
        self._fault: str | None = None
        self._hook: Any = None
        self._step_lock = threading.Lock()  # one cycle (step or pipeline) at a time
        self._count_lock = threading.Lock()  # counters: the writer thread updates them too
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"fm-writer-{worker_id}")
        self._acks: deque = deque()  # (lease id, ref) of sent acks not yet read (pipeline)
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self._counts = dict.fromkeys(("steps", "leases", "pairs", "written",
                                      "late_acks", "errors", "ledger_errors"), 0)
        self._fm_seconds = 0.0
        # wall seconds per phase of the steps (where the time goes; "lease" counts empty polls)
        # and the CPU seconds of the thread that ran compute / write + ack (the writer thread
        # in the pipeline): the CPU outside the FM that shares the cores with it
        # ("write_wait": the pipeline's compute thread waiting for the previous write + ack)
        self._phase = dict.fromkeys(("lease", "compute", "write", "ack", "compute_cpu",
                                     "write_cpu", "write_wait"), 0.0)
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self._device = describe_device(self._worker.device)
        log.info("FM worker %d: version %s on %s%s", worker_id, version,
                 self._device, " (restarted)" if self._restarted else "")

    # -- fault injection (tests): named points, never timing
    def arm(self, fault: str | None) -> None:
        """Make the next step exit the process at ``fault`` (one of FAULTS; None disarms).
        A restarted worker starts disarmed (a new process runs ``__init__``)."""
        if fault is not None and fault not in FAULTS:
            raise ConfigError(f"fault={fault!r}: must be one of {', '.join(FAULTS)} or None")
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._fault = fault
        if fault == "mid_forward":  # in the candidate blocks, after the request part ran
            self._hook = _EncodeFault(self._worker.encoder, lambda: self._exit("mid_forward"))

    def _exit(self, where: str) -> None:
        log.warning("FM worker %d: fault %r armed, exiting", self._id, where)
        os._exit(1)

    # -- the cycle, in three stages
    def _lease(self, ref: Any) -> Lease | None:
        t0 = time.perf_counter()
        packed = ray.get(ref)
        lease = QueueClient.lease_of(packed)
        if lease is not None and lease.read_at is None and self._history_at == "visible":
            lease.read_at = max(float(self._clock()), max(g.now for g in lease.groups))
        with self._count_lock:
            self._counts["steps"] += 1
            self._phase["lease"] += time.perf_counter() - t0
        return lease

    def _lease_ref(self, max_pairs: int | None = None) -> Any:
        limit = max_pairs if max_pairs is not None else self._lease_pairs
        return self._queue.lease_ref(limit, self.version)

    def _compute(self, lease: Lease, naive: bool) -> tuple:
        """FM + encoder over the lease (``naive``: the per-pair forward); nack on failure."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            out = (self._worker.run_naive if naive else self._worker.run)(lease.groups,
                                                                          lease.read_at)
        except Exception:
            self._fail(lease)
            raise
        with self._count_lock:
            self._phase["compute"] += time.perf_counter() - t0
            self._phase["compute_cpu"] += time.thread_time() - c0
        return out

    def _prefetch(self, lease: Lease) -> None:
        """Start reading the lease's histories (live history only), as ``_batches`` will
        ask for them: one row per group with items, in lease order."""
        if not self._live_history:
            return
        rows = [g for g in lease.groups if len(g.items)]
        try:
            self._worker.history.prefetch(np.array([g.user for g in rows], np.int64),
                                          self._worker.history_times(rows, lease.read_at),
                                          self._worker.fm.history_len)
        except Exception as exc:  # e.g. a bad id: the compute reads afresh and reports it
            log.debug("FM worker %d: history prefetch failed: %s", self._id, exc)

    def _fail(self, lease: Lease) -> None:
        with self._count_lock:
            self._counts["errors"] += 1
        self._queue.nack(lease.lease_id)  # back in the queue now, not after the timeout

    def _finish(self, lease: Lease, result: tuple, defer_ack: bool = False) -> dict[str, Any]:
        """Ledger report and cache write (in parallel), then the ack.

        ``defer_ack`` (the pipeline): the ack is sent but not waited for; its answer is read
        when the next lease finishes (``_settle_acks``), so the ack's round trip is off the
        writer thread's path. The report's ``acked`` is then None.
        """
        users, items, z, secs = result
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            scores = np.concatenate([g.priorities for g in lease.groups]).astype(np.float32)
            ledger_ref = (self._ledger.evaluated(users, items, secs)
                          if self._ledger is not None else None)
            # each pair at its own request's time (what its read TTL and age count from)
            now = np.repeat([g.now for g in lease.groups], [len(g.items) for g in lease.groups])
            written = self._cache.put(users, items, z, self.version, now, scores)
        except Exception:
            self._fail(lease)
            raise
        self._ledger_result(ledger_ref)
        if written < len(users):
            log.warning("FM worker %d: %d of %d pairs written (shard down or store full)",
                        self._id, written, len(users))
        if self._fault == "after_write_before_ack":
            self._exit(self._fault)
        t1 = time.perf_counter()
        ref = self._queue.ack(lease.lease_id)
        acked: bool | None = None
        if defer_ack:
            self._settle_acks()  # the previous lease's ack: answered by now
            self._acks.append((lease.lease_id, ref))
        else:
            acked = self._ack_result(lease.lease_id, ref)
        t2 = time.perf_counter()
        with self._count_lock:
            c, ph = self._counts, self._phase
            ph["write"] += t1 - t0
            ph["ack"] += t2 - t1
            ph["write_cpu"] += time.thread_time() - c0
            c["leases"] += 1
            c["pairs"] += len(users)
            c["written"] += written
            self._fm_seconds += secs
        return {"lease": lease.lease_id, "pairs": len(users), "written": written,
                "acked": acked, "fm_seconds": secs}

    def _ack_result(self, lease_id: str, ref: Any) -> bool:
        """Whether the queue took the ack; a late ack (expired lease, restarted or dead
        queue: the pairs may be evaluated again) is logged and counted."""
        try:
            acked = bool(ray.get(ref))
        except RayError as exc:
            log.warning("FM worker %d: ack of lease %s failed: %s", self._id, lease_id,
                        type(exc).__name__)
            acked = False
        if not acked:
            log.warning("FM worker %d: late ack of lease %s", self._id, lease_id)
            with self._count_lock:
                self._counts["late_acks"] += 1
        return acked

    def _settle_acks(self) -> None:
        """Read the answers of the deferred acks (writer thread, or after it is idle)."""
        while self._acks:
            self._ack_result(*self._acks.popleft())

    def _ledger_result(self, ref: Any) -> None:
        """Wait for the ledger's report; accounting is best effort: a dead ledger is logged
        and counted, never a reason to hold back the cache write's ack."""
        if ref is None:
            return
        try:
            ray.get(ref)
        except RayError as exc:
            with self._count_lock:
                self._counts["ledger_errors"] += 1
            log.warning("FM worker %d: ledger report failed: %s", self._id, type(exc).__name__)

    def step(self, max_pairs: int | None = None, naive: bool = False) -> dict[str, Any]:
        """One lease -> compute -> write -> ack cycle, nothing overlapped; ``naive`` runs
        the per-pair forward. ``lease`` is None in the report when the queue was empty."""
        with self._step_lock:
            lease = self._lease(self._lease_ref(max_pairs))
            if lease is None:
                return {"lease": None, "pairs": 0, "written": 0, "acked": False,
                        "fm_seconds": 0.0}
            return self._finish(lease, self._compute(lease, naive))

    def drain(self, naive: bool = False, max_leases: int | None = None,
              lease_pairs: int | None = None) -> dict[str, Any]:
        """Process leases (of ``lease_pairs``, default the worker's) until one comes back
        empty (or ``max_leases``), pipelined: the next lease is in hand, its histories being
        read, and the one after requested before the current forward; the write + ack of
        one lease run in a second thread during the next forward (module docstring)."""
        with self._step_lock:
            return self._pipeline(naive, max_leases, lease_pairs)

    def _pipeline(self, naive: bool, max_leases: int | None,
                  lease_pairs: int | None = None, stoppable: bool = False) -> dict[str, Any]:
        out = {"leases": 0, "pairs": 0, "written": 0, "late_acks": 0, "fm_seconds": 0.0}
        late0 = self._counts["late_acks"]

        def add(r: dict[str, Any]) -> None:
            out["leases"] += 1
            for k in ("pairs", "written", "fm_seconds"):
                out[k] += r[k]
        pending: Future | None = None
        asked = 1

        def more() -> bool:  # may one more lease be asked for? (not once ``stop`` is called)
            if stoppable and self._stop.is_set():
                return False
            return max_leases is None or asked < max_leases
        lease = self._lease(self._lease_ref(lease_pairs))
        ahead = None  # ref of the lease after ``nxt``
        if lease is not None:
            self._prefetch(lease)
            if more():
                ahead, asked = self._lease_ref(lease_pairs), asked + 1
        try:
            while lease is not None:
                # the next lease was asked for a cycle ago: take it, start reading its
                # histories (live history) and ask for the one after, then compute this one
                nxt = self._lease(ahead) if ahead is not None else None
                ahead = None
                if nxt is not None:
                    self._prefetch(nxt)
                    if more():
                        ahead, asked = self._lease_ref(lease_pairs), asked + 1
                try:
                    result = self._compute(lease, naive)
                except Exception:  # give back the leases held ahead
                    if nxt is not None:
                        self._fail(nxt)
                    if ahead is not None and (held := ray.get(ahead)) is not None:
                        self._fail(QueueClient.lease_of(held))
                    raise
                if pending is not None:
                    t0 = time.perf_counter()
                    add(pending.result())
                    with self._count_lock:
                        self._phase["write_wait"] += time.perf_counter() - t0
                pending = self._writer.submit(self._finish, lease, result, True)
                lease = nxt
        finally:
            if pending is not None:
                add(pending.result())
            self._writer.submit(self._settle_acks).result()  # the writer thread's deque
        out["late_acks"] = self._counts["late_acks"] - late0
        return out

    # -- background loop (optional; tests call step/drain directly)
    def start(self) -> bool:
        """Run ``drain`` in a background thread until ``stop``; False if already running."""
        if self._loop is not None and self._loop.is_alive():
            return False
        self._stop.clear()
        self._loop = threading.Thread(target=self._run_forever, name=f"fm-worker-{self._id}",
                                      daemon=True)
        self._loop.start()
        return True

    def _run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                with self._step_lock:  # a short pipeline that asks for no lease after stop
                    got = self._pipeline(False, max_leases=16, stoppable=True)
                if not got["leases"]:
                    self._stop.wait(self._cfg.idle_wait_s)
            except (RayError, HistoryUnavailable) as exc:  # queue or shard restarting: retry
                log.warning("FM worker %d: step failed: %s", self._id, type(exc).__name__)
                self._stop.wait(max(self._cfg.idle_wait_s, 0.5))
            except Exception:
                log.exception("FM worker %d: step failed", self._id)
                self._stop.wait(max(self._cfg.idle_wait_s, 0.5))

    def stop(self) -> bool:
        """Stop the background loop: it asks for no more leases, and returns once the ones
        it holds are written and acked (what the pool waits for before it kills a worker)."""
        self._stop.set()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.join()
        return loop is not None

    def metrics(self) -> dict[str, Any]:
        """Steps, leases, pairs, writes, late acks, FM-seconds, device, pid."""
        return {**self._counts, "fm_seconds": self._fm_seconds,
                "phase_seconds": dict(self._phase), "worker": self._id,
                "version": self.version, "device": self._device,
                "blocks": [self._worker.block_requests, self._worker.block_pairs],
                "lease_pairs": self._lease_pairs,
                "history": "live" if self._live_history else "static",
                "pid": os.getpid(), "restarted": self._restarted,
                "running": self._loop is not None}


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
        self.history_at, self.clock = check_history_at(history_at, "history_at"), clock
        self.cfg = resolve(cfg, profile)  # the profile's pool size where cfg leaves it None
        self.queue = QueueClient.of(queue)
        self.cache = cache
        self.ledger = LedgerClient.of(ledger)
        self.name = str(name)
        self.accelerator = accelerator_request(cfg, profile)  # {}: CPU workers
        self.options = worker_options(num_cpus, self.accelerator, actor_options)
        self.policy = ScalingPolicy(self.cfg, scale_clock, profile)
        # a URI stays one: each worker reads its own node's copy (solaris.artifact_store)
        self._args = (canonical(artifacts_dir), ray.put(tables),
                      None if history is None else ray.put(history))
        self._lease_pairs = lease_pairs
        self.workers: list[Any] = []
        self._unplaced: dict[int, Any] = {}  # id(worker) -> its first call, until answered
        self._retiring: list[tuple[Any, Any, float]] = []  # (worker, its stop call, deadline)
        self._seen: dict[int, tuple[int, int]] = {}  # id(worker) -> (pid, errors) last read
        self._silent: set[int] = set()  # workers whose last check failed (counted once)
        self.errors = 0
        self._running = False
        self._next_id = 0
        for _ in range(self.cfg.workers):
            self.add_worker()

    # -- size
    def add_worker(self) -> Any:
        """Start one more worker (no check against ``max_workers``; ``scale`` checks); while
        the pool runs, its loop starts once it is placed and built."""
        art, tables, history = self._args
        w = FMWorker.options(**self.options).remote(
            self.cfg, art, tables, history, self.queue, self.cache, self.ledger,
            self._lease_pairs, self._next_id, self.history_at, self.clock)
        self._next_id += 1
        self.workers.append(w)
        self._unplaced[id(w)] = w.metrics.remote()
        if self._running:
            w.start.remote()  # queued behind __init__: runs once the worker is built
        return w

    def pending(self) -> int:
        """Workers requested but not answering yet: not placed (no node with the resources
        they ask for: the autoscaler's cue) or still loading their models."""
        if self._unplaced:
            refs = list(self._unplaced.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(ready)
            self._unplaced = {k: r for k, r in self._unplaced.items() if r not in done}
        return len(self._unplaced)

    def remove_workers(self, n: int) -> int:
        """Retire ``n`` workers: unplaced ones first, killed at once (they hold no lease; one
        that raced into a lease gives it back by the lease timeout), then the newest placed
        ones, which stop leasing and are killed once their held leases are written and acked
        (``reap``). Returns how many were retired."""
        self.pending()
        order = sorted(range(len(self.workers)),
                       key=lambda i: (id(self.workers[i]) not in self._unplaced, -i))
        victims = set(order[:max(0, n)])
        deadline = float(self.policy.clock()) + RETIRE_TIMEOUT_S
        for i in sorted(victims):
            w = self.workers[i]
            key = id(w)
            self._seen.pop(key, None)
            self._silent.discard(key)
            if self._unplaced.pop(key, None) is not None:
                self._kill(w)
            else:
                self._retiring.append((w, w.stop.remote(), deadline))
        self.workers = [w for i, w in enumerate(self.workers) if i not in victims]
        self.reap()
        return len(victims)

    def reap(self) -> int:
        """Kill the retiring workers whose loop has stopped (every lease they held acked), or
        that ran past ``RETIRE_TIMEOUT_S``; returns how many are still retiring."""
        now = float(self.policy.clock())
        keep = []
        for w, ref, deadline in self._retiring:
            done = bool(ray.wait([ref], timeout=0)[0])
            if done or now >= deadline:
                if not done:
                    log.warning("precompute %s: a retiring worker did not stop in %.0f s: "
                                "killed, its leases return after the lease timeout",
                                self.name, RETIRE_TIMEOUT_S)
                self._kill(w)
            else:
                keep.append((w, ref, deadline))
        self._retiring = keep
        return len(keep)

    @staticmethod
    def _kill(w: Any) -> None:
        try:
            ray.kill(w, no_restart=True)
        except RayError:
            pass

    def scale(self, queue_metrics: dict[str, Any] | None = None) -> int:
        """Resize to what ``solaris.precompute.scaling`` decides from ``queue_metrics`` (the
        queue actor's ``metrics()``; None: read now) and the unplaced workers; returns the
        workers added (> 0) or retired (< 0)."""
        self.reap()
        if queue_metrics is None:
            queue_metrics = self.queue.metrics()
        n = len(self.workers)
        want = self.policy.target(n, PoolLoad.of(queue_metrics, self.pending()))
        for _ in range(want - n):
            self.add_worker()
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
        return {"workers": len(self.workers), "pending": self.pending(),
                "retiring": len(self._retiring), "errors": self.errors}

    def check(self, timeout_s: float = 5.0) -> int:
        """Read every placed worker's metrics: count in ``errors`` its new failed cycles, a
        restart (a new process: it crashed, Ray made it again) and a worker that does not
        answer (once, until it answers again); while the pool runs, start the loop of a
        worker that has none (a restarted one). Returns the errors found now."""
        self.pending()
        placed = [w for w in self.workers if id(w) not in self._unplaced]
        refs = [w.metrics.remote() for w in placed]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) if refs else ()
        new = 0
        for w, ref in zip(placed, refs):
            key = id(w)
            if ref not in ready:  # busy or restarting: read next time
                continue
            try:
                m = ray.get(ref)
            except RayError:
                new += key not in self._silent
                self._silent.add(key)
                continue
            self._silent.discard(key)
            pid, errs = int(m["pid"]), int(m["errors"])
            last = self._seen.get(key)
            if last is None:  # first read: a restart before it counts too
                new += errs + int(bool(m["restarted"]))
            elif pid != last[0]:  # a new process since the last read: its counts start at 0
                new += 1 + errs
            else:
                new += max(0, errs - last[1])
            self._seen[key] = (pid, errs)
            if self._running and not m["running"]:
                w.start.remote()
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
        self._running = True
        refs = [w.start.remote() for w in self.workers]
        if not self.accelerator:
            ray.get(refs)

    def stop(self) -> None:
        """Stop every worker's background loop (after the leases it holds); waits for the
        placed workers."""
        self._running = False
        self.pending()
        refs = [(id(w), w.stop.remote()) for w in self.workers]
        ray.get([r for key, r in refs if key not in self._unplaced or not self.accelerator])

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
        for w in [*self.workers, *(r[0] for r in self._retiring)]:
            self._kill(w)
        self.workers, self._retiring, self._unplaced = [], [], {}
        self._running = False


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
