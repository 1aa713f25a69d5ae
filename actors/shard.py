"""The cache-shard actor: one ``solaris.cache.store.PairStore`` behind a lock, snapshotted to
Parquet and restored after a restart.

It owns the lock that makes the store safe under the actor's threads, when to write snapshots
(``solaris.cache.snapshot`` writes them through ``pyarrow.fs``, so a shard restarted on another
node finds them) and the restore after a restart. Requests arrive as ``solaris.cache.wire``
byte strings and leave as one (one buffer each way). ``actors.cache.CacheGroup`` is the client.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np
import pyarrow.fs as pafs
import ray

from solaris.cache import wire
from solaris.cache.snapshot import read_snapshot, snapshot_location, write_snapshot
from solaris.cache.store import PairStore
from solaris.config import CacheConfig

log = logging.getLogger(__name__)

SHARD_NUM_CPUS = 0.1  # a shard is mostly idle between calls; the 2-core profile packs several
SHARD_MAX_CONCURRENCY = 4  # answer/put/metrics threads; the store itself is behind one lock


@ray.remote(num_cpus=SHARD_NUM_CPUS, max_restarts=-1, max_task_retries=0,
            max_concurrency=SHARD_MAX_CONCURRENCY)
class CacheShard:
    """One shard: a PairStore behind a lock, snapshotted to Parquet, restored on (re)start.

    Ray re-runs ``__init__`` after a crash (``max_restarts``): that is where the last snapshot
    is reloaded. Reads are not retried (``max_task_retries=0``): the client reads a failed
    read as misses. Writes are idempotent overwrites and retried a few times.
    """

    def __init__(self, cfg: CacheConfig, shard: int, group_id: str,
                 event_clock: Callable[[], float] | None = None):
        self._cfg = cfg
        self._shard = shard
        self._group_id = group_id
        self._clock = event_clock
        self._lock = threading.Lock()  # the store is not thread-safe; calls run on 4 threads
        self._snap_lock = threading.Lock()  # one snapshot write at a time
        self._changes = 0  # puts and expiries applied; an unchanged store is not re-written
        self._snapshotted_changes = 0
        self._snapshots = 0
        self._snapshot_errors = 0
        self._last_snapshot_s = float("nan")
        self._restored_entries = 0
        # answer calls, thread CPU seconds and wall seconds inside the actor, for queries with
        # the user's part and for neighbour probes only (where a lookup round's time goes)
        self._answer_stats = {"user": [0, 0.0, 0.0], "probe_only": [0, 0.0, 0.0]}
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self._snap: tuple[pafs.FileSystem, str] | None = None
        if cfg.snapshot_uri:
            self._snap = snapshot_location(cfg.snapshot_uri, group_id, shard, cfg.num_shards)
        self._store = self._restore()
        if self._snap is not None or self._clock is not None:
            threading.Thread(target=self._maintain, name=f"cache-shard-{shard}",
                             daemon=True).start()

    def _restore(self) -> PairStore:
        if self._snap is None:
            return PairStore(self._cfg)
        fs, path = self._snap
        try:
            table = read_snapshot(fs, path)
            if table is None:
                return PairStore(self._cfg)
            store = PairStore.restore(self._cfg, table)
        except Exception:  # a corrupt snapshot must not crash-loop the shard: start empty
            log.exception("shard %d: could not restore %s; starting empty", self._shard, path)
            return PairStore(self._cfg)
        self._restored_entries = table.num_rows
        log.info("shard %d: restored %d entries from %s", self._shard, table.num_rows, path)
        return store

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

    @ray.method(max_task_retries=2)
    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float, scores: np.ndarray | None = None) -> int:
        """Write pair embeddings of users this shard owns; returns the entries written."""
        with self._lock:
            n = self._store.put(users, items, vectors, version, now, scores)
            self._changes += 1
            return n

    def ping(self) -> bool:
        """A no-op call: liveness and round-trip time."""
        return True

    def metrics(self) -> dict[str, Any]:
        """The store's metrics plus this shard's snapshot and restart bookkeeping."""
        with self._lock:
            m = dict(self._store.metrics())
            m["answers"] = {k: dict(calls=v[0], cpu_s=v[1], wall_s=v[2])
                            for k, v in self._answer_stats.items()}
        m.update(shard=self._shard, group=self._group_id, pid=os.getpid(),
                 restarted=self._restarted,
                 restored_entries=self._restored_entries, snapshots=self._snapshots,
                 snapshot_errors=self._snapshot_errors, last_snapshot_s=self._last_snapshot_s)
        return m

    # -- snapshots
    def snapshot_now(self) -> dict[str, Any]:
        """Write a snapshot now (whatever changed); returns its path, rows and seconds."""
        if self._snap is None:
            return {"path": None, "rows": 0, "seconds": 0.0}
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        assert self._snap is not None
        fs, path = self._snap
        with self._snap_lock:
            t0 = time.monotonic()
            with self._lock:  # copy out under the lock, write outside it
                table = self._store.snapshot()
                changes = self._changes
            try:
                write_snapshot(fs, path, table)
            except Exception:
                self._snapshot_errors += 1
                raise
            self._snapshotted_changes = changes
            self._snapshots += 1
            self._last_snapshot_s = time.monotonic() - t0
        return {"path": path, "rows": table.num_rows, "seconds": self._last_snapshot_s}

    def _maintain(self) -> None:
        """Every ``snapshot_every_s`` wall seconds: expire by the event clock (if one was
        given; the store also expires on every call's ``now``), then snapshot if changed."""
        while True:
            time.sleep(self._cfg.snapshot_every_s)
            try:
                if self._clock is not None:
                    with self._lock:
                        if self._store.expire(self._clock()):
                            self._changes += 1
                if self._snap is not None and self._changes != self._snapshotted_changes:
                    self._snapshot()
            except Exception:
                log.exception("shard %d: background expiry or snapshot failed", self._shard)

    # -- fault injection (tests): explicit points, never timing
    def crash(self) -> None:
        """Kill this worker process at once, as a segfault or OOM kill would."""
        log.warning("shard %d: crash() called, exiting", self._shard)
        os._exit(1)

    def stall(self, seconds: float) -> None:
        """Hold the store lock for ``seconds``: every call behind it is late."""
        with self._lock:
            time.sleep(seconds)


def shard_name(group_id: str, shard: int) -> str:
    """The Ray actor name of one shard; the group id keeps two groups apart."""
    return f"solaris-cache-{group_id}-{shard}"
