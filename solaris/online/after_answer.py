"""The work after an answer, without Ray: coverage counts, the verifier's picks and the
impressions, buffered (``AfterAnswer``) and sent every ``serve.flush_ms`` or every
``serve.flush_requests`` requests; and the barrier the replay waits on.

It runs once the answer's bytes are on their way and never raises. The verifier ranks by the
VM alone's logits (inside the residual VM), so what is precomputed does not depend on the
corrections, nor does a simulation of it. Sending is injected (``Senders``): the router's
are actor calls, a unit test's are lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np

from solaris.cache.query import Slots
from solaris.online import verifier
from solaris.online.newusers import computable_picks
from solaris.online.serving import AfterAnswer
from solaris.tiers import NUM_TIERS, Tier

log = logging.getLogger("solaris.serve")


@dataclass(frozen=True)
class Senders:
    """Where the buffered work goes: ``impressions(records)`` (the history store),
    ``picks(version, users, items, priorities, nows, surfaces)`` (the precompute queue; may
    return an awaitable the barrier waits on), ``counted(tier_counts, aggregates, picks)``
    (the metrics: candidates by tier, aggregates present, pairs enqueued)."""

    impressions: Callable[[list], None]
    picks: Callable[..., Any]
    counted: Callable[[np.ndarray, int, int], None] = lambda tiers, agg, picks: None


class AfterAnswerWork:
    """One router's after-answer work: ``run`` per answered request (``begin`` when the
    answer is made), a flush by size or by time, and ``barrier`` for the replay."""

    def __init__(self, served: Any, rollouts: Any, senders: Senders, budget: Any):
        self.served = served  # solaris.online.rank.Served
        self.rollouts = rollouts  # solaris.online.rollout.Rollouts
        self.send = senders
        self.budget = budget  # verifier.BudgetController
        cfg = served.cfg
        self.buffer = AfterAnswer(cfg.serve.flush_requests)
        self.pending = 0  # answered requests whose after-answer work has not run yet
        self.tasks: set[asyncio.Task] = set()
        self.flusher: asyncio.Task | None = None
        self.counts = {"requests": 0, "flushes": 0, "queue_calls": 0}
        self.tiers = np.zeros(NUM_TIERS, np.int64)
        self.aggregates = 0

    def begin(self) -> None:
        """An answer with after-answer work is made (``run`` will follow it)."""
        self.pending += 1

    async def run(self, body: Any, items: np.ndarray, now: float, probs: np.ndarray,
                  base: np.ndarray, slots: Slots) -> None:
        try:
            cfg = self.served.cfg
            self.tiers += np.bincount(slots.pair_tier, minlength=NUM_TIERS)
            self.aggregates += int(np.count_nonzero(slots.agg_present))
            found = slots.pair_tier == Tier.PAIR
            version = self.rollouts.policy.active[body.task]
            self.rollouts.observe(now, body.request_id, version, int(found.sum()), len(items))
            picks = verifier.choose(base, items, found, slots.pair_age_s,
                                    np.zeros(len(items), bool), cfg.verifier,
                                    cfg.cache.read_ttl_s, self.budget.fraction)
            self.counts["requests"] += 1
            # the pairs the FM can compute (solaris.online.newusers): items it has a row for,
            # of a user it was trained on, or of any user where it reads users it never saw
            arts = self.served.arts
            picks = computable_picks(arts[version], body.user_id, items, picks)
            versions = [version]
            pending = self.rollouts.policy.pending(body.task)
            if pending is not None:
                versions.append(pending)
                if self.rollouts.shadow_due(body.request_id, self.counts["requests"]):
                    self.spawn(self.rollouts.shadow(body, items, now, pending))
            # what the user is shown: the top of the ranking (serve.impressions_top_k)
            k = min(cfg.serve.impressions_top_k, len(items))
            shown = items[np.argsort(-probs, kind="stable")[:k]]
            queued = {v: computable_picks(arts[v], body.user_id, items, picks)
                      for v in versions}
            full = self.buffer.add(body.user_id, shown, body.surface, now,
                                   {v: (items[p], base[p]) for v, p in queued.items()})
            self.budget.record(len(picks))
            if full:
                self.flush()
            elif self.flusher is None:
                self.flusher = self.spawn(self._flush_later())
        except Exception:
            log.exception("after-answer work failed for user %s", body.user_id)
        finally:
            self.pending -= 1

    def spawn(self, coro: Awaitable) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.served.cfg.serve.flush_ms / 1000.0)
        self.flusher = None
        self.flush()

    def flush(self) -> list:
        """Send the buffered impressions and picks (a call per version); returns what the
        picks' sends returned (the barrier waits on them)."""
        refs: list = []
        try:
            impressions, picks = self.buffer.drain()
            self.counts["flushes"] += 1
            self.send.impressions(impressions)
            enqueued = 0
            for version, (users, its, prios, nows, surfaces) in picks.items():
                refs.append(self.send.picks(version, users, its, prios, nows, surfaces))
                self.counts["queue_calls"] += 1
                enqueued += len(users)
            self.send.counted(self.tiers.copy(), self.aggregates, enqueued)
            self.tiers[:] = 0
            self.aggregates = 0
        except Exception:
            log.exception("flushing %d buffered requests failed", len(self.buffer))
        return refs

    async def barrier(self, deadline: float) -> None:
        """Wait (until ``deadline``, monotonic) for the after-answer work of every answered
        request, send the buffer, and wait for its sends and spawned work."""
        while self.pending > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self.flusher is not None:
            self.flusher.cancel()
            self.flusher = None
        refs = self.flush()
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        for ref in refs:
            if ref is not None:
                await ref
