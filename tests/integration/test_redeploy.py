"""A redeploy that replaces the app's replicas keeps the cache: the cache shards, queue,
ledger and KNN holder are detached (``serve.detached_state``), so pair embeddings computed
before the redeploy are still found after it."""

from __future__ import annotations

import json
import time

import pytest

requests = pytest.importorskip("requests")

from tests.tiny import train_tiny  # noqa: E402

T0 = 1.9e9
CANDIDATES = list(range(40))


def _rank(base: str, now: float) -> list[str]:
    r = requests.post(base + "/rank", timeout=30, json={
        "user_id": 3, "candidates": CANDIDATES, "task": "click", "now": now})
    assert r.status_code == 200, r.text
    return r.json()["tiers"]


@pytest.mark.slow
def test_pairs_cached_before_a_redeploy_are_found_after_it(tmp_path, deploy_app):
    art = str(train_tiny(tmp_path / "art"))
    confs = []
    for k, flush in enumerate((10.0, 15.0)):  # a changed config: Serve replaces the replicas
        conf = tmp_path / f"app{k}.yaml"
        conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 2, "deadline_ms": 500.0},
                                    "serve": {"flush_ms": flush, "profile": "replay"}}))
        confs.append(str(conf))
    base = deploy_app({"artifacts": art, "config": confs[0], "app_id": "redeploy"})
    deadline = time.monotonic() + 90
    k = 0
    while "pair" not in _rank(base, T0 + k):  # the FM workers fill the cache
        assert time.monotonic() < deadline, "no pair embedding was ever cached"
        k += 1
        time.sleep(0.2)
    before = _rank(base, T0 + k).count("pair")
    deploy_app({"artifacts": art, "config": confs[1], "app_id": "redeploy"}, healthy=False)
    deadline = time.monotonic() + 60
    while requests.get(base + "/stats", timeout=30).json()["serve"]["flush_ms"] != 15.0:
        assert time.monotonic() < deadline, "the redeploy never took over"
        time.sleep(0.5)
    after = _rank(base, T0 + k).count("pair")  # same event time: nothing expired
    assert after >= before > 0, (before, after)
