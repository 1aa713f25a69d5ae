"""The Serve config files validate against Ray Serve's own deploy schema, and name exactly
the app's deployments (LookupRouter, one VM per task of the default data, Precompute)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
schema = pytest.importorskip("ray.serve.schema")


@pytest.mark.parametrize("name", ["serve.yaml", "serve-local.yaml"])
def test_serve_config_validates(name):
    conf = schema.ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "configs" / name).read_text()))
    (app,) = conf.applications
    assert app.import_path == "serve_app:build_app"
    # the cluster config runs the cluster profile (service token required), the local one
    # the serving profile: neither lets a client set event time or debug modes
    assert app.args["profile"] == {"serve.yaml": "cluster", "serve-local.yaml": "serving"}[name]
    names = {d.name for d in app.deployments}
    assert names == {"LookupRouter", "VM_click", "VM_conversion", "Precompute"}
    for d in app.deployments:
        if d.name != "Precompute":
            assert d.max_ongoing_requests and d.max_queued_requests
