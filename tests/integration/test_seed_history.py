"""``jobs/seed_history.py`` against a running app's cache shards on a real local Ray: a team's
log with string ids seeds each user's last events under the codes the app's router gives
them (an id the map lacks under its provisional code); a second run adds nothing; a run cut
short resumes after its last chunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

ray = pytest.importorskip("ray")

from actors.cache import CacheGroup  # noqa: E402
from solaris.config import CacheConfig, HistoryConfig  # noqa: E402
from solaris.data.generic import load_generic_yaml  # noqa: E402
from solaris.ids import IdMap  # noqa: E402
from solaris.seeding import seed_history  # noqa: E402

APP = "seedtest"
MAX_EVENTS = 8
SETTINGS = ["--set", "cache.num_shards=2", "--set", "cache.dim=16",
            "--set", f"history.max_events={MAX_EVENTS}"]


def test_without_a_running_cluster_the_job_says_how_to_start_one(tmp_path) -> None:
    """No --address, no RAY_ADDRESS and no Ray running on this machine (this test runs before
    the module's cluster starts): the job starts no Ray of its own and says what to run."""
    running = subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True, text=True)
    if running.stdout.strip():  # Ray's "auto" would join that one, as a user's job should
        pytest.skip(f"another Ray runs on this machine (gcs_server pids "
                    f"{running.stdout.split()}): this test needs none")
    mapping, art, _ = write_log(tmp_path / "log")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run([sys.executable, str(ROOT / "jobs" / "seed_history.py"), "--data",
                        str(mapping), "--artifacts", str(art), "--app-id", APP, *SETTINGS],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(tmp_path)})
    assert p.returncode == 2, p.stderr
    assert "no Ray cluster runs on this machine" in p.stderr
    assert "ray start --head" in p.stderr


@pytest.fixture(scope="module")
def app_shards(ray_local):
    """The cache shards an app named ``seedtest`` runs, in Serve's namespace, on the module's
    local Ray (conftest.py), and that Ray's GCS address."""
    group = CacheGroup.create(CacheConfig(dim=16, num_shards=2), group_id=APP,
                              namespace="serve",
                              history=HistoryConfig(max_events=MAX_EVENTS, max_users=1000))
    group.wait_ready()
    return group, ray_local


def write_log(root: Path) -> tuple[Path, Path, IdMap]:
    """A log of 40 users (string ids, not in sorted order) over 30 items, 12 events each,
    and a deployment map that knows 35 of the users (the last 5 arrived since)."""
    rng = np.random.default_rng(0)
    users = [f"user-{(k * 37) % 101:03d}" for k in range(40)]
    items = [f"item-{(k * 13) % 31:02d}" for k in range(30)]
    rows = [{"uid": users[u], "iid": items[int(rng.integers(30))], "t": 1000 + 10 * e + u,
             "click": int(rng.integers(2))} for e in range(12) for u in range(40)]
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "log.parquet")
    (root / "mapping.yaml").write_text(yaml.safe_dump({
        "interactions": "log.parquet",
        "mapping": {"user": "uid", "item": "iid", "timestamp": "t",
                    "labels": {"click": "click"}}}))
    ids = IdMap.of(pa.array(users[:35][::-1]), pa.array(items))
    art = root / "artifacts"
    ids.save(art)
    return root / "mapping.yaml", art, ids


def run(gcs: str, *args: str) -> tuple[int, dict | None, str]:
    cmd = [sys.executable, str(ROOT / "jobs" / "seed_history.py"), "--address", gcs,
           "--app-id", APP, *SETTINGS, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, json.loads(lines[-1]) if lines else None, p.stderr


def windows(group: CacheGroup, codes: np.ndarray) -> dict[str, np.ndarray]:
    return group.history.window(codes, np.full(len(codes), 1e9), MAX_EVENTS)


def test_seeding_a_running_app_is_idempotent_and_resumes(app_shards, tmp_path) -> None:
    group, gcs = app_shards
    mapping, art, ids = write_log(tmp_path / "log")
    state = tmp_path / "state.json"
    code, out, err = run(gcs, "--data", str(mapping), "--artifacts", str(art),
                         "--chunk-rows", "100", "--state", str(state))
    assert code == 0, err
    assert out["events"] == 40 * MAX_EVENTS and out["sent"] == out["events"]
    assert out["chunks"] > 1 and out["events_per_s"] > 0

    # each user's last MAX_EVENTS events, under the code the router gives the raw id
    ds = load_generic_yaml(mapping, ids=ids)
    u, i, _, _, ts = seed_history(ds, float("inf"), MAX_EVENTS)
    raw_users = ds.users.column("raw_id").to_pylist()
    raw_items = ds.items.column("raw_id").to_pylist()
    served = ids.users.codes(raw_users, "user_id")  # 35 known codes + 5 provisional
    assert (served[:35] < 35).all() and (served[35:] >= 2**61).all()
    first = windows(group, served)
    for k, raw in enumerate(raw_users):
        mine = u == k
        want_items = ids.items.codes([raw_items[j] for j in i[mine]], "items")[::-1]
        got = first["valid"][k]
        assert got.sum() == MAX_EVENTS, raw
        np.testing.assert_array_equal(first["item"][k][got], want_items)
        np.testing.assert_array_equal(first["ts"][k][got], ts[mine][::-1])

    # the same command again (state gone): every event is already there, nothing added
    state.unlink()
    code, again, err = run(gcs, "--data", str(mapping), "--artifacts", str(art),
                           "--chunk-rows", "100", "--state", str(state))
    assert code == 0, err
    assert again["sent"] == out["events"] and again["resumed_after"] == 0
    second = windows(group, served)
    for key in ("valid", "item", "ts", "bits"):
        np.testing.assert_array_equal(second[key], first[key])
    counts = group.metrics()["shards"]
    assert sum(s["history"]["seed_present"] for s in counts) == out["events"]

    # cut short after one chunk: the next run carries on from the second
    st = json.loads(state.read_text())
    state.write_text(json.dumps({**st, "done": 1}))
    code, resumed, err = run(gcs, "--data", str(mapping), "--artifacts", str(art),
                             "--chunk-rows", "100", "--state", str(state))
    assert code == 0, err
    assert resumed["resumed_after"] == 1 and resumed["sent"] < out["events"]
    np.testing.assert_array_equal(windows(group, served)["item"], first["item"])


def test_no_such_app_is_a_clear_error(app_shards, tmp_path) -> None:
    _, gcs = app_shards
    mapping, art, _ = write_log(tmp_path / "log")
    code, out, err = run(gcs, "--data", str(mapping), "--artifacts", str(art),
                         "--app-id", "nope")
    assert code == 2 and out is None
    assert f"the Ray cluster at {gcs} runs no app 'nope'" in err


def test_the_guides_command_joins_the_running_app(app_shards, tmp_path) -> None:
    """The guide's command as written (no --address, no RAY_ADDRESS) finds the cluster the
    app runs on and seeds it."""
    mapping, art, _ = write_log(tmp_path / "log")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run([sys.executable, str(ROOT / "jobs" / "seed_history.py"), "--data",
                        str(mapping), "--artifacts", str(art), "--app-id", APP, *SETTINGS,
                        "--state", str(tmp_path / "state.json")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    out = json.loads([x for x in p.stdout.splitlines() if x.startswith("{")][-1])
    assert out["app_id"] == APP and out["events"] == 40 * MAX_EVENTS
