"""The rank pipeline: one ``/rank`` request from its body to its answer, without Ray.

Four stages: **validate** (the event time, the task, the candidate count, the ids through the
deployment's id map, the request features), **look up or compute** the two SOLARIS slots
(the lookup round, or the inline FM), **score** (the VM alone beside the lookup round and the
corrections here, or the whole residual VM at the VM replica) and **answer** (the response's
JSON, built directly). The lookups and the VM calls are injected callables, so the pipeline
is the same object under the router (actor calls, Serve handles) and in a unit test (plain
functions). What it does not do: the after-answer work (``solaris.online.after_answer``),
rollouts (``solaris.online.rollout``), health.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from solaris.artifacts import Artifacts
from solaris.cache.query import Slots
from solaris.clock import ClockSkewError, SkewGuard, event_clock
from solaris.config import SolarisConfig
from solaris.errors import RequestError, SolarisError
from solaris.ids import deployment_ids
from solaris.online.scoring import PackedSlots, ResidualHead, ScoreRequest, request_vector
from solaris.tiers import LABELS as TIER_LABELS

# request fields of the replay profile only
DEBUG_FIELDS = ("now", "mode", "features_for", "reads")


class Unavailable(SolarisError):
    """No VM replica answered (a 503)."""


@dataclass(frozen=True)
class Problem:
    """A refused request: the HTTP status and the field it names (``serve.http.problem``)."""

    status: int
    field: str
    message: str
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Served:
    """What every part of the request path reads of the versions served: the config, the
    artifacts by version (oldest first), the one id map of the deployment, the tasks, and the
    last surface code every version's tables hold (a request's surface past it is read as
    it, as the VM reads it), and where the artifacts were read."""

    cfg: SolarisConfig
    arts: Mapping[str, Artifacts]
    ids: Any  # solaris.ids.DeploymentIds
    tasks: list[str]
    last_surface: int
    dirs: tuple[str, ...] = ()  # where the artifacts were read (``serve.artifacts_dir``)

    @classmethod
    def open(cls, cfg: SolarisConfig, dirs: list[str]) -> "Served":
        arts = [Artifacts.open(d) for d in dirs]
        for a in arts:  # each version's feature spec (request features), read here once
            _ = a.spec
        return cls(cfg, {a.version: a for a in arts},
                   deployment_ids([(str(a.root), a.ids()) for a in arts]),
                   sorted({t for a in arts for t in a.tasks}),
                   min(a.spec.num_surfaces for a in arts) - 1, tuple(dirs))

    @property
    def manifests(self) -> dict[str, dict]:
        return {v: a.manifest for v, a in self.arts.items()}

    def coded(self, body: Any, field: str) -> tuple[Any, np.ndarray] | Problem:
        """The request with its user's code for ``user_id`` and the codes of its items
        (``field``); a problem naming the field for an id of the wrong kind."""
        try:
            user = int(self.ids.users.codes([body.user_id], "user_id")[0])
            items = self.ids.items.codes(getattr(body, field), field)
        except RequestError as e:
            return Problem(422, str(e).split(":", 1)[0], str(e))
        return body.model_copy(update={"user_id": user}), items

    def unserved_task(self, task: str) -> Problem | None:
        if task in self.tasks:
            return None
        return Problem(422, "task", f"{task!r} is not served (tasks: {', '.join(self.tasks)})")


class EventTime:
    """A request's event time: the wall clock, or in the replay profile the ``now`` it
    carries, checked against the latest accepted (``SkewGuard``); the serving profiles
    refuse the replay profile's fields."""

    def __init__(self, cfg: SolarisConfig):
        self.profile = cfg.serve.profile
        self.clock = SkewGuard(event_clock(cfg.serve)) if self.profile == "replay" else None

    def of(self, body: Any) -> float | Problem:
        if self.clock is None:
            for name in DEBUG_FIELDS:
                if getattr(body, name, None) is not None:
                    return Problem(422, name, f"not accepted in the {self.profile} profile "
                                   "(event time and per-request modes are the server's; "
                                   "serve.profile=replay accepts them)")
            return time.time()
        if body.now is None:
            return time.time()
        try:
            self.clock.check(float(body.now))
        except ClockSkewError as e:
            return Problem(422, "now", str(e))
        return float(body.now)


class Phases:
    """Seconds of the last requests per mode by phase (enrich, VM call, answer; the lookup
    round's own steps): where the time goes, as medians in ``/stats``."""

    def __init__(self, keep: int = 2000):
        self.by_mode: dict[str, deque] = defaultdict(lambda: deque(maxlen=keep))

    def add(self, mode: str, row: dict[str, float]) -> None:
        self.by_mode[mode].append(row)

    def medians_ms(self) -> dict[str, dict[str, float]]:
        return {m: {f"{k}_ms": round(float(np.median([r.get(k, 0.0) for r in d])) * 1e3, 3)
                    for k in d[-1]} for m, d in self.by_mode.items() if d}


@dataclass(frozen=True)
class Stages:
    """The pipeline's injected calls. ``lookup(user, items, now, version, surface, steps,
    reads)`` awaits both slots; ``inline(user, items, surface, now)`` awaits the inline FM's
    slots (None: the VM alone); ``score(task, version, request, method)`` awaits the VM
    replica's answer (``score``: (2, C) probabilities and the VM alone's logits; ``base``:
    the VM alone's (C,) logits), raising ``Unavailable``; ``respond(body)`` makes the
    response from the answer's JSON body (its encoding is timed as the answer)."""

    lookup: Callable[..., Awaitable[Slots]]
    inline: Callable[..., Awaitable[Slots | None]]
    score: Callable[..., Awaitable[Any]]
    respond: Callable[[dict[str, Any]], Any] = lambda body: body


@dataclass
class Ranked:
    """An answered request: the response, its mode, its seconds end to end, and the
    after-answer work's arguments (``None``: nothing to speculate on)."""

    response: Any
    mode: str
    seconds: float
    after: tuple | None = None


@dataclass
class RankPipeline:
    """validate → look up or compute → score → answer, for one request body
    (``serve.http.RankRequest`` or anything with its fields)."""

    served: Served
    stages: Stages
    scales: Callable[[], Any]  # the live ScaleTable (swapped whole by the control state)
    active: Callable[[str], str]  # task -> the version it serves
    knn_version: Callable[[], str]  # the KNN tables' version in use ("" for none)
    clock: EventTime  # the request's event time (the routes check it first)
    heads: Mapping[tuple[str, str], ResidualHead] = field(default_factory=dict)
    has_replica: bool = False
    phases: Phases = field(default_factory=Phases)

    async def rank(self, body: Any, now: float) -> Ranked | Problem:
        t0 = time.perf_counter()
        checked = self.validate(body)
        if isinstance(checked, Problem):
            return checked
        body, items, version, feats = checked
        mode = body.mode or self.served.cfg.serve.mode
        steps: dict[str, float] = {}
        extra: dict[str, float] = {}
        head = self.heads.get((version, body.task)) if mode == "solaris" else None
        alone = None
        if head is not None:  # the VM alone's forward runs while the lookup round does
            alone = asyncio.ensure_future(self.stages.score(
                body.task, version, ScoreRequest(body.user_id, items, body.surface, None,
                                                 features=feats), "base"))
        slots = await self._slots(mode, body, items, now, version, steps, alone)
        t1 = time.perf_counter()
        try:
            probs, base = await self._scores(body, items, version, feats, slots, alone, head,
                                             extra)
        except Unavailable as e:
            return Problem(503, "task", str(e))
        t2 = time.perf_counter()
        response = self.stages.respond(self.answer(body, items, mode, version, probs, slots))
        t3 = time.perf_counter()
        # with serve.overlap, "vm" is the wait for the VM alone after the lookup round plus
        # the corrections ("head", also on its own); a request that chose its lookup path
        # (replay profile) is timed apart
        self.phases.add(mode if body.reads is None else f"{mode}:{body.reads}",
                        {"enrich": t1 - t0, "vm": t2 - t1, "answer": t3 - t2, **extra,
                         **{f"lookup_{k}": v for k, v in steps.items()}})
        after = ((body, items, now, probs, base, slots)
                 if mode == "solaris" and slots is not None else None)
        return Ranked(response, mode, t3 - t0, after)

    def validate(self, body: Any) -> tuple[Any, np.ndarray, str, np.ndarray] | Problem:
        """The body with its ids as codes, its candidates' codes, the version that serves
        its task and its request features; or the problem that refuses it."""
        cfg = self.served.cfg.serve
        if body.reads == "replica" and not self.has_replica:
            return Problem(422, "reads", "this app reads the shards "
                           "(serve.cache_reads=shards): it has no read replica")
        unserved = self.served.unserved_task(body.task)
        if unserved is not None:
            return unserved
        if len(body.candidates) > cfg.max_candidates:
            return Problem(422, "candidates", f"{len(body.candidates)} candidates; the limit "
                           f"is {cfg.max_candidates}")
        coded = self.served.coded(body, "candidates")
        if isinstance(coded, Problem):
            return coded
        body, items = coded
        if body.surface > self.served.last_surface:  # a surface the data never held
            body = body.model_copy(update={"surface": self.served.last_surface})
        if body.features_for is not None and any(
                not 0 <= i < len(items) for i in body.features_for):
            return Problem(422, "features_for", f"positions must be in [0, {len(items)})")
        version = self.active(body.task)
        try:  # standardised as the version's VMs were trained (an absent one: its mean)
            feats = request_vector(self.served.arts[version].spec, body.features)
        except RequestError as e:
            return Problem(422, "features", str(e))
        return body, items, version, feats

    async def _slots(self, mode: str, body: Any, items: np.ndarray, now: float, version: str,
                     steps: dict[str, float], alone: asyncio.Future | None) -> Slots | None:
        try:
            if mode == "solaris":
                return await self.stages.lookup(body.user_id, items, now, version,
                                                body.surface, steps, body.reads)
            if mode == "inline":
                return await self.stages.inline(body.user_id, items, body.surface, now)
            return None
        except BaseException:
            if alone is not None:  # the answer is an error: the VM alone's is not needed
                alone.cancel()
                alone.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    async def _scores(self, body: Any, items: np.ndarray, version: str, feats: np.ndarray,
                      slots: Slots | None, alone: asyncio.Future | None,
                      head: ResidualHead | None, extra: dict[str, float]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities, the VM alone's logits): the corrections here over the VM alone's
        answer, or the residual VM at the replica."""
        scales = self.scales().array(version, body.task)
        if alone is not None:
            base_logit = await alone
            t_head = time.perf_counter()
            probs, base = head.served(base_logit, slots, scales, items)
            extra["head"] = time.perf_counter() - t_head
            return probs, base
        req = ScoreRequest(body.user_id, items, body.surface,
                           PackedSlots.pack(slots) if slots is not None else None, scales, feats)
        return await self.stages.score(body.task, version, req)

    def answer(self, body: Any, items: np.ndarray, mode: str, version: str,
               probs: np.ndarray, slots: Slots | None) -> dict[str, Any]:
        """The answer as ``RankResponse``'s JSON, built directly: validating 3 x 500 values
        again costs more than the VM (the schema test checks the shape)."""
        n = len(items)
        tiers = slots.pair_tier if slots is not None else np.zeros(n, np.int64)
        features = None
        if body.features_for is not None:
            pos = np.asarray(body.features_for, np.int64)
            d = self.served.cfg.cache.dim
            features = {"pair": (slots.pair_emb[pos] if slots is not None
                                 else np.zeros((len(pos), d))).astype(float).tolist(),
                        "user": (slots.agg_emb[pos] if slots is not None
                                 else np.zeros((len(pos), d))).astype(float).tolist()}
        return {"request_id": body.request_id or uuid.uuid4().hex, "task": body.task,
                "mode": mode, "scores": probs.astype(float).tolist(),
                "tiers": [TIER_LABELS[t] for t in tiers.tolist()],
                "ages_s": slots.pair_age_s.tolist() if slots is not None else [0.0] * n,
                "aggregate": slots.agg_present.tolist() if slots is not None else [False] * n,
                "versions": {"fm": version if mode != "vm" else "", "vm": version,
                             "knn": self.knn_version()},
                "features": features}
