"""An FM worker's cycle (``actors.precompute.FMWorker``), one part per concern: the models
(``ModelHolder``), the lease loop (``LeaseLoop``: lease, compute, pipelined cycles, the
background thread), the write-back (``WriteBack``: ledger report and cache write, then the
ack; a failed lease back to the queue), the fault points the tests arm (``FaultPoints``) and
the counters (``WorkerCounts``). The actor builds them in ``__init__`` and forwards to them;
the module docstring of ``actors.precompute`` describes the cycle and its pipeline.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import ray
import torch
from ray.exceptions import RayError

from actors.history import HistoryUnavailable
from actors.queue import QueueClient
from solaris.artifacts import SideTables, load_models
from solaris.config import PrecomputeConfig
from solaris.errors import ConfigError
from solaris.precompute.pqueue import Lease
from solaris.precompute.worker import (HistoryProvider, PrecomputeWorker, WindowHistory,
                                       describe_device, device_sizes)

log = logging.getLogger(__name__)

FAULTS = ("mid_forward", "after_write_before_ack")


class WorkerCounts:
    """A worker's counters (steps, leases, pairs, writes, late acks, errors), FM seconds and
    wall / CPU seconds per phase; thread-safe (the writer thread updates them too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("steps", "leases", "pairs", "written",
                                      "late_acks", "errors", "ledger_errors"), 0)
        self._fm_seconds = 0.0
        # wall seconds per phase of the steps (where the time goes; "lease" counts empty polls)
        # and the CPU seconds of the thread that ran compute / write + ack (the writer thread
        # in the pipeline): the CPU outside the FM that shares the cores with it
        # ("write_wait": the pipeline's compute thread waiting for the previous write + ack)
        self._phase = dict.fromkeys(("lease", "compute", "write", "ack", "compute_cpu",
                                     "write_cpu", "write_wait"), 0.0)

    def add(self, counts: dict[str, int] | None = None, phase: dict[str, float] | None = None,
            fm_seconds: float = 0.0) -> None:
        """Add to the counters, the phases' seconds and the FM seconds, at once."""
        with self._lock:
            for k, v in (counts or {}).items():
                self._counts[k] += v
            for k, v in (phase or {}).items():
                self._phase[k] += v
            self._fm_seconds += fm_seconds

    def count(self, name: str) -> int:
        """One counter's value."""
        return self._counts[name]

    def metrics(self) -> dict[str, Any]:
        """The counters, the FM seconds and the phases' seconds."""
        return {**self._counts, "fm_seconds": self._fm_seconds,
                "phase_seconds": dict(self._phase)}


class _EncodeFault:
    """The encoder's ``encode`` replaced by ``fire`` until ``remove``: a point inside the
    worker's forward, after the FM's request part ran (whatever the FM's layers)."""

    def __init__(self, encoder: Any, fire: Callable[[], None]) -> None:
        self._encoder = encoder
        encoder.encode = lambda *_a, **_k: fire()

    def remove(self) -> None:
        del self._encoder.encode  # the class's own method again


class FaultPoints:
    """Fault injection for tests: named points (``FAULTS``) where an armed worker exits its
    process, never timing. A restarted worker starts disarmed (a new process)."""

    def __init__(self, worker_id: int) -> None:
        self._id = worker_id
        self.armed: str | None = None
        self._hook: _EncodeFault | None = None

    def arm(self, fault: str | None, encoder: Any) -> None:
        """Make the next step exit the process at ``fault`` (one of FAULTS; None disarms);
        ``encoder``: the worker's, where ``mid_forward`` fires."""
        if fault is not None and fault not in FAULTS:
            raise ConfigError(f"fault={fault!r}: must be one of {', '.join(FAULTS)} or None")
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.armed = fault
        if fault == "mid_forward":  # in the candidate blocks, after the request part ran
            self._hook = _EncodeFault(encoder, lambda: self.exit("mid_forward"))

    def hit(self, where: str) -> None:
        """Exit here if the fault ``where`` is armed."""
        if self.armed == where:
            self.exit(where)

    def exit(self, where: str) -> None:
        log.warning("FM worker %d: fault %r armed, exiting", self._id, where)
        os._exit(1)


class ModelHolder:
    """The worker's models: a ``PrecomputeWorker`` (FM + encoder from the artifacts, the side
    tables, a history provider) on the device this worker may use."""

    def __init__(self, cfg: PrecomputeConfig, artifacts_dir: str, tables: SideTables,
                 history: HistoryProvider | None, cache: Any, worker_id: int) -> None:
        """``history`` None: the live history of ``cache`` (an ``actors.cache.CacheGroup``)."""
        self._id = worker_id
        # device cpu runs on the CPU whatever resources the worker holds (e.g. the fake GPU
        # node of the autoscaling test)
        use_gpu = cfg.device != "cpu" and bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        if cfg.device == "cuda" and not use_gpu:
            raise ConfigError("precompute.device='cuda': this worker got no usable GPU")
        device = "cuda" if use_gpu else "cpu"
        b_req, b_pairs, self.lease_pairs = device_sizes(cfg, device)  # a GPU's own, larger
        fm, enc, self.version = load_models(artifacts_dir)
        if history is None:
            history = WindowHistory(cache.history.window, cache.history.window_start)
        self.live_history = isinstance(history, WindowHistory)
        self.worker = PrecomputeWorker(fm, enc, history, tables, self.version, device,
                                       block_requests=b_req, block_pairs=b_pairs)
        self.device = describe_device(self.worker.device)

    def run(self, lease: Lease, naive: bool) -> tuple:
        """FM + encoder over the lease (``naive``: the per-pair forward)."""
        return (self.worker.run_naive if naive else self.worker.run)(lease.groups,
                                                                     lease.read_at)

    def prefetch(self, lease: Lease) -> None:
        """Start reading the lease's histories (live history only), as the forward will ask
        for them: one row per group with items, in lease order."""
        if not self.live_history:
            return
        rows = [g for g in lease.groups if len(g.items)]
        try:
            self.worker.history.prefetch(np.array([g.user for g in rows], np.int64),
                                         self.worker.history_times(rows, lease.read_at),
                                         self.worker.fm.history_len)
        except Exception as exc:  # e.g. a bad id: the compute reads afresh and reports it
            log.debug("FM worker %d: history prefetch failed: %s", self._id, exc)


class WriteBack:
    """A computed lease's way out: the ledger report and the cache write (in parallel), then
    the ack; a lease that failed goes back to the queue. In the pipeline the write + ack run
    in a writer thread of their own."""

    def __init__(self, queue: QueueClient, cache: Any, ledger: Any, version: str,
                 counts: WorkerCounts, faults: FaultPoints, worker_id: int) -> None:
        self._queue = queue
        self._cache = cache  # actors.cache.CacheGroup
        self._ledger = ledger  # actors.ledger.LedgerClient or None
        self._version = version
        self._counts = counts
        self._faults = faults
        self._id = worker_id
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"fm-writer-{worker_id}")
        self._acks: deque = deque()  # (lease id, ref) of sent acks not yet read (pipeline)

    def fail(self, lease: Lease) -> None:
        """Count the error and give the lease back (now, not after the lease timeout)."""
        self._counts.add({"errors": 1})
        self._queue.nack(lease.lease_id)  # back in the queue now, not after the timeout

    def finish(self, lease: Lease, result: tuple, defer_ack: bool = False) -> dict[str, Any]:
        """Ledger report and cache write (in parallel), then the ack.

        ``defer_ack`` (the pipeline): the ack is sent but not waited for; its answer is read
        when the next lease finishes (``settle``), so the ack's round trip is off the writer
        thread's path. The report's ``acked`` is then None.
        """
        users, items, z, secs = result
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            scores = np.concatenate([g.priorities for g in lease.groups]).astype(np.float32)
            ledger_ref = (self._ledger.evaluated(users, items, secs)
                          if self._ledger is not None else None)
            # each pair at its own request's time (what its read TTL and age count from)
            now = np.repeat([g.now for g in lease.groups], [len(g.items) for g in lease.groups])
            written = self._cache.put(users, items, z, self._version, now, scores)
        except Exception:
            self.fail(lease)
            raise
        self._ledger_result(ledger_ref)
        if written < len(users):
            log.warning("FM worker %d: %d of %d pairs written (shard down or store full)",
                        self._id, written, len(users))
        self._faults.hit("after_write_before_ack")
        t1 = time.perf_counter()
        ref = self._queue.ack(lease.lease_id)
        acked: bool | None = None
        if defer_ack:
            self._settle_acks()  # the previous lease's ack: answered by now
            self._acks.append((lease.lease_id, ref))
        else:
            acked = self._ack_result(lease.lease_id, ref)
        t2 = time.perf_counter()
        self._counts.add({"leases": 1, "pairs": len(users), "written": written},
                         {"write": t1 - t0, "ack": t2 - t1,
                          "write_cpu": time.thread_time() - c0}, secs)
        return {"lease": lease.lease_id, "pairs": len(users), "written": written,
                "acked": acked, "fm_seconds": secs}

    def submit(self, lease: Lease, result: tuple) -> Future:
        """``finish`` with a deferred ack, in the writer thread."""
        return self._writer.submit(self.finish, lease, result, True)

    def settle(self) -> None:
        """Read the answers of the deferred acks, in the writer thread (its deque)."""
        self._writer.submit(self._settle_acks).result()

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
            self._counts.add({"late_acks": 1})
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
            self._counts.add({"ledger_errors": 1})
            log.warning("FM worker %d: ledger report failed: %s", self._id, type(exc).__name__)


class LeaseLoop:
    """Leases from the queue through the models to the write-back: one cycle (``step``),
    pipelined cycles (``drain``), or a background thread of them (``start`` / ``stop``).
    Cycles are serialised by a lock."""

    def __init__(self, cfg: PrecomputeConfig, queue: QueueClient, model: ModelHolder,
                 back: WriteBack, counts: WorkerCounts, lease_pairs: int | None,
                 history_at: str, clock: Callable[[], float], worker_id: int) -> None:
        """``history_at`` (checked) and ``clock``: ``FMWorker``'s."""
        self._queue = queue
        self._model = model
        self._back = back
        self._counts = counts
        self._lease_pairs = lease_pairs
        self._history_at, self._clock = history_at, clock
        self._idle_wait_s = cfg.idle_wait_s
        self._id = worker_id
        self._step_lock = threading.Lock()  # one cycle (step or pipeline) at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the cycle's stages
    def _lease(self, ref: Any) -> Lease | None:
        t0 = time.perf_counter()
        packed = ray.get(ref)
        lease = QueueClient.lease_of(packed)
        if lease is not None and lease.read_at is None and self._history_at == "visible":
            lease.read_at = max(float(self._clock()), max(g.now for g in lease.groups))
        self._counts.add({"steps": 1}, {"lease": time.perf_counter() - t0})
        return lease

    def _lease_ref(self, max_pairs: int | None = None) -> Any:
        limit = max_pairs if max_pairs is not None else self._lease_pairs
        return self._queue.lease_ref(limit, self._model.version)

    def _compute(self, lease: Lease, naive: bool) -> tuple:
        """FM + encoder over the lease (``naive``: the per-pair forward); nack on failure."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            out = self._model.run(lease, naive)
        except Exception:
            self._back.fail(lease)
            raise
        self._counts.add(phase={"compute": time.perf_counter() - t0,
                                "compute_cpu": time.thread_time() - c0})
        return out

    def step(self, max_pairs: int | None = None, naive: bool = False) -> dict[str, Any]:
        """One lease -> compute -> write -> ack cycle, nothing overlapped; ``naive`` runs
        the per-pair forward. ``lease`` is None in the report when the queue was empty."""
        with self._step_lock:
            lease = self._lease(self._lease_ref(max_pairs))
            if lease is None:
                return {"lease": None, "pairs": 0, "written": 0, "acked": False,
                        "fm_seconds": 0.0}
            return self._back.finish(lease, self._compute(lease, naive))

    def drain(self, naive: bool = False, max_leases: int | None = None,
              lease_pairs: int | None = None) -> dict[str, Any]:
        """Process leases (of ``lease_pairs``, default the worker's) until one comes back
        empty (or ``max_leases``), pipelined: the next lease is in hand, its histories being
        read, and the one after requested before the current forward; the write + ack of
        one lease run in a second thread during the next forward."""
        with self._step_lock:
            return self._pipeline(naive, max_leases, lease_pairs)

    def _pipeline(self, naive: bool, max_leases: int | None,
                  lease_pairs: int | None = None, stoppable: bool = False) -> dict[str, Any]:
        out = {"leases": 0, "pairs": 0, "written": 0, "late_acks": 0, "fm_seconds": 0.0}
        late0 = self._counts.count("late_acks")

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
            self._model.prefetch(lease)
            if more():
                ahead, asked = self._lease_ref(lease_pairs), asked + 1
        try:
            while lease is not None:
                # the next lease was asked for a cycle ago: take it, start reading its
                # histories (live history) and ask for the one after, then compute this one
                nxt = self._lease(ahead) if ahead is not None else None
                ahead = None
                if nxt is not None:
                    self._model.prefetch(nxt)
                    if more():
                        ahead, asked = self._lease_ref(lease_pairs), asked + 1
                try:
                    result = self._compute(lease, naive)
                except Exception:  # give back the leases held ahead
                    if nxt is not None:
                        self._back.fail(nxt)
                    if ahead is not None and (held := ray.get(ahead)) is not None:
                        self._back.fail(QueueClient.lease_of(held))
                    raise
                if pending is not None:
                    t0 = time.perf_counter()
                    add(pending.result())
                    self._counts.add(phase={"write_wait": time.perf_counter() - t0})
                pending = self._back.submit(lease, result)
                lease = nxt
        finally:
            if pending is not None:
                add(pending.result())
            self._back.settle()  # the writer thread's deque
        out["late_acks"] = self._counts.count("late_acks") - late0
        return out

    # -- background loop (optional; tests call step/drain directly)
    def start(self) -> bool:
        """Run ``drain`` in a background thread until ``stop``; False if already running."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_forever,
                                        name=f"fm-worker-{self._id}", daemon=True)
        self._thread.start()
        return True

    def _run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                with self._step_lock:  # a short pipeline that asks for no lease after stop
                    got = self._pipeline(False, max_leases=16, stoppable=True)
                if not got["leases"]:
                    self._stop.wait(self._idle_wait_s)
            except (RayError, HistoryUnavailable) as exc:  # queue or shard restarting: retry
                log.warning("FM worker %d: step failed: %s", self._id, type(exc).__name__)
                self._stop.wait(max(self._idle_wait_s, 0.5))
            except Exception:
                log.exception("FM worker %d: step failed", self._id)
                self._stop.wait(max(self._idle_wait_s, 0.5))

    def stop(self) -> bool:
        """Stop the background loop: it asks for no more leases, and returns once the ones
        it holds are written and acked (what the pool waits for before it kills a worker)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        return thread is not None

    def running(self) -> bool:
        """Whether a background loop was started and not stopped."""
        return self._thread is not None
