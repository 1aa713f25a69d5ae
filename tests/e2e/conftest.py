"""End-to-end tests: the whole system on a Ray cluster of several nodes on one machine.

``multinode`` starts a head and two worker nodes with ``ray.cluster_utils.Cluster`` (their own
raylets, object stores and worker processes; a worker node can be killed) and connects this
process to it. Nothing here attaches to another Ray instance on the machine or stops one.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

ray = pytest.importorskip("ray")

HEAD = {"num_cpus": 1, "resources": {"head": 1}}
WORKER = {"num_cpus": 1, "resources": {"shard_host": 2, "fm_host": 1}}
OBJECT_STORE = 100 * 1024**2  # per node; three nodes share the machine


@dataclass
class MultiNode:
    cluster: Any  # ray.cluster_utils.Cluster
    head: Any  # ray._private.node.Node of the head (the driver's node)
    workers: list[Any]  # the worker nodes' Node objects, in the order they were added


@pytest.fixture
def multinode(monkeypatch):
    """A head (``HEAD``) and two worker nodes (``WORKER``), this process connected to the head.

    Torn down in full afterwards: Serve, the driver, every node's processes.
    """
    from ray.cluster_utils import Cluster

    # Cluster writes (and on shutdown deletes) the machine-wide "current cluster" address
    # file that a bare ``ray.init()`` reads; other engineers' local Ray owns that file
    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    monkeypatch.setattr(ray._common.utils, "reset_ray_address", lambda *a, **k: None)
    temp_dir = tempfile.mkdtemp(prefix="sol-e2e-")  # short: Ray's socket paths have a limit
    common = {"object_store_memory": OBJECT_STORE, "temp_dir": temp_dir}
    cluster = Cluster(initialize_head=True, head_node_args={
        **HEAD, **common, "include_dashboard": False})
    try:
        workers = [cluster.add_node(**WORKER, **common) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        yield MultiNode(cluster, cluster.head_node, workers)
    finally:
        try:
            from ray import serve

            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)
