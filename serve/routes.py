"""The app's HTTP routes over a router's parts: ``POST /rank``, ``POST /feedback``,
``GET|POST /scales``, ``GET /healthz``, ``GET /stats``. Each route is a few lines of glue:
the work is in the parts (``solaris.online.rank``, ``solaris.online.after_answer``,
``serve.readiness``); the schemas and problem answers are ``serve.http``'s.

``build_api(router)`` makes one replica's FastAPI app; ``build_api()`` (no router) makes the
same routes for the OpenAPI schema alone (the HTTP reference page).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from actors.control import ControlUnavailable
from serve.auth import operator_call, read_call, service_call
from serve.http import (RETRY_AFTER_S, FeedbackRequest, RankRequest, RankResponse,
                        ScaleRequest, new_api, problem)
from serve.readiness import replica_id
from solaris.artifact_store import shown
from solaris.config import config_to_dict
from solaris.online import health
from solaris.online.rank import Problem
from solaris.online.scales import ScaleError, scale_dict

log = logging.getLogger("solaris.serve")

_TOKEN = {401: {"description": "the service token is missing or wrong"}}


def refused(r: Any, p: Problem, counted: bool = True) -> JSONResponse:
    """The problem answer of ``p`` (a 503 asks the client to retry), counted by status."""
    if counted:
        r.meters.errors.inc(tags={"code": str(p.status)})
    headers = p.headers or ({"Retry-After": str(RETRY_AFTER_S)} if p.status == 503 else None)
    return problem(p.status, p.field, p.message, headers)


def build_api(r: Any = None) -> FastAPI:
    """The routes over router ``r`` (``serve.router.Router``)."""
    api = new_api()
    if r is not None:
        api.state.max_body_bytes = r.served.cfg.serve.max_body_bytes
        api.state.credentials = r.credentials  # who may call what (serve/auth.py)

    @api.get("/healthz", responses={503: {"description": "unready: no VM replica answers"}})
    async def healthz() -> Any:
        """Readiness per dependency, each checked within ``serve.health_budget_ms``: the VM
        replicas (required: without one nothing is served, 503), the cache shards, the
        queue, the FM workers, the KNN table's age, the control state and the read replica
        (each only degrades: the lookups fall back). ``status``: ok | degraded | unready;
        the answer is reused for ``serve.health_cache_s`` (load balancers poll often)."""
        body = await r.readiness.answer()
        return JSONResponse(body, status_code=503 if body["status"] == health.UNREADY else 200)

    @api.post("/rank", response_model=RankResponse, dependencies=[Depends(service_call)],
              responses={**_TOKEN, 413: {"description": "body too large"},
                         422: {"description": "a field is malformed (named in detail.loc)"},
                         503: {"description": "no VM replica (Retry-After)"}})
    async def rank(body: RankRequest) -> Any:
        now = r.pipeline.clock.of(body)
        out = now if isinstance(now, Problem) else await r.pipeline.rank(body, now)
        if isinstance(out, Problem):
            return refused(r, out)
        r.meters.latency.observe(out.seconds * 1000.0, tags={"mode": out.mode,
                                                             "task": body.task})
        if out.after is not None:  # runs once the answer's bytes are sent
            r.after.begin()
            out.response.background = BackgroundTask(r.after.run, *out.after)
        return out.response

    @api.post("/feedback", dependencies=[Depends(service_call)],
              responses={**_TOKEN, 422: {"description": "a field is malformed"}})
    async def feedback(body: FeedbackRequest) -> Any:
        now = r.pipeline.clock.of(body)
        if isinstance(now, Problem):
            return refused(r, now)
        n, t = len(body.items), len(next(iter(r.served.arts.values())).tasks)
        if len(body.labels) != n or any(len(row) != t or not set(row) <= {0, 1}
                                        for row in body.labels):
            return refused(r, Problem(422, "labels", f"expected {n} rows (one per item) of "
                                      f"{t} values in {{0, 1}}"), counted=False)
        coded = r.served.coded(body, "items")
        if isinstance(coded, Problem):
            return refused(r, coded)
        body, items = coded
        r.backend.record_labels(body.user_id, items, np.asarray(body.labels, np.float64), now)
        return {"ok": True, "labels": n}

    @api.get("/scales", dependencies=[Depends(read_call)])
    async def get_scales() -> dict[str, Any]:
        """Every VM's live scales (by version/task) and the validation curves behind them."""
        return r.live.table.state()

    @api.post("/scales", dependencies=[Depends(operator_call)],
              responses={401: {"description": "the operator token is missing or wrong"},
                         403: {"description": "no operator token is configured: calls off"},
                         422: {"description": "a field is malformed (named)"}})
    async def set_scales(body: ScaleRequest) -> Any:
        """Set one scale of a residual VM: the next requests use it, no redeploy; a tier at 0
        in every VM of a version is no longer looked up."""
        return await _set_scale(r, body)

    @api.get("/stats", dependencies=[Depends(read_call)])
    async def stats() -> dict[str, Any]:
        """The router's rollout state and the precompute backend's last gauges."""
        return await _stats(r)

    return api


async def _set_scale(r: Any, body: ScaleRequest) -> Any:
    unserved = r.served.unserved_task(body.task)
    if unserved is not None:
        return refused(r, unserved)
    version = body.version or r.rollouts.policy.active[body.task]
    if body.slot == "pair" and body.tier is None:
        return refused(r, Problem(422, "tier", "required for slot 'pair'"))
    try:  # checked here, on a copy, before the app's state is changed
        r.live.check(version, body.task, body.slot, body.tier, body.scale)
    except ScaleError as e:
        return refused(r, Problem(422, e.field, str(e)))
    try:
        state = await r.control.set_scale(
            {"version": version, "task": body.task, "slot": body.slot,
             "tier": body.tier if body.slot == "pair" else None, "scale": float(body.scale)})
    except ControlUnavailable as e:
        return refused(r, Problem(503, "scale", str(e)))
    row = scale_dict(r.live.table.array(version, body.task))
    log.info("scales of %s/%s set: %s (control revision %d)", version, body.task, row,
             state["revision"])
    return {"version": version, "task": body.task, "scales": row,
            "revision": state["revision"]}


async def _stats(r: Any) -> dict[str, Any]:
    cfg = r.served.cfg
    knn = r.lookups.knn.tables
    cold = r.lookups.cold
    out: dict[str, Any] = {
        "rollout": r.rollouts.policy.state(), "mode": cfg.serve.mode,
        "phases_p50": r.pipeline.phases.medians_ms(),
        "cache_client": r.backend.group.client_counts(),
        "cache_replica": r.replica.metrics() if r.replica is not None else None,
        # the after-answer work: requests, flushes and their actor calls (history writes:
        # cache_client.history_writes.sent)
        "after_answer": dict(r.after.counts),
        # the artifacts served (the app's args or the config; oldest version first,
        # credentials left out), as the config field writes them
        "serve": {**config_to_dict(cfg.serve),
                  "artifacts_dir": ",".join(map(shown, r.served.dirs))},
        "auth_refused": dict(r.credentials.refused),
        "clock": r.pipeline.clock.clock.metrics() if r.pipeline.clock.clock else None,
        "scales": r.live.table.state(),
        "control": r.control.metrics(),
        "replica": replica_id(),
        "knn": {"version": knn.version, "swaps": knn.swaps, "errors": knn.errors,
                "disabled": [v.line() for v in knn.verdicts if not v.served],
                "cold_starts": cold.count, "cold_start_memo": cold.memo.metrics()}
        if knn else None}
    if r.calls.precompute is not None:
        try:
            out["precompute"] = await asyncio.wait_for(
                r.calls.precompute.summary.remote(r.after.counts["requests"]), timeout=10)
        except Exception as e:
            out["precompute"] = {"error": type(e).__name__}
    return out
