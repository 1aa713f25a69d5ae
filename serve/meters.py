"""The router's metrics (defined once in ``solaris.metrics``): per request (latency,
candidates by tier, aggregates present, refusals by status, pairs enqueued) and what a
dashboard needs that no request counts -- shard liveness, the KNN table's age, the control
state's revision -- set by a thread every ``GAUGE_EVERY_S`` (every router replica reports
its own view)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
from ray.util import metrics as ray_metrics

from solaris import metrics
from solaris.online import health
from solaris.tiers import LABELS as TIER_LABELS

log = logging.getLogger("solaris.serve")

GAUGE_EVERY_S = 5.0


class RouterMeters:
    def __init__(self) -> None:
        self.latency = metrics.build(metrics.RANK_LATENCY_MS, ray_metrics)
        self.tier = metrics.build(metrics.CANDIDATES, ray_metrics)
        self.agg = metrics.build(metrics.AGGREGATE_PRESENT, ray_metrics)
        self.errors = metrics.build(metrics.RANK_ERRORS, ray_metrics)
        self.enqueued = metrics.build(metrics.ENQUEUED_PAIRS, ray_metrics)
        self.shard_up = metrics.build(metrics.SHARD_UP, ray_metrics)
        self.knn_age = metrics.build(metrics.KNN_TABLE_AGE_S, ray_metrics)
        self.control = metrics.build(metrics.CONTROL_REVISION, ray_metrics)

    def counted(self, tiers: np.ndarray, aggregates: int, enqueued: int) -> None:
        """A flush's counts (Ray counters take only positive increments)."""
        for t, n in enumerate(tiers.tolist()):
            if n:
                self.tier.inc(float(n), tags={"tier": TIER_LABELS[t]})
        if aggregates:
            self.agg.inc(float(aggregates))
        if enqueued:
            self.enqueued.inc(float(enqueued))

    def start_gauges(self, router: Any) -> None:
        threading.Thread(target=self._gauge_loop, args=(router,), name="router-gauges",
                         daemon=True).start()

    def _gauge_loop(self, router: Any) -> None:
        while True:
            try:
                self._set_gauges(router)
            except Exception:
                log.exception("router gauges failed")
            time.sleep(GAUGE_EVERY_S)

    def _set_gauges(self, r: Any) -> None:
        budget = r.served.cfg.serve.health_budget_ms / 1000.0
        for s, up in enumerate(r.backend.group.ping_all(budget)):
            self.shard_up.set(1.0 if up else 0.0, tags={"shard": str(s)})
        knn = r.lookups.knn.tables
        age = health.knn_age_s(knn.version, time.time()) if knn else None
        self.knn_age.set(-1.0 if age is None else age)
        self.control.set(float(r.control.revision))
