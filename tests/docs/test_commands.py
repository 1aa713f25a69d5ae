"""Every command of README.md and docs/guides/ is a test, classed by docs/commands.yaml.

- The manifest classes every command block and names no block that is gone.
- ``parse`` and ``cloud`` blocks: each command's arguments go through its real parser
  (tests/docs/parse_check.py, one process for them all); a cloud block's repository files
  exist.
- ``run`` blocks run as written, through the real CLIs, one shell per document (an
  ``export`` in one block feeds the next), from a copy of the repository root holding a
  small world (``WORLDS``): the document's placeholders are bound to it, ``HOME`` is the
  copy (``~/.ray``, ``~/.cache/solaris`` and ``~/.curlrc`` are its own: curl fails on an HTTP
  error there), and ``serve run`` runs in the background until ``/healthz`` answers 200, then
  is stopped with everything it started once the document is done. A failing block fails;
  the later blocks of its document are skipped naming it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.docs.blocks import (CLASSES, DOCUMENTS, ROOT, Block, blocks, classed, commands,
                               expand_synopsis, logical_lines, manifest)
from tests.tiny import TINY, _processes

pytestmark = pytest.mark.slow

SERVE_PORT = 8000  # the port the guides call (Serve's default, configs/serve-local.yaml)
SERVE_READY_S = 420.0
BLOCK_TIMEOUT_S = 600.0
# a small synthetic world (tests/tiny.py) as the export and training commands take it
SMALL = [f"--set=data.synthetic.{k}={TINY[f'data.synthetic.{k}']}"
         for k in ("num_users", "num_items", "days", "target_interactions")]


# -- the worlds: what each document's placeholders mean, and the files they name ----------

@dataclass
class World:
    """A document's small world: ``setup(ws)`` writes its files into the workspace; ``bind``
    maps each placeholder to its value (``{ws}`` is the workspace); ``env`` is added to the
    shell's environment."""

    setup: Callable[[Path], None] = lambda ws: None
    bind: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def shop_log(ws: Path) -> None:
    """A team's log of its own ids: the small synthetic world exported with string ids, its
    ``mapping.yaml`` where the guides expect it."""
    _sh(ws, ["solaris", "export", "--dataset", "synthetic", "--string-ids", "--out", ".",
             *SMALL])


def tiny_default_artifacts(ws: Path) -> None:
    """The app's default artifacts (``$SOLARIS_ARTIFACTS``): the small synthetic world."""
    from tests.tiny import train_tiny

    train_tiny(ws / "default-artifacts")


WORLDS: dict[str, World] = {
    "docs/guides/your-own-log.md": World(
        shop_log, {"file:///srv/knn": "file://{ws}/knn", "/tmp/check": "{ws}/check"}),
    "docs/guides/capacity-planning.md": World(shop_log),
    "docs/guides/knn-schedule.md": World(bind={
        "KNN_URI": "file://{ws}/knn", "s3://BUCKET/knn": "file://{ws}/knn",
        "ARTIFACTS": "{ws}/ARTIFACTS", "DATA": "{ws}/DATA"}),
    "docs/guides/serving.md": World(
        tiny_default_artifacts,
        env={"SOLARIS_ARTIFACTS": "{ws}/default-artifacts",
             "SOLARIS_OPERATOR_TOKEN": "docs-test-operator-token"}),
    "docs/guides/cluster.md": World(),
    "docs/guides/your-own-models.md": World(),
}
# parse-only placeholders: any value of the right kind will do
PARSE_BIND = {"DIR": "DIR", "FILE": "FILE.yaml", "ARTIFACTS_DIR": "artifacts/v1"}


def bind(text: str, mapping: dict[str, str], ws: Path | None = None) -> str:
    """``text`` with each placeholder (a whole word, longest first) replaced."""
    for key in sorted(mapping, key=len, reverse=True):
        value = mapping[key].replace("{ws}", str(ws)) if ws else mapping[key]
        text = re.sub(rf"(?<![\w/.-]){re.escape(key)}(?![\w-])", lambda _: value, text)
    return text


# -- the manifest ----------------------------------------------------------------------

def test_the_manifest_classes_every_command_block_and_no_other():
    unclassed = [f"{b.id}: {b.first!r}" for b, entry in classed() if entry is None]
    assert not unclassed, (
        "command blocks docs/commands.yaml does not class (add each with its class: run, "
        "parse or cloud):\n  " + "\n  ".join(unclassed))
    firsts = {(b.doc, b.first) for b, _ in classed()}
    stale = [f"{doc}: {e['first']!r}" for doc, entries in manifest().items()
             for e in entries or [] if (doc, e["first"]) not in firsts]
    assert not stale, "docs/commands.yaml classes blocks that are gone:\n  " + "\n  ".join(stale)
    bad = [f"{doc}: {e['first']!r}: {e.get('class')!r}" for doc, entries in manifest().items()
           for e in entries or [] if e.get("class") not in CLASSES]
    assert not bad, f"classes must be one of {CLASSES}:\n  " + "\n  ".join(bad)
    assert set(manifest()) <= set(DOCUMENTS)
    not_run = [f"{doc}: {e['first']!r}" for doc, entries in manifest().items()
               for e in entries or [] if e["class"] != "run" and not e.get("why")]
    assert not not_run, "a block that is not run says why:\n  " + "\n  ".join(not_run)
    missing_world = {b.doc for b, e in classed() if e and e["class"] == "run"} - set(WORLDS)
    assert not missing_world, f"documents with run blocks and no world: {missing_world}"


def test_the_counts_by_document(capsys):
    """How many blocks run and how many are checked statically, by document (printed with
    ``pytest -s``; the numbers the closing notes quote)."""
    counts: dict[str, Counter] = {}
    for b, entry in classed():
        counts.setdefault(b.doc, Counter())[entry["class"] if entry else "unclassed"] += 1
    total = sum(counts.values(), Counter())
    with capsys.disabled():
        print("\ncommand blocks by document (run / parse / cloud):")
        for doc, c in counts.items():
            print(f"  {doc:40s} {c['run']:3d} {c['parse']:3d} {c['cloud']:3d}")
        print(f"  {'all':40s} {total['run']:3d} {total['parse']:3d} {total['cloud']:3d}")
    assert total["run"] >= 10 and not total["unclassed"]


# -- parse and cloud blocks ------------------------------------------------------------

STATIC = [(b, e) for b, e in classed() if e and e["class"] in ("parse", "cloud")]
# a repository file a command names (the documents' own outputs live elsewhere)
REPO_FILE = re.compile(r"^(?:configs|deploy|jobs|bench|examples)/[\w./-]+$|^cluster\.yaml$")


def static_argvs(block: Block) -> list[list[str]]:
    return [expand_synopsis(argv) for argv in commands(bind(block.source, PARSE_BIND))]


@pytest.fixture(scope="module")
def parsed() -> dict[str, list[str | None]]:
    """Every static block's commands through their parsers, in one process."""
    argvs = [(b.id, a) for b, _ in STATIC for a in static_argvs(b)]
    done = subprocess.run([sys.executable, str(ROOT / "tests/docs/parse_check.py")],
                          input=json.dumps([a for _, a in argvs]), capture_output=True,
                          text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, list[str | None]] = {}
    for (bid, argv), answer in zip(argvs, json.loads(done.stdout)):
        out.setdefault(bid, []).append(None if answer is None
                                       else f"{' '.join(argv)}\n    -> {answer}")
    return out


@pytest.mark.parametrize("block", [b for b, _ in STATIC], ids=lambda b: b.id)
def test_a_static_block_parses(block, parsed):
    assert static_argvs(block), f"{block.id}: no command found in {block.source!r}"
    errors = [e for e in parsed[block.id] if e]
    assert not errors, f"{block.id}: a command its parser refuses:\n  " + "\n  ".join(errors)
    named = {part for argv in static_argvs(block) for token in argv
             for part in token.split("=") if REPO_FILE.match(part)}
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert not gone, f"{block.id}: names files that are not in the repository: {gone}"


def test_a_wrong_flag_fails_the_parse_check(tmp_path):
    """The check can fail: a guide's command with a flag its parser lacks is refused."""
    argvs = [["python", "jobs/seed_history.py", "--data", "m.yaml", "--artifacts", "a",
              "--app", "shop", "--no-such-flag"],
             ["solaris", "train", "--dataset", "generic", "--out", "x", "--outt", "y"],
             ["serve", "run", "serve_app:app", "--no-such-flag"]]
    done = subprocess.run([sys.executable, str(ROOT / "tests/docs/parse_check.py")],
                          input=json.dumps(argvs), capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    answers = json.loads(done.stdout)
    assert all(answers), answers
    assert "--no-such-flag" in answers[0] and "--outt" in answers[1]


# -- run blocks ------------------------------------------------------------------------

RUN = [(b, e) for b, e in classed() if e and e["class"] == "run"]


class DocShell:
    """One document's shell: a workspace that is a copy of the repository root (its
    top-level entries linked) holding the world, the exports of earlier blocks, and the
    ``serve run`` processes still running."""

    SKIP = {".git", ".venv", "runs", "site", ".pytest_cache", "artifacts"}

    def __init__(self, doc: str, ws: Path):
        self.doc, self.ws = doc, ws
        self.world = WORLDS[doc]
        self.failed: str | None = None
        self.background: list[tuple[subprocess.Popen, Path]] = []
        ws.mkdir(parents=True)
        for entry in ROOT.iterdir():
            if entry.name not in self.SKIP:
                (ws / entry.name).symlink_to(entry)
        (ws / ".curlrc").write_text("fail-with-body\nshow-error\n")
        env = {**os.environ, "HOME": str(ws),
               **{k: v.replace("{ws}", str(ws)) for k, v in self.world.env.items()}}
        env.pop("RAY_ADDRESS", None)
        self.env = env
        (ws / ".state.sh").write_text("")
        self.world.setup(ws)
        for b in blocks(doc):  # a config file a guide names in its first line (# app.yaml)
            m = re.match(r"#\s*([\w.-]+\.ya?ml)\s*$", b.source.splitlines()[0]) \
                if b.language == "yaml" else None
            if m:
                (ws / m.group(1)).write_text(bind(b.source, self.world.bind, ws))

    def run(self, block: Block) -> None:
        text = bind(block.source, self.world.bind, self.ws)
        segment: list[str] = []
        for line in logical_lines(text):
            if re.match(r"^serve run\b", line):
                self._script("\n".join(segment), block)
                segment = []
                self._serve(line, block)
            else:
                segment.append(line)
        self._script("\n".join(segment), block)

    def _script(self, text: str, block: Block) -> None:
        if not text.strip():
            return
        script = f"set -eo pipefail\n. ./.state.sh\n{text}\nexport -p > ./.state.sh\n"
        try:
            done = subprocess.run(["bash", "-c", script], cwd=self.ws, env=self.env,
                                  capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{block.id}: still running after {e.timeout:.0f} s") from e
        assert done.returncode == 0, (
            f"{block.id}: exit {done.returncode}\n{text}\n--- stdout\n{done.stdout[-3000:]}"
            f"\n--- stderr\n{done.stderr[-5000:]}{self._serve_logs()}")

    def _serve(self, line: str, block: Block) -> None:
        if _answers(SERVE_PORT) is not None:
            raise AssertionError(f"{block.id}: port {SERVE_PORT} already answers before "
                                 f"`{line}` started")
        log = self.ws / f"serve-{len(self.background)}.log"
        proc = subprocess.Popen(["bash", "-c", f". ./.state.sh\nexec {line}"], cwd=self.ws,
                                env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.background.append((proc, log))
        deadline = time.monotonic() + SERVE_READY_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{block.id}: `{line}` exited {proc.returncode} before "
                                     f"it served{self._serve_logs()}")
            if _answers(SERVE_PORT) == 200:
                return
            time.sleep(2.0)
        raise AssertionError(f"{block.id}: `{line}`: /healthz not 200 within "
                             f"{SERVE_READY_S:.0f} s{self._serve_logs()}")

    def _serve_logs(self) -> str:
        return "".join(f"\n--- {log.name}\n{log.read_text()[-4000:]}"
                       for _, log in self.background if log.exists())

    def close(self) -> None:
        """Stop every ``serve run`` with all it started (its Ray included), then wait for
        the port to be free."""
        if not self.background:
            return
        for proc, _ in self.background:
            stop_tree(proc)
        deadline = time.monotonic() + 60
        while _answers(SERVE_PORT) is not None and time.monotonic() < deadline:
            time.sleep(1.0)
        self.background = []


def _answers(port: int) -> int | None:
    """The HTTP status of ``/healthz`` on ``port``, None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGINT to ``proc``'s process group (``serve run`` shuts Serve and its Ray down),
    then SIGKILL to whatever of its descendants and its Ray session is left."""
    procs = _processes()
    tree, todo = set(), [proc.pid]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(p for p, (pp, _) in procs.items() if pp == pid)
    sessions = {m for p in tree if p in procs
                for m in re.findall(r"/tmp/ray/session_[\w.-]+", procs[p][1])}
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=45)
    except subprocess.TimeoutExpired:
        pass
    procs = _processes()
    left = {p for p in tree if p in procs} | {
        p for p, (_, cmd) in procs.items() if any(s in cmd for s in sessions)}
    for pid in left - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def shells(tmp_path_factory):
    """One shell per document, made on its first run block; each closed when the next
    document starts and all at the end."""
    made: dict[str, DocShell] = {}

    def get(doc: str) -> DocShell:
        if doc not in made:
            for other in made.values():
                other.close()
            made[doc] = DocShell(doc, tmp_path_factory.mktemp("docs") / Path(doc).stem)
        return made[doc]

    yield get
    for sh in made.values():
        sh.close()


@pytest.mark.parametrize("block", [b for b, _ in RUN], ids=lambda b: b.id)
def test_a_run_block_runs_as_written(block, shells):
    sh = shells(block.doc)
    if sh.failed:
        pytest.skip(f"an earlier block of {block.doc} failed ({sh.failed})")
    try:
        sh.run(block)
    except BaseException:
        sh.failed = block.id
        raise


def _sh(ws: Path, argv: list[str]) -> None:
    done = subprocess.run(argv, cwd=ws, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HOME": str(ws)})
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-3000:]}"
