"""The client of the behaviour history the cache shards hold (``actors.shard``), part of the
cache group's client (``actors.cache.CacheGroup.history``).

Each shard holds the history of the users it owns. The router writes it fire-and-forget
(``record_impressions``, ``record_labels``: one call to the owning shard, never waited on; a
failed write is logged and counted by the ``WriteTracker``, found when it next reaps its
finished writes or in ``flush``); the FM workers read it with ``window``, one parallel round
to the owning shards per lease; a cold start or a replay seeds it with ``replay_log``.

Ray is not initialised here: callers call ``ray.init`` (or run inside a Ray job / Serve app).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
import ray
from ray.exceptions import RayActorError, RayError

from actors.fanout import RoundCounts, ShardSet, collect
from solaris import wire as frames
from solaris.cache.inputs import check_ids, check_time, check_user
from solaris.errors import RequestError, SolarisError
from solaris.history import WINDOW_KEYS, merge_windows

log = logging.getLogger(__name__)

REAP_EVERY = 64  # fire-and-forget writes between checks of the finished ones
MAX_TRACKED = 4096  # outstanding writes tracked; past it the oldest are no longer checked


class HistoryUnavailable(SolarisError):
    """A shard did not return its users' history in time (dead, restarting or late): the
    FM worker gives its lease back rather than compute embeddings from a missing history."""


class WriteTracker:
    """Fire-and-forget calls to a group's shards: the refs not yet seen finished, and what
    became of them (sent, failed, no longer tracked). A pickled copy starts its own
    bookkeeping."""

    def __init__(self, shard_set: ShardSet) -> None:
        self._set = shard_set
        self._lock = threading.Lock()
        self._pending: deque = deque()  # (shard, ref) of writes not yet seen finished
        self._records = {"sent": 0, "failed": 0, "untracked": 0}
        self._failed = np.zeros(shard_set.cfg.num_shards, np.int64)

    def __getstate__(self) -> dict[str, Any]:
        return {"shard_set": self._set}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["shard_set"])

    def send(self, s: int, method: str, *frames_: Any) -> None:
        """A fire-and-forget call of ``method`` on shard ``s`` (tracked as a history write:
        ``reap`` waits for it, a failure is counted)."""
        try:
            ref = getattr(self._set.handles[s], method).remote(*frames_)
        except Exception as exc:  # e.g. a handle of a shard killed for good
            log.warning("cache shard %d: %s not sent: %s", s, method, type(exc).__name__)
            with self._lock:
                self._records["sent"] += 1
                self._records["failed"] += 1
                self._failed[s] += 1
            return
        with self._lock:
            self._records["sent"] += 1
            self._pending.append((s, ref))
            due = len(self._pending) % REAP_EVERY == 0 or len(self._pending) > MAX_TRACKED
        if due:
            self.reap(0.0)

    def reap(self, timeout_s: float) -> int:
        """Check finished writes (waiting up to ``timeout_s`` for the outstanding ones);
        count and log the failed; returns how many are still outstanding."""
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
        if not pending:
            return 0
        refs = [r for _, r in pending]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout_s))
        done_set = set(done)
        left, failed = [], []
        for s, r in pending:
            if r not in done_set:
                left.append((s, r))
                continue
            try:
                ray.get(r, timeout=0)
            except RayError as exc:
                failed.append((s, exc))
        for s, exc in failed:
            level = logging.DEBUG if isinstance(exc, RayActorError) else logging.WARNING
            log.log(level, "cache shard %d: history write failed: %s", s, type(exc).__name__)
        with self._lock:
            for s, _ in failed:
                self._records["failed"] += 1
                self._failed[s] += 1
            if len(left) > MAX_TRACKED:  # a stuck shard: stop tracking the oldest
                self._records["untracked"] += len(left) - MAX_TRACKED
                left = left[-MAX_TRACKED:]
            self._pending.extendleft(reversed(left))
            return len(self._pending)

    def counts(self) -> dict[str, Any]:
        """The writes sent, failed and no longer tracked, those pending, failed by shard."""
        with self._lock:
            return {**self._records, "pending": len(self._pending),
                    "failed_by_shard": self._failed.tolist()}


def _check_surfaces(surfaces: Any, items: np.ndarray) -> np.ndarray:
    """A surface code, or one per item (RequestError naming the shape otherwise)."""
    surf = np.asarray(surfaces)
    if surf.ndim > 1 or (surf.ndim == 1 and len(surf) != len(items)):
        raise RequestError(f"surfaces: expected a code or {len(items)} codes, got shape "
                           f"{surf.shape}")
    return surf


class HistoryClient:
    """The shards' histories: fire-and-forget writes, one-round reads, a seeding."""

    def __init__(self, shard_set: ShardSet, rounds: RoundCounts, writes: WriteTracker) -> None:
        self._set = shard_set
        self._rounds = rounds  # late and failed reads count with the lookups' answers
        self._writes = writes

    # -- fire-and-forget writes (the router)
    def record_impressions(self, user: int, items: np.ndarray, surfaces: np.ndarray | int,
                           now: float) -> None:
        """Candidates shown to ``user`` at event time ``now``, to the user's shard's history.

        One call to the owning shard, not waited on. Raises RequestError for a bad request
        (checked here); a dead or failing shard is logged and counted, never raised.
        """
        user = check_user(user)
        items = check_ids(items, "items")
        now = check_time(now)
        surf = _check_surfaces(surfaces, items)
        self._send(user, "record_impressions",
                   frames.encode_impressions([(user, items, surf, now)]))

    def record_labels(self, user: int, items: np.ndarray, labels: np.ndarray,
                      now: float) -> None:
        """Labels (n, T) of 0/1 for ``user``'s ``items``, arriving at event time ``now``;
        fire-and-forget like ``record_impressions``."""
        user = check_user(user)
        items = check_ids(items, "items")
        now = check_time(now)
        y = np.asarray(labels)
        if y.ndim != 2 or y.shape[0] != len(items) or not np.isin(y, (0, 1)).all():
            raise RequestError(f"labels: expected ({len(items)}, T) of 0/1, got shape "
                               f"{y.shape}")
        self._send(user, "record_labels", frames.encode("labels", (user, items, y, now)))

    def record_impressions_many(self, records: Sequence[tuple[int, np.ndarray, Any, float]]
                                ) -> None:
        """``record_impressions`` of many requests ``(user, items, surfaces, now)`` (e.g. a
        router's last few milliseconds), one call per shard involved; not waited on."""
        for s, recs in self.impressions_by_shard(records).items():
            self._writes.send(s, "record_impressions", frames.encode_impressions(recs))

    def impressions_by_shard(self, records: Sequence[tuple[int, np.ndarray, Any, float]]
                             ) -> dict[int, list]:
        """Requests' impressions ``(user, items, surfaces, now)``, checked (RequestError
        naming a bad field) and grouped by the shard that owns each user."""
        by_shard: dict[int, list] = {}
        if not records:
            return by_shard
        users = np.array([check_user(r[0]) for r in records], np.int64)
        for rec, s in zip(records, self._set.shard_of(users).tolist()):
            user, items, surfaces, now = rec
            items = check_ids(items, "items")
            surf = _check_surfaces(surfaces, items)
            by_shard.setdefault(int(s), []).append((int(user), items, surf, check_time(now)))
        return by_shard

    def _send(self, user: int, method: str, frame: bytes) -> None:
        self._writes.send(int(self._set.shard_of(np.array([user]))[0]), method, frame)

    # -- one-round reads (the FM workers) and a seeding (cold start, replay)
    def window(self, users: np.ndarray, now: np.ndarray, history_len: int,
               timeout_s: float = 30.0) -> dict[str, np.ndarray]:
        """The raw history windows (``HistoryStore.window``) of R requests as of their event
        times, from one parallel round to the shards that own the users.

        Raises HistoryUnavailable when a shard involved fails or misses ``timeout_s``:
        embeddings computed from a missing history would be wrong, not just absent.
        """
        return self.window_start(users, now, history_len, timeout_s)()

    def window_start(self, users: np.ndarray, now: np.ndarray, history_len: int,
                     timeout_s: float = 30.0) -> Callable[[], dict[str, np.ndarray]]:
        """``window`` in two halves: the calls go out now, the returned function waits for
        them (until ``timeout_s`` after this call) and merges -- so a worker can read the
        next lease's histories while it computes the current one."""
        users = check_ids(users, "users")
        now = np.asarray(now, np.float64)
        if now.shape != users.shape:
            raise RequestError(f"now: expected {len(users)} event times, got shape {now.shape}")
        deadline = time.monotonic() + timeout_s
        rows = self._set.rows_by_shard(users)
        refs = self._set.fan_out(rows, lambda h, r: h.history_window.remote(
            frames.encode("window_query", (users[r], now[r], history_len))))

        def result() -> dict[str, np.ndarray]:
            got, late, failed = collect(refs, deadline)
            if late or failed:
                self._rounds.add(late, list(failed), lookup=False)
                raise HistoryUnavailable(
                    f"history of shards {sorted([*late, *failed])} of group "
                    f"{self._set.group_id} unavailable (late: {late}, failed: "
                    f"{ {s: type(e).__name__ for s, e in failed.items()} })")
            parts = [(rows[s], frames.decode_window(got[s], WINDOW_KEYS)) for s in rows]
            return merge_windows(parts, len(users), history_len)
        return result

    def replay_log(self, users: np.ndarray, items: np.ndarray, surfaces: np.ndarray,
                   labels: np.ndarray, ts: np.ndarray, timeout_s: float = 300.0) -> int:
        """Seed the shards' histories from a logged interaction log (event order; one
        request per (user, ts)), one call per shard; returns the rows recorded. For a cold
        start or a replay; a shard that fails loses its part (logged)."""
        users = check_ids(users, "users")
        items = check_ids(items, "items")
        surfaces, labels, ts = np.asarray(surfaces), np.asarray(labels), np.asarray(ts)
        if not (len(items) == len(surfaces) == len(labels) == len(ts) == len(users)):
            raise RequestError(f"replay_log: users ({len(users)}), items ({len(items)}), "
                               f"surfaces ({len(surfaces)}), labels ({len(labels)}) and ts "
                               f"({len(ts)}) differ in length")
        refs = self._set.fan_out(self._set.rows_by_shard(users),
                                 lambda h, m: h.replay_history.remote(frames.encode(
                                     "history_log",
                                     (users[m], items[m], surfaces[m], labels[m], ts[m]))))
        return sum(self._set.gather(refs, timeout_s, "replay_history", 0).values())
