"""Users the FM never saw, over real HTTP on a local Ray: an app whose FM declares that it
reads them (``ReadsUnseenUsers``: the example causal FM) queues a new user's candidates, its
FM workers compute them and the user's next request is served pair tiers; the same weights
under a class that does not declare it queue none of the new user's pairs (and a known
user's still)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from tests.tiny import train_tiny  # noqa: E402

T0 = 1.9e9
TIMEOUT_S = 15.0
CAUSAL = {"fm.cls": "examples.causal_fm:CausalTransformerFM", "fm.version": "causal-v1",
          "fm.kwargs": {"dim": 16, "layers": 1, "heads": 2, "shared_dim": 64, "dropout": 0.1}}
KNOWN_ONLY = "tests.integration.known_users_fm:KnownUsersOnlyFM"
NUM_USERS = 300  # tests/tiny.py's world
NEW = NUM_USERS + 7  # an id past the FM's user table (the identity map passes it through)
CANDS = list(range(100, 160))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Artifacts of the causal FM, a copy whose FM checkpoint names the class that does not
    read new users, and a config."""
    import torch

    causal = train_tiny(tmp_path_factory.mktemp("causal"), **CAUSAL)
    known_only = tmp_path_factory.mktemp("known") / "artifacts"
    shutil.copytree(causal, known_only)
    fm_path = known_only / json.loads((causal / "manifest.json").read_text())["fm"]
    ck = torch.load(fm_path, map_location="cpu", weights_only=True)
    ck["config"]["cls"] = KNOWN_ONLY
    torch.save(ck, fm_path)
    conf = tmp_path_factory.mktemp("conf") / "serve.yaml"
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 1},
                                "serve": {"profile": "replay"}}))
    return {"causal": causal, "known_only": known_only, "conf": conf}


def deploy(deploy_app, cluster, artifacts: Path, app_id: str) -> str:
    """The app of ``artifacts`` on the module's local Ray with Serve (conftest.py)."""
    return deploy_app({"artifacts": str(artifacts), "config": str(cluster["conf"]),
                       "app_id": app_id})


def rank(base: str, user: int, now: float) -> dict:
    r = requests.post(base + "/rank", json={"user_id": user, "candidates": CANDS,
                                             "task": "click", "now": now}, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def after_answer(base: str) -> dict:
    return requests.get(base + "/stats", timeout=TIMEOUT_S).json()["after_answer"]


def rank_flushed(base: str, user: int, now: float) -> tuple[dict, dict]:
    """(the answer, ``/stats``' after-answer counts once its after-answer work -- the
    impressions and the picks -- was flushed to the shards and the queue)."""
    before = after_answer(base)["flushes"]
    out = rank(base, user, now)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = after_answer(base)
        if got["flushes"] > before:  # a flush drains the whole buffer
            return out, got
        time.sleep(0.1)
    raise AssertionError(f"the request's after-answer work was not flushed: {got}")


def test_a_new_users_pairs_are_computed_and_served_for_an_fm_that_reads_new_users(
        cluster, deploy_app):
    base = deploy(deploy_app, cluster, cluster["causal"], "newusers")
    first, stats = rank_flushed(base, NEW, T0)
    assert set(first["tiers"]) == {"none"}  # nothing computed yet: the VM alone
    assert stats["queue_calls"] == 1  # its candidates were queued
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tiers = rank(base, NEW, T0 + 10)["tiers"]
        if "pair" in tiers:
            break
        time.sleep(0.5)
    # the verifier's top 20% of the new user's candidates, computed by the FM workers
    assert tiers.count("pair") >= int(0.2 * len(CANDS))


def test_a_new_user_gets_no_pair_queued_for_an_fm_that_does_not_read_new_users(
        cluster, deploy_app):
    base = deploy(deploy_app, cluster, cluster["known_only"], "knownonly")
    for k in range(3):
        out, stats = rank_flushed(base, NEW, T0 + k)
        assert set(out["tiers"]) == {"none"}
        assert stats["queue_calls"] == 0  # answered, nothing queued
    _, stats = rank_flushed(base, 7, T0)  # a user the FM was trained on: queued as ever
    assert stats["queue_calls"] == 1
