"""The import contracts (DESIGN.md, "Product and research apart").

``lint-imports`` checks the two contracts in ``pyproject.toml`` by reading import statements:
the product (the serving, cache, precompute, KNN, model, training, data and simulation
packages, the product's command line, ``serve/`` and ``actors/``) imports nothing of the
replay, the closed loop, the policy bounds or the reports; and the core (``solaris``) never
imports the packages above it (``serve``, ``actors``, ``jobs``). The linter cannot see a
string import (``importlib.import_module("jobs.replay")``, a ``"serve.x:attr"`` path handed
to a loader): a walk of every file of ``solaris/`` refuses those. ``bench/`` is not a
package: no product file names it in an import or puts it on ``sys.path``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["solaris/online", "solaris/cache", "solaris/precompute", "solaris/knn",
           "solaris/models", "solaris/train", "solaris/data", "solaris/simulate", "serve",
           "actors", "solaris/history.py", "solaris/features.py", "solaris/config.py",
           "solaris/clock.py", "solaris/artifacts.py", "jobs/rebuild_knn.py", "serve_app.py"]


def lint_imports() -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    return subprocess.run([exe, str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    run = lint_imports()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "The product never imports the research code KEPT" in run.stdout
    assert "The core never imports the app, the actors or the jobs KEPT" in run.stdout
    assert "The request path cannot train a model KEPT" in run.stdout
    assert "3 kept, 0 broken" in run.stdout


# -- string imports of the packages above the core ---------------------------------------
UPPER = ("serve", "actors", "jobs")  # the packages above the core (the layers contract)
# calls that import, or run, what a string names (by module path or file path)
LOADERS = {"import_module", "__import__", "find_spec", "resolve_name", "run_module",
           "run_path", "spec_from_file_location", "load_module", "get_loader"}
# an import path: a dotted module path, then ``:attr`` as an entry point or a plug-in names it
IMPORT_PATH = re.compile(r"([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)*)(:[A-Za-z_][\w.]*)?")


def _literal_prefix(node: ast.AST) -> str | None:
    """The text a string argument starts with: a constant, an f-string's leading constant,
    the left end of a concatenation; None when it starts with no literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _literal_prefix(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_prefix(node.left)
    return None


def _upper_package(text: str) -> str | None:
    """The package above the core that a module path or file path (``jobs/replay.py``)
    starts with, if any."""
    head = re.split(r"[./:]", text.strip().removeprefix("./"), maxsplit=1)[0]
    return head if head in UPPER else None


def _names_a_module(text: str, root: Path) -> bool:
    """Whether ``text`` is an import path into an upper package: ``module:attr``, or a dotted
    path that is a module or package of the repository (so a config key such as
    ``"serve.profile"`` is not one)."""
    m = IMPORT_PATH.fullmatch(text)
    if m is None or m.group(1) not in UPPER:
        return False
    if m.group(3):
        return True
    rel = Path(*(m.group(1) + m.group(2)).split("."))
    return bool(m.group(2)) and ((root / rel).with_suffix(".py").is_file()
                                 or (root / rel / "__init__.py").is_file())


def string_imports(source: str, where: str, root: Path = ROOT) -> list[str]:
    """Each string import of ``serve``, ``actors`` or ``jobs`` in ``source`` (``where``:
    its path in messages), as ``path:line: what -- why``: a loader called on a string that
    names one of them, and any string constant that is an import path into one of them."""
    out = []
    flagged: set[int] = set()  # constants already named by their loader call
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else None
            text = _literal_prefix(node.args[0])
            if name in LOADERS and text is not None and (pkg := _upper_package(text)):
                out.append(f"{where}:{node.lineno}: {name}({text!r}...) imports `{pkg}` by "
                           "name")
                flagged |= {id(n) for n in ast.walk(node.args[0])}
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in flagged and _names_a_module(node.value, root):
            out.append(f"{where}:{node.lineno}: the string {node.value!r} is an import path "
                       f"into `{_upper_package(node.value)}`")
    return sorted(out, key=lambda s: int(s.split(":")[1]))


def test_no_core_file_imports_serve_actors_or_jobs_by_a_string():
    """What the linter cannot see: the core imports nothing above it by name either. What it
    runs of them is registered as an entry point in pyproject.toml and found by group
    (``solaris.registry``)."""
    files = sorted((ROOT / "solaris").rglob("*.py"))
    found = [m for path in files
             for m in string_imports(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert len(files) > 100
    assert not found, ("the core (solaris/) imports a package above it by a string; register "
                       "what it runs as an entry point in pyproject.toml instead:\n  "
                       + "\n  ".join(found))


SAMPLE = '''
"""A docstring that names jobs.replay and serve.router in prose."""
import importlib
from importlib import import_module

KEY = "serve.profile"  # a config key: serve/profile.py is no module
SECTION = "serve"
PLUGIN = "jobs.commands:DEMO"


def f(name):
    importlib.import_module("jobs.replay")
    import_module(f"serve.{name}")
    __import__("actors" + ".cache")
    importlib.import_module("solaris.replay")
    runpy.run_path("jobs/replay.py")
    return getattr(cfg, "serve"), "serve.router"
'''


def test_the_walk_names_each_string_import_and_nothing_else():
    assert string_imports(SAMPLE, "x.py") == [
        "x.py:8: the string 'jobs.commands:DEMO' is an import path into `jobs`",
        "x.py:12: import_module('jobs.replay'...) imports `jobs` by name",
        "x.py:13: import_module('serve.'...) imports `serve` by name",
        "x.py:14: __import__('actors'...) imports `actors` by name",
        "x.py:16: run_path('jobs/replay.py'...) imports `jobs` by name",
        "x.py:17: the string 'serve.router' is an import path into `serve`"]


def product_files() -> list[Path]:
    out = []
    for p in PRODUCT:
        path = ROOT / p
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def test_no_product_file_reaches_the_benches():
    offenders = []
    for path in product_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "bench" or n.startswith("bench.") for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (isinstance(node, ast.Attribute) and node.attr in ("insert", "append")
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} (sys.path)")
    assert len(product_files()) > 50 and not offenders, offenders
