"""Unit tests never touch a Ray cluster: importing ``ray`` fails under tests/unit."""

import builtins
import sys

import pytest

_real_import = builtins.__import__


def _guarded_import(name, *args, **kwargs):
    if name == "ray" or name.startswith("ray."):
        raise ImportError(f"unit tests must not import {name!r}; move the test to tests/integration")
    return _real_import(name, *args, **kwargs)


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    for mod in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.setattr(builtins, "__import__", _guarded_import)
    yield
