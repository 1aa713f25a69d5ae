"""The cache-shard actor: one ``solaris.cache.store.PairStore`` and one
``solaris.history.HistoryStore`` for the users the shard owns, each behind its own lock,
snapshotted to Parquet and restored after a restart.

It owns the locks that make the stores safe under the actor's threads, when to write snapshots
(``solaris.cache.snapshot`` writes them through ``pyarrow.fs``, so a shard restarted on another
node finds them) and the restore after a restart: one part each (``actors.shard_stores``), the
actor's methods the thin remote entry points over them. Lookups arrive as
``solaris.cache.wire`` byte strings and leave as one (one buffer each way).
``actors.cache.CacheGroup`` is the client.

The history lives here because the same consistent-hash placement that puts a user's pairs
on a shard puts the user's behaviour there too (DESIGN.md step 6): the router's impression
and label writes and the FM workers' history reads for a user all go to one shard. Its
snapshot is a second Parquet file beside the pair snapshot (``history_location``), written
on the same timer when the history changed; a write after the last snapshot is lost with
the process, as a pair write is. A shard with nothing to restore writes both (empty) at its
first snapshot, so every shard of a running group leaves a file. A shard of a new shard count
restores its users from the complete set of snapshots a group of another count left
(``solaris.cache.reshard``: its own files first, unless that set is newer).

History calls run in their own concurrency group of one thread, so they never hold up
lookups and one caller's writes apply in the order they arrive (in practice: Ray does not
promise order for threaded actors; a label that overtakes its impression is kept as its own
event).

Calls that carry several arrays (``put_frame``, the history calls) take one SOLARIS frame
(``solaris.wire``) instead: Ray serialises every numpy argument on its own (~0.1 ms each on 2
cores), one frame costs a copy; and nothing pickled crosses between the processes.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Callable

import ray

from actors import names
from actors.shard_stores import HistorySide, PairSide, Snapshots, open_stores
from solaris.clock import EventClock
from solaris.config import CacheConfig, HistoryConfig
from solaris.durable import every

log = logging.getLogger(__name__)

SHARD_NUM_CPUS = 0.1  # a shard is mostly idle between calls; the 2-core profile packs several
SHARD_MAX_CONCURRENCY = 4  # answer/put/metrics threads; the store itself is behind one lock
HISTORY_GROUP = "history"  # the concurrency group (one thread) of the history calls
# no per-call task events (Ray's task table / timeline): every request makes a call per shard,
# and recording each cost caller, shard and GCS CPU -- Serve's own actors run without them too
RECORD_TASK_EVENTS = False


@ray.remote(num_cpus=SHARD_NUM_CPUS, max_restarts=-1, max_task_retries=0,
            max_concurrency=SHARD_MAX_CONCURRENCY, concurrency_groups={HISTORY_GROUP: 1},
            enable_task_events=RECORD_TASK_EVENTS)
class CacheShard:
    """One shard: a PairStore and a HistoryStore, snapshotted to Parquet, restored on
    (re)start.

    Ray re-runs ``__init__`` after a crash (``max_restarts``): that is where the last snapshot
    is reloaded. Reads are not retried (``max_task_retries=0``): the client reads a failed
    read as misses. Writes are idempotent overwrites and retried a few times.
    """

    def __init__(self, cfg: CacheConfig, shard: int, group_id: str,
                 event_clock: Callable[[], float] | None = None,
                 history_cfg: HistoryConfig | None = None, clock: EventClock | None = None):
        self._shard = shard
        self._group_id = group_id
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        pairs, hist = open_stores(cfg, shard, group_id,
                                  history_cfg if history_cfg is not None else HistoryConfig(),
                                  clock)
        self._pairs = PairSide(pairs)
        self._history = HistorySide(hist, shard)
        self._snapshots = Snapshots(self._pairs, self._history, event_clock)
        if pairs.location is not None or event_clock is not None:
            every(cfg.snapshot_every_s, self._snapshots.maintain, f"cache-shard-{shard}")

    # -- serving path
    def answer(self, query: bytes) -> bytes:
        """Everything one request needs from this shard (``PairStore.answer``); the query and
        the answer travel as ``solaris.cache.wire`` byte strings (one buffer each way)."""
        return self._pairs.answer(query)

    # -- the routers' read replicas (solaris.cache.replica)
    def changes(self, query: bytes) -> bytes:
        """A replica's pull: a ``changes_query`` frame (its epoch and sequence of this shard)
        -> a ``changes`` frame of what it lacks (``PairStore.changes``)."""
        return self._pairs.changes(query)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def after_answers(self, impressions: bytes | None, reads: bytes | None) -> int:
        """A router's after-answer flush to this shard in one call: an ``impressions``
        frame (``record_impressions``) and a ``reads`` frame (its replica's read marks and
        counts: ``PairStore.apply_reads``), either None; returns the events recorded."""
        if reads is not None:
            self._pairs.apply_reads(reads)
        return 0 if impressions is None else self._history.record_impressions(impressions)

    @ray.method(max_task_retries=2)
    def put_frame(self, payload: bytes) -> int:
        """Write pair embeddings of users this shard owns, their arguments in one ``pairs``
        frame (``solaris.wire``); returns the entries written."""
        return self._pairs.put_frame(payload)

    # -- history (DESIGN.md step 6): the router writes, the FM workers read
    @ray.method(concurrency_group=HISTORY_GROUP)
    def record_impressions(self, payload: bytes) -> int:
        """An ``impressions`` frame (``solaris.wire.encode_impressions``) of one or many
        requests' ``(user, items, surfaces, now)`` (a router batches them):
        ``HistoryStore.record_impressions`` of each; returns the events recorded."""
        return self._history.record_impressions(payload)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def record_labels(self, payload: bytes) -> int:
        """A ``labels`` frame of ``(user, items, labels, now)``: ``HistoryStore.record_labels``;
        returns the labels recorded."""
        return self._history.record_labels(payload)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def replay_history(self, payload: bytes) -> int:
        """A ``history_log`` frame of ``(users, items, surfaces, labels, ts)``, a logged
        interaction log in event order: ``HistoryStore.replay_log`` (seeding a cold shard);
        returns the rows."""
        return self._history.replay_log(payload)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def history_window(self, payload: bytes) -> bytes:
        """A ``window_query`` frame of ``(users, now, history_len)`` -> a ``window`` frame of
        ``HistoryStore.window(...)``: the raw history of R requests as of their event times
        (the FM worker builds its inputs)."""
        return self._history.window(payload)

    def ping(self) -> bool:
        """A no-op call: liveness and round-trip time."""
        return True

    def metrics(self) -> dict[str, Any]:
        """The store's metrics plus this shard's snapshot and restart bookkeeping."""
        m = self._pairs.metrics()
        m["history"] = self._history.metrics()
        m.update(shard=self._shard, group=self._group_id, pid=os.getpid(),
                 restarted=self._restarted, **self._snapshots.metrics())
        return m

    # -- snapshots
    def snapshot_now(self) -> dict[str, Any]:
        """Write both snapshots now (pairs and history, changed or not); returns their
        paths, rows (history: events) and seconds."""
        return self._snapshots.now()

    # -- fault injection (tests): explicit points, never timing
    def crash(self) -> None:
        """Kill this worker process at once, as a segfault or OOM kill would."""
        log.warning("shard %d: crash() called, exiting", self._shard)
        os._exit(1)

    def stall(self, seconds: float) -> None:
        """Hold the store lock for ``seconds``: every call behind it is late."""
        with self._pairs.lock:
            time.sleep(seconds)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def stall_history(self, seconds: float) -> None:
        """Hold the history thread for ``seconds``: every history call behind it is late."""
        time.sleep(seconds)


def shard_name(group_id: str, shard: int) -> str:
    """The Ray actor name of one shard; the group id keeps two groups apart."""
    return names.cache_shard(group_id, shard)
