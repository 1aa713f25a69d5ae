"""The integration tests' one local Ray with Serve, and the app factory that deploys on it.

A module asks for ``serve_ray`` (its own local Ray, started once for the module and shut down
after it, Serve's proxy on a free loopback port) and ``deploy_app`` (``serve_app.build_app``
with the args a ``serve run`` config carries, then wait for ``/healthz``). A module sets
``RAY_ENV`` (a dict) for environment variables its app's processes need, such as the
operator token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from tests.tiny import free_port, local_serve, wait_healthy


@dataclass(frozen=True)
class ServeRay:
    base: str  # Serve's proxy, http://127.0.0.1:PORT
    metrics: str  # the node's Prometheus text


@pytest.fixture(scope="module")
def serve_ray(request) -> Iterator[ServeRay]:
    metrics_port = free_port()
    with local_serve(free_port(), env=getattr(request.module, "RAY_ENV", None),
                     metrics_port=metrics_port) as base:
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
