"""STYLE rule 1: every solaris module imports with ``ray`` blocked (the unit conftest blocks it)."""

import importlib
import pkgutil

import solaris


def test_every_solaris_module_imports_without_ray():
    names = [m.name for m in pkgutil.walk_packages(solaris.__path__, "solaris.")]
    assert len(names) > 10
    for name in names:
        importlib.import_module(name)
