"""The cache-shard actor: one ``solaris.cache.store.PairStore`` and one
``solaris.history.HistoryStore`` for the users the shard owns, each behind its own lock,
snapshotted to Parquet and restored after a restart.

It owns the locks that make the stores safe under the actor's threads, when to write snapshots
(``solaris.cache.snapshot`` writes them through ``pyarrow.fs``, so a shard restarted on another
node finds them) and the restore after a restart. Lookups arrive as ``solaris.cache.wire``
byte strings and leave as one (one buffer each way). ``actors.cache.CacheGroup`` is the client.

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

import numpy as np
import ray

from actors import names
from solaris import wire as frames
from solaris.cache import replica as _replica
from solaris.cache import wire
from solaris.cache import reshard
from solaris.cache.ring import HashRing
from solaris.cache.snapshot import history_location, snapshot_location
from solaris.cache.store import PairStore
from solaris.clock import EventClock
from solaris.config import CacheConfig, HistoryConfig
from solaris.errors import RequestError
from solaris.durable import Durable, every
from solaris.history import WINDOW_KEYS, HistoryStore

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
        self._cfg = cfg
        self._history_cfg = history_cfg if history_cfg is not None else HistoryConfig()
        self._shard = shard
        self._group_id = group_id
        self._clock = event_clock
        # answer calls, thread CPU seconds and wall seconds inside the actor, for queries with
        # the user's part and for neighbour probes only (where a lookup round's time goes)
        self._answer_stats = {"user": [0, 0.0, 0.0], "probe_only": [0, 0.0, 0.0]}
        self._export_stats = [0, 0.0, 0]  # replica pulls: calls, thread CPU s, bytes sent
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        snap = (snapshot_location(cfg.snapshot_uri, group_id, shard, cfg.num_shards)
                if cfg.snapshot_uri else None)
        hcfg = self._history_cfg
        # a set of snapshots of another shard count to re-split (None: this shard's own)
        old = None if snap is None else reshard.plan(snap[0], snap[1], shard, cfg.num_shards)
        load_pairs = load_history = None
        if old is not None:
            ring, what = HashRing.from_config(cfg), f"the {old.num_shards}-shard snapshots"
            load_pairs = (what, lambda: reshard.split_pairs(
                reshard.read_tables(snap[0], old.pairs), ring, shard))
            load_history = (what, lambda: reshard.split_history(
                reshard.read_tables(snap[0], old.history), ring, shard))

        def restore_history(table: Any) -> HistoryStore:
            store = HistoryStore(hcfg, clock)
            store.restore(table)
            return store

        # the pair store and the history, each behind its own lock (calls run on 4 threads);
        # each checks its event times against ``clock`` (solaris/clock.py)
        self._pairs = Durable(f"shard {shard} pairs", snap, lambda: PairStore(cfg, clock),
                              lambda t: PairStore.restore(cfg, t, clock), lambda st: st.snapshot(),
                              load_pairs)
        self._hist = Durable(f"shard {shard} history",
                             None if snap is None else (snap[0], history_location(snap[1])),
                             lambda: HistoryStore(hcfg, clock), restore_history,
                             lambda st: st.snapshot(), load_history)
        for d in (self._pairs, self._hist):
            if d.location is not None and d.source is None and not d.restore_failed:
                d.touch()  # nothing to restore: leave a file, so the group's set is complete
        self._lock, self._store = self._pairs.lock, self._pairs.state
        self._hist_lock, self._history = self._hist.lock, self._hist.state
        self._last_snapshot_s = float("nan")
        if snap is not None or self._clock is not None:
            every(cfg.snapshot_every_s, self._maintain, f"cache-shard-{shard}")

    # -- serving path
    def answer(self, query: bytes) -> bytes:
        """Everything one request needs from this shard (``PairStore.answer``); the query and
        the answer travel as ``solaris.cache.wire`` byte strings (one buffer each way)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        q = wire.decode_query(query)
        with self._lock:
            out = wire.encode_answer(self._store.answer(q))
            stats = self._answer_stats["user" if q.user >= 0 else "probe_only"]
            stats[0] += 1
            stats[1] += time.thread_time() - c0
            stats[2] += time.perf_counter() - t0
        return out

    # -- the routers' read replicas (solaris.cache.replica)
    def changes(self, query: bytes) -> bytes:
        """A replica's pull: a ``changes_query`` frame (its epoch and sequence of this shard)
        -> a ``changes`` frame of what it lacks (``PairStore.changes``)."""
        epoch, seq = _replica.decode_changes_query(query)
        c0 = time.thread_time()
        with self._lock:
            out = _replica.encode_changes(*self._store.changes(epoch, seq))
            self._export_stats[0] += 1
            self._export_stats[1] += time.thread_time() - c0
            self._export_stats[2] += len(out)
        return out

    @ray.method(concurrency_group=HISTORY_GROUP)
    def after_answers(self, impressions: bytes | None, reads: bytes | None) -> int:
        """A router's after-answer flush to this shard in one call: an ``impressions``
        frame (``record_impressions``) and a ``reads`` frame (its replica's read marks and
        counts: ``PairStore.apply_reads``), either None; returns the events recorded."""
        done = 0
        if reads is not None:
            users, items, names, vix, written, counts, max_now = _replica.decode_reads(reads)
            with self._lock:
                self._store.apply_reads(users, items, names, vix, written, counts, max_now)
        if impressions is not None:
            done = self._record_impressions(frames.decode_impressions(impressions))
        return done

    @ray.method(max_task_retries=2)
    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float | np.ndarray, scores: np.ndarray | None = None) -> int:
        """Write pair embeddings of users this shard owns; returns the entries written."""
        with self._lock:
            n = self._store.put(users, items, vectors, version, now, scores)
            self._pairs.touch()
            return n

    @ray.method(max_task_retries=2)
    def put_frame(self, payload: bytes) -> int:
        """``put`` with its arguments in one ``pairs`` frame (``solaris.wire``)."""
        users, items, vectors, version, now, scores = frames.decode(payload, "pairs", 6)
        return self.put(users, items, vectors, version, now, scores)

    # -- history (DESIGN.md step 6): the router writes, the FM workers read
    @ray.method(concurrency_group=HISTORY_GROUP)
    def record_impressions(self, payload: bytes) -> int:
        """An ``impressions`` frame (``solaris.wire.encode_impressions``) of one or many
        requests' ``(user, items, surfaces, now)`` (a router batches them):
        ``HistoryStore.record_impressions`` of each; returns the events recorded."""
        return self._record_impressions(frames.decode_impressions(payload))

    def _record_impressions(self, records: list) -> int:
        """Each record on its own: one refused (a time too far ahead, a bad id) is logged and
        counted by the store, and the batch's other requests are still recorded."""
        done = 0
        with self._hist_lock:
            for user, items, surfaces, now in records:
                try:
                    self._history.record_impressions(user, items, surfaces, now)
                    done += len(items)
                except RequestError as e:
                    log.warning("shard %d: impressions of user %s refused: %s", self._shard,
                                user, e)
            self._hist.touch()
        return done

    @ray.method(concurrency_group=HISTORY_GROUP)
    def record_labels(self, payload: bytes) -> int:
        """A ``labels`` frame of ``(user, items, labels, now)``: ``HistoryStore.record_labels``;
        returns the labels recorded."""
        user, items, labels, now = frames.decode(payload, "labels", 4)
        with self._hist_lock:
            self._history.record_labels(user, items, labels, now)
            self._hist.touch()
        return len(items)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def replay_history(self, payload: bytes) -> int:
        """A ``history_log`` frame of ``(users, items, surfaces, labels, ts)``, a logged
        interaction log in event order: ``HistoryStore.replay_log`` (seeding a cold shard);
        returns the rows."""
        users, items, surfaces, labels, ts = frames.decode(payload, "history_log", 5)
        with self._hist_lock:
            self._history.replay_log(users, items, surfaces, labels, ts)
            self._hist.touch()
        return len(users)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def history_window(self, payload: bytes) -> bytes:
        """A ``window_query`` frame of ``(users, now, history_len)`` -> a ``window`` frame of
        ``HistoryStore.window(...)``: the raw history of R requests as of their event times
        (the FM worker builds its inputs)."""
        users, now, history_len = frames.decode(payload, "window_query", 3)
        with self._hist_lock:
            window = self._history.window(users, now, history_len)
        return frames.encode_window(window, WINDOW_KEYS)

    def ping(self) -> bool:
        """A no-op call: liveness and round-trip time."""
        return True

    def metrics(self) -> dict[str, Any]:
        """The store's metrics plus this shard's snapshot and restart bookkeeping."""
        with self._lock:
            m = dict(self._store.metrics())
            m["answers"] = {k: dict(calls=v[0], cpu_s=v[1], wall_s=v[2])
                            for k, v in self._answer_stats.items()}
            c, cpu, nbytes = self._export_stats
            m["replica_pulls"] = {"calls": c, "cpu_s": cpu, "bytes": nbytes}
            if self._store.journal is not None:
                j = self._store.journal
                m["journal"] = {"seq": j.seq, "kept": j.seq - j.low, "bytes": j.nbytes}
        with self._hist_lock:
            m["history"] = self._history.metrics()
        m.update(shard=self._shard, group=self._group_id, pid=os.getpid(),
                 restarted=self._restarted, restored_entries=self._pairs.restored,
                 restored_from=self._pairs.source,  # a path, another count's set, or None
                 restored_events=self._hist.restored, snapshots=self._pairs.snapshots,
                 history_snapshots=self._hist.snapshots,
                 snapshot_errors=self._pairs.errors + self._hist.errors,
                 last_snapshot_s=self._last_snapshot_s)
        return m

    # -- snapshots
    def snapshot_now(self) -> dict[str, Any]:
        """Write both snapshots now (pairs and history, changed or not); returns their
        paths, rows (history: events) and seconds."""
        if self._pairs.location is None:
            return {"path": None, "rows": 0, "history_path": None, "history_rows": 0,
                    "seconds": 0.0}
        return self._snapshot(force=True)

    def _snapshot(self, force: bool = False) -> dict[str, Any]:
        t0 = time.monotonic()
        rows = self._pairs.snapshot(force)
        history_rows = self._hist.snapshot(force)
        if rows is not None or history_rows is not None:
            self._last_snapshot_s = time.monotonic() - t0
        return {"path": self._pairs.location[1], "rows": rows,
                "history_path": self._hist.location[1], "history_rows": history_rows,
                "seconds": self._last_snapshot_s}

    def _maintain(self) -> None:
        """Every ``snapshot_every_s`` wall seconds: expire by the event clock (if one was
        given; the store also expires on every call's ``now``), then snapshot what changed
        (pairs, history or both)."""
        if self._clock is not None:
            with self._lock:
                if self._store.expire(self._clock()):
                    self._pairs.touch()
        if self._pairs.location is not None:
            self._snapshot()

    # -- fault injection (tests): explicit points, never timing
    def crash(self) -> None:
        """Kill this worker process at once, as a segfault or OOM kill would."""
        log.warning("shard %d: crash() called, exiting", self._shard)
        os._exit(1)

    def stall(self, seconds: float) -> None:
        """Hold the store lock for ``seconds``: every call behind it is late."""
        with self._lock:
            time.sleep(seconds)

    @ray.method(concurrency_group=HISTORY_GROUP)
    def stall_history(self, seconds: float) -> None:
        """Hold the history thread for ``seconds``: every history call behind it is late."""
        time.sleep(seconds)


def shard_name(group_id: str, shard: int) -> str:
    """The Ray actor name of one shard; the group id keeps two groups apart."""
    return names.cache_shard(group_id, shard)
