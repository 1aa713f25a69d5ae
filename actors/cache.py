"""The client of a group of cache shards (``actors.shard.CacheShard``): one round per request.

``CacheGroup`` lives in the caller's process (the router): it creates or attaches to the named
shards, places users on them with the consistent-hash ring, and turns ``solaris.online.enrich``'s plan
into one parallel round of ``answer`` calls with a deadline (DESIGN.md, "One round of remote
calls per request"); a query and its answer each cross as one ``solaris.cache.wire`` byte
string. A shard that is dead, restarting, failing or late reads as misses; the caller never
sees an exception or waits past the deadline. The in-process equivalent of
``CacheGroup.lookup`` is ``solaris.online.enrich.enrich_local`` on one store: both give the same
``Slots``, bit for bit.

Each shard also holds the behaviour history of the users it owns (``actors.shard``). The
router writes it fire-and-forget (``record_impressions``, ``record_labels``: one call to the
owning shard, never waited on; a failed write is logged and counted, found when the client
next reaps its finished writes or in ``flush_records``); the FM workers read it with
``history_window``, one parallel round to the owning shards per lease.

Ray is not initialised here: callers call ``ray.init`` (or run inside a Ray job / Serve app).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from actors.shard import SHARD_NUM_CPUS, CacheShard, shard_name
from solaris.online import enrich
from solaris import wire as frames
from solaris.cache import wire
from solaris.cache.inputs import check_ids, check_time, check_user
from solaris.cache.query import ShardAnswer, ShardQuery, Slots
from solaris.cache.ring import HashRing
from solaris.clock import EventClock
from solaris.config import CacheConfig, EnrichConfig, HistoryConfig
from solaris.errors import ConfigError, RequestError, SolarisError
from solaris.knn.neighbours import NeighbourTable
from solaris.history import WINDOW_KEYS, merge_windows

log = logging.getLogger(__name__)

__all__ = ["CacheGroup", "CacheShard", "HistoryUnavailable", "collect", "shard_name"]

REAP_EVERY = 64  # fire-and-forget writes between checks of the finished ones
MAX_TRACKED = 4096  # outstanding writes tracked; past it the oldest are no longer checked


class _Round(NamedTuple):
    """A lookup round in flight: its plan, each shard's query and answer ref, the deadline
    (a ``time.monotonic()`` instant) and the monotonic times it started, was planned and was
    sent."""

    plan: Any
    queries: dict[int, ShardQuery]
    refs: dict[int, Any]
    deadline: float
    times: tuple[float, float, float]


class HistoryUnavailable(SolarisError):
    """A shard did not return its users' history in time (dead, restarting or late): the
    FM worker gives its lease back rather than compute embeddings from a missing history."""


class CacheGroup:
    """The router's view of a group of cache shards: handles, the ring, one-round lookups.

    Picklable (handles and the ring travel), so a Serve deployment can receive one.
    """

    def __init__(self, cfg: CacheConfig, handles: Sequence[Any], group_id: str):
        if len(handles) != cfg.num_shards:
            raise ConfigError(f"cache.num_shards={cfg.num_shards}: got {len(handles)} shard "
                              "handles")
        self.cfg = cfg
        self.group_id = group_id
        self.shards = list(handles)
        self.ring = HashRing.from_config(cfg)
        self._counts_lock = threading.Lock()
        self._late = np.zeros(cfg.num_shards, np.int64)  # answers past the deadline
        self._failed = np.zeros(cfg.num_shards, np.int64)  # answers that raised (dead shard)
        self._lookups = 0
        self._init_records()

    def _init_records(self) -> None:
        """Fire-and-forget history writes: outstanding refs and what became of them."""
        self._pending: deque = deque()  # (shard, ref) of writes not yet seen finished
        self._records = {"sent": 0, "failed": 0, "untracked": 0}
        self._record_failed = np.zeros(self.cfg.num_shards, np.int64)

    @classmethod
    def create(cls, cfg: CacheConfig, group_id: str | None = None, *,
               num_cpus: float = SHARD_NUM_CPUS, max_restarts: int = -1,
               namespace: str | None = None, detached: bool = False,
               event_clock: Callable[[], float] | None = None,
               history: HistoryConfig | None = None,
               clock: EventClock | None = None,
               actor_options: dict[str, Any] | None = None) -> "CacheGroup":
        """Start (or attach to, if they already run) the ``cfg.num_shards`` named shards.

        ``event_clock`` (e.g. ``time.time`` in production, None in a replay) lets an idle
        shard expire entries between calls; it must be picklable. ``history`` bounds each
        shard's history store (default ``HistoryConfig()``). ``clock`` is what each store
        checks event times against (``solaris.clock.event_clock`` of the app's profile;
        None: any time). ``actor_options`` (placement:
        e.g. ``{"resources": {"shard_host": 0.5}, "scheduling_strategy": "SPREAD"}``) go to
        each shard's ``.options``, over the defaults; a restarted shard keeps them.
        """
        group_id = group_id or uuid.uuid4().hex[:8]
        opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": max_restarts,
                                "get_if_exists": True}
        if namespace is not None:
            opts["namespace"] = namespace
        if detached:
            opts["lifetime"] = "detached"
        opts.update(actor_options or {})
        handles = [CacheShard.options(name=shard_name(group_id, s), **opts)
                   .remote(cfg, s, group_id, event_clock, history, clock)
                   for s in range(cfg.num_shards)]
        return cls(cfg, handles, group_id)

    @classmethod
    def connect(cls, cfg: CacheConfig, group_id: str, namespace: str | None = None) -> "CacheGroup":
        """Attach to a running group by name (e.g. from another job or a Serve replica)."""
        handles = [ray.get_actor(shard_name(group_id, s), namespace=namespace)
                   for s in range(cfg.num_shards)]
        return cls(cfg, handles, group_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_counts_lock", "_pending", "_records", "_record_failed"):
            del state[k]  # a copy starts its own bookkeeping of writes
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # an object-store copy (e.g. an FM worker's constructor argument) holds read-only
        # arrays: the counters must be writable
        self._late, self._failed = self._late.copy(), self._failed.copy()
        self._counts_lock = threading.Lock()
        self._init_records()

    # -- placement
    def shard_of(self, users: np.ndarray) -> np.ndarray:
        """Shard index of each user (consistent hashing: a user's pairs live on one shard)."""
        return self.ring.shard_of(np.asarray(users, dtype=np.int64))

    def rows_by_shard(self, users: np.ndarray) -> dict[int, np.ndarray]:
        """The positions of ``users`` each shard owns (shards owning none left out)."""
        shard = self.shard_of(users)
        return {int(s): np.flatnonzero(shard == s) for s in np.unique(shard)}

    def _fan_out(self, rows: dict[int, np.ndarray], call: Callable[[Any, np.ndarray], Any]
                 ) -> dict[int, Any]:
        """One call per shard in ``rows`` (``rows_by_shard``): ``call(shard handle,
        positions)``; the refs by shard, for ``_gather`` or ``collect``."""
        return {s: call(self.shards[s], r) for s, r in rows.items()}

    # -- serving path
    def lookup(self, user: int, candidates: np.ndarray, now: float, version: str,
               user_knn: NeighbourTable | None, item_knn: NeighbourTable | None,
               enrich_cfg: EnrichConfig, deadline_ms: float | None = None,
               phases: dict[str, float] | None = None) -> Slots:
        """The request's two SOLARIS slots from one parallel round of shard calls.

        ``deadline_ms`` (default ``cfg.deadline_ms``) bounds the wait on the monotonic clock,
        counted from entry; shards that are late or fail contribute ``ShardAnswer.empty`` (all
        misses). Raises RequestError only for a bad request (user, candidates, now, version).
        ``phases``, if given, receives the seconds of each step of the round (plan, submit,
        wait, assemble) -- for benchmarks.
        """
        rnd = self._start_round(user, candidates, now, version, user_knn, item_knn, enrich_cfg,
                                deadline_ms)
        return self._end_round(rnd, collect(rnd.refs, rnd.deadline), phases)

    async def lookup_async(self, user: int, candidates: np.ndarray, now: float, version: str,
                           user_knn: NeighbourTable | None,
                           item_knn: NeighbourTable | None, enrich_cfg: EnrichConfig,
                           deadline_ms: float | None = None,
                           phases: dict[str, float] | None = None) -> Slots:
        """``lookup`` for an event loop (a Serve replica): the round is awaited, no thread
        blocks on it; the same slots, the same deadline and miss semantics, the same
        ``phases``."""
        rnd = self._start_round(user, candidates, now, version, user_knn, item_knn, enrich_cfg,
                                deadline_ms)
        return self._end_round(rnd, await collect_async(rnd.refs, rnd.deadline), phases)

    def _start_round(self, user: int, candidates: np.ndarray, now: float, version: str,
                     user_knn: NeighbourTable | None,
                     item_knn: NeighbourTable | None, enrich_cfg: EnrichConfig,
                     deadline_ms: float | None) -> "_Round":
        """Plan a lookup, route its keys by shard and send each shard its query."""
        t0 = time.monotonic()
        budget = (self.cfg.deadline_ms if deadline_ms is None else deadline_ms) / 1000.0
        p = enrich.plan(user, candidates, user_knn, item_knn, enrich_cfg)
        queries = enrich.route(p, self.shard_of, version, now)
        t1 = time.monotonic()
        refs = {s: self.shards[s].answer.remote(wire.encode_query(q))
                for s, q in queries.items()}  # the user's shard first: it has the most work
        return _Round(p, queries, refs, t0 + budget, (t0, t1, time.monotonic()))

    def _end_round(self, rnd: "_Round", collected: tuple, phases: dict[str, float] | None
                   ) -> Slots:
        """Decode a round's answers (late or failed shards: misses) and assemble the slots."""
        t3 = time.monotonic()
        slots = enrich.assemble(rnd.plan, self._answers(rnd.queries, *collected), self.cfg.dim)
        if phases is not None:
            t0, t1, t2 = rnd.times
            phases.update(plan=t1 - t0, submit=t2 - t1, wait=t3 - t2,
                          assemble=time.monotonic() - t3)
        return slots

    def _answers(self, queries: dict[int, ShardQuery], got: dict[int, Any], late: list[int],
                 failed: dict[int, RayError]) -> dict[int, ShardAnswer]:
        """Decode a round's answers; late or failed shards answer empty (counted)."""
        out: dict[int, ShardAnswer] = {}
        for s in queries:
            if s in got:
                out[s] = wire.decode_answer(got[s])
                continue
            out[s] = ShardAnswer.empty(self.cfg.dim)
            exc = failed.get(s)
            if exc is not None and not isinstance(exc, RayActorError):
                log.warning("shard %d answer failed: %s", s, exc)  # a bug, but only misses
            elif exc is not None:  # dead or restarting shard: expected, counted
                log.debug("shard %d unavailable: %s", s, type(exc).__name__)
        with self._counts_lock:
            self._lookups += 1
            self._late[late] += 1
            self._failed[list(failed)] += 1
        return out

    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float | np.ndarray, scores: np.ndarray | None = None,
            timeout_s: float = 30.0) -> int:
        """Write pairs at event time ``now`` (one, or one per pair: ``PairStore.put``), one
        call per shard involved; returns the entries written.

        A shard that fails or does not finish within ``timeout_s`` loses its part (logged):
        its pairs keep reading as missing, so the verifier enqueues them again.
        """
        users = np.asarray(users, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        vectors = np.asarray(vectors)
        if not (len(users) == len(items) == len(vectors)):
            raise RequestError(f"put: users ({len(users)}), items ({len(items)}) and vectors "
                             f"({len(vectors)}) differ in length")
        sc = None if scores is None else np.asarray(scores)
        at = float(now) if np.ndim(now) == 0 else np.asarray(now, np.float64)
        if np.ndim(at) and at.shape != users.shape:
            raise RequestError(f"put: now has {at.shape[0]} times for {len(users)} pairs")
        refs = self._fan_out(self.rows_by_shard(users), lambda h, m: h.put_frame.remote(
            frames.encode("pairs", (users[m], items[m], vectors[m], str(version),
                                    at if np.ndim(at) == 0 else at[m],
                                    None if sc is None else sc[m]))))
        return sum(self._gather(refs, timeout_s, "put", 0).values())

    # -- history: fire-and-forget writes (the router), one-round reads (the FM workers)
    def record_impressions(self, user: int, items: np.ndarray, surfaces: np.ndarray | int,
                           now: float) -> None:
        """Candidates shown to ``user`` at event time ``now``, to the user's shard's history.

        One call to the owning shard, not waited on. Raises RequestError for a bad request
        (checked here); a dead or failing shard is logged and counted, never raised.
        """
        user = check_user(user)
        items = check_ids(items, "items")
        now = check_time(now)
        surf = np.asarray(surfaces)
        if surf.ndim > 1 or (surf.ndim == 1 and len(surf) != len(items)):
            raise RequestError(f"surfaces: expected a code or {len(items)} codes, got shape "
                               f"{surf.shape}")
        self._send(user, "record_impressions", frames.encode_impressions([(user, items, surf, now)]))

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
            self._send_to(s, "record_impressions", frames.encode_impressions(recs))

    def impressions_by_shard(self, records: Sequence[tuple[int, np.ndarray, Any, float]]
                             ) -> dict[int, list]:
        """Requests' impressions ``(user, items, surfaces, now)``, checked (RequestError
        naming a bad field) and grouped by the shard that owns each user."""
        by_shard: dict[int, list] = {}
        if not records:
            return by_shard
        users = np.array([check_user(r[0]) for r in records], np.int64)
        for rec, s in zip(records, self.shard_of(users).tolist()):
            user, items, surfaces, now = rec
            items = check_ids(items, "items")
            surf = np.asarray(surfaces)
            if surf.ndim > 1 or (surf.ndim == 1 and len(surf) != len(items)):
                raise RequestError(f"surfaces: expected a code or {len(items)} codes, got "
                                   f"shape {surf.shape}")
            by_shard.setdefault(int(s), []).append((int(user), items, surf, check_time(now)))
        return by_shard

    def _send(self, user: int, method: str, frame: bytes) -> None:
        self._send_to(int(self.shard_of(np.array([user]))[0]), method, frame)

    def _send_to(self, s: int, method: str, *frames_: Any) -> None:
        """A fire-and-forget call of ``method`` on shard ``s`` (tracked as a history write:
        ``flush_records`` waits for it, a failure is counted)."""
        try:
            ref = getattr(self.shards[s], method).remote(*frames_)
        except Exception as exc:  # e.g. a handle of a shard killed for good
            log.warning("cache shard %d: %s not sent: %s", s, method, type(exc).__name__)
            with self._counts_lock:
                self._records["sent"] += 1
                self._records["failed"] += 1
                self._record_failed[s] += 1
            return
        with self._counts_lock:
            self._records["sent"] += 1
            self._pending.append((s, ref))
            due = len(self._pending) % REAP_EVERY == 0 or len(self._pending) > MAX_TRACKED
        if due:
            self._reap(0.0)

    def _reap(self, timeout_s: float) -> int:
        """Check finished writes (waiting up to ``timeout_s`` for the outstanding ones);
        count and log the failed; returns how many are still outstanding."""
        with self._counts_lock:
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
        with self._counts_lock:
            for s, _ in failed:
                self._records["failed"] += 1
                self._record_failed[s] += 1
            if len(left) > MAX_TRACKED:  # a stuck shard: stop tracking the oldest
                self._records["untracked"] += len(left) - MAX_TRACKED
                left = left[-MAX_TRACKED:]
            self._pending.extendleft(reversed(left))
            return len(self._pending)

    def flush_records(self, timeout_s: float = 30.0) -> int:
        """Wait up to ``timeout_s`` for the outstanding history writes and count the failed;
        returns how many are still outstanding (0: every write landed or was counted)."""
        return self._reap(timeout_s)

    def history_window(self, users: np.ndarray, now: np.ndarray, history_len: int,
                       timeout_s: float = 30.0) -> dict[str, np.ndarray]:
        """The raw history windows (``HistoryStore.window``) of R requests as of their event
        times, from one parallel round to the shards that own the users.

        Raises HistoryUnavailable when a shard involved fails or misses ``timeout_s``:
        embeddings computed from a missing history would be wrong, not just absent.
        """
        return self.history_window_start(users, now, history_len, timeout_s)()

    def history_window_start(self, users: np.ndarray, now: np.ndarray, history_len: int,
                             timeout_s: float = 30.0) -> Callable[[], dict[str, np.ndarray]]:
        """``history_window`` in two halves: the calls go out now, the returned function
        waits for them (until ``timeout_s`` after this call) and merges -- so a worker can
        read the next lease's histories while it computes the current one."""
        users = check_ids(users, "users")
        now = np.asarray(now, np.float64)
        if now.shape != users.shape:
            raise RequestError(f"now: expected {len(users)} event times, got shape {now.shape}")
        deadline = time.monotonic() + timeout_s
        rows = self.rows_by_shard(users)
        refs = self._fan_out(rows, lambda h, r: h.history_window.remote(
            frames.encode("window_query", (users[r], now[r], history_len))))

        def result() -> dict[str, np.ndarray]:
            got, late, failed = collect(refs, deadline)
            if late or failed:
                with self._counts_lock:
                    self._late[late] += 1
                    self._failed[list(failed)] += 1
                raise HistoryUnavailable(
                    f"history of shards {sorted([*late, *failed])} of group {self.group_id} "
                    f"unavailable (late: {late}, failed: "
                    f"{ {s: type(e).__name__ for s, e in failed.items()} })")
            parts = [(rows[s], frames.decode_window(got[s], WINDOW_KEYS)) for s in rows]
            return merge_windows(parts, len(users), history_len)
        return result

    def replay_history(self, users: np.ndarray, items: np.ndarray, surfaces: np.ndarray,
                       labels: np.ndarray, ts: np.ndarray, timeout_s: float = 300.0) -> int:
        """Seed the shards' histories from a logged interaction log (event order; one
        request per (user, ts)), one call per shard; returns the rows recorded. For a cold
        start or a replay; a shard that fails loses its part (logged)."""
        users = check_ids(users, "users")
        items = check_ids(items, "items")
        surfaces, labels, ts = np.asarray(surfaces), np.asarray(labels), np.asarray(ts)
        if not (len(items) == len(surfaces) == len(labels) == len(ts) == len(users)):
            raise RequestError(f"replay_history: users ({len(users)}), items ({len(items)}), "
                               f"surfaces ({len(surfaces)}), labels ({len(labels)}) and ts "
                               f"({len(ts)}) differ in length")
        refs = self._fan_out(self.rows_by_shard(users), lambda h, m: h.replay_history.remote(
            frames.encode("history_log", (users[m], items[m], surfaces[m], labels[m], ts[m]))))
        return sum(self._gather(refs, timeout_s, "replay_history", 0).values())

    def metrics(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """Per-shard store metrics (``{"up": False}`` for a shard that did not answer) and the
        client's counts of late and failed shard answers (lookups and history reads) and of
        its fire-and-forget history writes (sent, failed, pending)."""
        refs = {s: h.metrics.remote() for s, h in enumerate(self.shards)}
        got = self._gather(refs, timeout_s, "metrics", None)
        shards = [dict(got[s], up=True) if got[s] is not None else {"shard": s, "up": False}
                  for s in range(len(self.shards))]
        return {"group": self.group_id, "shards": shards, "client": self.client_counts()}

    def client_counts(self) -> dict[str, Any]:
        """This client's own counts (no shard call): lookups, late and failed shard answers
        per shard, history writes (sent, failed, pending)."""
        with self._counts_lock:
            return {"lookups": self._lookups, "late": self._late.tolist(),
                    "failed": self._failed.tolist(),
                    "history_writes": {**self._records, "pending": len(self._pending),
                                       "failed_by_shard": self._record_failed.tolist()}}

    def ping(self, shard: int = 0, timeout_s: float = 5.0) -> bool:
        """Whether ``shard`` answers a no-op call within ``timeout_s``."""
        return bool(self._gather({shard: self.shards[shard].ping.remote()}, timeout_s, "ping",
                                 False)[shard])

    def ping_all(self, timeout_s: float = 5.0) -> list[bool]:
        """A no-op call to every shard in one parallel round: which answered in time."""
        got = self._gather({s: h.ping.remote() for s, h in enumerate(self.shards)}, timeout_s,
                           "ping", False)
        return [bool(got[s]) for s in range(len(self.shards))]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every shard answers a ping (e.g. after start or a restart)."""
        deadline = time.monotonic() + timeout_s
        pending = set(range(len(self.shards)))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cache shards {sorted(pending)} of group {self.group_id} "
                                   f"not ready after {timeout_s} s")
            got = self._gather({s: self.shards[s].ping.remote() for s in pending},
                               min(left, 5.0), "ping", False, level=logging.DEBUG)
            pending = {s for s, ok in got.items() if not ok}
            if pending:
                time.sleep(0.05)

    def snapshot_now(self, timeout_s: float = 60.0) -> list[dict[str, Any] | None]:
        """Snapshot every shard now; None for a shard that failed."""
        got = self._gather({s: h.snapshot_now.remote() for s, h in enumerate(self.shards)},
                           timeout_s, "snapshot_now", None)
        return [got[s] for s in range(len(self.shards))]

    def shutdown(self) -> None:
        """Kill every shard for good (no restart); their snapshots stay."""
        for h in self.shards:
            try:
                ray.kill(h, no_restart=True)
            except RayError:
                pass

    def _gather(self, refs: dict[int, Any], timeout_s: float, what: str, default: Any,
                level: int = logging.WARNING) -> dict[int, Any]:
        """Each ref's value, or ``default`` where it failed or missed ``timeout_s``."""
        got, late, failed = collect(refs, time.monotonic() + timeout_s)
        for s in late:
            log.log(level, "cache shard %d: %s timed out after %.1f s", s, what, timeout_s)
        for s, exc in failed.items():
            log.log(level, "cache shard %d: %s failed: %s", s, what, type(exc).__name__)
        return {s: got.get(s, default) for s in refs}


def collect(refs: dict[int, Any], deadline: float
            ) -> tuple[dict[int, Any], list[int], dict[int, RayError]]:
    """(values, late, failed) of the refs by ``deadline`` (a ``time.monotonic()`` instant).

    The usual round -- every shard answers in time -- is one ``ray.get`` of all the refs;
    ``ray.wait`` and a ``ray.get`` per ref (what a late or failed shard needs) cost ~0.15 ms
    per shard more on 2 cores, so they run only when that one get did not succeed.
    """
    keys = list(refs)
    if not keys:
        return {}, [], {}
    try:
        values = ray.get([refs[s] for s in keys], timeout=max(0.0, deadline - time.monotonic()))
        return dict(zip(keys, values)), [], {}
    except (GetTimeoutError, RayError):
        pass
    done, _ = ray.wait([refs[s] for s in keys], num_returns=len(keys),
                       timeout=max(0.0, deadline - time.monotonic()))
    ready = set(done)
    got: dict[int, Any] = {}
    late: list[int] = []
    failed: dict[int, RayError] = {}
    for s in keys:
        if refs[s] not in ready:
            late.append(s)
            continue
        try:
            got[s] = ray.get(refs[s], timeout=0)
        except RayError as exc:
            failed[s] = exc
    return got, late, failed


async def collect_async(refs: dict[int, Any], deadline: float
                        ) -> tuple[dict[int, Any], list[int], dict[int, RayError]]:
    """``collect`` awaited: (values, late, failed) of the refs by ``deadline``.

    One future for the whole round: each ref's completion is recorded from Ray's thread
    (``ObjectRef._on_completed``, as Ray Serve's own replica results use it) and only the
    round's last wakes the event loop, once. Awaiting each ref wakes it once per ref, through
    a future per ref; on 2 cores that cost the caller 0.1-0.2 ms more per call at the serving
    rate (``bench/actor_call.py --rate R --callers``).
    """
    if not refs:
        return {}, [], {}
    loop = asyncio.get_running_loop()
    whole = loop.create_future()
    arrived: dict[int, Any] = {}
    lock = threading.Lock()

    def settle() -> None:
        if not whole.done():  # cancelled when the deadline came first
            whole.set_result(None)

    def on_done(s: int, value: Any) -> None:  # on a Ray thread
        with lock:
            arrived[s] = value
            last = len(arrived) == len(refs)
        if last:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is gone: nobody waits for this round any more
                pass

    for s, ref in refs.items():
        ref._on_completed(functools.partial(on_done, s))
    try:
        await asyncio.wait_for(whole, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        pass
    with lock:
        done = dict(arrived)
    got: dict[int, Any] = {}
    late: list[int] = []
    failed: dict[int, RayError] = {}
    for s in refs:
        if s not in done:
            late.append(s)
        elif isinstance(done[s], RayError):
            failed[s] = done[s]
        elif isinstance(done[s], BaseException):
            failed[s] = RayError(repr(done[s]))
        else:
            got[s] = done[s]
    return got, late, failed
