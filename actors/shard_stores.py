"""What a cache shard (``actors.shard.CacheShard``) holds, one part per store: the pair store
and the history store, each behind its own lock (the actor runs calls on several threads),
and their snapshots.

``open_stores`` makes both durable stores of one shard: restored from the shard's own
snapshots, or re-split from the complete set a group of another shard count left
(``solaris.cache.reshard``), or new (then an empty file is written at once, so every shard of
a running group leaves one). ``PairSide`` answers lookups, a read replica's pulls and reads,
and writes; ``HistorySide`` records and reads the users' behaviour; ``Snapshots`` writes both
on the shard's timer or on demand. Calls arrive and leave as ``solaris.cache.wire`` byte
strings or SOLARIS frames (``solaris.wire``): nothing here is pickled between processes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from solaris import wire as frames
from solaris.cache import replica as _replica
from solaris.cache import reshard
from solaris.cache import wire
from solaris.cache.ring import HashRing
from solaris.cache.snapshot import history_location, snapshot_location
from solaris.cache.store import PairStore
from solaris.clock import EventClock
from solaris.config import CacheConfig, HistoryConfig
from solaris.durable import Durable
from solaris.errors import RequestError
from solaris.history import WINDOW_KEYS, HistoryStore

log = logging.getLogger(__name__)


def open_stores(cfg: CacheConfig, shard: int, group_id: str, history_cfg: HistoryConfig,
                clock: EventClock | None) -> tuple[Durable, Durable]:
    """Shard ``shard``'s pair store and history store, each a ``Durable`` behind its own
    lock, each checking its event times against ``clock`` (``solaris/clock.py``)."""
    snap = (snapshot_location(cfg.snapshot_uri, group_id, shard, cfg.num_shards)
            if cfg.snapshot_uri else None)
    hcfg = history_cfg
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

    pairs = Durable(f"shard {shard} pairs", snap, lambda: PairStore(cfg, clock),
                    lambda t: PairStore.restore(cfg, t, clock), lambda st: st.snapshot(),
                    load_pairs)
    hist = Durable(f"shard {shard} history",
                   None if snap is None else (snap[0], history_location(snap[1])),
                   lambda: HistoryStore(hcfg, clock), restore_history,
                   lambda st: st.snapshot(), load_history)
    for d in (pairs, hist):
        if d.location is not None and d.source is None and not d.restore_failed:
            d.touch()  # nothing to restore: leave a file, so the group's set is complete
    return pairs, hist


class PairSide:
    """The shard's ``PairStore`` behind its lock: lookups, a replica's pulls and reads, writes,
    expiry; with the CPU and wall seconds its answers and pulls took."""

    def __init__(self, durable: Durable) -> None:
        self.durable = durable
        self.lock, self.store = durable.lock, durable.state
        # answer calls, thread CPU seconds and wall seconds inside the actor, for queries with
        # the user's part and for neighbour probes only (where a lookup round's time goes)
        self._answer_stats = {"user": [0, 0.0, 0.0], "probe_only": [0, 0.0, 0.0]}
        self._export_stats = [0, 0.0, 0]  # replica pulls: calls, thread CPU s, bytes sent

    def answer(self, query: bytes) -> bytes:
        """Everything one request needs from this shard (``PairStore.answer``), as
        ``solaris.cache.wire`` byte strings."""
        t0, c0 = time.perf_counter(), time.thread_time()
        q = wire.decode_query(query)
        with self.lock:
            out = wire.encode_answer(self.store.answer(q))
            stats = self._answer_stats["user" if q.user >= 0 else "probe_only"]
            stats[0] += 1
            stats[1] += time.thread_time() - c0
            stats[2] += time.perf_counter() - t0
        return out

    def changes(self, query: bytes) -> bytes:
        """A replica's pull: a ``changes_query`` frame -> a ``changes`` frame of what it
        lacks (``PairStore.changes``)."""
        epoch, seq = _replica.decode_changes_query(query)
        c0 = time.thread_time()
        with self.lock:
            out = _replica.encode_changes(*self.store.changes(epoch, seq))
            self._export_stats[0] += 1
            self._export_stats[1] += time.thread_time() - c0
            self._export_stats[2] += len(out)
        return out

    def apply_reads(self, reads: bytes) -> None:
        """A ``reads`` frame of a replica's read marks and counts (``PairStore.apply_reads``)."""
        users, items, names, vix, written, counts, max_now = _replica.decode_reads(reads)
        with self.lock:
            self.store.apply_reads(users, items, names, vix, written, counts, max_now)

    def put_frame(self, payload: bytes) -> int:
        """A ``pairs`` frame of ``(users, items, vectors, version, now, scores)`` of users
        this shard owns (``PairStore.put``); returns the entries written."""
        users, items, vectors, version, now, scores = frames.decode(payload, "pairs", 6)
        with self.lock:
            n = self.store.put(users, items, vectors, version, now, scores)
            self.durable.touch()
            return n

    def expire(self, now: float) -> None:
        """Expire by event time ``now`` (``PairStore.expire``)."""
        with self.lock:
            if self.store.expire(now):
                self.durable.touch()

    def metrics(self) -> dict[str, Any]:
        """The store's metrics, the answers' and pulls' counts and seconds, the journal."""
        with self.lock:
            m = dict(self.store.metrics())
            m["answers"] = {k: dict(calls=v[0], cpu_s=v[1], wall_s=v[2])
                            for k, v in self._answer_stats.items()}
            c, cpu, nbytes = self._export_stats
            m["replica_pulls"] = {"calls": c, "cpu_s": cpu, "bytes": nbytes}
            if self.store.journal is not None:
                j = self.store.journal
                m["journal"] = {"seq": j.seq, "kept": j.seq - j.low, "bytes": j.nbytes}
        return m


class HistorySide:
    """The shard's ``HistoryStore`` behind its lock: the router's writes, the FM workers'
    reads, a seeding from a log."""

    def __init__(self, durable: Durable, shard: int) -> None:
        self.durable = durable
        self.lock, self.store = durable.lock, durable.state
        self._shard = shard

    def record_impressions(self, payload: bytes) -> int:
        """An ``impressions`` frame of one or many requests' ``(user, items, surfaces,
        now)``; each on its own: one refused (a time too far ahead, a bad id) is logged and
        counted by the store, and the batch's other requests are still recorded. Returns the
        events recorded."""
        done = 0
        with self.lock:
            for user, items, surfaces, now in frames.decode_impressions(payload):
                try:
                    self.store.record_impressions(user, items, surfaces, now)
                    done += len(items)
                except RequestError as e:
                    log.warning("shard %d: impressions of user %s refused: %s", self._shard,
                                user, e)
            self.durable.touch()
        return done

    def record_labels(self, payload: bytes) -> int:
        """A ``labels`` frame of ``(user, items, labels, now)``: ``HistoryStore.record_labels``;
        returns the labels recorded."""
        user, items, labels, now = frames.decode(payload, "labels", 4)
        with self.lock:
            self.store.record_labels(user, items, labels, now)
            self.durable.touch()
        return len(items)

    def replay_log(self, payload: bytes) -> int:
        """A ``history_log`` frame of ``(users, items, surfaces, labels, ts)`` in event order:
        ``HistoryStore.replay_log``; returns the rows."""
        users, items, surfaces, labels, ts = frames.decode(payload, "history_log", 5)
        with self.lock:
            self.store.replay_log(users, items, surfaces, labels, ts)
            self.durable.touch()
        return len(users)

    def window(self, payload: bytes) -> bytes:
        """A ``window_query`` frame of ``(users, now, history_len)`` -> a ``window`` frame of
        ``HistoryStore.window(...)``."""
        users, now, history_len = frames.decode(payload, "window_query", 3)
        with self.lock:
            window = self.store.window(users, now, history_len)
        return frames.encode_window(window, WINDOW_KEYS)

    def metrics(self) -> dict[str, Any]:
        """``HistoryStore.metrics``."""
        with self.lock:
            return self.store.metrics()


class Snapshots:
    """Both stores' snapshots: on the shard's timer (what changed, after expiring by the
    event clock) or at once (both, changed or not)."""

    def __init__(self, pairs: PairSide, history: HistorySide,
                 event_clock: Callable[[], float] | None) -> None:
        self._pairs, self._hist = pairs.durable, history.durable
        self._pair_side = pairs
        self._clock = event_clock
        self.last_s = float("nan")  # seconds the last snapshot that wrote anything took

    def now(self) -> dict[str, Any]:
        """Write both snapshots now (pairs and history, changed or not); returns their
        paths, rows (history: events) and seconds."""
        if self._pairs.location is None:
            return {"path": None, "rows": 0, "history_path": None, "history_rows": 0,
                    "seconds": 0.0}
        return self._write(force=True)

    def _write(self, force: bool = False) -> dict[str, Any]:
        t0 = time.monotonic()
        rows = self._pairs.snapshot(force)
        history_rows = self._hist.snapshot(force)
        if rows is not None or history_rows is not None:
            self.last_s = time.monotonic() - t0
        return {"path": self._pairs.location[1], "rows": rows,
                "history_path": self._hist.location[1], "history_rows": history_rows,
                "seconds": self.last_s}

    def maintain(self) -> None:
        """Every ``snapshot_every_s`` wall seconds: expire by the event clock (if one was
        given; the store also expires on every call's ``now``), then snapshot what changed
        (pairs, history or both)."""
        if self._clock is not None:
            self._pair_side.expire(self._clock())
        if self._pairs.location is not None:
            self._write()

    def metrics(self) -> dict[str, Any]:
        """What was restored, the snapshots written, their errors, the last one's seconds."""
        p, h = self._pairs, self._hist
        return {"restored_entries": p.restored,
                "restored_from": p.source,  # a path, another count's set, or None
                "restored_events": h.restored, "snapshots": p.snapshots,
                "history_snapshots": h.snapshots, "snapshot_errors": p.errors + h.errors,
                "last_snapshot_s": self.last_s}
