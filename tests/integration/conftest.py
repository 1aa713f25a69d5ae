"""The integration tests' one local Ray, with or without Serve, and the app factory that
deploys on it.

A module asks for ``ray_local`` (its own local Ray, started once for the module and shut down
after it; the value is its GCS address, for a job run against it), or for ``serve_ray`` (the
same with Serve's proxy on a free loopback port) and ``deploy_app`` (``serve_app.build_app``
with the args a ``serve run`` config carries, then wait for ``/healthz``). A module sets
``RAY_ENV`` (a dict) for environment variables its Ray processes need, such as the operator
token; a module whose variables name a folder made for the run overrides ``ray_env``.

A module that starts no Ray here runs a command that starts its own (``solaris replay``,
``solaris simulate``, a job in a subprocess) or a cluster of another shape
(``gpu_autoscaling_scenario.py``: Ray's autoscaling test cluster, in a process of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from tests.tiny import free_port, local_ray, local_serve, wait_healthy


@dataclass(frozen=True)
class ServeRay:
    base: str  # Serve's proxy, http://127.0.0.1:PORT
    metrics: str  # the node's Prometheus text


@pytest.fixture(scope="module")
def ray_env(request) -> dict[str, str] | None:
    """Environment variables for the module's Ray processes: its ``RAY_ENV``, if any."""
    return getattr(request.module, "RAY_ENV", None)


@pytest.fixture(scope="module")
def ray_local(ray_env: dict[str, str] | None) -> Iterator[str]:
    """The module's local Ray without Serve (2 logical CPUs); yields its GCS address."""
    with local_ray(env=ray_env) as gcs:
        yield gcs


@pytest.fixture(scope="module")
def serve_ray(ray_env: dict[str, str] | None) -> Iterator[ServeRay]:
    """The module's local Ray with Serve's proxy on a free loopback port."""
    metrics_port = free_port()
    with local_serve(free_port(), env=ray_env, metrics_port=metrics_port) as base:
        yield ServeRay(base, f"http://127.0.0.1:{metrics_port}/metrics")


@pytest.fixture(scope="module")
def deploy_app(serve_ray: ServeRay) -> Callable[..., str]:
    """``deploy_app(args, healthy=True)``: the app built from ``args`` replaces this module's
    app (Serve's ``default``); with ``healthy``, returns once ``/healthz`` answers 200."""
    from ray import serve

    import serve_app

    def deploy(args: dict[str, Any], healthy: bool = True, timeout_s: float = 120.0) -> str:
        serve.run(serve_app.build_app(args), blocking=False)
        if healthy:
            wait_healthy(serve_ray.base, timeout_s)
        return serve_ray.base

    return deploy
