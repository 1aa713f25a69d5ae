"""The Grafana dashboard and the Prometheus alert rules (deploy/) name only metrics the code
defines, under the names Ray exports them (ray_ prefix; _total for counters; _bucket, _sum,
_count for histograms); every alert has a runbook section. The live endpoint is read in
tests/integration/test_serve_app.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "solaris-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "solaris-alerts.yaml"
RUNBOOK = ROOT / "docs" / "guides" / "runbook.md"
_DEFINED = re.compile(r"ray_metrics\.(Gauge|Counter|Histogram)\(\s*f?\"(solaris_[a-z0-9_{}]+)\"")
_NAMED = re.compile(r"\b(ray_solaris_[a-z0-9_]+)")
SUFFIXES = {"Gauge": ("",), "Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count")}


def dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p["targets"]]


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def named_metrics() -> set[str]:
    """Every ray_solaris_* name the dashboard and the alert rules use."""
    exprs = dashboard_exprs() + [r["expr"] for r in alert_rules()]
    return {m for e in exprs for m in _NAMED.findall(e)}


def exported_names() -> set[str]:
    """The Prometheus names of the metrics the code defines (the gauges named in a loop in
    serve/precompute.py are listed there as ``solaris_{k}``: expanded from its tuple)."""
    out: set[str] = set()
    for path in [*ROOT.glob("serve/*.py"), *ROOT.glob("actors/*.py"), *ROOT.glob("jobs/*.py")]:
        text = path.read_text()
        for kind, name in _DEFINED.findall(text):
            names = [name]
            if "{k}" in name:  # ("queue_depth", "pending ..."), ...
                names = [name.replace("{k}", k) for k in
                         re.findall(r"\(\"([a-z_]+)\", \"", text[text.index(name):])]
            out |= {f"ray_{n}{s}" for n in names for s in SUFFIXES[kind]}
    return out


def test_the_dashboard_is_grafana_json_with_a_prometheus_target_per_panel():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] == "solaris" and d["panels"]
    for p in d["panels"]:
        assert p["title"] and p["targets"], p.get("title")
        assert all(t["expr"] and t["datasource"]["type"] == "prometheus" for t in p["targets"])
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


def test_every_metric_named_is_one_the_code_exports():
    defined = exported_names()
    assert {"ray_solaris_rank_latency_ms_bucket", "ray_solaris_queue_depth",
            "ray_solaris_shard_up"} <= defined  # the scan finds the three kinds
    unknown = named_metrics() - defined
    assert not unknown, f"named in deploy/ but not defined in the code: {sorted(unknown)}"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section():
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.+)$", RUNBOOK.read_text(), re.M)}
    rules = alert_rules()
    assert len(rules) >= 8
    for r in rules:
        assert r["labels"]["severity"] in ("page", "warning") and r["annotations"]["summary"]
        anchor = r["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, (r["alert"], anchor)
        assert anchor == r["alert"].lower()
