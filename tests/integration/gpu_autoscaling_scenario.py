"""GPU FM workers that autoscale, on Ray's autoscaling test cluster with a fake GPU node type
(the scenario; ``test_gpu_autoscaling.py`` runs it in a process of its own).

The head has CPUs only; the autoscaler may launch one ``gpu_worker`` node
(``{"CPU": 1, "GPU": 1, "fm_gpu": 1}``, min 0, as cluster.yaml's type asks the cloud for).
The pool starts empty (the cluster profile's ``workers`` and ``min_workers``: 0) and asks
for the accelerator resources whether or not a GPU node is up (``accelerator: always``;
``device: cpu``: the fake GPU is only a resource, the worker runs torch on the CPU). The
timeline, recorded and asserted: pairs are queued, a worker is requested and pending, the
autoscaler launches the node, the worker runs and the queue drains, the pool retires the
worker after its idle cool-down, and the node goes after the autoscaler's idle timeout; no
pair is lost.

Why a process of its own: the test cluster needs Ray's token authentication off
(``RAY_AUTH_MODE=disabled``), and a Ray client process keeps the authentication mode it first
saw -- a pytest process that ran another module's local Ray (token mode) cannot talk to it,
nor, after it, to the next module's. ``AutoscalingCluster.start()`` and ``shutdown()`` run
``ray stop --force``: see the wrapper for the check that no other Ray runs here.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

ray = pytest.importorskip("ray")

from ray.cluster_utils import AutoscalingCluster  # noqa: E402

from tests import tiny  # noqa: E402
from actors.cache import CacheGroup  # noqa: E402
from actors.precompute import WorkerPool  # noqa: E402
from actors.queue import create_queue  # noqa: E402
from solaris.artifacts import SideTables  # noqa: E402
from solaris.config import (CacheConfig, EnrichConfig, HistoryConfig,  # noqa: E402
                            PrecomputeConfig, QueueConfig, load_config)
from solaris.data.load import load_dataset  # noqa: E402
from solaris.features import FeatureTables  # noqa: E402
from solaris.tiers import Tier  # noqa: E402
from solaris.train.artifacts import train_artifacts  # noqa: E402

pytestmark = pytest.mark.slow

MB = 1024**2
HEAD = {"CPU": 2, "object_store_memory": 120 * MB}
GPU_NODE = {"CPU": 1, "GPU": 1, "fm_gpu": 1, "object_store_memory": 80 * MB}
IDLE_TIMEOUT_MIN = 0.1  # the autoscaler stops an idle node after 6 s
REQUESTS, PER_REQUEST = 12, 8  # 96 pairs
LEASE_PAIRS = 16
# workers / min_workers unset: the cluster profile's 0 and 0; the default accelerator
# resources ({"GPU": 1, "fm_gpu": 1}), asked for although the worker computes on the CPU
POOL = PrecomputeConfig(max_workers=1, scale_up_depth=40, scale_down_after_s=3.0,
                        device="cpu", accelerator="always")
TICK_S = 0.5
TIMEOUT_S = 150.0


class FakeGpuCluster(AutoscalingCluster):
    """``AutoscalingCluster`` with the whole autoscaler config written here: the wheel lacks
    the fake provider's ``example.yaml`` the base class starts from."""

    def _generate_config(self, head_resources: dict, worker_node_types: dict,
                         autoscaler_v2: bool = False, **config_kwargs) -> dict:
        assert not autoscaler_v2
        config = {
            "cluster_name": "solaris-fake-gpu", "max_workers": 1, "upscaling_speed": 1.0,
            "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "head_node_type": "ray.head.default",
            "available_node_types": {
                "ray.head.default": {"resources": dict(head_resources), "node_config": {},
                                     "max_workers": 0},
                **worker_node_types},
            "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
            "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": []}
        config.update(config_kwargs)
        return config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny artifacts, their side tables, the log (the cache shards' history) and the pairs
    to queue (REQUESTS requests of PER_REQUEST candidates)."""
    cfg = load_config(None, tiny.TINY)
    ds = load_dataset(cfg.data)
    art = tmp_path_factory.mktemp("artifacts")
    manifest = train_artifacts(cfg, ds, art, seed=0)
    ft = FeatureTables(ds, cfg.features)
    rng = np.random.default_rng(0)
    users = rng.choice(np.unique(ft.user), REQUESTS, replace=False)
    items = np.concatenate([rng.choice(ds.num_items, PER_REQUEST, replace=False)
                            for _ in users])
    now = np.repeat(float(ft.ts.max()) + 60.0 + 10.0 * np.arange(REQUESTS), PER_REQUEST)
    surf = np.repeat(rng.integers(0, ds.spec.num_surfaces, REQUESTS), PER_REQUEST)
    pairs = (np.repeat(users, PER_REQUEST), items, rng.random(len(items)), now, surf)
    return dict(artifacts=art, version=manifest["version"], dim=cfg.encoder.width,
                tables=SideTables.from_features(ft),
                log=(ft.user, ft.item, ft.surface, ft.labels, ft.ts), pairs=pairs)


# not conftest.py's ray_local: Ray's autoscaling test cluster (a head and a node type the
# autoscaler launches), with token authentication off (the module docstring says why)
@pytest.fixture(scope="module")
def fake_cluster(world):
    if ray.is_initialized():  # never beside another module's Ray
        ray.shutdown()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")  # loopback test cluster: no token
        # the cluster helper runs the ``ray`` CLI: this interpreter's
        mp.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        cluster = FakeGpuCluster(head_resources=dict(HEAD),
                                 worker_node_types={"gpu_worker": {
                                     "resources": dict(GPU_NODE), "node_config": {},
                                     "min_workers": 0, "max_workers": 1}})
        try:
            cluster.start()
            ray.init(address="auto", logging_level="warning",
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
            yield cluster
        finally:
            try:
                ray.shutdown()
            finally:
                cluster.shutdown()


def gpu_nodes() -> int:
    """Alive nodes that hold the fake GPU node type's custom resource."""
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("fm_gpu"))


def test_gpu_workers_scale_with_the_queue_and_the_node_follows(fake_cluster, world):
    assert gpu_nodes() == 0 and ray.cluster_resources().get("GPU", 0) == 0
    cache = CacheGroup.create(CacheConfig(dim=world["dim"], num_shards=2, capacity=10_000,
                                          deadline_ms=5000.0),
                              history=HistoryConfig(max_events=64, max_users=1000))
    queue = create_queue(QueueConfig(capacity=10_000, lease_timeout_s=10.0,
                                     lease_pairs=LEASE_PAIRS))
    pool = WorkerPool(POOL, world["artifacts"], world["tables"], None, queue, cache,
                      profile="cluster", name="fake-gpu")
    try:
        assert cache.history.replay_log(*world["log"]) == len(world["log"][0])
        assert pool.options["num_gpus"] == 1 and pool.options["resources"] == {"fm_gpu": 1}
        assert not pool.workers and pool.cfg.min_workers == 0
        pool.start()  # no worker yet: the pool starts those it adds
        users, items, prios, now, surf = world["pairs"]
        enqueued = ray.get(queue.put.remote(users, items, prios, now, surf, world["version"]))
        assert enqueued == len(users)
        t0 = time.monotonic()
        events: dict[str, float] = {}
        seen: dict[str, int] = {"max_pending": 0, "max_workers": 0}
        device = None

        def mark(name: str) -> None:
            if name not in events:
                events[name] = round(time.monotonic() - t0, 1)

        q = ray.get(queue.metrics.remote())
        mark("queued")
        figures = {"queue depth": q["depth"]}
        while "node gone" not in events:
            assert time.monotonic() - t0 < TIMEOUT_S, f"timeline stuck: {events}, {q}"
            st = pool.tick(q)
            q = ray.get(queue.metrics.remote())
            nodes = gpu_nodes()
            seen["max_pending"] = max(seen["max_pending"], st["pending"])
            seen["max_workers"] = max(seen["max_workers"], st["workers"])
            if st["workers"] and st["pending"]:
                mark("workers requested")
            if nodes:
                mark("node launched")
            if st["workers"] and not st["pending"]:
                mark("worker running")
                if device is None:
                    device = pool.metrics(timeout_s=30)[0]["device"]
            if q["depth"] == 0 and q["leased"] == 0:
                mark("queue drained")
            if "queue drained" in events and not st["workers"] and not st["retiring"]:
                mark("workers removed")
            if "workers removed" in events and not nodes:
                mark("node gone")
            time.sleep(TICK_S)

        written = sum(s["entries"] for s in cache.metrics()["shards"])
        lost = enqueued - written - q["depth"] - q["leased"]
        print("\nGPU autoscaling timeline (seconds after the pairs were queued):")
        for name, t in events.items():
            print(f"  {t:6.1f}  {name}")
        print(f"  queue depth {figures['queue depth']}, pending workers seen "
              f"{seen['max_pending']}, written {written}, lost {lost}, "
              f"worker device {device}, errors {pool.errors}")

        order = ["queued", "workers requested", "node launched", "worker running",
                 "queue drained", "workers removed", "node gone"]
        assert list(events) == order, events  # in the order they were seen
        assert all(events[a] <= events[b] for a, b in zip(order, order[1:])), events
        assert events["workers requested"] < events["node launched"]  # pending first
        assert events["workers removed"] - events["queue drained"] >= POOL.scale_down_after_s
        assert seen["max_pending"] == 1 and seen["max_workers"] == 1
        assert figures["queue depth"] == enqueued == REQUESTS * PER_REQUEST
        assert lost == 0 and written == enqueued  # each pair computed and written once
        assert q["expired_leases"] == 0 and q["late_acks"] == 0
        assert device == "cpu" and pool.errors == 0
        ecfg = EnrichConfig(user_knn_probe=0, item_tier=False, aggregate=False)
        for u in np.unique(users).tolist():
            slots = cache.lookup(u, items[users == u], float(now.max()) + 1.0,
                                 world["version"], None, None, ecfg)
            assert (slots.pair_tier == Tier.PAIR).all(), f"user {u}: pairs missing"
    finally:
        pool.shutdown()
        cache.shutdown()
        ray.kill(queue, no_restart=True)
