"""A version rollout through the live app: two FM/encoder versions precomputed side by side,
the VMs switch to the new one once its pair coverage catches up, and no answer ever mixes
versions (the features a VM reads are always of the version it was trained on)."""

from __future__ import annotations

import json
import time

import pytest

requests = pytest.importorskip("requests")

from tests.tiny import train_tiny  # noqa: E402

T0 = 1.9e9


@pytest.mark.slow
def test_vms_switch_to_the_new_version_once_it_is_covered(tmp_path, deploy_app):
    dirs = []
    for k, version in enumerate(("fm-v1", "fm-v2")):
        dirs.append(str(train_tiny(tmp_path / version, seed=k, **{"fm.version": version})))
    conf = tmp_path / "serve.yaml"
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 2, "deadline_ms": 200.0},
                                "serve": {"rollout_threshold": 0.5, "rollout_min_lookups": 300,
                                          "flush_ms": 10.0, "profile": "replay"}}))
    base = deploy_app({"artifacts": ",".join(dirs), "config": str(conf), "app_id": "roll"})
    seen: list[str] = []
    deadline = time.monotonic() + 120
    k = 0
    while time.monotonic() < deadline:
        user = k % 6  # a few users with fixed candidates: speculation pays off
        r = requests.post(base + "/rank", timeout=30, json={
            "user_id": user, "candidates": list(range(10 * user, 10 * user + 50)),
            "task": "click", "now": T0 + k})
        assert r.status_code == 200, r.text
        v = r.json()["versions"]
        assert v["fm"] == v["vm"], v  # features and VM always of one version
        seen.append(v["vm"])
        k += 1
        if seen[-1] == "fm-v2+enc16" and seen.count("fm-v2+enc16") >= 20:
            break
    assert seen[0] == "fm-v1+enc16"
    assert "fm-v2+enc16" in seen, requests.get(base + "/stats", timeout=30).json()["rollout"]
    first = seen.index("fm-v2+enc16")
    assert set(seen[first:]) == {"fm-v2+enc16"}  # a switch is final
    state = requests.get(base + "/stats", timeout=30).json()["rollout"]
    assert state["active"] == {"click": "fm-v2+enc16", "conversion": "fm-v1+enc16"}
    assert state["coverage"]["fm-v2+enc16"] >= 0.5 * state["coverage"]["fm-v1+enc16"] > 0
