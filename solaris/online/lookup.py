"""Where a request's two SOLARIS slots come from, without Ray: the KNN tables in use (a
due poll of the published pointer on a thread), a cold-start user's neighbours, the lookup
(the router's read replica, or one awaited round of cache-shard calls) and the inline FM.

The read replica and the cache group are injected (``actors/replica.py``,
``actors/cache.py`` under the router; plain objects in a unit test).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Executor
from typing import Any, Callable

import numpy as np

from solaris.cache.query import Slots
from solaris.knn.neighbours import NeighbourTable
from solaris.online.scoring import InlineFM
from solaris.online.serving import ColdStartMemo, KnnTables, cold_start_inputs, is_cold

log = logging.getLogger("solaris.serve")


class KnnView:
    """The KNN tables in use (``None``: none published). A due poll of the published
    pointer (a call to the app's holder; on a new version, a fetch of its snapshot) runs on
    ``io``, never on the event loop: requests go on with the tables in use meanwhile."""

    def __init__(self, tables: KnnTables | None, io: Executor):
        self.tables = tables
        self.io = io
        self.poll: Any = None  # the poll running on a thread, if any
        if tables is not None:
            tables.current()  # the published tables, if any, before the first request

    def now(self) -> Any:
        if self.tables is None:
            return None
        if self.poll is None and self.tables.due():
            self.poll = asyncio.get_running_loop().run_in_executor(self.io, self.tables.current)
            self.poll.add_done_callback(self._polled)
        return self.tables.peek()

    def _polled(self, _: Any) -> None:
        self.poll = None

    @property
    def version(self) -> str:
        """The version in use ("" for none), as the answer names it."""
        return (self.tables.version or "") if self.tables is not None else ""


class ColdStart:
    """Neighbours of a user the published table lacks: the user vector the index was built
    with, of the FM it was built from (the request tower of the active version's for a table
    that records neither), over the user's history as of the request, queried against the
    live index; memoised by the user's inputs (``serve.cold_start_memo``)."""

    def __init__(self, served: Any, history: Callable[[], Any], active: Callable[[], str],
                 lock: threading.Lock):
        self.served = served  # solaris.online.rank.Served
        self.history = history  # () -> the live HistoryProvider
        self.active = active  # () -> the first task's active version
        self.lock = lock
        self.encoder: tuple | None = None  # ((FM version, user vector), encoder, side, events)
        self.memo = ColdStartMemo(served.cfg.serve.cold_start_memo)
        self.count = 0

    def neighbours(self, user: int, now: float, surface: int, knn: Any
                   ) -> NeighbourTable | None:
        """The user's one-row neighbour table; None (next tier) on failure."""
        try:
            enc, side, hlen, _ = self._encoder(knn)
            cfg = self.served.cfg
            req = cold_start_inputs(self.history(), user, now, surface, hlen, side)
            probe = cfg.enrich.user_knn_probe + 1

            def query() -> tuple[np.ndarray, np.ndarray]:
                ids, sims = knn.live.query(enc.encode(req), probe)
                return ids[0], sims[0]

            ids, sims = self.memo.get(knn.version, probe, req, query)
            self.count += 1
            return NeighbourTable.one(user, ids, sims, knn.version)
        except Exception:
            log.exception("cold-start neighbours for user %s failed; next tier", user)
            return None

    def _encoder(self, knn: Any) -> tuple:
        from solaris.knn.user_encoder import LEGACY_USER_VECTOR, events_read, user_encoder

        built = knn.built_from.get("user")
        arts = self.served.arts
        version = (built.fm_version if built is not None and built.fm_version in arts
                   else self.active())
        kind = (built.user_vector if built is not None and built.user_vector
                else LEGACY_USER_VECTOR)
        with self.lock:
            if self.encoder is None or self.encoder[0] != (version, kind):
                from solaris.artifacts import load_models

                art = arts[version]
                fm, _, _ = load_models(art.root)
                hlen = min(events_read(kind, fm, self.served.cfg.knn.user_events),
                           self.served.cfg.history.max_events)
                self.encoder = ((version, kind), user_encoder(kind, fm), art.side_tables(),
                                hlen)
            _, enc, side, hlen = self.encoder
        return enc, side, hlen, version


class Lookups:
    """Both SOLARIS slots of a request: from the read replica (no call), or in one awaited
    round of shard calls (cold-start neighbours, which run the user encoder, on a thread
    first); or the inline FM's (``serve.mode=inline``)."""

    def __init__(self, served: Any, group: Any, replica: Any, knn: KnnView,
                 scales: Callable[[], Any], history: Callable[[], Any],
                 active: Callable[[], str], io: Executor):
        self.served = served
        self.group = group  # the cache group's client (lookup_async)
        self.replica = replica  # the read replica (lookup), or None
        self.knn = knn
        self.scales = scales  # () -> the live ScaleTable
        self.history = history
        self.active = active
        self.io = io
        self.lock = threading.Lock()
        self.cold = ColdStart(served, history, active, self.lock)
        self._inline: InlineFM | None = None

    async def lookup(self, user: int, items: np.ndarray, now: float, version: str,
                     surface: int = 0, phases: dict[str, float] | None = None,
                     reads: str | None = None) -> Slots:
        knn = self.knn.now()
        users = knn.users if knn else None
        if knn is not None and knn.live is not None and is_cold(users, user):
            cold = await asyncio.get_running_loop().run_in_executor(
                self.io, self.cold.neighbours, user, now, surface, knn)
            users = cold or users
        enrich = self.scales().enrich_for(version, self.served.cfg.enrich)
        items_knn = knn.items if knn else None
        if self.replica is not None and reads != "shards":
            return self.replica.lookup(user, items, now, version, users, items_knn, enrich,
                                       phases=phases)
        return await self.group.lookup_async(user, items, now, version, users, items_knn,
                                             enrich, phases=phases)

    async def inline(self, user: int, items: np.ndarray, surface: int, now: float
                     ) -> Slots | None:
        return await asyncio.get_running_loop().run_in_executor(
            self.io, self._inline_slots, user, items, surface, now)

    def _inline_slots(self, user: int, items: np.ndarray, surface: int, now: float
                      ) -> Slots | None:
        """The inline FM's slots; None (the VM alone) if the user's history is unreadable."""
        try:
            with self.lock:
                if self._inline is None:
                    art = self.served.arts[self.active()]
                    self._inline = InlineFM(art, art.side_tables(), self.history(),
                                            self.served.cfg.serve.inline_sharing)
            return self._inline.slots(user, items, surface, now)
        except Exception as e:  # e.g. HistoryUnavailable: a shard missed the deadline
            log.warning("inline FM failed for user %s (%s: %s); answering with the VM alone",
                        user, type(e).__name__, e)
            return None
