"""Every shipped Serve config goes through Ray's own app builder, as ``serve run CONFIG`` and
``serve deploy CONFIG`` put it through: each config validates against Ray Serve's deploy
schema, its import path resolves, the builder takes the one parameter Ray passes, its
``args`` build the app once with the YAML's types and once as ``serve run``'s ``key=value``
strings, and every deployment the config names exists in the built app. No cluster is
started: Ray's builder path runs in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tiny import ROOT, train_tiny

schema = pytest.importorskip("ray.serve.schema")
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary  # noqa: E402
from ray.serve._private.build_app import build_app as ray_build_app  # noqa: E402
from ray._common.utils import import_attr  # noqa: E402


def _configs() -> dict[str, dict]:
    """name -> the Serve config (a dict), for each shipped config and the RayService's."""
    out = {f"configs/{p.name}": yaml.safe_load(p.read_text())
           for p in sorted((ROOT / "configs").glob("serve*.yaml"))}
    for doc in yaml.safe_load_all((ROOT / "deploy/kuberay/rayservice.yaml").read_text()):
        if doc and doc.get("kind") == "RayService":
            out["deploy/kuberay/rayservice.yaml"] = yaml.safe_load(doc["spec"]["serveConfigV2"])
    return out


CONFIGS = _configs()


def as_cli_strings(args: dict[str, Any]) -> dict[str, str]:
    """``args`` as ``serve run IMPORT_PATH key=value ...`` passes them: every value a string
    (a mapping as its JSON)."""
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else str(v).lower()
            if isinstance(v, bool) else str(v) for k, v in args.items()}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("art") / "v1")


@pytest.fixture
def in_repo(monkeypatch, artifacts, tmp_path):
    """The builder's process as ``serve run`` leaves it: the repository as the working
    directory, the default artifacts already built (``SOLARIS_ARTIFACTS``), and the cluster
    profile's state root set."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SOLARIS_ARTIFACTS", str(artifacts))
    monkeypatch.setenv("SOLARIS_STATE_URI", str(tmp_path / "state"))


def built_deployments(import_path: str, args: dict[str, Any]) -> dict[str, Any]:
    """name -> deployment of the app Ray's builder makes from ``import_path`` and ``args``."""
    app = call_user_app_builder_with_args_if_necessary(import_attr(import_path), args)
    built = ray_build_app(app, name="solaris")
    return {d.name: d for d in built.deployments}


def test_the_configs_are_all_found():
    assert set(CONFIGS) == {"configs/serve.yaml", "configs/serve-local.yaml",
                            "deploy/kuberay/rayservice.yaml"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_serve_config_validates(name):
    conf = schema.ServeDeploySchema.model_validate(CONFIGS[name])
    (app,) = conf.applications
    assert app.import_path == "serve_app:build_app"
    # the cluster configs run the cluster profile (service token required), the local one
    # the serving profile: neither lets a client set event time or debug modes
    assert app.args["profile"] == ("serving" if name.endswith("serve-local.yaml")
                                   else "cluster")
    for d in app.deployments:
        if d.name != "Precompute":
            assert d.max_ongoing_requests and d.max_queued_requests


@pytest.mark.parametrize("typed", [True, False], ids=["yaml-types", "cli-strings"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rays_builder_builds_every_config(name, typed, in_repo, artifacts):
    (app,) = CONFIGS[name]["applications"]
    args = app["args"] if typed else as_cli_strings(app["args"])
    deployments = built_deployments(app["import_path"], args)
    tasks = sorted(json.loads((artifacts / "manifest.json").read_text())["tasks"])
    # every deployment the config names is one the app has (Serve refuses the config else)
    named = {d["name"] for d in app["deployments"]}
    assert named <= set(deployments), (
        f"{name} names deployments {sorted(named - set(deployments))} the app does not have "
        f"(its deployments: {sorted(deployments)}; the artifacts' tasks: {tasks}): give "
        f"VM options in args.vm, not per task")
    assert set(deployments) == {"LookupRouter", "Precompute", *(f"VM_{t}" for t in tasks)}
    # the replay's barriers are on the replay profile's router only
    router = deployments["LookupRouter"].func_or_class
    assert not hasattr(router, "flush_now") and not hasattr(router, "refresh_now")
    # the config's per-task VM options reach every VM deployment
    for t in tasks:
        cfg = deployments[f"VM_{t}"]
        assert cfg.max_ongoing_requests == app["args"]["vm"]["max_ongoing_requests"]
        assert cfg.max_queued_requests == app["args"]["vm"]["max_queued_requests"]


def test_the_builder_takes_the_one_parameter_ray_passes(in_repo, artifacts):
    """Ray counts every parameter (keyword-only and defaulted ones included): a builder with
    a second one is refused before it runs."""
    def two_parameter_builder(args, *, router_replicas=None):  # the shape Ray refuses
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="exactly one parameter"):
        call_user_app_builder_with_args_if_necessary(two_parameter_builder, {})
    deployments = built_deployments("serve_app:build_app",
                                    {"artifacts": str(artifacts), "router_replicas": "2",
                                     "profile": "replay"})
    assert deployments["LookupRouter"].num_replicas == 2
    router = deployments["LookupRouter"].func_or_class
    assert hasattr(router, "flush_now") and hasattr(router, "refresh_now")


@pytest.mark.parametrize("args, field", [
    ({"vm": '{"num_replica": 2}'}, "num_replica"),
    ({"vm": "{not json"}, "vm="),
    ({"router_replicas": "two"}, "router_replicas='two'"),
    ({"router_replicas": "0"}, "router_replicas='0'"),
    ({"replicas": "2"}, "replicas"),
])
def test_a_bad_app_argument_is_an_error_naming_it(args, field, in_repo, artifacts):
    from solaris.errors import ConfigError

    with pytest.raises(ConfigError, match=field.replace("{", "\\{")):
        built_deployments("serve_app:build_app", {"artifacts": str(artifacts), **args})
