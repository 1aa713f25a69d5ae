"""The documentation site builds with warnings as errors (``mkdocs build --strict``).

``mkdocs.yml``'s ``validation`` makes a page under ``docs/`` that the nav does not list, a
link to a missing page or heading, an absolute link and a link to a file outside ``docs/``
(a repository file: name it as a code span instead) each a warning, and ``strict`` makes any
warning fail the build. The nav test says the same about unlisted pages by name.
"""

from __future__ import annotations

import os
import re
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


README_MAX_LINES, README_MAX_WORDS = 200, 2000
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    lines, words = len(text.splitlines()), len(text.split())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
    assert words <= README_MAX_WORDS, f"README.md has {words} words (at most {README_MAX_WORDS})"
    targets = [t for t in _LINK.findall(text) if "://" not in t]
    assert targets, "README.md links no page of docs/"
    broken = [t for t in targets if not (ROOT / t).exists()]
    assert not broken, f"README.md links missing files: {broken}"


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    """The quickstart's second command is what ``.ci/run`` runs; both commands are the first
    two code blocks of the README."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    install, test = blocks[0].strip(), blocks[1].strip()
    assert "solaris demo" in install and "pytest" in test
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()
