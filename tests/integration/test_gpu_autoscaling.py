"""GPU FM workers that autoscale: runs ``gpu_autoscaling_scenario.py`` (Ray's autoscaling test
cluster with a fake GPU node type; its docstring tells the timeline) in a pytest process of
its own, with Ray's token authentication off, and shows its timeline (``pytest -s``).

The test cluster's start runs ``ray stop --force``, which kills every Ray on the machine: if
another Ray runs here (a developer's own cluster; a previous module's Ray gets 20 s to exit),
the test skips and says so (``SOLARIS_TEST_MAY_STOP_RAY=1`` runs it anyway).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCENARIO = HERE / "gpu_autoscaling_scenario.py"

pytestmark = pytest.mark.slow


def other_rays(grace_s: float = 20.0) -> list[int]:
    """PIDs of Ray GCS servers still running on this machine after ``grace_s``: another Ray
    that ``ray stop --force`` would kill."""
    deadline = time.monotonic() + grace_s
    while True:
        pids = []
        for d in Path("/proc").glob("[0-9]*"):
            try:
                if (d / "comm").read_text().strip() == "gcs_server":
                    pids.append(int(d.name))
            except OSError:
                continue
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.5)


def test_gpu_workers_scale_with_the_queue_and_the_node_follows():
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc to check that no other Ray runs here (ray stop --force)")
    busy = other_rays()
    if busy and os.environ.get("SOLARIS_TEST_MAY_STOP_RAY") != "1":
        pytest.skip(f"another Ray runs on this machine (GCS pids {busy}), and the autoscaling "
                    "test cluster's start runs `ray stop --force`, which would kill it; stop "
                    "it or set SOLARIS_TEST_MAY_STOP_RAY=1")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        str(SCENARIO)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout
    start = out.find("GPU autoscaling timeline")
    print("\n" + (out[start:out.find("\n\n", start) + 1] if start >= 0 else out[-3000:]))
    assert r.returncode == 0, f"the scenario failed:\n{out[-6000:]}\n{r.stderr[-3000:]}"
    assert "1 passed" in out and "lost 0" in out
