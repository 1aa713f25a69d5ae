"""What every deployment of the app holds: its handles on the app's actors (cache group,
precompute queue, ledger; created on first use, found by name afterwards), the published KNN
tables, the router's handles on the other deployments, and the deployments' shared logging
setting."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Mapping

import numpy as np

from solaris.clock import event_clock
from solaris.config import SolarisConfig
from solaris.online.rank import Unavailable
from solaris.online.serving import KnnTables

# per-request access logs cost the hot path CPU; turn them on per deployment in a Serve config
# (logging_config: {enable_access_log: true}) when wanted
QUIET = {"enable_access_log": False}


def knn_tables(cfg: SolarisConfig, app_id: str, served: Mapping[str, str] | None = None
               ) -> KnnTables | None:
    """The published KNN tables (``jobs/rebuild_knn.py``) if ``knn.table_uri`` is set, read
    once per version by the app's holder actor and shared through the object store;
    ``served``: the app's FM versions and their id maps' digests (a table built from
    another is disabled, ``solaris.knn.provenance``)."""
    if not cfg.knn.table_uri:
        return None
    from actors.knn import create_knn_holder, holder_tables

    return holder_tables(cfg.knn, create_knn_holder(cfg.knn, app_id,
                                                    detached=cfg.serve.detached_state),
                         served)


class Calls:
    """The router's handles on the app's other deployments: each task's VM (``score``) and
    the precompute deployment (None: no FM workers)."""

    def __init__(self, vms: dict[str, Any], precompute: Any = None):
        self.vms = vms  # task -> DeploymentHandle
        self.precompute = precompute

    async def score(self, task: str, version: str, req: Any, method: str = "score") -> Any:
        """The VM replica's answer to ``req`` (``solaris.online.scoring.ScoreRequest``):
        ``score`` ((2, C) probabilities and the VM alone's logits) or ``base`` (the VM
        alone's (C,) logits); one retry, then ``Unavailable``."""
        from solaris.online.scoring import decode_scores, encode_score_request

        handle = getattr(self.vms[task], method)
        payload = encode_score_request(version, req)
        for attempt in (0, 1):
            try:
                return decode_scores(await handle.remote(payload))
            except Exception as e:  # replica died mid-call, or none is running: retry once
                if attempt:
                    raise Unavailable(f"no VM replica for task {task!r} answered: "
                                      f"{type(e).__name__}") from e
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")


class Backend:
    """The app's clients of its actors: cache group, queue, ledger (created or attached)."""

    def __init__(self, cfg: SolarisConfig, settings: dict[str, Any]):
        from actors import names
        from actors.cache import CacheGroup
        from actors.ledger import LedgerClient
        from actors.queue import QueueClient

        app_id = settings["app_id"]
        detached = cfg.serve.detached_state  # outlive the replica (a redeploy keeps them)
        clock = event_clock(cfg.serve)  # what the stores check event times against
        self.group = CacheGroup.create(cfg.cache, group_id=app_id, detached=detached,
                                       history=cfg.history, clock=clock)
        self.queue = QueueClient.create(cfg.queue, queue_id=app_id, name=names.queue(app_id),
                                        detached=detached, clock=clock)
        self.ledger = LedgerClient.create(names.ledger(app_id), detached=detached)

    def history_provider(self, timeout_s: float) -> Any:
        """The live history (on the cache shards) as a ``HistoryProvider`` for the request
        path; a shard that misses ``timeout_s`` raises ``HistoryUnavailable``."""
        from solaris.precompute.worker import WindowHistory

        return WindowHistory(functools.partial(self.group.history.window, timeout_s=timeout_s))

    def record_impressions_many(self, records: list) -> None:
        if records:
            self.group.history.record_impressions_many(records)

    def record_labels(self, user: int, items: np.ndarray, labels: np.ndarray, now: float) -> None:
        self.group.history.record_labels(user, items, labels, now)
