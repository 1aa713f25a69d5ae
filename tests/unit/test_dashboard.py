"""The Grafana dashboard and the Prometheus alert rules (deploy/) name only metrics the code
defines, under the names Ray exports them (ray_ prefix; _total for counters; _bucket, _sum,
_count for histograms); every alert has a runbook section. The live endpoint is read in
tests/integration/test_serve_app.py."""

from __future__ import annotations

import json
import re

from tests.dashboard import (ALERTS, DASHBOARD, RUNBOOK, alert_rules,  # noqa: F401
                             exported_names, named_metrics)


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
