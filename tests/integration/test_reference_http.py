"""The HTTP reference pages (docs/reference/http.md and openapi.json) are what the code
generates: the OpenAPI schema of the app with the routes a router replica serves, rendered
beside the app (``serve/reference.py``, which imports Ray; no cluster is started) and
registered with ``python -m solaris.reference``."""

from __future__ import annotations

import json

import pytest

from serve import reference as http_reference
from solaris import reference


@pytest.mark.parametrize("name", sorted(reference.registered_pages()))
def test_the_http_page_is_what_the_code_generates(name):
    message = reference.difference(name)
    if message is not None:
        pytest.fail(message, pytrace=False)


def test_every_route_is_on_the_page_with_who_may_call_it():
    schema, access = http_reference.openapi()
    page = reference.render("http.md")
    ops = [(m, p) for p, methods in schema["paths"].items() for m in methods]
    assert {("post", "/rank"), ("post", "/feedback"), ("post", "/scales"), ("get", "/healthz"),
            ("get", "/stats")} <= set(ops)
    for method, path in ops:
        assert f"## {method.upper()} {path}\n" in page
    assert access[("post", "/scales")] == "the operator's bearer token"
    assert access[("post", "/rank")] == "the service token, where one is configured"
    assert access[("get", "/healthz")] == "open"
    assert json.loads(reference.render("openapi.json")) == schema
    # every field of a request body, with its limits
    assert "| `candidates` | array of (`integer` or `string`) | yes | — | items >= 1; each " \
           "item: string: length 1..256 |" in page
