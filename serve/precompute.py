"""The precompute deployment: the FM worker pools (one per live version, scaled up and down
with the queue's depth and lag every poll: ``WorkerPool.tick``, which also publishes the
pool's own metrics), the queue and cache gauges, and the replay's stepping of the workers.

An FM class that does not import where the app runs (``solaris.artifacts.check_fm_class``,
checked before any worker starts) leaves the deployment up with no workers and the error in
``health``: ``/healthz`` fails readiness with it, and nothing restarts in a loop."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ray import serve
from ray.util import metrics as ray_metrics

from serve.backend import Backend
from solaris import metrics
from solaris.config import load_config
from solaris.errors import SolarisError
from solaris.precompute.ledger import speculation_report
from solaris.artifacts import Artifacts, check_fm_class
from solaris.artifacts import served_unlike_trained

log = logging.getLogger("solaris.serve")


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, num_replicas=1)
class Precompute:
    """FM worker pools (one per live version) and the queue / cache gauges."""

    def __init__(self, settings: dict[str, Any]):
        self._stop = threading.Event()
        self.pools: dict[str, Any] = {}
        self.error: str | None = None  # why no FM worker runs (a plug-in that does not load)
        cfg = load_config(settings.get("config"), settings.get("overrides"))
        self.backend = Backend(cfg, settings)
        try:
            self._start_pools(cfg, settings["artifact_dirs"])
        except SolarisError as e:
            self.error = f"{type(e).__name__}: {e}"
            log.error("precompute: no FM workers: %s (fix it and redeploy)", self.error)
        # keyed as _collect names them: the metric's name less "solaris_"
        self._gauges = {m.name.removeprefix("solaris_"): metrics.build(m, ray_metrics)
                        for m in metrics.exported_by("precompute")}
        self._last: dict[str, Any] = {}
        self._counts: tuple[dict | None, list[dict]] = (None, [])  # ledger, shards (last poll)
        self._paused = False
        threading.Thread(target=self._poll, name="solaris-gauges", daemon=True).start()

    def _start_pools(self, cfg: Any, dirs: list[str]) -> None:
        """One started pool per artifact version; every version's FM class is imported here
        first, so a class that does not import starts no worker at all."""
        from actors.precompute import WorkerPool

        arts = [Artifacts.open(d) for d in dirs]
        for d in dirs:
            check_fm_class(d)
        for d, art in zip(dirs, arts):
            if (why := served_unlike_trained(art.manifest, cfg)):
                log.warning("%s", why)
            # the location, not this replica's copy: a worker opens it on its own node
            pool = WorkerPool(cfg.precompute, d, art.side_tables(),
                              None, self.backend.queue,  # None: live history on the shards
                              self.backend.group, self.backend.ledger,
                              history_at=cfg.schedule.history_at,
                              profile=cfg.serve.profile, name=art.version)
            pool.start()
            self.pools[art.version] = pool

    def _poll(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self._last = self._collect()
            except Exception:  # a dead actor mid-restart: keep the last values
                log.exception("metrics poll failed")

    def _collect(self) -> dict[str, Any]:
        q = self.backend.queue.metrics(timeout_s=5)
        shards = [s for s in self.backend.group.metrics(timeout_s=5)["shards"] if s.get("up")]
        if not self._paused:
            for pool in self.pools.values():
                pool.tick(q)
        vals = {"queue_depth": q.get("depth", 0), "queue_dropped": q.get("dropped", 0),
                "precompute_lag_s": q.get("lag_s_mean") or 0.0,
                "cache_entries": sum(s.get("entries", 0) for s in shards),
                "version_mismatch": sum(s.get("pair_other_version", 0) for s in shards),
                "fm_workers": sum(len(p.workers) for p in self.pools.values())}
        for k, v in vals.items():
            self._gauges[k].set(float(v))
        try:
            ledger = self.backend.ledger.report()
        except Exception as e:  # accounting is best effort: the gauges still count
            log.warning("ledger report failed: %s", type(e).__name__)
            ledger = None
        self._counts = (ledger, shards)
        return {"queue": q, **vals}

    def pause(self) -> int:
        """Stop every FM worker's loop (the queue keeps accepting); returns the workers."""
        self._paused = True
        for pool in self.pools.values():
            pool.stop()
        return sum(len(p.workers) for p in self.pools.values())

    def resume(self) -> int:
        """Restart the FM workers' loops after ``pause``."""
        self._paused = False
        for pool in self.pools.values():
            pool.start()
        return sum(len(p.workers) for p in self.pools.values())

    def step_until(self, until: float | None, allowance: int | None,
                   timeout_s: float = 600.0, read_at: float | None = None) -> dict[str, Any]:
        """The replay's precompute step: stop the background loops, let the queue lease only
        work of request event time <= ``until`` and at most ``allowance`` pairs, and step
        every FM worker (all versions) until nothing is leasable or leased; the workers read
        the histories as of ``read_at`` (None: of each request). What gets computed depends
        on the queue's order alone, not on how many workers share it."""

        from actors.precompute import drain_workers

        if not self._paused:
            self.pause()
        self.backend.queue.set_gate(until, allowance, read_at)
        reports = drain_workers([], self.backend.queue, timeout_s,
                                by_version=[list(self.pools[v].workers)
                                            for v in sorted(self.pools)])
        return {"pairs": sum(r["pairs"] for r in reports if r),
                "queue": self.backend.queue.metrics()}

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` reads (no actor call): FM workers, the last polled queue depth
        and lag, and how old those figures are."""
        last = self._last or {}
        return {"workers": sum(len(p.workers) for p in self.pools.values()),
                "paused": self._paused, "queue_depth": int(last.get("queue_depth", 0)),
                "lag_s": float(last.get("precompute_lag_s", 0.0)),
                "polled": self._last is not None, "error": self.error}

    def summary(self, served: int = 0) -> dict[str, Any]:
        """The last gauges, the queue's metrics, each pool's worker metrics and the
        speculation figures (``speculation_report``: the FM's cost per 1,000 of ``served``
        requests, duplicates, speculation precision)."""
        out = dict(self._last or self._collect())
        out["speculation"] = speculation_report(*self._counts, served=max(0, int(served)))
        out["workers"] = {v: p.metrics() for v, p in self.pools.items()}
        # where the FM runs: "cpu" or "cuda:<index> (<GPU name>)", one entry per device
        out["fm_devices"] = sorted({m["device"] for ms in out["workers"].values()
                                    for m in ms if m})
        return out

    def __del__(self) -> None:
        self._stop.set()
