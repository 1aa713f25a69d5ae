"""A worker node lost under traffic, on a three-node Ray cluster on one machine.

The head holds Serve (proxy, router, VMs), the precompute queue and the ledger; the cache
shards are spread over the two worker nodes (``shard_host``) and one FM worker runs on each
(``fm_host``). Client threads post /rank for a fixed population of users, each with its own
candidates, so the verifier keeps enqueuing the pairs still missing and the FM workers keep
writing them. One worker node is then killed outright while the traffic runs.

What must hold:

- every request is answered (200, or a 503 with Retry-After), none past the client's timeout;
- the shards of the dead node restart on the surviving node, from their snapshots;
- no accepted pair is lost: after the traffic stops and the surviving FM worker drains the
  queue (the dead worker's leases come back after the lease timeout), every pair the queue
  accepted has exactly one live cache entry.

The verifier takes every candidate (``verifier.fraction`` 1.0), so every pair of the
traffic is accepted by the queue at least once (checked with the queue's counter), and
"every traffic pair is live" covers every accepted pair. The pairs a dead shard wrote after
its last snapshot are lost with its process (write-behind, ``actors/shard.py``); the test
lets every user be served once more after the restore, as production traffic would, so the
verifier enqueues them again -- the end state must still be complete.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from ray import serve  # noqa: E402

from actors.cache import CacheGroup  # noqa: E402
from actors.ledger import LedgerActor  # noqa: E402
from actors.precompute import WorkerPool  # noqa: E402
from actors.queue import create_queue  # noqa: E402
from solaris.config import EnrichConfig, HistoryConfig, PrecomputeConfig, load_config  # noqa: E402
from solaris.data.load import load_dataset  # noqa: E402
from solaris.online.scoring import Artifacts  # noqa: E402
from solaris.online.serving import settings_from_args  # noqa: E402
from solaris.tiers import Tier  # noqa: E402
from solaris.train.artifacts import train_artifacts  # noqa: E402
from tests.tiny import TINY  # noqa: E402  test_serve_app's sizes: quality is not under test

log = logging.getLogger(__name__)

APP = "mn"  # names the cache group, queue and ledger the router attaches to
NUM_SHARDS = 4  # two per worker node
# 5,760 distinct pairs: the first pass over the users (new pairs for the FM workers) lasts
# past the kill, so the FM workers usually hold leases when the node dies
USERS, CANDIDATES = 240, 24
CLIENTS = 3
T0 = 1.9e9  # event time of the traffic's start
TIMEOUT_S = 20.0  # a client's patience; nothing may take longer
ON_HEAD = {"resources": {"head": 0.01}}
SHARD_PLACEMENT = {"resources": {"shard_host": 0.5}, "scheduling_strategy": "SPREAD"}
FM_PLACEMENT = {"resources": {"fm_host": 1}}  # one FM worker per worker node


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_of(handle) -> str:
    """The node id an actor runs on (a closure run inside the actor)."""
    return ray.get(handle.__ray_call__.remote(
        lambda self: ray.get_runtime_context().get_node_id()), timeout=60)


def _wait(cond, timeout_s: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s} s")
        time.sleep(every)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    cfg = load_config(None, TINY)
    art = tmp_path_factory.mktemp("artifacts")
    train_artifacts(cfg, load_dataset(cfg.data), art, seed=0)
    return art


class Traffic:
    """Client threads posting /rank round-robin over the users; every answer recorded."""

    def __init__(self, base: str, cands: dict[int, list[int]]):
        self.base, self.cands = base, cands
        self.users = sorted(cands)
        self.results: list[tuple[int, float, float, int, str]] = []  # user, t0, t1, code, retry
        self._lock = threading.Lock()
        self._next = itertools.count()
        self.stop = threading.Event()
        self.t_start = time.monotonic()

    def client(self) -> None:
        while not self.stop.is_set():
            u = self.users[next(self._next) % len(self.users)]
            t = time.monotonic()
            body = {"user_id": u, "candidates": self.cands[u], "task": "click",
                    "now": T0 + (t - self.t_start)}
            try:
                r = requests.post(self.base + "/rank", json=body, timeout=TIMEOUT_S)
                code, retry = r.status_code, r.headers.get("retry-after", "")
            except requests.RequestException as e:
                code, retry = 0, type(e).__name__
            with self._lock:
                self.results.append((u, t, time.monotonic(), code, retry))

    def served_since(self, t: float) -> set[int]:
        """Users with a 200 to a request sent after monotonic instant ``t``."""
        with self._lock:
            return {u for u, t0, _, code, _ in self.results if t0 > t and code == 200}


@pytest.mark.slow
def test_worker_node_killed_under_traffic(multinode, artifacts, tmp_path):
    t_test = time.monotonic()
    conf = tmp_path / "solaris.yaml"
    conf.write_text(json.dumps({
        "cache": {"dim": 16, "num_shards": NUM_SHARDS, "deadline_ms": 500.0,
                  "snapshot_uri": str(tmp_path / "shards"), "snapshot_every_s": 0.5},
        "queue": {"lease_timeout_s": 3.0, "lease_pairs": 48,
                  "snapshot_uri": str(tmp_path / "queue"), "snapshot_every_s": 0.5},
        "verifier": {"fraction": 1.0},  # every missing candidate is enqueued
        "serve": {"max_candidates": 300}}))
    cfg = load_config(conf)
    art = Artifacts.open(artifacts)
    heads = {multinode.head.node_id}
    workers = {n.node_id for n in multinode.workers}

    # -- the actors, placed; the router attaches to them by name (get_if_exists)
    group = CacheGroup.create(cfg.cache, group_id=APP, actor_options=SHARD_PLACEMENT,
                              history=HistoryConfig(max_events=64, max_users=1000))
    queue = create_queue(cfg.queue, queue_id=APP, name=f"solaris-queue-{APP}",
                         actor_options=ON_HEAD)
    ledger = LedgerActor.options(name=f"solaris-ledger-{APP}", get_if_exists=True,
                                 **ON_HEAD).remote()
    pool = WorkerPool(PrecomputeConfig(workers=2, max_workers=2, device="cpu"), art.root,
                      art.side_tables(), None, queue, group, ledger,
                      actor_options=FM_PLACEMENT)
    try:
        group.wait_ready(timeout_s=90)
        pool.wait_ready(timeout_s=120)
        shard_nodes = [_node_of(h) for h in group.shards]
        fm_nodes = [_node_of(w) for w in pool.workers]
        assert set(shard_nodes) == workers, shard_nodes  # spread over both worker nodes
        assert sorted(fm_nodes) == sorted(workers), fm_nodes  # one FM worker on each
        assert _node_of(queue) in heads
        pool.start()

        # -- Serve on the head: proxy, router and VMs (build_app's graph, placed)
        import serve_app

        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port, "location": "HeadOnly"})
        settings = settings_from_args({"artifacts": str(artifacts), "config": str(conf),
                                       "app_id": APP, "precompute": "false",
                                       "profile": "replay"})
        placed = {"num_cpus": 0.1, **ON_HEAD}
        vms = {t: serve_app.VMReplicas.options(name=f"VM_{t}", ray_actor_options=placed)
               .bind(settings, t) for t in art.tasks}
        serve.run(serve_app.LookupRouter.options(name="LookupRouter", ray_actor_options=placed)
                  .bind(settings, vms, None), blocking=False)
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: requests.get(base + "/healthz", timeout=5).ok, 90, "serve up", 0.5)

        rng = np.random.default_rng(0)
        users = rng.choice(art.num_users, USERS, replace=False)  # users and items the FM
        cands = {int(u): sorted(rng.choice(art.num_items, CANDIDATES, replace=False).tolist())
                 for u in users}
        traffic = Traffic(base, cands)
        t_up = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as clients:
            for _ in range(CLIENTS):
                clients.submit(traffic.client)
            try:
                # every shard holds pairs, and two pair snapshots ran since (the first may
                # have started before the pairs were written)
                def written() -> list | None:
                    ms = group.metrics(timeout_s=10)["shards"]
                    return ms if all(m["up"] and m["entries"] > 0 for m in ms) else None
                seen = _wait(written, 60, "every shard written")
                _wait(lambda: all(m["up"] and m["snapshots"] >= s["snapshots"] + 2 for m, s in
                                  zip(group.metrics(timeout_s=10)["shards"], seen)),
                      30, "every shard snapshotted")
                before = group.metrics(timeout_s=10)["shards"]
                try:  # best effort: kill while the FM workers hold leases (first pass)
                    _wait(lambda: ray.get(queue.metrics.remote(), timeout=10)["open_leases"]
                          >= 2, 15, "leases out", 0.05)
                except TimeoutError:
                    log.warning("multinode: no leases out; killing the node anyway")
                victim = next(n for n in multinode.workers if n.node_id == shard_nodes[0])
                survivor = (workers - {victim.node_id}).pop()
                moved = [s for s, n in enumerate(shard_nodes) if n == victim.node_id]
                t_kill = time.monotonic()
                multinode.cluster.remove_node(victim, allow_graceful=False)

                # the dead node's shards restart on the survivor, from their snapshots (a
                # dying worker process may still answer for a moment: wait for the new ones)
                def restarted() -> list | None:
                    ms = group.metrics(timeout_s=5)["shards"]
                    ok = all(m["up"] for m in ms) and all(
                        ms[s]["pid"] != before[s]["pid"] for s in moved)
                    return ms if ok else None
                after = _wait(restarted, 90, "the dead node's shards restarted")
                t_back = time.monotonic()
                for s in range(NUM_SHARDS):
                    node = _node_of(group.shards[s])
                    assert node == survivor, (s, node)
                    if s in moved:
                        assert after[s]["pid"] != before[s]["pid"] and after[s]["restarted"]
                        assert after[s]["restored_entries"] > 0, after[s]
                    else:
                        assert after[s]["pid"] == before[s]["pid"]
                        assert not after[s]["restarted"]
                # every user served once more after the restore (what production traffic
                # does): pairs lost after a dead shard's last snapshot are enqueued again
                _wait(lambda: traffic.served_since(t_back) >= set(cands), 90,
                      "every user served after the restore")
            finally:
                traffic.stop.set()
        t_stop = time.monotonic()

        # -- the surviving FM worker drains the queue, the dead worker's leases included
        def drained() -> dict | None:
            q1 = ray.get(queue.metrics.remote(), timeout=10)
            time.sleep(1.0)  # the router's fire-and-forget puts settle
            q2 = ray.get(queue.metrics.remote(), timeout=10)
            idle = q2["put"] == q1["put"] and q2["depth"] == 0 and q2["leased"] == 0
            return q2 if idle else None
        q = _wait(drained, 90, "queue drained", every=0.0)
        t_drained = time.monotonic()

        # -- every request answered, in time; 503s only with Retry-After
        res = traffic.results
        codes = [c for _, _, _, c, _ in res]
        assert len(res) > USERS
        assert max(t1 - t0 for _, t0, t1, _, _ in res) < TIMEOUT_S
        assert set(codes) <= {200, 503}, sorted(set(codes))
        assert all(r for *_, c, r in res if c == 503)
        assert codes.count(200) > 0.9 * len(codes)

        # -- no accepted pair lost: each traffic pair accepted at least once, each live once
        pairs = [(u, i) for u, items in cands.items() for i in items]
        assert q["dropped"] == 0 and q["accepted"] >= len(pairs), q
        ecfg = EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)
        read_at = T0 + (t_stop - traffic.t_start) + 1.0
        missing = {}
        for u, items in cands.items():
            slots = group.lookup(u, np.array(items), read_at, art.version, None, None, ecfg,
                                 deadline_ms=10_000)
            if not (slots.pair_tier == Tier.PAIR).all():
                missing[u] = np.array(items)[slots.pair_tier != Tier.PAIR].tolist()
        assert not missing, f"accepted pairs missing from the cache: {missing}"
        final = group.metrics(timeout_s=10)["shards"]
        assert sum(m["entries"] for m in final) == len(pairs)  # one live entry per pair
        live = pool.workers[fm_nodes.index(survivor)]
        wm = ray.get(live.metrics.remote(), timeout=30)
        assert wm["written"] > 0 and not wm["restarted"]
        log.info("multinode: up %.1fs, traffic %.1fs (kill at +%.1fs, shards back +%.1fs), "
                    "drain %.1fs, total %.1fs; %d requests (%d not 200), %d pairs; moved shards "
                    "restored %s entries (%s shortly before the kill); pairs of expired leases "
                    "(the dead FM worker's) %d",
                    t_up - t_test, t_stop - t_up, t_kill - t_up, t_back - t_kill,
                    t_drained - t_stop, time.monotonic() - t_test, len(res),
                    len(res) - codes.count(200), len(pairs),
                    [after[s]["restored_entries"] for s in moved],
                    [before[s]["entries"] for s in moved], q["expired_pairs"])
    finally:
        serve.shutdown()
        pool.shutdown()
        group.shutdown()
        for h in (queue, ledger):
            ray.kill(h, no_restart=True)
