"""The rank pipeline, the after-answer work and the rollout driver without Ray: a tiny trained
artifact, the VM scored in process, lookups that are plain functions. A request with no
SOLARIS input is the VM alone, bit for bit; the corrections run beside the VM alone give the
residual VM's scores; every refusal names its field; the after-answer work flushes by size
and its barrier waits for every answered request."""

from __future__ import annotations

import asyncio
import time
import zlib

import numpy as np
import pytest

from serve.http import RankRequest
from solaris.cache.query import Slots
from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.online.after_answer import AfterAnswerWork, Senders
from solaris.online.rank import (EventTime, Problem, RankPipeline, Ranked, Served, Stages,
                                 Unavailable)
from solaris.online.rollout import RolloutPolicy, Rollouts
from solaris.online.scales import ScaleTable
from solaris.online.scoring import ResidualHead, ScoreRequest, VMScorer
from solaris.online.verifier import BudgetController
from solaris.tiers import LABELS, Tier
from solaris.train.artifacts import train_artifacts
from tests.unit.test_scoring import TINY  # the scorers' tiny world

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    cfg = load_config(None, TINY)
    out = tmp_path_factory.mktemp("art")
    train_artifacts(cfg, load_dataset(cfg.data), out, seed=0)
    return str(out)


def slots_for(items: np.ndarray, dim: int, seed: int = 0) -> Slots:
    """Slots with a pair embedding for every other candidate and an aggregate for all."""
    rng = np.random.default_rng(seed)
    c = len(items)
    pair = np.arange(c) % 2 == 0
    emb = rng.normal(size=(c, dim)).astype(np.float32)
    return Slots(pair_emb=np.where(pair[:, None], emb, np.nan).astype(np.float32),
                 pair_present=pair, pair_tier=np.where(pair, Tier.PAIR, Tier.NONE),
                 pair_age_s=np.where(pair, 30.0, 0.0),
                 agg_emb=rng.normal(size=(c, dim)).astype(np.float32),
                 agg_present=np.ones(c, bool), missing=~pair)


class World:
    """A pipeline over the trained artifact, its VM scored in process; the stages record
    their calls."""

    def __init__(self, root: str, overlap: bool = True, fail_score: bool = False,
                 fail_lookup: bool = False, **serve: object):
        cfg = load_config(None, {**TINY, **{f"serve.{k}": v for k, v in serve.items()}})
        self.served = Served.open(cfg, [root])
        self.art = self.served.arts[next(iter(self.served.arts))]
        self.version = self.art.version
        self.vm = VMScorer(self.art, "click", self.art.side_tables(), cfg.cache.read_ttl_s)
        self.calls: list[str] = []
        self.fail_score, self.fail_lookup = fail_score, fail_lookup
        self.scales = ScaleTable(self.served.manifests)
        heads = ({(self.version, "click"): ResidualHead(self.art, "click", cfg.cache.read_ttl_s)}
                 if overlap else {})
        self.pipeline = RankPipeline(
            self.served, Stages(self.lookup, self.inline, self.score),
            lambda: self.scales, lambda task: self.version, lambda: "knn-1", EventTime(cfg),
            heads)

    async def lookup(self, user, items, now, version, surface, steps, reads):
        self.calls.append("lookup")
        await asyncio.sleep(0)
        if self.fail_lookup:
            raise TimeoutError("a shard missed the deadline")
        return slots_for(items, self.vm.dim)

    async def inline(self, user, items, surface, now):
        self.calls.append("inline")
        return None

    async def score(self, task, version, req, method="score"):
        self.calls.append(method)
        await asyncio.sleep(0.01)
        if self.fail_score:
            raise Unavailable(f"no VM replica for task {task!r} answered: RayActorError")
        if method == "base":
            return self.vm.base_logits([req])[0]
        return self.vm.score([req], with_base=True)[0]

    def rank(self, **fields) -> Ranked | Problem:
        body = RankRequest(**{"user_id": 3, "candidates": list(range(20)), "task": "click",
                              **fields})
        return asyncio.run(self.pipeline.rank(body, 1000.0))


def test_a_request_with_no_solaris_input_is_the_vm_alone_bit_for_bit(trained):
    w = World(trained, mode="vm")
    out = w.rank(candidates=[5, 1, 140, 7])
    alone = w.vm.score([ScoreRequest(3, np.array([5, 1, 140, 7]), 0, None)])[0]
    assert isinstance(out, Ranked) and out.mode == "vm" and out.after is None
    assert out.response["scores"] == alone.astype(float).tolist()
    assert out.response["tiers"] == [LABELS[Tier.NONE]] * 4
    assert out.response["versions"] == {"fm": "", "vm": w.version, "knn": "knn-1"}
    assert w.calls == ["score"]  # nothing looked up


def test_corrections_beside_the_vm_alone_equal_the_residual_vm_at_the_replica(trained):
    beside, whole = World(trained, overlap=True), World(trained, overlap=False)
    a, b = beside.rank(), whole.rank()
    assert sorted(beside.calls) == ["base", "lookup"] and whole.calls == ["lookup", "score"]
    np.testing.assert_allclose(a.response["scores"], b.response["scores"], rtol=1e-6)
    tiers = [LABELS[Tier.PAIR] if i % 2 == 0 else LABELS[Tier.NONE] for i in range(20)]
    assert a.response["tiers"] == b.response["tiers"] == tiers
    assert a.response["ages_s"][:2] == [30.0, 0.0]
    assert a.after is not None and len(a.after[1]) == 20  # the after-answer work's inputs
    assert {"enrich", "vm", "answer", "head"} <= set(beside.pipeline.phases.by_mode["solaris"][0])


@pytest.mark.parametrize("fields,field", [
    ({"task": "purchase"}, "task"),
    ({"candidates": list(range(51))}, "candidates"),
    ({"features_for": [0, 20]}, "features_for"),
    ({"reads": "replica"}, "reads"),
    ({"features": {"no_such_feature": 1.0}}, "features"),
])
def test_each_refusal_names_its_field_and_calls_nothing(trained, fields, field):
    w = World(trained, max_candidates=50)
    out = w.rank(**fields)
    assert isinstance(out, Problem) and out.status == 422 and out.field == field, out
    assert w.calls == []


def test_a_vm_that_does_not_answer_is_a_503_and_a_failed_lookup_cancels_the_vm_call(trained):
    out = World(trained, fail_score=True).rank()
    assert isinstance(out, Problem) and (out.status, out.field) == (503, "task")
    w = World(trained, fail_lookup=True)
    with pytest.raises(TimeoutError):
        w.rank()
    assert w.calls == ["base", "lookup"] or w.calls == ["lookup", "base"]


def test_the_event_time_is_the_servers_outside_the_replay_profile(trained):
    serving = EventTime(load_config(None, {**TINY, "serve.profile": "serving"}))
    body = RankRequest(user_id=1, candidates=[1], task="click", now=5.0)
    refused = serving.of(body)
    assert isinstance(refused, Problem) and refused.field == "now"
    replay = EventTime(load_config(None, {**TINY, "serve.profile": "replay"}))
    assert replay.of(body) == 5.0


class Sent:
    def __init__(self):
        self.impressions: list = []
        self.picks: list = []
        self.counted: list = []

    def senders(self) -> Senders:
        def picks(version, users, items, prios, nows, surfaces):
            self.picks.append((version, np.asarray(users).tolist()))

        return Senders(self.impressions.extend, picks,
                       lambda tiers, agg, n: self.counted.append((tiers.tolist(), agg, n)))


def test_after_answer_flushes_by_size_and_its_barrier_waits_for_every_request(trained):
    w = World(trained, flush_requests=2, flush_ms=10_000)
    cfg = w.served.cfg
    policy = RolloutPolicy({"click": [w.version]}, cfg.serve.rollout_threshold,
                           cfg.serve.rollout_min_lookups)
    sent = Sent()
    work = AfterAnswerWork(w.served, Rollouts(policy, ["click"], w.lookup, lambda t, v: None),
                           sent.senders(), BudgetController(cfg.verifier, lambda: 0.0))

    async def serve_three() -> None:
        for user in (3, 4, 5):
            out = await w.pipeline.rank(RankRequest(user_id=user, candidates=list(range(20)),
                                                    task="click"), 1000.0)
            work.begin()
            await work.run(*out.after)
            if user == 4:  # two requests: the buffer is full and was sent
                assert len(sent.counted) == 1 and work.pending == 0
        assert len(sent.counted) == 1  # the third waits for the timer, or the barrier
        await work.barrier(time.monotonic() + 5.0)

    asyncio.run(serve_three())
    top_k = cfg.serve.impressions_top_k
    assert [u for u, *_ in sent.impressions] == [3, 4, 5]
    assert all(len(items) == top_k for _, items, *_ in sent.impressions)
    assert work.counts["requests"] == 3 and work.counts["flushes"] == 2
    # the candidates by tier, counted once each: 10 pairs and 10 misses per request
    assert sum(np.asarray(t) for t, _, _ in sent.counted)[Tier.PAIR] == 30
    assert sum(agg for _, agg, _ in sent.counted) == 60
    assert all(v == w.version for v, _ in sent.picks)


def test_rollouts_at_the_barrier_apply_in_event_time_order_and_shadow_by_request_id():
    policy = RolloutPolicy({"click": ["v1", "v2"]}, 0.5, 1)
    promoted: list = []
    r = Rollouts(policy, ["click"], None, lambda t, v: promoted.append((t, v)), shadow_every=4,
                 at_barrier=True)
    r.observe(20.0, "b", "v2", 9, 10)
    r.observe(10.0, "a", "v1", 8, 10)
    assert policy.coverage("v1") == 0.0 and not promoted  # kept for the barrier
    r.decide_at_barrier()
    assert promoted == [("click", "v2")] and policy.active["click"] == "v2"
    assert r.observed == []
    due = [rid for rid in map(str, range(40)) if r.shadow_due(rid, 1)]
    assert due == [rid for rid in map(str, range(40)) if zlib.crc32(rid.encode()) % 4 == 0]
    live = Rollouts(RolloutPolicy({"click": ["v1"]}, 0.5, 1), ["click"], None, None)
    assert [live.shadow_due("x", n) for n in (3, 4, 8)] == [False, True, True]
