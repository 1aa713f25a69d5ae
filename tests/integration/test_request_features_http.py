"""A team's log over real HTTP: a generic impression log with opaque string ids whose mapping
declares a request-time feature (``request_features: [hour]``), trained with the tiny
settings and served on a local Ray. ``/rank`` and ``/feedback`` take the raw string ids (an
unknown one is served through the fallbacks; an integer is a 422 naming the field);
``/rank``'s ``features`` reach the VM (another value, other scores), in the default path
(the router's corrections over the replica's VM alone, ``serve.overlap``) and in the
VM replica's own (mode ``vm``); an undeclared name or a non-finite value is a 422 naming it;
a request without the feature is served at its training mean."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tests.tiny import TINY  # noqa: E402

TIMEOUT_S = 15.0
T0 = 1.9e9


def _generic_log_with_hour(root: Path) -> Path:
    """The tiny synthetic world exported as a generic impression log, plus a column
    ``hour`` (one value per request), declared as a request feature."""
    import yaml

    from solaris.config import load_config
    from solaris.data.export import export_generic
    from solaris.data.load import load_dataset

    cfg = load_config(None, TINY)
    path = export_generic(load_dataset(cfg.data), root, string_ids=True)
    doc = yaml.safe_load(path.read_text())
    log = pq.read_table(root / doc["interactions"])
    rid = log.column("request_id").to_numpy()
    hour = (np.random.default_rng(0).integers(0, 24, rid.max() + 1)[rid]).astype(np.float64)
    pq.write_table(log.append_column("hour", pa.array(hour)), root / doc["interactions"])
    doc["mapping"]["request_features"] = ["hour"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory, deploy_app):
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.train.artifacts import train_artifacts

    mapping = _generic_log_with_hour(tmp_path_factory.mktemp("log"))
    cfg = load_config(None, {**TINY, "data.dataset": "generic", "data.data_dir": str(mapping)})
    ds = load_dataset(cfg.data)
    assert ds.spec.request_continuous == ("hour",)
    art = tmp_path_factory.mktemp("artifacts")
    train_artifacts(cfg, ds, art, seed=0)
    conf = tmp_path_factory.mktemp("conf") / "serve.yaml"
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 1, "deadline_ms": 200.0},
                                "serve": {"profile": "replay"}}))
    base = deploy_app({"artifacts": str(art), "config": str(conf), "app_id": "rqfeat"},
                      healthy=False)
    return {"base": base, "spec": ds.spec, "ds": ds,
            "users": ds.users.column("raw_id").to_pylist(),
            "items": ds.items.column("raw_id").to_pylist()}


def _rank(app, **kw) -> requests.Response:
    body = {"user_id": app["users"][3], "candidates": app["items"][:40], "task": "click",
            "now": T0}
    body.update(kw)
    return requests.post(app["base"] + "/rank", json=body, timeout=TIMEOUT_S)


@pytest.mark.parametrize("mode", [None, "vm"])
def test_the_request_feature_reaches_the_vm(app, mode):
    extra = {} if mode is None else {"mode": mode}
    scores = {}
    for hour in (2.0, 20.0):
        r = _rank(app, features={"hour": hour}, **extra)
        assert r.status_code == 200, r.text
        scores[hour] = np.array(r.json()["scores"])
    assert not np.array_equal(scores[2.0], scores[20.0])
    # absent: the training mean, the same scores as sending the mean itself
    mean = app["spec"].request_mean[0]
    absent = _rank(app, **extra)
    at_mean = _rank(app, features={"hour": mean}, **extra)
    assert absent.status_code == at_mean.status_code == 200
    np.testing.assert_array_equal(absent.json()["scores"], at_mean.json()["scores"])


def test_an_undeclared_feature_is_a_422_naming_it(app):
    r = _rank(app, features={"hour": 3.0, "weekday": 1.0})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "features"] and "'weekday'" in detail["msg"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_feature_is_refused(app, value):
    raw = ('{"user_id": "%s", "candidates": ["%s"], "task": "click", "now": %r, '
           '"features": {"hour": %s}}' % (app["users"][3], app["items"][1], T0, value))
    r = requests.post(app["base"] + "/rank", data=raw, timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "features" in r.text and "hour" in r.text
    assert _rank(app, features={"hour": 5.0}).status_code == 200  # still serving


def test_rank_and_feedback_take_the_logs_raw_string_ids(app):
    """The router translates the raw ids with the artifacts' id map: a known user's request
    is scored as that user (another user's scores differ), its labels reach its history;
    an id never seen is served through the fallbacks; an integer id here is a 422."""
    users, items = app["users"], app["items"]
    assert all(isinstance(u, str) for u in users) and users != sorted(users)
    a = _rank(app, user_id=users[3], features={"hour": 5.0})
    b = _rank(app, user_id=users[4], features={"hour": 5.0})
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["scores"] != b.json()["scores"]
    r = requests.post(app["base"] + "/feedback", timeout=TIMEOUT_S, json={
        "user_id": users[3], "items": items[:2], "labels": [[1, 0], [0, 0]], "now": T0 + 1})
    assert r.status_code == 200 and r.json()["labels"] == 2, r.text
    new = _rank(app, user_id="a-user-never-seen", candidates=["an-item-never-seen", items[0]],
                features={"hour": 5.0})
    assert new.status_code == 200, new.text
    assert new.json()["tiers"][0] == "none" and len(new.json()["scores"]) == 2
    for body, field in (({"user_id": 3}, "user_id"), ({"candidates": [items[0], 7]},
                                                       "candidates")):
        bad = _rank(app, **body)
        assert bad.status_code == 422 and field in json.dumps(bad.json()["detail"]), bad.text
    r = requests.post(app["base"] + "/feedback", timeout=TIMEOUT_S, json={
        "user_id": users[3], "items": [5], "labels": [[1, 0]], "now": T0 + 2})
    assert r.status_code == 422 and "items" in r.text
