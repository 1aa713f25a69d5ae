"""A bench module loaded by its file path, so that ``bench/`` never goes on ``sys.path``
(``bench/serve.py`` would shadow the app's ``serve`` package, ``bench/precompute.py`` reads
as the precompute code).

A bench that uses another takes this loader by its path too, which works whether the bench
runs as a script or was itself loaded by path (as the tests load it, ``tests/benches.py``)::

    sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
    machine = sibling("machine").machine
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent


def sibling(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``bench_<name>``, executed once per process and kept
    in ``sys.modules`` (where its dataclasses and pickles look their module up)."""
    key = f"bench_{name}"
    if key not in sys.modules:
        path = BENCH / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(f"bench module {name!r}: no {path}")
        spec = importlib.util.spec_from_file_location(key, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
