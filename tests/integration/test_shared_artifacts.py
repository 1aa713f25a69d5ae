"""An FM worker pool given a ``file://`` URI of artifacts outside the working directory: each
worker copies them into its node's cache (``solaris.artifact_store``), loads the FM from the
copy and fills the cache group with pairs of the artifacts' version."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

ray = pytest.importorskip("ray")

from actors.cache import CacheGroup  # noqa: E402
from actors.precompute import WorkerPool  # noqa: E402
from actors.queue import create_queue  # noqa: E402
from solaris.artifact_store import CACHE_ENV  # noqa: E402
from solaris.artifacts import Artifacts, SideTables  # noqa: E402
from solaris.config import CacheConfig, PrecomputeConfig, QueueConfig, load_config  # noqa: E402
from solaris.data.load import load_dataset  # noqa: E402
from solaris.features import FeatureTables  # noqa: E402
from tests import tiny  # noqa: E402


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory) -> dict[str, str]:
    """The node's artifact cache, a folder of this run, for the module's Ray (conftest.py)."""
    return {CACHE_ENV: str(tmp_path_factory.mktemp("node-cache"))}


def test_fm_workers_open_artifacts_from_a_file_uri(tmp_path_factory, ray_env, ray_local):
    art = tiny.train_tiny(tmp_path_factory.mktemp("published") / "art")
    assert not art.is_relative_to(ROOT)
    manifest = Artifacts.open(art).manifest
    node_cache = Path(ray_env[CACHE_ENV])
    cfg = load_config(None, tiny.TINY)
    ft = FeatureTables(load_dataset(cfg.data), cfg.features)
    cache = CacheGroup.create(CacheConfig(dim=cfg.encoder.width, num_shards=1,
                                          capacity=1000, deadline_ms=5000.0))
    cache.history.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    queue = create_queue(QueueConfig(capacity=1000, lease_pairs=32))
    pool = WorkerPool(PrecomputeConfig(workers=1, max_workers=1, device="cpu"),
                      art.as_uri(), SideTables.from_features(ft), None, queue, cache)
    pool.wait_ready()
    assert pool.metrics()[0]["version"] == manifest["version"]
    users = np.repeat(np.arange(4), 5)
    items = np.tile(np.arange(5), 4)
    now = np.full(len(users), float(ft.ts.max()) + 60.0)
    assert ray.get(queue.put.remote(users, items, np.ones(len(users)), now,
                                    np.zeros(len(users), np.int64),
                                    manifest["version"])) == len(users)
    pool.drain(timeout_s=60)
    assert sum(s["entries"] for s in cache.metrics()["shards"]) == len(users)
    copies = [p for p in node_cache.iterdir() if p.is_dir()]
    assert len(copies) == 1  # the worker's copy, checked against the manifest's hashes
    for name in manifest["files"]:
        assert (copies[0] / name).read_bytes() == (art / name).read_bytes()
    pool.shutdown()
    cache.shutdown()
