"""FM worker actors: lease from the precompute queue, run FM + encoder, write the cache, ack.

``FMWorker`` wraps one ``solaris.precompute.worker.PrecomputeWorker`` built in ``__init__`` from the
artifact files (``fm.pt`` and ``encoder.pt``, read with ``weights_only``; from the worker's
own node's copy where the location is a URI, ``solaris.artifact_store``), the side-feature
tables and a history provider: by default (``history=None``) the live history held by the
cache shards (``WindowHistory`` over ``CacheGroup.history_window``); a static provider
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

Placement: ``num_gpus=1`` where GPUs exist (``PrecomputeConfig.device``: ``auto`` looks at
the cluster's resources when the worker is created), CPU otherwise, with
``PrecomputeConfig.threads`` torch threads. Fault injection for tests goes through
``arm(fault)`` with the named points in ``FAULTS``.

Scaling (``WorkerPool``): the pool starts ``PrecomputeConfig.workers`` workers; ``scale()``
reads the queue depth and starts one more worker per ``scale_up_depth`` pending pairs
above what the running workers cover, up to ``max_workers``; it never stops one (a worker
with nothing to lease sleeps ``idle_wait_s`` and costs no FM time). On a cluster, call
``scale()`` from the process that owns the pool (the serve app or a job) every few seconds:
each new GPU worker asks for ``num_gpus=1``, so Ray's autoscaler starts a GPU node of the
``cluster.yaml`` GPU worker type when none is free, and ``max_workers`` caps the GPUs used.
"""

from __future__ import annotations

import logging
import math
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

from actors.cache import HistoryUnavailable
from actors.ledger import LedgerClient
from actors.queue import QueueClient
from solaris.config import PrecomputeConfig, check_history_at
from solaris.errors import ConfigError
from solaris.precompute.pqueue import Lease
from solaris.artifact_store import canonical
from solaris.artifacts import SideTables, load_models
from solaris.precompute.worker import (HistoryProvider, PrecomputeWorker, WindowHistory,
                                describe_device, device_sizes)

log = logging.getLogger(__name__)

WORKER_NUM_CPUS = 0.25  # logical share on the 2-core profile; on a cluster pass threads
FAULTS = ("mid_forward", "after_write_before_ack")


def worker_gpus(cfg: PrecomputeConfig) -> int:
    """GPUs one worker asks for: ``cuda`` 1, ``cpu`` 0, ``auto`` 1 where the cluster has any."""
    if cfg.device == "cpu":
        return 0
    if cfg.device == "cuda":
        return 1
    return 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0


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
        use_gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        if cfg.device == "cuda" and not use_gpu:
            raise ConfigError("precompute.device='cuda': this worker got no usable GPU")
        device = "cuda" if use_gpu else "cpu"
        b_req, b_pairs, dev_lease = device_sizes(cfg, device)  # a GPU's own, larger sizes
        self._lease_pairs = lease_pairs if lease_pairs is not None else dev_lease
        fm, enc, version = load_models(artifacts_dir)
        if history is None:
            history = WindowHistory(cache.history_window, cache.history_window_start)
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
                  lease_pairs: int | None = None) -> dict[str, Any]:
        out = {"leases": 0, "pairs": 0, "written": 0, "late_acks": 0, "fm_seconds": 0.0}
        late0 = self._counts["late_acks"]

        def add(r: dict[str, Any]) -> None:
            out["leases"] += 1
            for k in ("pairs", "written", "fm_seconds"):
                out[k] += r[k]
        pending: Future | None = None
        asked = 1

        def more() -> bool:  # may one more lease be asked for?
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
                with self._step_lock:  # a short pipeline: stop is checked between runs
                    got = self._pipeline(False, max_leases=16)
                if not got["leases"]:
                    self._stop.wait(self._cfg.idle_wait_s)
            except (RayError, HistoryUnavailable) as exc:  # queue or shard restarting: retry
                log.warning("FM worker %d: step failed: %s", self._id, type(exc).__name__)
                self._stop.wait(max(self._cfg.idle_wait_s, 0.5))
            except Exception:
                log.exception("FM worker %d: step failed", self._id)
                self._stop.wait(max(self._cfg.idle_wait_s, 0.5))

    def stop(self) -> bool:
        """Stop the background loop after its current step."""
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
class WorkerPool:
    """Starts ``PrecomputeConfig.workers`` FM workers and adds more with the queue depth.

    Lives in the caller's process (driver, job or serve app). The side tables (and a static
    history, if one is given) go to the object store once and are shared by every worker
    (and every restart). ``history=None`` is the production wiring: every worker reads the
    live history from the cache shards of ``cache``.
    """

    def __init__(self, cfg: PrecomputeConfig, artifacts_dir: str | Path, tables: SideTables,
                 history: HistoryProvider | None, queue: Any, cache: Any, ledger: Any = None,
                 lease_pairs: int | None = None, num_cpus: float = WORKER_NUM_CPUS, *,
                 actor_options: dict[str, Any] | None = None,
                 history_at: str = "request", clock: Any = time.time) -> None:
        """``actor_options`` (placement: e.g. ``{"resources": {"fm_host": 1}}``) go to each
        worker's ``.options``, over ``num_cpus`` and the GPUs ``cfg.device`` asks for;
        ``history_at`` and ``clock``: each ``FMWorker``'s (``ScheduleConfig.history_at``)."""
        self.history_at, self.clock = check_history_at(history_at, "history_at"), clock
        self.cfg = cfg
        self.queue = QueueClient.of(queue)
        self.cache = cache
        self.ledger = LedgerClient.of(ledger)
        self.num_gpus = worker_gpus(cfg)
        # a URI stays one: each worker reads its own node's copy (solaris.artifact_store)
        self._args = (canonical(artifacts_dir), ray.put(tables),
                      None if history is None else ray.put(history))
        self._lease_pairs = lease_pairs
        self._num_cpus = num_cpus
        self._actor_options = dict(actor_options or {})
        self.workers: list[Any] = []
        for _ in range(cfg.workers):
            self.add_worker()

    def add_worker(self) -> Any:
        """Start one more worker (no check against ``max_workers``; ``scale`` checks)."""
        art, tables, history = self._args
        opts = {"num_cpus": self._num_cpus, "num_gpus": self.num_gpus, **self._actor_options}
        w = FMWorker.options(**opts).remote(
            self.cfg, art, tables, history, self.queue, self.cache, self.ledger,
            self._lease_pairs, len(self.workers), self.history_at, self.clock)
        self.workers.append(w)
        return w

    def scale(self, depth: int | None = None) -> int:
        """Add workers while ``depth`` (default: the queue's) exceeds ``scale_up_depth`` per
        running worker, up to ``max_workers``; returns how many were added."""
        if depth is None:
            depth = int(self.queue.metrics()["depth"])
        want = min(self.cfg.max_workers, max(len(self.workers),
                                              math.ceil(depth / self.cfg.scale_up_depth)))
        added = want - len(self.workers)
        for _ in range(added):
            self.add_worker()
        if added:
            log.info("precompute: depth %d -> %d workers", depth, len(self.workers))
        return added

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
        """Start every worker's background loop."""
        ray.get([w.start.remote() for w in self.workers])

    def stop(self) -> None:
        """Stop every worker's background loop (after its current step)."""
        ray.get([w.stop.remote() for w in self.workers])

    def metrics(self) -> list[dict[str, Any] | None]:
        """Each worker's metrics; None for one that did not answer."""
        out = []
        for w in self.workers:
            try:
                out.append(ray.get(w.metrics.remote(), timeout=30))
            except RayError:
                out.append(None)
        return out

    def shutdown(self) -> None:
        """Kill every worker for good."""
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except RayError:
                pass
        self.workers = []


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
