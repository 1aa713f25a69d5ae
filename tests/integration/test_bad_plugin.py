"""A plug-in that does not import where the app runs fails readiness with its error, over
real HTTP on a local Ray: artifacts whose FM checkpoint names ``nosuch.module:FM`` and whose
conversion VM names ``nosuch.vm:VM``. The deployments that load them stay up: ``/healthz``
answers 503 naming each class and its ``ConfigError``, the click VM still loads, and Serve
restarts no replica meanwhile."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from tests.tiny import train_tiny  # noqa: E402

TIMEOUT_S = 15.0
BAD_FM, BAD_VM = "nosuch.module:FM", "nosuch.vm:VM"


def rename_class(path: Path, cls: str) -> None:
    """Rewrite the model class a checkpoint's config names (as a team's class saved where
    its module imported and served where it does not)."""
    import torch

    ck = torch.load(path, map_location="cpu", weights_only=True)
    ck["config"]["cls"] = cls
    torch.save(ck, path)


@pytest.fixture(scope="module")
def app(tmp_path_factory, deploy_app):
    art = train_tiny(tmp_path_factory.mktemp("artifacts"))
    manifest = json.loads((art / "manifest.json").read_text())
    assert set(manifest["tasks"]) == {"click", "conversion"}
    rename_class(art / manifest["fm"], BAD_FM)
    rename_class(art / manifest["vms"]["conversion"]["file"], BAD_VM)
    conf = tmp_path_factory.mktemp("conf") / "serve.yaml"
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 1},
                                "serve": {"health_cache_s": 0.0}}))
    return {"base": deploy_app({"artifacts": str(art), "config": str(conf),
                                "app_id": "badplugin"}, healthy=False)}


def _replicas() -> dict[str, list[str]]:
    """Each deployment's live replica actors (Serve names them after the deployment)."""
    out: dict[str, list[str]] = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["namespace"] == "serve" and "REPLICA" in a["name"]:
            for dep in ("Precompute", "VM_click", "VM_conversion", "LookupRouter"):
                if f"#{dep}#" in a["name"]:
                    out.setdefault(dep, []).append(a["name"])
    return {k: sorted(v) for k, v in out.items()}


def test_healthz_names_the_class_that_does_not_import_and_nothing_restarts(app):
    before = _replicas()
    assert set(before) == {"Precompute", "VM_click", "VM_conversion", "LookupRouter"}
    r = requests.get(app["base"] + "/healthz", timeout=TIMEOUT_S)
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unready" and body["ok"] is False
    fm = body["checks"]["fm_workers"]
    assert not fm["ok"] and fm["required"] and fm["workers"] == 0
    assert "ConfigError" in fm["detail"] and BAD_FM in fm["detail"]
    assert "cannot import 'nosuch.module'" in fm["detail"]
    assert "did not answer" not in fm["detail"]
    conv = body["checks"]["vm_conversion"]
    assert not conv["ok"] and BAD_VM in conv["detail"] and "did not load" in conv["detail"]
    assert body["checks"]["vm_click"]["ok"]
    router = body["checks"]["router"]  # the corrections the router runs (serve.overlap)
    assert not router["ok"] and BAD_VM in router["detail"]
    # the task whose VM did not load is refused as unavailable, not a 500
    r = requests.post(app["base"] + "/rank", timeout=TIMEOUT_S,
                      json={"user_id": 3, "task": "conversion", "candidates": [1, 2, 3]})
    assert r.status_code == 503, r.text
    time.sleep(8.0)  # several of Serve's health-check periods
    assert _replicas() == before  # the same replicas: none failed and none was restarted
    again = requests.get(app["base"] + "/healthz", timeout=TIMEOUT_S).json()
    assert again["checks"]["fm_workers"]["detail"] == fm["detail"]
