"""The readiness verdict of /healthz (solaris/online/health.py): only a required check makes
a router unready; the KNN table's age from its version's build stamp."""

from __future__ import annotations

import calendar
import time

from solaris.online import health
from solaris.online.health import Check


def test_only_a_failed_required_check_makes_the_router_unready():
    assert health.verdict([Check("vm_click", True, True), Check("shards", True)]) == health.OK
    assert health.verdict([Check("vm_click", True, True), Check("shards", False)]) == \
        health.DEGRADED
    assert health.verdict([Check("vm_click", False, True), Check("shards", True)]) == \
        health.UNREADY


def test_a_dead_shard_is_named_and_degrades():
    c = health.shards_check([True, False, True, False], 3.0)
    assert not c.ok and not c.required and c.to_dict()["down"] == [1, 3]
    assert "[1, 3]" in c.detail


def test_the_knn_age_comes_from_the_oldest_build_stamp_in_the_version():
    built = calendar.timegm(time.strptime("20261206T120000Z", "%Y%m%dT%H%M%SZ"))
    v = "20261206T120000Z-abc123|20261206T130000Z-def456"
    assert health.knn_age_s(v, built + 7200) == 7200
    assert health.knn_age_s("handmade", built) is None and health.knn_age_s(None, 0) is None
    ok = health.knn_check(True, v, built + 3600, 2 * 3600)
    stale = health.knn_check(True, v, built + 3 * 3600, 2 * 3600)
    assert ok.ok and not stale.ok and stale.detail.startswith("stale")
    assert health.knn_check(False, None, 0, 1).ok  # not configured: nothing to be stale
    assert not health.knn_check(True, None, 0, 1).ok  # configured, nothing published yet


def test_fm_workers_are_unhealthy_only_with_work_queued_and_no_worker():
    assert health.fm_check({"workers": 0, "queue_depth": 0}, 1).ok
    assert not health.fm_check({"workers": 0, "queue_depth": 5}, 1).ok
    assert health.fm_check({"workers": 2, "queue_depth": 5}, 1).ok
    c = health.fm_check(None, 500, "GetTimeoutError")
    assert not c.ok and "GetTimeoutError" in c.detail


def test_a_precompute_that_could_not_load_its_fm_fails_readiness_with_the_error():
    err = "ConfigError: /a/fm.pt: fm.cls='nosuch.module:FM': cannot import 'nosuch.module'"
    c = health.fm_check({"workers": 0, "queue_depth": 0, "error": err}, 1)
    assert not c.ok and c.required and err in c.detail
    assert health.verdict([c]) == health.UNREADY
    assert health.fm_check({"workers": 1, "queue_depth": 0, "error": None}, 1).ok
    late = health.fm_check(None, 1, "TimeoutError")  # not answering only degrades
    assert not late.required and "TimeoutError" in late.detail


def test_a_deployment_whose_plugin_did_not_load_fails_readiness():
    bad = health.loaded_check("vm_click", "CheckpointError: vm.cls='x.y:Z': cannot import")
    assert not bad.ok and bad.required and "x.y:Z" in bad.detail
    assert health.verdict([bad]) == health.UNREADY
    assert health.loaded_check("router", None).ok
