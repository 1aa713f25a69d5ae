"""The SOLARIS Ray Serve app: a lookup router (HTTP ingress) and the vertical models.

    serve run serve_app:app                      # local: default artifacts, built once if missing
    serve run serve_app:build_app config=PATH    # a config tree (YAML) with a serve: section
    serve run configs/serve-local.yaml           # a Serve config file: replicas, queues
    serve deploy configs/serve.yaml              # the same onto a running cluster

The deployments live in ``serve/``: ``serve.router.LookupRouter`` (``POST /rank``: cache
lookup, the task's VM, the answer, then speculation; its routes in ``serve.routes``), ``serve.vm.VMReplicas`` (one task's
VMs behind ``@serve.batch``, deployed as ``VM_<task>``) and ``serve.precompute.Precompute``
(the FM worker pools and the gauges); ``serve.http`` holds the HTTP schemas, the problem
answers and the body limit. Errors become HTTP codes there only: malformed input is a 4xx
naming the field, unknown ids are served through the fallbacks, a missing VM replica is a 503
with Retry-After after one retry.
"""

from __future__ import annotations

import os
from typing import Any

from serve.http import FeedbackRequest, RankRequest, RankResponse, ScaleRequest
from serve.precompute import Precompute
from serve.router import LookupRouter, router_for
from serve.vm import VMReplicas
from solaris.config import load_config
from solaris.artifacts import Artifacts
from solaris.online.serving import (default_artifacts_dir, deployment_options, positive_int,
                                    settings_from_args)
from solaris.train.artifacts import ensure_artifacts
from solaris.state import durable_overrides

__all__ = ["FeedbackRequest", "LookupRouter", "Precompute", "RankRequest", "RankResponse",
           "ScaleRequest", "VMReplicas", "build_app"]


def build_app(args: dict[str, Any] | None = None) -> Any:
    """The Serve application, as Ray's app builder calls it (one parameter: the ``args`` of
    ``serve run serve_app:build_app key=value ...`` as strings, or a config file's ``args``
    with their YAML types).

    ``config`` (YAML of the config tree), ``artifacts`` (a directory; a comma-separated list
    rolls out the later versions), ``mode`` (solaris | vm | inline), ``app_id``, ``profile``
    (serving | cluster | replay: whose clock event time is, and who may call what;
    ``serve/auth.py``; cluster also keeps the app's state under ``$SOLARIS_STATE_URI``,
    ``solaris/state.py``), ``precompute`` (false: no FM workers), and the deployments' options
    where a config file cannot name them: ``vm`` (Serve options applied to every ``VM_<task>``
    deployment, one per task of the artifacts, so a config never names the tasks),
    ``router_replicas`` (a fixed number of router replicas). Relative paths in ``config`` and
    ``artifacts`` resolve against the working directory of the Ray the app is built on: the
    shell's for a ``serve run`` that starts its own Ray, the directory ``ray start`` ran in
    for ``serve deploy`` (or a ``serve run`` joining that cluster)."""
    args = dict(args or {})
    vm_opts = deployment_options(args.pop("vm", None), "vm")
    router_replicas = positive_int(args.pop("router_replicas", None), "router_replicas")
    settings = settings_from_args(args)
    cfg = load_config(settings.get("config"), settings.get("overrides"))
    # the cluster profile's durable state (solaris/state.py), resolved here once: every
    # deployment reads the same locations from its overrides, whatever its node's environment
    settings["overrides"].update(durable_overrides(cfg, settings["app_id"], os.environ))
    if not settings["artifact_dirs"]:
        settings["artifact_dirs"] = [str(ensure_artifacts(cfg, default_artifacts_dir(cfg)))]
    tasks = sorted({t for d in settings["artifact_dirs"] for t in Artifacts.open(d).tasks})
    vms = {t: VMReplicas.options(name=f"VM_{t}", **vm_opts).bind(settings, t) for t in tasks}
    pre = Precompute.bind(settings) if settings["precompute"] else None
    opts = {"num_replicas": router_replicas} if router_replicas else {}
    # the replay profile's router adds the replay's barriers (serve/router.py)
    router = router_for(cfg.serve.profile)
    return router.options(name="LookupRouter", **opts).bind(settings, vms, pre)


def __getattr__(name: str) -> Any:
    """``serve run serve_app:app`` builds the default app on first access (not at import,
    so replicas importing this module never build anything)."""
    if name == "app":
        return build_app({})
    raise AttributeError(name)
