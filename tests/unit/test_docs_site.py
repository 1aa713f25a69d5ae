"""The documentation site builds with warnings as errors (``mkdocs build --strict``).

``mkdocs.yml``'s ``validation`` makes a page under ``docs/`` that the nav does not list, a
link to a missing page or heading, an absolute link and a link to a file outside ``docs/``
(a repository file: name it as a code span instead) each a warning, and ``strict`` makes any
warning fail the build. The nav test says the same about unlisted pages by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(node) -> list[str]:
    """Every page path (relative to ``docs/``) the nav lists, nested sections included."""
    if isinstance(node, str):
        return [] if "://" in node else [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                        "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"mkdocs build --strict failed (exit {r.returncode}):\n{out}"
    assert (tmp_path / "site" / "index.html").is_file(), out


def test_every_page_under_docs_is_in_the_nav() -> None:
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(cfg["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in listed]
    assert not missing, f"pages under docs/ missing from mkdocs.yml's nav: {missing}"
    absent = [p for p in listed if not (DOCS / p).is_file()]
    assert not absent, f"nav entries with no page under docs/: {absent}"
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"
