"""The client of a group of cache shards (``actors.shard.CacheShard``): one round per request.

``CacheGroup`` lives in the caller's process (the router): it creates or attaches to the named
shards and composes the parts of their client, which share one ``actors.fanout.ShardSet``
(the handles, the consistent-hash ring, one call per shard with a deadline):

- ``pairs`` (``PairClient``): turns ``solaris.online.enrich``'s plan into one parallel round
  of ``answer`` calls with a deadline (DESIGN.md, "One round of remote calls per request"); a
  query and its answer each cross as one ``solaris.cache.wire`` byte string. A shard that is
  dead, restarting, failing or late reads as misses; the caller never sees an exception or
  waits past the deadline. The in-process equivalent of ``CacheGroup.lookup`` is
  ``solaris.online.enrich.enrich_local`` on one store: both give the same ``Slots``, bit for
  bit. Its ``put`` writes the FM workers' pairs, one call per shard involved.
- ``history`` (``actors.history.HistoryClient``): the behaviour history each shard holds for
  the users it owns -- the router's fire-and-forget writes (tracked by ``writes``, an
  ``actors.history.WriteTracker``: ``flush_records`` waits for them), the FM workers'
  one-round reads, the seeding of a cold start or a replay.
- ``health`` (``ShardHealth``): pings, readiness, the shards' metrics; ``rounds``
  (``actors.fanout.RoundCounts``): the late and failed answers of lookups and history reads.

The group's own methods are the entry points its callers use (the lookups, the pair writes,
flushes, pings, counts, snapshots, shutdown), each delegating to one part.

Ray is not initialised here: callers call ``ray.init`` (or run inside a Ray job / Serve app).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import ray
from ray.exceptions import RayActorError, RayError

from actors.fanout import RoundCounts, ShardSet, collect, collect_async
from actors.history import HistoryClient, HistoryUnavailable, WriteTracker
from actors.shard import SHARD_NUM_CPUS, CacheShard, shard_name
from solaris.online import enrich
from solaris import wire as frames
from solaris.cache import wire
from solaris.cache.query import ShardAnswer, ShardQuery, Slots
from solaris.clock import EventClock
from solaris.config import CacheConfig, EnrichConfig, HistoryConfig
from solaris.errors import RequestError
from solaris.knn.neighbours import NeighbourTable

log = logging.getLogger(__name__)

__all__ = ["CacheGroup", "CacheShard", "HistoryUnavailable", "PairClient", "ShardHealth",
           "collect", "collect_async", "shard_name"]


class _Round(NamedTuple):
    """A lookup round in flight: its plan, each shard's query and answer ref, the deadline
    (a ``time.monotonic()`` instant) and the monotonic times it started, was planned and was
    sent."""

    plan: Any
    queries: dict[int, ShardQuery]
    refs: dict[int, Any]
    deadline: float
    times: tuple[float, float, float]


class PairClient:
    """The pair embeddings on the shards: one-round lookups, waited-on writes."""

    def __init__(self, shard_set: ShardSet, rounds: RoundCounts) -> None:
        self._set = shard_set
        self._rounds = rounds

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
        budget = (self._set.cfg.deadline_ms if deadline_ms is None else deadline_ms) / 1000.0
        p = enrich.plan(user, candidates, user_knn, item_knn, enrich_cfg)
        queries = enrich.route(p, self._set.shard_of, version, now)
        t1 = time.monotonic()
        refs = {s: self._set.handles[s].answer.remote(wire.encode_query(q))
                for s, q in queries.items()}  # the user's shard first: it has the most work
        return _Round(p, queries, refs, t0 + budget, (t0, t1, time.monotonic()))

    def _end_round(self, rnd: "_Round", collected: tuple, phases: dict[str, float] | None
                   ) -> Slots:
        """Decode a round's answers (late or failed shards: misses) and assemble the slots."""
        t3 = time.monotonic()
        slots = enrich.assemble(rnd.plan, self._answers(rnd.queries, *collected),
                                self._set.cfg.dim)
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
            out[s] = ShardAnswer.empty(self._set.cfg.dim)
            exc = failed.get(s)
            if exc is not None and not isinstance(exc, RayActorError):
                log.warning("shard %d answer failed: %s", s, exc)  # a bug, but only misses
            elif exc is not None:  # dead or restarting shard: expected, counted
                log.debug("shard %d unavailable: %s", s, type(exc).__name__)
        self._rounds.add(late, list(failed), lookup=True)
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
        refs = self._set.fan_out(self._set.rows_by_shard(users), lambda h, m: h.put_frame.remote(
            frames.encode("pairs", (users[m], items[m], vectors[m], str(version),
                                    at if np.ndim(at) == 0 else at[m],
                                    None if sc is None else sc[m]))))
        return sum(self._set.gather(refs, timeout_s, "put", 0).values())


class ShardHealth:
    """Whether a group's shards answer: pings, readiness, their metrics."""

    def __init__(self, shard_set: ShardSet) -> None:
        self._set = shard_set

    def ping(self, shard: int = 0, timeout_s: float = 5.0) -> bool:
        """Whether ``shard`` answers a no-op call within ``timeout_s``."""
        return bool(self._set.gather({shard: self._set.handles[shard].ping.remote()},
                                     timeout_s, "ping", False)[shard])

    def ping_all(self, timeout_s: float = 5.0) -> list[bool]:
        """A no-op call to every shard in one parallel round: which answered in time."""
        return [bool(ok) for ok in self._set.call_all("ping", timeout_s, False)]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every shard answers a ping (e.g. after start or a restart)."""
        deadline = time.monotonic() + timeout_s
        handles = self._set.handles
        pending = set(range(len(handles)))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cache shards {sorted(pending)} of group "
                                   f"{self._set.group_id} not ready after {timeout_s} s")
            got = self._set.gather({s: handles[s].ping.remote() for s in pending},
                                   min(left, 5.0), "ping", False, level=logging.DEBUG)
            pending = {s for s, ok in got.items() if not ok}
            if pending:
                time.sleep(0.05)

    def metrics(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Each shard's store metrics (``{"shard": s, "up": False}`` for a shard that did not
        answer within ``timeout_s``)."""
        got = self._set.call_all("metrics", timeout_s, None)
        return [dict(m, up=True) if m is not None else {"shard": s, "up": False}
                for s, m in enumerate(got)]


class CacheGroup:
    """The router's view of a group of cache shards: its parts (pairs, history, health,
    counts) over one ``ShardSet``, and the entry points its callers use.

    Picklable (handles and the ring travel), so a Serve deployment can receive one; a copy
    starts its own bookkeeping of history writes.
    """

    def __init__(self, cfg: CacheConfig, handles: Sequence[Any], group_id: str):
        self.shard_set = ShardSet(cfg, handles, group_id)
        self.cfg, self.group_id = cfg, group_id
        self.shards = self.shard_set.handles
        self.rounds = RoundCounts(cfg.num_shards)
        self.writes = WriteTracker(self.shard_set)
        self.pairs = PairClient(self.shard_set, self.rounds)
        self.history = HistoryClient(self.shard_set, self.rounds, self.writes)
        self.health = ShardHealth(self.shard_set)

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

    def shard_of(self, users: np.ndarray) -> np.ndarray:
        """Shard index of each user (``ShardSet.shard_of``)."""
        return self.shard_set.shard_of(users)

    def lookup(self, user: int, candidates: np.ndarray, now: float, version: str,
               user_knn: NeighbourTable | None, item_knn: NeighbourTable | None,
               enrich_cfg: EnrichConfig, deadline_ms: float | None = None,
               phases: dict[str, float] | None = None) -> Slots:
        """The request's two SOLARIS slots from one round of shard calls (``PairClient.lookup``)."""
        return self.pairs.lookup(user, candidates, now, version, user_knn, item_knn,
                                 enrich_cfg, deadline_ms, phases)

    async def lookup_async(self, user: int, candidates: np.ndarray, now: float, version: str,
                           user_knn: NeighbourTable | None,
                           item_knn: NeighbourTable | None, enrich_cfg: EnrichConfig,
                           deadline_ms: float | None = None,
                           phases: dict[str, float] | None = None) -> Slots:
        """``lookup`` for an event loop (``PairClient.lookup_async``)."""
        return await self.pairs.lookup_async(user, candidates, now, version, user_knn,
                                             item_knn, enrich_cfg, deadline_ms, phases)

    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float | np.ndarray, scores: np.ndarray | None = None,
            timeout_s: float = 30.0) -> int:
        """Write pairs, one call per shard involved (``PairClient.put``); the entries
        written."""
        return self.pairs.put(users, items, vectors, version, now, scores, timeout_s)

    def flush_records(self, timeout_s: float = 30.0) -> int:
        """Wait up to ``timeout_s`` for the outstanding history writes and count the failed;
        returns how many are still outstanding (0: every write landed or was counted)."""
        return self.writes.reap(timeout_s)

    def ping_all(self, timeout_s: float = 5.0) -> list[bool]:
        """Which shards answer a no-op call in time (``ShardHealth.ping_all``)."""
        return self.health.ping_all(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every shard answers a ping (``ShardHealth.wait_ready``)."""
        self.health.wait_ready(timeout_s)

    def metrics(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """Per-shard store metrics (``{"up": False}`` for a shard that did not answer) and the
        client's counts of late and failed shard answers (lookups and history reads) and of
        its fire-and-forget history writes (sent, failed, pending)."""
        return {"group": self.group_id, "shards": self.health.metrics(timeout_s),
                "client": self.client_counts()}

    def client_counts(self) -> dict[str, Any]:
        """This client's own counts (no shard call): lookups, late and failed shard answers
        per shard, history writes (sent, failed, pending)."""
        return {**self.rounds.counts(), "history_writes": self.writes.counts()}

    def snapshot_now(self, timeout_s: float = 60.0) -> list[dict[str, Any] | None]:
        """Snapshot every shard now; None for a shard that failed."""
        return self.shard_set.call_all("snapshot_now", timeout_s, None)

    def shutdown(self) -> None:
        """Kill every shard for good (no restart); their snapshots stay."""
        for h in self.shards:
            try:
                ray.kill(h, no_restart=True)
            except RayError:
                pass
