"""No copied code: pylint's duplicate-code check (6 or more similar lines, comments,
docstrings, imports and signatures ignored) over every package of the project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["solaris", "actors", "jobs", "serve", "serve_app.py"]


def test_no_block_of_six_lines_is_written_twice():
    paths = [p for p in PACKAGES if (ROOT / p).exists()]
    assert paths == PACKAGES  # a package renamed or moved must be named here
    # -j 2: pylint maps the files over two processes and compares every pair after (40 s on
    # one 2-core machine's one process, 23 s on two)
    out = subprocess.run([sys.executable, "-m", "pylint", "--disable=all",
                          "--enable=duplicate-code", "--min-similarity-lines=6",
                          "--score=n", "-j", "2", *paths], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
