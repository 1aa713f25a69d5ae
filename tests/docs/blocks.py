"""The command blocks of README.md and docs/guides/, as Sybil reads them, and how the suite
treats each: the manifest (docs/commands.yaml) classes every block as ``run`` (a user's path,
run as written), ``parse`` (its commands' arguments parsed by their real parsers) or
``cloud`` (needs a cloud or a remote cluster: parsed where the parser is Ray's or ours, the
repository files it names checked). A block is named by its first line."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml
from sybil import Document
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "commands.yaml"
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT))
                                  for p in (ROOT / "docs" / "guides").glob("*.md")))
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
CLASSES = ("run", "parse", "cloud")


@dataclass(frozen=True)
class Block:
    """One fenced block of a document: its language, first line (its name), text and line."""

    doc: str
    line: int
    language: str
    source: str

    @property
    def first(self) -> str:
        return next(x.strip() for x in self.source.splitlines() if x.strip())

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _collect(example) -> None:  # the evaluator Sybil gives each region; never evaluated
    raise AssertionError("blocks are run by tests/docs/test_commands.py, not by Sybil")


def blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc`` (a path relative to the repository), in order."""
    out = []
    for lang in (*SHELL_LANGUAGES, "yaml", "json"):
        document = Document.parse(str(ROOT / doc), CodeBlockParser(lang, _collect))
        out += [Block(doc, ex.line, lang, str(ex.parsed)) for ex in document]
    return sorted(out, key=lambda b: b.line)


def command_blocks(doc: str) -> list[Block]:
    return [b for b in blocks(doc) if b.language in SHELL_LANGUAGES]


def manifest() -> dict[str, list[dict]]:
    return yaml.safe_load(MANIFEST.read_text())


def classed() -> Iterator[tuple[Block, dict]]:
    """Every command block with its manifest entry (None where the manifest has none)."""
    man = manifest()
    for doc in DOCUMENTS:
        entries = {e["first"]: e for e in man.get(doc) or []}
        for b in command_blocks(doc):
            yield b, entries.get(b.first)


# -- a block's text as commands ---------------------------------------------------------

def logical_lines(source: str) -> list[str]:
    """The block's lines with ``\\`` continuations joined; blank and comment-only lines
    dropped."""
    out, cur = [], ""
    for raw in source.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


_SEPARATORS = {"&&", "||", ";", "|", "&"}
_REDIRECTS = {">", ">>", "<", "2>", "2>&1"}


def commands(source: str, loop_values: dict[str, str] | None = None) -> list[list[str]]:
    """Each simple command of a block as argv (comments, separators, redirections, leading
    ``VAR=value`` assignments and ``for ... do`` / ``done`` scaffolding removed; a loop
    variable bound to its first value)."""
    out: list[list[str]] = []
    loop = dict(loop_values or {})
    for line in logical_lines(source):
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        tokens = list(lex)
        cur: list[str] = []
        skip_next = False
        for t in tokens + [";"]:
            if skip_next:
                skip_next = False
                continue
            if t in _REDIRECTS:
                skip_next = True
                continue
            if t in _SEPARATORS:
                if cur:
                    out.append(cur)
                cur = []
                continue
            cur.append(t)
        # for-loops: `for f in a b; do` binds f, `done` closes
    flat: list[list[str]] = []
    for argv in out:
        if argv[0] == "for" and len(argv) >= 4 and argv[2] == "in":
            loop[argv[1]] = argv[3]
            continue
        if argv[0] == "do":
            argv = argv[1:]
        if not argv or argv == ["done"]:
            continue
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv:
            flat.append([_bind_loop(a, loop) for a in argv])
    return flat


def _bind_loop(arg: str, loop: dict[str, str]) -> str:
    for k, v in loop.items():
        arg = arg.replace(f"${k}", v).replace(f"${{{k}}}", v)
    return arg


# synopsis placeholders a parse-only check gives a value of the right kind
SYNOPSIS_VALUES = {"S": "0", "N": "1000", "K": "2", "SECONDS": "60"}


def expand_synopsis(argv: list[str]) -> list[str]:
    """A synopsis as one concrete command: ``[--flag VALUE]`` kept without brackets (the flag
    must exist), ``[RUN_DIR ...]`` and ``...`` dropped, ``{a,b,c}`` its first choice,
    placeholders of counts a number."""
    out: list[str] = []
    depth, group, optional_positional = 0, [], False
    for a in argv:
        if a == "...":
            continue
        if a.startswith("["):
            depth += a.count("[")
            group = []
            a = a.lstrip("[")
            optional_positional = not a.startswith("-")
        closes = a.count("]")
        a = a.rstrip("]")
        if depth:
            if a and a != "...":
                group.append(a)
            if closes:
                depth -= closes
                if not optional_positional:
                    out += group
            continue
        out.append(a)
    return [SYNOPSIS_VALUES.get(a, a) for a in map(_first_choice, out)]


def _first_choice(arg: str) -> str:
    m = re.fullmatch(r"\{([^}]*)\}", arg)
    return m.group(1).split(",")[0] if m else arg
