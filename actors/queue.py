"""The precompute queue actor: one ``solaris.precompute.pqueue.PrecomputeQueue`` behind a lock, made durable.

``PrecomputeQueueActor`` owns what the pure queue leaves out: one Ray call per batch
(``put`` takes a whole verifier batch, ``lease`` returns whole request groups), the wall
clock that times leases (this process's ``time.monotonic``), and durability across a restart
of the actor itself.

Durability: **write-behind snapshots** (not a log). Every call that changes the set of queued
pairs or their priority/request -- a ``put`` that accepted, merged or dropped anything, an
``ack`` that succeeded -- marks the queue dirty; a background thread writes the whole queue
(``PrecomputeQueue.snapshot``: pending and leased pairs) to Parquet through ``pyarrow.fs``
at most once per ``QueueConfig.snapshot_every_s`` wall seconds, atomically (temporary file,
then move). ``flush()`` writes at once and returns when the state it saw is on disk.
Ray re-runs ``__init__`` after a crash (``max_restarts=-1``): it reads the last snapshot and
queues every pair in it as pending (leased pairs included).

What a crash can still lose -- exactly the changes after the last completed snapshot, i.e. at
most the last ``snapshot_every_s`` seconds plus one snapshot write:

- pairs whose ``put`` returned since: gone (the verifier enqueues a pair again the next time
  its user is served while it is still missing or near expiry; one speculation round is
  missed). Of those, pairs a worker had already leased still reach the cache (the worker
  writes them; its ack comes back False). A ``put`` still in flight when the actor dies is
  retried on the restarted actor (``max_task_retries``), so it is not lost;
- acks since: their pairs come back and are evaluated again (duplicates: the cache overwrites
  the same key, so one live entry remains; the cost ledger counts the extra evaluations);
- merges and drops since: the snapshot's priorities and members come back;
- lease bookkeeping: never lost as work -- leased pairs are in the snapshot and return as
  pending; the old leases' acks arrive as late acks (``ack`` returns False) and their pairs
  are evaluated once more (duplicates, counted);
- counters since the last snapshot (the snapshot carries the counters it saw).

Nothing that a completed ``flush()`` covered is lost. Write-behind instead of a snapshot per
batch because a snapshot costs O(depth) (about 140 ms at 100k pairs on one core) and the
verifier puts once per served request; a log would make every put durable at O(batch) cost
but needs replay of acks, which the pure queue has no call for.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray

from actors.shard import RECORD_TASK_EVENTS
from solaris import wire
from solaris.atomic import filesystem
from solaris.clock import EventClock
from solaris.config import QueueConfig
from solaris.durable import Durable, every
from solaris.precompute.pqueue import Lease, PrecomputeQueue

log = logging.getLogger(__name__)

QUEUE_NUM_CPUS = 0.1  # bookkeeping only: the 2-core profile packs it beside the shards
QUEUE_FILE = "queue.parquet"


def queue_snapshot_location(uri: str, queue_id: str) -> tuple[pafs.FileSystem, str]:
    """Filesystem and path of queue ``queue_id``'s snapshot under ``uri`` (URI or dir)."""
    fs, root = filesystem(uri)
    return fs, f"{root.rstrip('/')}/queue-{queue_id}/{QUEUE_FILE}"


@ray.remote(num_cpus=QUEUE_NUM_CPUS, max_restarts=-1, max_task_retries=3,
            enable_task_events=RECORD_TASK_EVENTS)
class PrecomputeQueueActor:
    """One PrecomputeQueue; calls are serialised (one at a time) and retried on a restart.

    Retrying is safe: a retried ``put`` merges into what the snapshot restored, a retried
    ``lease`` leases from the restored queue, a retried ``ack`` of a lease the restarted
    queue never issued returns False (its pairs are evaluated again, counted).
    """

    def __init__(self, cfg: QueueConfig, queue_id: str = "default",
                 clock: EventClock | None = None) -> None:
        self._cfg = cfg
        self._queue_id = queue_id

        def restore(table: Any) -> PrecomputeQueue:
            q = PrecomputeQueue(cfg, event_clock=clock)
            q.restore(table)
            return q

        self._durable = Durable(
            f"queue {queue_id}",
            queue_snapshot_location(cfg.snapshot_uri, queue_id) if cfg.snapshot_uri else None,
            lambda: PrecomputeQueue(cfg, event_clock=clock), restore, lambda q: q.snapshot())
        self._lock = self._durable.lock  # the queue vs the snapshot thread
        self._queue = self._durable.state
        if self._durable.location is not None:
            every(cfg.snapshot_every_s, self._durable.snapshot, f"queue-{queue_id}-snapshot")

    # ------------------------------------------------------------------ durability
    def _snapshot(self) -> dict[str, Any]:
        t0 = time.monotonic()
        rows = self._durable.snapshot()
        return {"path": self._durable.location[1], "rows": rows,
                "seconds": 0.0 if rows is None else time.monotonic() - t0}

    def flush(self) -> dict[str, Any]:
        """Write the snapshot now if anything changed; on return that state is durable."""
        if self._durable.location is None:
            return {"path": None, "rows": None, "seconds": 0.0}
        return self._snapshot()

    # ------------------------------------------------------------------ queue calls
    def put(self, users: np.ndarray, items: np.ndarray, priorities: np.ndarray,
            now: np.ndarray | float, surfaces: np.ndarray | int, version: str) -> int:
        """Queue one verifier batch (``PrecomputeQueue.put``); returns the new pairs."""
        with self._lock:
            new = self._queue.put(users, items, priorities, now, surfaces, version)
            if len(users):
                self._durable.touch()
            return new

    def lease(self, max_pairs: int | None = None, version: str | None = None) -> Lease | None:
        """Lease whole request groups (``PrecomputeQueue.lease``); None when empty."""
        with self._lock:
            return self._queue.lease(max_pairs, version=version)

    def put_frame(self, payload: bytes) -> int:
        """``put`` with its arguments in one ``picks`` frame (``solaris.wire``): what the
        router sends."""
        return self.put(*wire.decode(payload, "picks", 6))

    def lease_frame(self, max_pairs: int | None = None, version: str | None = None
                    ) -> bytes | None:
        """``lease`` as one ``lease`` frame (``Lease.to_frame``; what FM workers
        call): a lease carries two arrays per request group, and Ray would serialise each on
        its own (~0.1 ms apiece; 200 groups at 10 candidates per request)."""
        lease = self.lease(max_pairs, version)
        return None if lease is None else lease.to_frame()

    def ack(self, lease_id: str) -> bool:
        """The lease's pairs are in the cache; False for an expired or unknown lease."""
        with self._lock:
            ok = self._queue.ack(lease_id)
            self._durable.touch(int(ok))
            return ok

    def set_gate(self, until: float | None, allowance: int | None,
                 read_at: float | None = None) -> dict[str, Any]:
        """The replay's event-time gate (``PrecomputeQueue.set_gate``); returns the metrics."""
        with self._lock:
            self._queue.set_gate(until, allowance, read_at)
            return self._queue.metrics()

    def nack(self, lease_id: str) -> bool:
        """Return a lease unprocessed (its pairs are pending again at once)."""
        with self._lock:
            return self._queue.nack(lease_id)

    def contains(self, users: np.ndarray, items: np.ndarray, version: str) -> np.ndarray:
        """(n,) bool: pair pending or leased (the verifier skips these)."""
        with self._lock:
            return self._queue.contains(users, items, version)

    def metrics(self) -> dict[str, Any]:
        """The queue's depth and counters plus snapshot and restart bookkeeping."""
        with self._lock:
            m = self._queue.metrics()
            d = self._durable.stats()
        m.update(queue_id=self._queue_id, pid=os.getpid(), restored_pairs=d.pop("restored"), **d)
        return m

    # ------------------------------------------------------------------ fault injection (tests)
    @ray.method(max_task_retries=0)
    def crash(self) -> None:
        """Kill this process at once, as an OOM kill would (Ray restarts the actor)."""
        log.warning("queue %s: crash() called, exiting", self._queue_id)
        os._exit(1)


def create_queue(cfg: QueueConfig, queue_id: str | None = None, *, name: str | None = None,
                 namespace: str | None = None, detached: bool = False,
                 clock: EventClock | None = None,
                 actor_options: dict[str, Any] | None = None) -> Any:
    """Start (or attach to, by ``name``) a queue actor; its snapshots live under
    ``cfg.snapshot_uri``/queue-<queue_id>/. An actor restart keeps its id by itself; pass a
    stable ``queue_id`` for a queue that must find its snapshot after the whole app restarts.
    ``clock``: what the queue checks request event times against
    (``solaris.clock.event_clock``; None: any time).
    ``actor_options`` (placement: e.g. ``{"resources": {"head": 0.01}}``) go to
    ``.options``, over the defaults."""
    queue_id = queue_id or uuid.uuid4().hex[:8]
    opts: dict[str, Any] = {}
    if name is not None:
        opts.update(name=name, get_if_exists=True)
    if namespace is not None:
        opts["namespace"] = namespace
    if detached:
        opts["lifetime"] = "detached"
    opts.update(actor_options or {})
    return PrecomputeQueueActor.options(**opts).remote(cfg, queue_id, clock)


class QueueClient:
    """The project's one way to call a precompute queue actor: what crosses is a SOLARIS
    frame (``solaris.wire``) or plain scalars, the waited calls have a timeout, and the
    handle stays inside (``handle``; tests reach it for fault injection).

    ``put``, ``ack`` and ``nack`` return their ``ObjectRef`` (the router and the FM workers
    do not wait on them); ``lease_ref`` / ``lease_of`` split a lease into its call and its
    answer, so a worker can ask for the next lease while it computes the current one.
    """

    def __init__(self, handle: Any, timeout_s: float = 60.0) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    @classmethod
    def create(cls, cfg: QueueConfig, queue_id: str | None = None, **kw: Any) -> "QueueClient":
        """``create_queue`` (same arguments) wrapped in a client."""
        return cls(create_queue(cfg, queue_id, **kw))

    @classmethod
    def of(cls, queue: Any) -> "QueueClient":
        """``queue`` if it is a client, else a client of the actor handle ``queue``."""
        return queue if isinstance(queue, cls) else cls(queue)

    def put(self, users: np.ndarray, items: np.ndarray, priorities: np.ndarray,
            now: np.ndarray | float, surfaces: np.ndarray | int, version: str) -> Any:
        """Queue one verifier batch (one ``picks`` frame); the ref gives the new pairs."""
        return self.handle.put_frame.remote(wire.encode("picks", (
            np.asarray(users, np.int64), np.asarray(items, np.int64),
            np.asarray(priorities, np.float64), now if np.isscalar(now) else np.asarray(now),
            surfaces if np.isscalar(surfaces) else np.asarray(surfaces), str(version))))

    def lease_ref(self, max_pairs: int | None = None, version: str | None = None) -> Any:
        """The call of a lease (``lease_of`` reads its answer)."""
        return self.handle.lease_frame.remote(max_pairs, version)

    @staticmethod
    def lease_of(frame: bytes | None) -> Lease | None:
        """The lease a ``lease_ref`` answered (None: nothing leasable)."""
        return None if frame is None else Lease.from_frame(frame)

    def lease(self, max_pairs: int | None = None, version: str | None = None) -> Lease | None:
        """Lease whole request groups, waited on."""
        return self.lease_of(ray.get(self.lease_ref(max_pairs, version), timeout=self.timeout_s))

    def ack(self, lease_id: str) -> Any:
        """The lease's pairs are in the cache (the ref: False for an expired lease)."""
        return self.handle.ack.remote(lease_id)

    def nack(self, lease_id: str) -> Any:
        """Give a lease back unprocessed (its pairs are pending again at once)."""
        return self.handle.nack.remote(lease_id)

    def metrics(self, timeout_s: float | None = None) -> dict[str, Any]:
        """``PrecomputeQueueActor.metrics``, waited on (``timeout_s``, default the client's)."""
        return ray.get(self.handle.metrics.remote(), timeout=timeout_s or self.timeout_s)

    def set_gate(self, until: float | None, allowance: int | None,
                 read_at: float | None = None) -> dict[str, Any]:
        """The replay's event-time gate (its leases read the history as of ``read_at``, None:
        of each request); returns the queue's metrics."""
        return ray.get(self.handle.set_gate.remote(until, allowance, read_at),
                       timeout=self.timeout_s)
