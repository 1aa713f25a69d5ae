"""The HTTP API's reference pages, generated beside the app they describe: ``http.md`` (every
route, who may call it, its request and response bodies) and ``openapi.json`` (the schema
itself), from the app's OpenAPI schema.

``pyproject.toml`` registers both pages (entry-point group ``solaris.reference_pages``), so
``python -m solaris.reference`` writes and ``--check`` checks them with the core's pages; the
core turns the schema into Markdown (``solaris.reference.openapi_page``) and imports nothing
of the app. Importing this module imports no Ray: ``openapi`` builds the routes a router
replica serves (``serve.routes``, which imports Ray; nothing is started) when a page is
rendered.
"""

from __future__ import annotations

import json
from typing import Any

from solaris import reference

# who may call a route, by the guard among its dependencies (serve/auth.py)
_ACCESS = {"operator_call": "the operator's bearer token",
           "service_call": "the service token, where one is configured",
           "read_call": "either token where a service token is configured, else open"}


def openapi() -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """The app's OpenAPI schema, and who may call each (method, path)."""
    from serve import auth
    from serve.routes import build_api  # the routes a router replica serves (imports Ray)

    api = build_api()

    guards = {getattr(auth, k): v for k, v in _ACCESS.items()}
    access = {}
    for route in _api_routes(api.routes):
        calls = [d.dependency for d in route.dependencies]
        for method in route.methods:
            access[(method.lower(), route.path)] = next(
                (guards[c] for c in calls if c in guards), "open")
    return api.openapi(), access


def _api_routes(routes: list[Any]) -> list[Any]:
    """The API routes of ``routes``, those of included routers too (Serve's ingress includes
    the class's routes as a router)."""
    from fastapi.routing import APIRoute

    out = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and hasattr(inner, "routes"):
            out += _api_routes(inner.routes)
    return out


def openapi_text() -> str:
    """The page ``openapi.json``: the app's schema as JSON."""
    return json.dumps(openapi()[0], indent=2, sort_keys=False) + "\n"


def http_page() -> str:
    """The page ``http.md``: the app's schema in Markdown."""
    return reference.openapi_page(*openapi(),
                                  source="the app's OpenAPI schema (serve/http.py, "
                                  "serve/router.py)")
