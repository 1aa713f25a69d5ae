"""A router's read replica of its cache group (``solaris.cache.replica``), kept in step by
Ray calls: the pulls (one ``CacheShard.changes`` call per shard per ``serve.replica_refresh_s``,
on a thread of their own) and the reads sent back (``CacheShard.after_answers``, one call per
shard per after-answer flush, carrying the flush's impressions too).

A request reads the replica only: ``lookup`` plans, routes, answers each shard's query from its
mirror and assembles, with no actor call. ``refresh`` is also the replay's barrier: it pulls
every shard once and returns when all are applied (``ReplayRouter.refresh_now``, the
replay profile's router).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

import numpy as np

from actors.cache import CacheGroup, collect
from solaris import wire as frames
from solaris.cache.query import Slots
from solaris.cache.replica import ReadReplica
from solaris.config import EnrichConfig
from solaris.knn.neighbours import NeighbourTable
from solaris.online import enrich

log = logging.getLogger(__name__)


class ReplicaClient:
    """The replica of ``group``'s shards in this process, its refresh thread, its flushes."""

    def __init__(self, group: CacheGroup, refresh_s: float, stale_s: float,
                 start: bool = True) -> None:
        self.group = group
        self.refresh_s = float(refresh_s)
        self.replica = ReadReplica(group.cfg, stale_s)
        self._stop = threading.Event()
        self._refresh_lock = threading.Lock()  # one pull round at a time
        self.lookups = 0
        self.refresh_cpu_s = 0.0  # this process's thread CPU on pull rounds (apply included)
        self.rounds = 0
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="cache-replica",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh(max(1.0, 5 * self.refresh_s))
            except Exception:
                log.exception("cache replica: refresh failed")

    def alive(self) -> bool:
        """Whether the refresh thread runs (or none was started: the caller refreshes)."""
        return self._thread is None or self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()

    def refresh(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Pull every shard's changes once (one parallel round) and apply them; a shard that
        fails or misses ``timeout_s`` keeps its mirror as it was (counted). Returns the
        records applied and the shards that failed."""
        with self._refresh_lock:
            c0 = time.thread_time()
            sent = time.monotonic()
            r = self.replica
            refs = {s: h.changes.remote(r.cursor(s)) for s, h in enumerate(self.group.shards)}
            got, late, failed = collect(refs, sent + timeout_s)
            applied = 0
            for s, frame in got.items():
                try:
                    applied += r.apply(s, frame, at=sent)
                except Exception:  # a frame this replica cannot apply: start it over
                    log.exception("cache replica: shard %d's changes not applied", s)
                    r.epoch[s] = ""
                    r.failed(s)
            for s in [*late, *failed]:
                r.failed(s)
                log.debug("cache replica: shard %d did not answer its pull", s)
            self.rounds += 1
            self.refresh_cpu_s += time.thread_time() - c0
            return {"applied": applied, "failed": sorted([*late, *failed])}

    def lookup(self, user: int, candidates: np.ndarray, now: float, version: str,
               user_knn: NeighbourTable | None, item_knn: NeighbourTable | None,
               enrich_cfg: EnrichConfig, phases: dict[str, float] | None = None) -> Slots:
        """The request's two SOLARIS slots from the replica: ``CacheGroup.lookup``'s slots
        when the mirrors are in step, with no actor call. RequestError for a bad request."""
        t0 = time.monotonic()
        p = enrich.plan(user, candidates, user_knn, item_knn, enrich_cfg)
        queries = enrich.route(p, self.group.shard_of, version, now)
        t1 = time.monotonic()
        answers = self.replica.answers(queries)
        t2 = time.monotonic()
        slots = enrich.assemble(p, answers, self.group.cfg.dim)
        self.lookups += 1
        if phases is not None:
            phases.update(plan=t1 - t0, answer=t2 - t1, assemble=time.monotonic() - t2)
        return slots

    def flush(self, impressions: Sequence[tuple[int, np.ndarray, Any, float]]) -> None:
        """The after-answer flush: per shard, the impressions of the requests buffered and
        the replica's reads since the last flush, in one ``after_answers`` call (not waited
        on; tracked as the group's history writes, so ``flush_records`` waits for them)."""
        by_shard = self.group.history.impressions_by_shard(impressions)
        for s in range(len(self.group.shards)):
            reads = self.replica.take_reads(s)
            recs = by_shard.get(s)
            if reads is None and not recs:
                continue
            imp = frames.encode_impressions(recs) if recs else None
            self.group.writes.send(s, "after_answers", imp, reads)

    def metrics(self) -> dict[str, Any]:
        """The replica's per-shard figures, its lookups and its pull rounds' CPU here."""
        return {"lookups": self.lookups, "rounds": self.rounds,
                "refresh_cpu_s": round(self.refresh_cpu_s, 4), "refresh_s": self.refresh_s,
                "stale_s": self.replica.stale_s, **self.replica.metrics()}
