"""cluster.yaml passes Ray's own cluster-config schema and has the node types SOLARIS needs.

The schema file ships inside the installed ``ray`` package; it is found by path (no
``import ray``: unit tests block it)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def ray_schema() -> dict:
    spec = importlib.util.find_spec("ray")  # locates the package without importing it
    if spec is None or spec.origin is None:
        pytest.skip("ray is not installed: no cluster-config schema to check against")
    path = Path(spec.origin).parent / "autoscaler" / "ray-schema.json"
    if not path.is_file():
        pytest.skip(f"{path}: not in this ray version")
    return json.loads(path.read_text())


def test_cluster_yaml_passes_rays_schema(cluster):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(cluster, ray_schema())


def test_schema_check_catches_a_broken_config(cluster):
    jsonschema = pytest.importorskip("jsonschema")
    broken = json.loads(json.dumps(cluster))
    broken["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, ray_schema())


def test_node_types_workers_and_resources(cluster):
    types = cluster["available_node_types"]
    assert cluster["head_node_type"] in types
    workers = {n: t for n, t in types.items() if n != cluster["head_node_type"]}
    for name, t in workers.items():
        assert 0 <= t["min_workers"] <= t["max_workers"], name
    assert sum(t["max_workers"] for t in workers.values()) <= cluster["max_workers"]
    gpu = [t for t in workers.values() if t["resources"].get("GPU", 0) >= 1]
    cpu = [t for t in workers.values() if not t["resources"].get("GPU")]
    assert len(gpu) == 1 and len(cpu) == 1
    assert gpu[0]["resources"]["fm_gpu"] == 1  # FM work can ask for the GPU nodes by name
    assert gpu[0]["min_workers"] == 0  # GPUs only while there is FM work


def test_setup_installs_torch_first_then_the_project(cluster):
    gpu = next(t for t in cluster["available_node_types"].values()
               if t["resources"].get("GPU"))
    for cmds in (cluster["setup_commands"], gpu["worker_setup_commands"]):
        torch_at = next(i for i, c in enumerate(cmds) if re.search(r"torch==2\.13\.0", c))
        project_at = next(i for i, c in enumerate(cmds) if re.search(r"pip install -e", c))
        assert torch_at < project_at
    assert "download.pytorch.org/whl/cpu" in cluster["setup_commands"][0]  # CPU build there
    assert ".venv" in cluster["rsync_exclude"]
    assert "." in cluster["file_mounts"].values()


def test_every_node_starts_ray_with_token_auth_and_the_apps_tokens(cluster):
    """The dashboard binds 0.0.0.0: Ray's token authentication guards it and the job API on
    every node, and the app's own tokens reach every node's processes by file."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in cluster[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), key
        assert all("SOLARIS_SERVICE_TOKEN_FILE=" in c and "SOLARIS_OPERATOR_TOKEN_FILE=" in c
                   for c in start), key
    assert {"~/.ray/auth_token", "~/.solaris/service_token",
            "~/.solaris/operator_token"} <= set(cluster["file_mounts"])


def test_every_node_names_one_root_for_the_apps_durable_state(cluster):
    """The cluster profile refuses to start without a state root (solaris/state.py): every
    node's Ray processes get the same SOLARIS_STATE_URI."""
    roots = set()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for c in (c for c in cluster[key] if "ray start" in c):
            m = re.search(r"SOLARIS_STATE_URI=(\S+?);", c)
            assert m, key
            roots.add(m.group(1))
    assert roots == {"s3://BUCKET/solaris-state"}
