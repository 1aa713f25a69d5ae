"""The app's metrics, defined once: name, kind, description, tag keys, histogram boundaries.

The router (``serve/meters.py``), the precompute deployment (``serve/precompute.py``) and the
FM worker pools (``actors/precompute.py``) build their Ray metrics from these definitions
(``build``); the reference page ``docs/reference/metrics.md`` is generated from them, and a
unit test checks that every metric the Grafana dashboard and the Prometheus alert rules in
``deploy/`` read is one of them. No Ray import: ``build`` is handed ``ray.util.metrics``.

Ray exports a metric to Prometheus as ``ray_<name>``, a counter with ``_total`` appended, a
histogram as its ``_bucket``, ``_sum`` and ``_count`` series (``prometheus_names``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from solaris.errors import ConfigError

KINDS = {"counter": "Counter", "gauge": "Gauge", "histogram": "Histogram"}  # kind -> Ray class
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"solaris_[a-z0-9_]+")


@dataclass(frozen=True)
class Metric:
    """One metric as the code records it and Prometheus reads it."""

    name: str  # the name given to Ray ("solaris_..."); Prometheus sees it with a ray_ prefix
    kind: str  # counter | gauge | histogram
    description: str  # Ray's description: the HELP line of the Prometheus endpoint
    exporter: str  # who records it: "router", "precompute" or "pool" (the EXPORTERS keys)
    tag_keys: tuple[str, ...] = ()  # the labels every record carries
    boundaries: tuple[float, ...] = ()  # a histogram's bucket upper bounds (increasing, > 0)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ConfigError(f"metric name={self.name!r}: expected 'solaris_' and then "
                              "lower-case letters, digits or '_'")
        if self.kind not in KINDS:
            raise ConfigError(f"metric {self.name} kind={self.kind!r}: must be one of "
                              f"{', '.join(KINDS)}")
        if self.exporter not in EXPORTERS:
            raise ConfigError(f"metric {self.name} exporter={self.exporter!r}: must be one "
                              f"of {', '.join(EXPORTERS)}")
        bounds = self.boundaries
        if (self.kind == "histogram") != bool(bounds):
            raise ConfigError(f"metric {self.name} boundaries={bounds!r}: a histogram needs "
                              "them, another kind has none")
        if any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ConfigError(f"metric {self.name} boundaries={bounds!r}: must be > 0 and "
                              "increasing")

    def prometheus_names(self) -> tuple[str, ...]:
        """The series Ray exports this metric as, e.g. ``ray_solaris_rank_errors_total``."""
        return tuple(f"ray_{self.name}{s}" for s in SUFFIXES[self.kind])


# who records each metric: Metric.exporter -> (a title, who records it and how)
EXPORTERS = {
    "router": ("The router", "each LookupRouter replica (serve/meters.py)"),
    "precompute": ("The precompute deployment", "the Precompute deployment, every 2 s from "
                   "the queue and the cache shards (serve/precompute.py)"),
    "pool": ("The FM worker pools", "each FM worker pool, tagged with the pool's name (in the "
             "app: the FM version it serves; actors/precompute.py)"),
}

# -- the router: one series per replica (Prometheus adds the replica's labels)
RANK_LATENCY_MS = Metric("solaris_rank_latency_ms", "histogram", "router latency of /rank",
                         "router", ("mode", "task"),
                         (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0))
CANDIDATES = Metric("solaris_candidates", "counter", "candidates by tier", "router", ("tier",))
AGGREGATE_PRESENT = Metric("solaris_aggregate_present", "counter",
                           "candidates with the user slot present", "router")
RANK_ERRORS = Metric("solaris_rank_errors", "counter", "non-2xx answers of /rank", "router",
                     ("code",))
ENQUEUED_PAIRS = Metric("solaris_enqueued_pairs", "counter", "verifier picks handed to the queue",
                        "router")
SHARD_UP = Metric("solaris_shard_up", "gauge",
                  "1 if the cache shard answered this router's last ping in time", "router",
                  ("shard",))
KNN_TABLE_AGE_S = Metric("solaris_knn_table_age_s", "gauge",
                         "seconds since the KNN tables this router serves were built (-1: none "
                         "published, or no knn.table_uri)", "router")
CONTROL_REVISION = Metric("solaris_control_revision", "gauge",
                          "the control state's revision this router serves (routers that differ "
                          "for long are not following)", "router")

# -- the precompute deployment's gauges (no tags)
QUEUE_DEPTH = Metric("solaris_queue_depth", "gauge", "pending precompute pairs", "precompute")
QUEUE_DROPPED = Metric("solaris_queue_dropped", "gauge",
                       "pairs dropped on queue overflow (cumulative)", "precompute")
PRECOMPUTE_LAG_S = Metric("solaris_precompute_lag_s", "gauge",
                          "wall seconds from enqueue to cache write (recent mean)", "precompute")
CACHE_ENTRIES = Metric("solaris_cache_entries", "gauge", "live pair embeddings in the cache group",
                       "precompute")
VERSION_MISMATCH = Metric("solaris_version_mismatch", "gauge",
                          "own-pair lookups that found only another version (cumulative)",
                          "precompute")
FM_WORKERS = Metric("solaris_fm_workers", "gauge", "running FM workers", "precompute")

# -- the FM worker pools: one series per pool
FM_POOL_WORKERS = Metric("solaris_fm_pool_workers", "gauge",
                         "FM workers in the pool (placed or not; retiring ones not)", "pool",
                         ("pool",))
FM_POOL_PENDING = Metric("solaris_fm_pool_pending", "gauge",
                         "FM workers requested but not placed and built yet (e.g. waiting for "
                         "the autoscaler's GPU node)", "pool", ("pool",))
FM_WORKER_ERRORS = Metric("solaris_fm_worker_errors", "counter",
                          "FM worker errors: failed cycles (leases given back), restarts after "
                          "a crash, workers that stopped answering", "pool", ("pool",))

METRICS: tuple[Metric, ...] = (
    RANK_LATENCY_MS, CANDIDATES, AGGREGATE_PRESENT, RANK_ERRORS, ENQUEUED_PAIRS, SHARD_UP,
    KNN_TABLE_AGE_S, CONTROL_REVISION, QUEUE_DEPTH, QUEUE_DROPPED, PRECOMPUTE_LAG_S,
    CACHE_ENTRIES, VERSION_MISMATCH, FM_WORKERS, FM_POOL_WORKERS, FM_POOL_PENDING,
    FM_WORKER_ERRORS)
assert len({m.name for m in METRICS}) == len(METRICS), "metric names must be unique"


def exported_by(exporter: str) -> tuple[Metric, ...]:
    """The metrics ``exporter`` records, in registry order."""
    if exporter not in EXPORTERS:
        raise ConfigError(f"exporter={exporter!r}: must be one of {', '.join(EXPORTERS)}")
    return tuple(m for m in METRICS if m.exporter == exporter)


def prometheus_names() -> set[str]:
    """Every series name the app's metrics reach Prometheus under."""
    return {n for m in METRICS for n in m.prometheus_names()}


def build(metric: Metric, module: Any) -> Any:
    """The metric object of ``module`` (``ray.util.metrics``) for ``metric``."""
    cls = getattr(module, KINDS[metric.kind])
    kwargs: dict[str, Any] = {"description": metric.description, "tag_keys": metric.tag_keys}
    if metric.kind == "histogram":
        kwargs["boundaries"] = list(metric.boundaries)
    return cls(metric.name, **kwargs)
