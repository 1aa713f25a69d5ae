"""The reference pages (docs/reference/) are what the code generates (``solaris/reference.py``):
the core's pages (configuration, command line, metrics, FM inputs) here, the HTTP pages, which
the app registers (``serve/reference.py``) and which import Ray, in
tests/integration/test_reference_http.py; here, that ``python -m solaris.reference`` covers
every page of the directory, those too. The generator reads every config field's comment,
every option of every command, and the one registry of metrics (``solaris/metrics.py``) that
the code builds its Ray metrics from and the dashboard and alert rules read."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
import typing
from pathlib import Path

import pytest
import yaml

from solaris import cli, config, metrics, reference, registry
from solaris.errors import ConfigError
from tests.dashboard import named_metrics

ROOT = Path(__file__).resolve().parents[2]
UNIT_PAGES = list(reference.PAGES)  # the core's own pages; none imports Ray


@pytest.mark.parametrize("name", UNIT_PAGES)
def test_the_page_is_what_the_code_generates(name):
    message = reference.difference(name)
    if message is not None:
        pytest.fail(message, pytrace=False)


def test_the_check_command_names_each_stale_page(tmp_path, capsys):
    assert reference.main(["--dir", str(tmp_path), *UNIT_PAGES]) == 0
    assert reference.main(["--check", "--dir", str(tmp_path), *UNIT_PAGES]) == 0
    page = tmp_path / "cli.md"
    page.write_text(page.read_text().replace("--verbose", "--loud"))
    (tmp_path / "metrics.md").unlink()
    capsys.readouterr()
    assert reference.main(["--check", "--dir", str(tmp_path), *UNIT_PAGES]) == 1
    err = capsys.readouterr().err
    assert f"{page} is stale: regenerate it with `python -m solaris.reference`" in err
    assert "metrics.md is stale" in err and "(the file is missing)" in err
    assert "configuration.md" not in err
    assert "-| `-v`, `--loud`" in err and "+| `-v`, `--verbose`" in err  # the diff


def test_the_command_covers_every_page_of_the_directory_the_apps_registered_too():
    """``python -m solaris.reference`` writes and checks every page under docs/reference/:
    the core's and those the app registers (rendered beside it, by serve/reference.py). The
    registrations are looked up, not rendered: nothing here imports Ray."""
    on_disk = {p.name for p in reference.REFERENCE_DIR.iterdir() if p.is_file()}
    registered = reference.registered_pages()
    assert set(registered) == {"http.md", "openapi.json"}
    assert {f.__module__ for f in registered.values()} == {"serve.reference"}
    assert set(reference.pages()) == set(UNIT_PAGES) | set(registered) == on_disk


def test_what_pyproject_registers_is_what_is_installed():
    """The entry points of pyproject.toml (the research commands, the app's reference pages)
    are read from the installed metadata: a registration added since the last install is
    missing until ``pip install -e .`` runs again, and this says so."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert set(declared) == {cli.COMMANDS, reference.PAGE_GROUP}
    for group, table in declared.items():
        installed = {name: ep.value for name, ep in registry.entries(group).items()}
        assert installed == table, (f"{group}: installed {installed}, pyproject.toml {table}: "
                                    "run `pip install -e .` again")


def test_every_page_starts_with_the_command_that_generates_it():
    for name in UNIT_PAGES:
        first = reference.render(name).splitlines()[0]
        assert first.startswith("<!-- Generated from ") and "`python -m solaris.reference`" \
            in first, (name, first)


# -- configuration ----------------------------------------------------------------------
def leaf_keys(cls: type, prefix: str = "") -> dict[str, tuple[dataclasses.Field, type]]:
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out |= leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            out[prefix + f.name] = (f, cls)
    return out


def config_rows() -> dict[str, list[str]]:
    """key -> [type, default, description] of the configuration page's tables."""
    rows = {}
    for line in reference.render("configuration.md").splitlines():
        if m := re.match(r"\| `([a-z_.]+)` \| (.*) \|$", line):
            rows[m.group(1)] = re.split(r"(?<!\\) \| ", m.group(2))
    return rows


def test_every_config_key_is_on_the_page_with_its_default_and_a_description():
    keys = leaf_keys(config.SolarisConfig)
    rows = config_rows()
    assert len(keys) > 150
    assert set(keys) <= set(rows)
    for key, (f, _) in keys.items():
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        shown = rows[key][1].strip("`").strip()
        back = yaml.safe_load(shown)  # what `--set KEY=<shown>` would set
        assert back == (list(default) if isinstance(default, tuple) else default), (key, shown)
        assert rows[key][2] not in ("", "—"), key


def test_the_page_says_what_the_comments_beside_the_fields_say():
    rows = config_rows()
    assert rows["fm.emb_dim"][2] == "width of id / feature / history-token embeddings"
    assert rows["cache.codec"][2] == r"fp32 \| fp16 \| int8 (per-vector scale)"
    assert rows["split.vm_surface"][0] == "`int` or `null`"
    assert rows["train.weight_decay"][1] == "`1.0e-06`"  # reads back as a float
    assert rows["precompute.block_pairs"][2] == "as `precompute.block_requests`, above"
    assert rows["data.synthetic.click_rate"][2].endswith("lifts the realised rate by ~1-2 points)")
    assert rows["data.synthetic"][0] == "section"


SOURCE = '''
@dataclass(frozen=True)
class Demo:
    """A demo section."""

    a: int = 1  # on the line
    # right above,
    # two lines
    b: str = "x"
    c: float = 0.5  # on the line, and it
    # goes on under it
    d: int = 2  # its own
    e: int = 3
    f: int = 4

    # a note that is right above no field

    g: int = 5

    def __post_init__(self) -> None:
        pass  # no field
'''


def test_field_docs_reads_comments_on_above_and_under_a_field():
    docs = reference.field_docs(SOURCE.replace("g: int = 5", "g: int = 5  # g"))
    assert docs == {"a": "on the line", "b": "right above, two lines",
                    "c": "on the line, and it goes on under it", "d": "its own",
                    "e": "=d", "f": "=d", "g": "g"}


def test_a_field_without_a_comment_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"demo\.g: no comment describes this config field"):
        reference.field_docs(SOURCE, "demo.")


@pytest.mark.parametrize("value", [None, True, False, 0, 3, 0.5, 1e-6, 2.5e20, "auto", "",
                                   "fm-v1", "a: b", "null", "1", "solaris.models.fm:X",
                                   (64, 32), (0.0, 0.25), {"GPU": 1.0, "fm_gpu": 1.0}])
def test_a_default_is_shown_as_yaml_that_reads_back_as_itself(value):
    back = yaml.safe_load(reference.yaml_value(value))
    assert back == (list(value) if isinstance(value, tuple) else value)
    assert type(back) is (list if isinstance(value, tuple) else type(value))


def test_markdown_text_is_escaped_outside_code_spans():
    text = "a | b `x | y` *c* <d> __init__ snake_case ``e_|``"
    assert reference._escape(text) == (r"a \| b `x | y` \*c\* &lt;d> \_\_init\_\_ snake_case "
                                       "``e_|``")


# -- command line -------------------------------------------------------------------------
def parsers(p: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(name, p)]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub, sp in a.choices.items():
                out += parsers(sp, f"{name} {sub}")
    return out


def test_every_command_and_option_is_on_the_cli_page():
    page = reference.render("cli.md")
    sections = re.split(r"^#+ ", page, flags=re.M)
    by_command = {s.splitlines()[0]: s for s in sections[2:]}
    commands = parsers(cli.build_parser(), "solaris")
    assert len(commands) >= 10 and set(by_command) == {n for n, _ in commands[1:]}
    for name, p in commands:
        text = sections[1] if name == "solaris" else by_command[name]
        for a in p._actions:
            if a.option_strings and not isinstance(a, argparse._HelpAction):
                assert f"`{a.option_strings[-1]}`" in text, (name, a.option_strings)
    assert "| `--seeds` | `SEEDS` (integer) | — | seeds (default: report.seeds) |" in page
    assert "| `--out` | `OUT` (path) | **required** | — |" in page
    assert "| `--candidates` | `CANDIDATES` (integer) | `100` |" in page


# -- metrics --------------------------------------------------------------------------------
def test_every_metric_the_dashboard_and_the_alerts_read_is_in_the_registry():
    named = named_metrics()
    assert {"ray_solaris_rank_latency_ms_bucket", "ray_solaris_rank_errors_total",
            "ray_solaris_queue_depth"} <= named  # the three kinds, as Ray exports them
    unknown = named - metrics.prometheus_names()
    assert not unknown, f"named in deploy/ but not in solaris/metrics.py: {sorted(unknown)}"


def test_no_ray_metric_is_made_outside_the_registry():
    direct = re.compile(r"ray_metrics\.(Gauge|Counter|Histogram)\(|metrics import (Gauge|Counter"
                        r"|Histogram)")
    users = []
    for path in [*ROOT.glob("serve/*.py"), *ROOT.glob("actors/*.py"), *ROOT.glob("jobs/*.py")]:
        text = path.read_text()
        assert not direct.search(text), f"{path.name}: a Ray metric not made by metrics.build"
        if "metrics.build(" in text:
            users.append(path.relative_to(ROOT).as_posix())
    assert sorted(users) == ["actors/precompute.py", "serve/meters.py", "serve/precompute.py"]


class FakeMetric:
    def __init__(self, name, description="", boundaries=None, tag_keys=None):
        self.args = (type(self).__name__, name, description, boundaries, tag_keys)


class FakeRayMetrics:
    """Only what ``build`` uses of ``ray.util.metrics``: its three classes."""

    Counter = type("Counter", (FakeMetric,), {})
    Gauge = type("Gauge", (FakeMetric,), {})
    Histogram = type("Histogram", (FakeMetric,), {})


def test_build_makes_the_ray_metric_of_each_kind():
    fake = FakeRayMetrics()
    assert metrics.build(metrics.RANK_LATENCY_MS, fake).args == (
        "Histogram", "solaris_rank_latency_ms", "router latency of /rank",
        [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], ("mode", "task"))
    assert metrics.build(metrics.RANK_ERRORS, fake).args == (
        "Counter", "solaris_rank_errors", "non-2xx answers of /rank", None, ("code",))
    assert metrics.build(metrics.QUEUE_DEPTH, fake).args == (
        "Gauge", "solaris_queue_depth", "pending precompute pairs", None, ())
    assert metrics.RANK_LATENCY_MS.prometheus_names() == (
        "ray_solaris_rank_latency_ms_bucket", "ray_solaris_rank_latency_ms_sum",
        "ray_solaris_rank_latency_ms_count")
    assert [m.name for m in metrics.exported_by("pool")] == [
        "solaris_fm_pool_workers", "solaris_fm_pool_pending", "solaris_fm_worker_errors"]


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "rank_errors"}, "name='rank_errors'"),
    ({"kind": "summary"}, "kind='summary'"),
    ({"exporter": "vm"}, "exporter='vm'"),
    ({"kind": "histogram"}, "a histogram needs them"),
    ({"kind": "histogram", "boundaries": (5.0, 1.0)}, "must be > 0 and increasing"),
    ({"boundaries": (1.0,)}, "another kind has none"),
])
def test_a_bad_metric_definition_is_refused_by_name(kwargs, message):
    base = {"name": "solaris_x", "kind": "counter", "description": "x", "exporter": "router"}
    with pytest.raises(ConfigError, match=re.escape(message)):
        metrics.Metric(**{**base, **kwargs})
