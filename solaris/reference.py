"""The reference pages of the documentation, generated from the code they describe: the config
tree (``solaris/config.py``), the command line (``solaris/cli.py`` and the commands registered
with it), the metrics (``solaris/metrics.py``), the FM's inputs (``solaris/models/contract.py``)
and the HTTP API (the OpenAPI schema of the app).

    python -m solaris.reference            # write every page to docs/reference/
    python -m solaris.reference --check    # exit 1 naming each page that differs from the code

The core renders its own pages (``PAGES``). A page that describes a package above the core is
generated beside it and registered by name in ``pyproject.toml`` (entry-point group
``solaris.reference_pages``): the HTTP API's two pages need the app's routes, which import Ray
(nothing is started), so the app renders its schema and this module turns it into Markdown
(``openapi_page``); the core imports nothing of the app, and its own pages render where Ray
cannot be imported.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any, Callable

from solaris import atomic
from solaris.errors import ConfigError, SolarisError
from solaris.registry import entries

COMMAND = "python -m solaris.reference"
ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = ROOT / "docs" / "reference"
_CODE = re.compile(r"(`+)(.+?)\1")  # a Markdown code span
DIFF_LINES = 40  # lines of a stale page's diff that --check and the tests show


# -- Markdown -------------------------------------------------------------------------------
def _escape(text: str) -> str:
    """``text`` as Markdown table-cell text: code spans kept, and outside them the characters
    that would start emphasis, HTML or a new cell escaped."""
    out, at = [], 0
    for m in _CODE.finditer(text):
        out += [_escape_plain(text[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join(out + [_escape_plain(text[at:])])


def _escape_plain(text: str) -> str:
    text = re.sub(r"([\\|*])", r"\\\1", text.replace("<", "&lt;"))
    # an underscore between letters or digits (snake_case) starts no emphasis: kept as it is
    return re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return lines + ["| " + " | ".join(c or "—" for c in row) + " |" for row in rows]


def _banner(source: str) -> list[str]:
    return [f"<!-- Generated from {source} by `{COMMAND}`: edit the code, not this page. -->"]


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# -- configuration ----------------------------------------------------------------------------
def field_docs(source: str, where: str = "", sections: frozenset[str] = frozenset()
               ) -> dict[str, str]:
    """Each field's description in the source of one dataclass: the comment on its line and the
    comment lines right above it. Comment lines right under a field with a comment of its own,
    followed by another such field, continue the first's; a field with none shares the one of
    the field right above it (``"=name"``). Fields named in ``sections`` (sub-configs) need
    none; ``where`` names the section in errors."""
    source = textwrap.dedent(source)
    lines = source.splitlines()
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not lines[tok.start[0] - 1][:tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string[1:].strip(), alone)
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    fields = [(s.target.id, s.lineno, s.end_lineno or s.lineno) for s in cls.body
              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    inline = {name: " ".join(comments[n][0] for n in range(lo, hi + 1)
                             if n in comments and not comments[n][1])
              for name, lo, hi in fields}
    docs: dict[str, str] = {}
    prev: tuple[str, int] | None = None  # the field above: (name, last line)
    for name, lo, hi in fields:
        top = lo
        while top - 1 in comments and comments[top - 1][1]:
            top -= 1
        block = " ".join(comments[n][0] for n in range(top, lo))
        adjacent = prev is not None and prev[1] == top - 1
        if block and adjacent and inline[prev[0]] and inline[name]:
            docs[prev[0]] += " " + block  # the field above's comment goes on
            block = ""
        doc = " ".join(p for p in (block, inline[name]) if p)
        if not doc and name not in sections:
            if not (prev is not None and prev[1] == lo - 1):
                raise ConfigError(f"{where}{name}: no comment describes this config field "
                                  "(on its line or right above it)")
            doc = docs[prev[0]] if docs[prev[0]].startswith("=") else "=" + prev[0]
        docs[name] = doc
        prev = (name, hi)
    return docs


def _sections(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted prefix, dataclass) of every section under ``cls``, a section before its own."""
    out = []
    for f in dataclasses.fields(cls):
        sub = _dataclass_of(cls, f)
        if sub is not None:
            out += [(prefix + f.name, sub)] + _sections(sub, prefix + f.name + ".")
    return out


def _dataclass_of(cls: type, f: dataclasses.Field) -> type | None:
    hint = typing.get_type_hints(cls)[f.name]
    return hint if dataclasses.is_dataclass(hint) else None


def yaml_value(value: Any) -> str:
    """``value`` as YAML flow text that reads back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)  # PyYAML reads a float only with a dot: 1e-06 -> 1.0e-06
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    import yaml

    text = str(value)
    plain = text and yaml.safe_load(text) == text and not re.search(r"[\[\]{},#&*!|>'\"%@`]",
                                                                      text)
    return text if plain else json.dumps(text)


def _type(annotation: str) -> str:
    return " or ".join(_code("null" if p == "None" else p) for p in annotation.split(" | "))


def config_page() -> str:
    from solaris import config

    out = _banner("solaris/config.py") + [
        "# Configuration", "",
        "Every setting of the config tree, section by section: its key, type, default and "
        "what it does. A YAML config file (`--config`, `configs/`) nests the keys by section "
        "(`fm:` then `emb_dim: 32` under it); `--set fm.emb_dim=32` sets one key from the "
        "command line, its value read as YAML (`null`, `true`, `[64, 32]`). A key not given "
        "keeps its default, and a `tuple` is written as a YAML list. Every value is checked "
        "when the config is built: a bad one is refused with an error that names the key. "
        "The command line is on the [command line](cli.md) page.", "",
        f"This page is generated from `solaris/config.py` by `{COMMAND}`.", ""]
    for prefix, cls in _sections(config.SolarisConfig):
        subs = frozenset(f.name for f in dataclasses.fields(cls) if _dataclass_of(cls, f))
        docs = field_docs(inspect.getsource(cls), prefix + ".", subs)
        out += [f"## {prefix}", "", _escape(" ".join(inspect.getdoc(cls).split())), ""]
        rows = []
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}"
            if _dataclass_of(cls, f) is not None:
                rows.append([_code(key), "section", "", f"the `{key}` section, below"])
                continue
            default = f.default if f.default_factory is dataclasses.MISSING \
                else f.default_factory()
            doc = docs[f.name]
            doc = f"as `{prefix}.{doc[1:]}`, above" if doc.startswith("=") else _escape(doc)
            rows.append([_code(key), _type(str(f.type)), _code(yaml_value(default)), doc])
        out += _table(["key", "type", "default", "description"], rows) + [""]
    out += ["## Removed options", "",
            "Options removed once their default had won: the behaviour is always the one "
            "given, and the dated note says how the others were measured. A config or `--set` "
            "that names one is refused with its note; a config stored by an earlier version "
            "(an artifact's manifest, a finished replay's `replay-config.yaml`) still loads, "
            "the key ignored.", ""]
    out += _table(["key", "behaviour", "result"],
                  [[_code(key), _code(yaml_value(now)), f"[{Path(note).name}](../results/"
                    f"{Path(note).name})"] for key, (now, note) in config.REMOVED.items()])
    return "\n".join(out + [""])


# -- command line -------------------------------------------------------------------------------
_TYPES = {int: "integer", float: "number", Path: "path", str: "text", None: "text"}


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion
        text = text % {**vars(action), "prog": prog}
    return _escape(" ".join(text.split()))


def _value(action: argparse.Action) -> str:
    """What an option takes, in words: a flag, one of its choices, or a value of a type."""
    if action.nargs == 0:
        return "flag"
    many = {"+": "one or more", "*": "any number"}.get(str(action.nargs))
    if action.choices is not None:
        text = ({"+": "one or more of ", "*": "any of "}.get(str(action.nargs), "one of ")
                + ", ".join(_code(str(c)) for c in action.choices))
    else:
        kind = _TYPES.get(action.type) or getattr(action.type, "__name__", "text")
        text = f"{_code(action.metavar or action.dest.upper())} ({kind})"
        text += f", {many}" if many else ""
    if isinstance(action, argparse._AppendAction):
        text += ", repeatable"
    return text


def _default(action: argparse.Action) -> str:
    """An option's default ("" for none), or that it is required."""
    if action.required:
        return "**required**"
    d = action.default
    if action.nargs == 0:
        return "off" if d is False else ("on" if d is True else "")
    if d is None or d == [] or d is argparse.SUPPRESS:
        return ""
    return _code(" ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d))


def _command(parser: argparse.ArgumentParser, name: str, about: str, depth: int) -> list[str]:
    """The section of command ``name`` and its subcommands' (the parser itself: no heading)."""
    out = ["#" * depth + f" {name}", ""] if depth > 1 else []
    if about:
        out += [_escape(about), ""]
    rows, subs = [], []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            subs += [(f"{name} {n}", p, helps.get(n, "")) for n, p in a.choices.items()]
        elif not isinstance(a, argparse._HelpAction) and a.help is not argparse.SUPPRESS:
            opts = ", ".join(_code(o) for o in a.option_strings) or _code(a.dest.upper())
            rows.append([opts, _value(a), _default(a), _help(a, name)])
    if rows:
        out += _table(["option", "value", "default", "description"], rows) + [""]
    if subs:
        out += ["Commands: " + ", ".join(_code(s[0]) for s in subs) + ".", ""]
    for sub_name, sub, about in subs:
        out += _command(sub, sub_name, about, depth + 1)
    return out


def cli_page() -> str:
    from solaris import cli

    parser = cli.build_parser()
    # where the registered commands are defined, as file paths (``module.py``)
    where = sorted({module.replace(".", "/") + ".py" for module, _ in cli.registered().values()})
    registered = (", with the commands registered with it (" + ", ".join(f"`{w}`" for w in where)
                  + ")") if where else ""
    out = _banner("solaris/cli.py" + (" and " + ", ".join(where) if where else "")) + [
        "# Command line", "", _escape(" ".join((parser.description or "").split())), "",
        f"Every command of `{parser.prog}` and its options, with their defaults; each command "
        "also takes `-h` / `--help`. `--config` and `--set KEY=VALUE` take the keys of the "
        "[configuration](configuration.md) page. The options of the table below go before "
        "the command.", "",
        f"This page is generated from the argument parser in `solaris/cli.py`{registered}, "
        f"by `{COMMAND}`.", ""]
    return "\n".join(out + _command(parser, parser.prog, "", 1))


# -- HTTP ---------------------------------------------------------------------------------------
def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _schema_type(s: dict[str, Any]) -> str:
    """A JSON schema's type in words: ``array of (`integer` or `string`)``."""
    def of(t: str) -> str:
        return f"({t})" if " or " in t else t

    if "$ref" in s:
        return _code(s["$ref"].rsplit("/", 1)[1])
    if "anyOf" in s:
        return " or ".join(f"({t})" if " " in t else t for t in map(_schema_type, s["anyOf"]))
    kind = s.get("type")
    if kind == "array":
        return f"array of {of(_schema_type(s.get('items', {})))}"
    if kind == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"object of {of(_schema_type(s['additionalProperties']))}"
    return _code(kind) if kind else "any JSON"


_BOUNDS = (("minLength", "maxLength", "length"), ("minItems", "maxItems", "items"),
           ("minimum", "maximum", "value"))


def _constraints(s: dict[str, Any], inner: str = "") -> list[str]:
    """The limits a JSON schema sets, in words (``length 1..256``), those of the branches of
    a union and of an array's items too."""
    out = []
    for lo, hi, what in _BOUNDS:
        if lo in s and hi in s:
            out.append(f"{inner}{what} {_number(s[lo])}..{_number(s[hi])}")
        elif lo in s or hi in s:
            out.append(f"{inner}{what} {'>=' if lo in s else '<='} {_number(s.get(lo, s.get(hi)))}")
    for key, op in (("exclusiveMinimum", ">"), ("exclusiveMaximum", "<")):
        if key in s:
            out.append(f"{inner}value {op} {_number(s[key])}")
    if "enum" in s:
        out.append(inner + "one of " + ", ".join(_code(json.dumps(v)) for v in s["enum"]))
    if "pattern" in s:
        out.append(f"{inner}matches {_code(s['pattern'])}")
    branches = [b for b in s.get("anyOf", ()) if b.get("type") != "null"]
    for b in branches:
        out += _constraints(b, inner + (f"{b.get('type', 'value')}: " if len(branches) > 1
                                        else ""))
    if "items" in s:
        out += _constraints(s["items"], inner + "each item: ")
    return out


def _model(schemas: dict[str, Any], ref: str, lead: str) -> list[str]:
    """A table of the fields of schema ``ref``, under a line that starts with ``lead``."""
    name = ref.rsplit("/", 1)[1]
    model = schemas[name]
    out = [f"{lead}`{name}`" + (f": {_escape(' '.join(model['description'].split()))}"
                                if model.get("description") else ""), ""]
    rows = []
    for prop, s in model.get("properties", {}).items():
        rows.append([_code(prop), _schema_type(s),
                     "yes" if prop in model.get("required", ()) else "no",
                     _code(json.dumps(s["default"])) if "default" in s else "",
                     _escape("; ".join(_constraints(s))),
                     _escape(" ".join(s.get("description", "").split()))])
    if model.get("additionalProperties") is False:
        out += ["Fields not listed are refused (422).", ""]
    return out + _table(["field", "type", "required", "default", "constraints",
                         "description"], rows) + [""]


def openapi_page(schema: dict[str, Any], access: dict[tuple[str, str], str],
                 source: str) -> str:
    """The HTTP API's page from an OpenAPI ``schema`` and who may call each (method, path)
    (``access``); ``source`` names where the schema comes from (the page's banner)."""
    info, schemas = schema["info"], schema.get("components", {}).get("schemas", {})
    out = _banner(source) + [
        "# HTTP API", "", f"{_escape(info.get('description', ''))} Version {info['version']}.",
        "", f"This page is generated from the app's OpenAPI schema by `{COMMAND}`, which also "
        "writes the schema itself: [openapi.json](openapi.json).", ""]
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            out += [f"## {method.upper()} {path}", ""]
            if op.get("description"):
                out += [_escape(" ".join(op["description"].split())), ""]
            if (method, path) not in access:
                raise SolarisError(f"{method.upper()} {path}: not among the app's API routes "
                                  "(cannot tell who may call it)")
            out += [f"Access: {access[(method, path)]}.", ""]
            params = op.get("parameters", [])
            if params:
                out += _table(["parameter", "in", "type", "required", "description"], [
                    [_code(p["name"]), p["in"], _schema_type(p.get("schema", {})),
                     "yes" if p.get("required") else "no",
                     _escape(p.get("description", ""))] for p in params]) + [""]
            body = op.get("requestBody")
            if body:
                ref = body["content"]["application/json"]["schema"]["$ref"]
                lead = "Request body (JSON" + (", required" if body.get("required") else "")
                out += _model(schemas, ref, lead + "): ")
            rows, models = [], []
            for status, r in op.get("responses", {}).items():
                s = r.get("content", {}).get("application/json", {}).get("schema")
                rows.append([status, _escape(r.get("description", "")),
                             "" if s is None else _schema_type(s)])
                if s and "$ref" in s:
                    models.append(s["$ref"])
            out += ["Responses:", ""] + _table(["status", "description", "body"], rows) + [""]
            for ref in models:
                out += _model(schemas, ref, "Response body: ")
    return "\n".join(out)


# -- metrics ------------------------------------------------------------------------------------
def metrics_page() -> str:
    from solaris import metrics

    out = _banner("solaris/metrics.py") + [
        "# Metrics", "",
        "The metrics the app records through Ray: Ray's Prometheus endpoint exports each as "
        "`ray_` and its name; a counter adds `_total`, a histogram is its `_bucket`, `_sum` "
        "and `_count` series. The Grafana dashboard (`deploy/grafana/solaris-dashboard.json`) "
        "and the alert rules (`deploy/prometheus/solaris-alerts.yaml`) read these names.", "",
        f"This page is generated from the definitions in `solaris/metrics.py`, from which "
        f"the code builds its metrics, by `{COMMAND}`.", ""]
    for exporter, (title, who) in metrics.EXPORTERS.items():
        out += [f"## {title}", "", f"Recorded by {_escape(who)}.", ""]
        rows = []
        for m in metrics.exported_by(exporter):
            about = m.description + (f" (buckets: {', '.join(map(_number, m.boundaries))})"
                                     if m.boundaries else "")
            rows.append(["<br>".join(_code(n) for n in m.prometheus_names()), m.kind,
                         ", ".join(_code(t) for t in m.tag_keys), _escape(about)])
        out += _table(["Prometheus series", "kind", "labels", "description"], rows) + [""]
    return "\n".join(out)


# -- FM inputs ------------------------------------------------------------------------------------
def fm_inputs_page() -> str:
    from solaris.data.schema import FeatureSpec
    from solaris.models import api, check, contract

    keys = [f.name for f in contract.INPUTS]
    if keys != [*api.REQUEST_KEYS, *api.CANDIDATE_KEYS]:
        raise SolarisError(f"solaris.models.contract.INPUTS names {keys}, the interface "
                           f"{[*api.REQUEST_KEYS, *api.CANDIDATE_KEYS]}")
    out = _banner("solaris/models/contract.py, solaris/models/api.py and "
                  "solaris/data/schema.py") + [
        "# FM inputs", "",
        "What every key an FM reads holds: its dtype, shape, values, coding, padding and unit. "
        "Training (`FeatureTables.batch`, `solaris/features.py`), the FM workers and the KNN "
        "job (`request_inputs`, `solaris/history.py`) build the same codes; the interface "
        "itself is on [Your own FM and VM](../guides/your-own-models.md). A test checks "
        "this table against batches of both paths, and `solaris check-fm` holds a class to "
        "it ([below](#check-a-class)).", "",
        f"This page is generated from `solaris/models/contract.py` (the table), "
        f"`solaris/models/api.py` (the capability) and `solaris/data/schema.py` (the spec) "
        f"by `{COMMAND}`.", "",
        "Codes of the history (`hist_*`) and of multi-hot lists are **shifted by one**: 0 "
        "is padding. The candidate's own codes (`item`, `item_cat`) and the request's "
        "`surface` are **not** shifted: an FM that shares one table between a candidate "
        "and its history adds 1 to them itself. Every value of a padded history slot is 0.",
        "", "## Shapes", ""]
    out += _table(["symbol", "size"], [[_code(d), about] for d, about in contract.DIMS.items()])
    sides = (("request", "Request side: `request_part(req)` and `user_vectors(req)`",
              "`req` holds `REQUEST_KEYS`, R rows each, one per request."),
             ("candidate", "Candidate side: `candidate_part(state, cand, req_index)`",
              "`cand` holds `CANDIDATE_KEYS`, B rows each, one per (request, candidate) "
              "pair; `req_index` (B,) `int64` is each pair's row of `state` (`0..R-1`)."))
    for side, title, about in sides:
        rows = []
        for f in contract.INPUTS:
            if f.side != side:
                continue
            values = "finite" if f.high == "-" else f"`0 .. {f.high}`"
            shape = f"({', '.join(f.shape)}{',' if len(f.shape) == 1 else ''})"
            rows.append([_code(f.name), _code(f.dtype), _code(shape),
                         values, f.coding, f.padding, f.unit])
        out += ["", f"## {title}", "", about, ""]
        out += _table(["key", "dtype", "shape", "values", "coding", "padding", "unit"], rows)
    out += ["", "In training every pair carries its own request side (R = B, `req_index` the "
            "identity: `solaris.models.api.shared_layer`). The FM is not given the request-time "
            "features (`spec.request_continuous`): only the VM reads them (`request_cont`).",
            "", "Value names: `card` is the column's cardinality, `vocab` its vocabulary size "
            "(the spec's values, below), T the number of tasks.", "",
            "## The feature spec (`spec`)", "",
            "The FM is built with the dataset's `FeatureSpec` (`solaris/data/schema.py`): the "
            "column counts and sizes it sizes its tables by.", ""]
    docs = field_docs(inspect.getsource(FeatureSpec), "spec.")
    out += _table(["field", "type", "description"], [
        [_code(f.name), _type(str(f.type)), _escape(docs[f.name])]
        for f in dataclasses.fields(FeatureSpec)])
    out += ["", "It is built with `num_users` and `num_items` (the id ranges above), `tasks` "
            "(the heads' order and `hist_action`'s bits), `history_len` (L) and `version`; "
            "the interface page says how.", "",
            "## Users it never saw (`ReadsUnseenUsers`)", "",
            _escape(" ".join(inspect.getdoc(api.ReadsUnseenUsers).split())), "",
            "With it, a new user's candidates are queued for the FM workers and their pairs "
            "served like anyone's; without it, such a user is answered by the VM alone (and "
            "the user-KNN cold start) until the FM is retrained. The built-in FM does not "
            "declare it (it reads a user-id table); `examples/causal_fm.py` does.", "",
            "## Check a class", "",
            "`solaris check-fm MODULE:CLASS` (`solaris.models.check.check_fm`) builds the "
            "class on a small synthetic world with these inputs and exits 1 naming each "
            "probe that fails; `--config FILE` gives its `fm.kwargs`:", "",
            "```bash", "PYTHONPATH=. solaris check-fm examples.causal_fm:CausalTransformerFM",
            "```", ""]
    out += _table(["probe", "holds the class to"],
                  [[_code(n), about] for n, about in check.PROBES.items()])
    return "\n".join(out + [""])


# -- the pages ------------------------------------------------------------------------------------
# the core's own pages; ``pages()`` adds those registered under ``PAGE_GROUP``
PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": config_page, "cli.md": cli_page, "metrics.md": metrics_page,
    "fm-inputs.md": fm_inputs_page}
PAGE_GROUP = "solaris.reference_pages"  # pyproject.toml: page name = "module:function"


def registered_pages() -> dict[str, Callable[[], str]]:
    """The pages the installed packages register under ``PAGE_GROUP``, by name (each a
    function that renders it). Loading one imports its module only: nothing is rendered."""
    out = {}
    for ep in entries(PAGE_GROUP).values():
        if ep.name in PAGES:
            raise SolarisError(f"reference page {ep.name!r} ({ep.value}): the core's own page "
                               "has that name")
        out[ep.name] = ep.load()
    return out


def pages() -> dict[str, Callable[[], str]]:
    """Every reference page: the core's, then the registered ones."""
    return {**PAGES, **registered_pages()}


def render(name: str) -> str:
    """Page ``name`` (a key of ``pages()``) as the code describes it now."""
    every = PAGES if name in PAGES else pages()
    if name not in every:
        raise SolarisError(f"page={name!r}: not a reference page ({', '.join(every)})")
    text = every[name]()
    return text if text.endswith("\n") else text + "\n"


def difference(name: str, directory: Path = REFERENCE_DIR) -> str | None:
    """None if page ``name`` in ``directory`` is what the code generates; else a message that
    names the page, the command that regenerates it and the first lines that differ."""
    path, fresh = directory / name, render(name)
    old = path.read_text() if path.is_file() else ""
    if old == fresh:
        return None
    diff = difflib.unified_diff(old.splitlines(), fresh.splitlines(), f"{name} (on disk)",
                                f"{name} (from the code)", lineterm="", n=1)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return (f"{shown} is stale: regenerate it with `{COMMAND}`"
            + ("" if path.is_file() else " (the file is missing)") + "\n"
            + "\n".join(list(diff)[:DIFF_LINES]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Write (or check) the reference "
                                "pages generated from the code.")
    p.add_argument("pages", nargs="*", metavar="PAGE",
                   help="pages to write or check (default: all: the core's, "
                   f"{', '.join(PAGES)}, and those registered under {PAGE_GROUP})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each page that differs from the code")
    p.add_argument("--dir", type=Path, default=REFERENCE_DIR, help="where the pages are")
    args = p.parse_args(argv)
    every = pages()
    names = args.pages or list(every)
    if unknown := [n for n in names if n not in every]:
        p.error(f"not a reference page: {', '.join(unknown)} (pages: {', '.join(every)})")
    if args.check:
        messages = [m for m in (difference(n, args.dir) for n in names) if m is not None]
        for m in messages:
            print(m, file=sys.stderr)
        return 1 if messages else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for n in names:
        atomic.save_text(args.dir / n, render(n))
        print(f"wrote {args.dir / n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
