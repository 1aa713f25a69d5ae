"""The bench modules the tests check, loaded by file path: ``load_bench("vm_ab")`` is
``bench/vm_ab.py`` as the module ``bench_vm_ab``. ``bench/`` never goes on ``sys.path``
(``bench/serve.py`` would shadow the app's ``serve`` package); the loader is the benches' own
(``bench/sibling.py``), so a test and the bench it loads share one copy of each module."""

from __future__ import annotations

import runpy
from types import ModuleType

from tests.tiny import ROOT

_sibling = runpy.run_path(str(ROOT / "bench" / "sibling.py"))["sibling"]


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py``, executed once per process."""
    return _sibling(name)
