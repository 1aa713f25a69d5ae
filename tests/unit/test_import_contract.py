"""The product never imports the research code (DESIGN.md, "Product and research apart").

``lint-imports`` checks the contract in ``pyproject.toml`` by reading import statements:
the serving, cache, precompute, KNN, model, training, data and simulation packages, ``serve/``
and ``actors/`` import nothing of the replay, the closed loop, the policy bounds or the
reports. ``bench/`` is not a package: no product file names it in an import or puts it on
``sys.path``.
"""

from __future__ import annotations

import ast
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


def test_the_import_contract_is_kept():
    run = lint_imports()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


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
