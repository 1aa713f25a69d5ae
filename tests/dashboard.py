"""The metric names deploy/ uses (the Grafana dashboard, the Prometheus alert rules) and
the names the code exports them under: read by tests/unit/test_dashboard.py and by the
live endpoint check in tests/integration/test_serve_app.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "solaris-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "solaris-alerts.yaml"
RUNBOOK = ROOT / "docs" / "guides" / "runbook.md"
_NAMED = re.compile(r"\b(ray_solaris_[a-z0-9_]+)")


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
    """The Prometheus names of the metrics the code defines: the registry the router, the
    precompute deployment and the FM worker pools build their Ray metrics from
    (``solaris/metrics.py``; tests/unit/test_reference_pages.py checks that no Ray metric is
    made outside it)."""
    from solaris.metrics import prometheus_names

    return prometheus_names()
