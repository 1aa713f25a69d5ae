"""The Serve app over real HTTP on a local Ray: /rank, /feedback, /healthz, the limits and
4xx answers, a schema-driven fuzz (no 5xx, still serving afterwards), and a cache shard and
then a VM replica killed under load (every request answered, none past its timeout).

The app runs in the replay profile (requests carry their event time and the debug fields),
with an operator token for ``POST /scales``; the serving profile's refusals are
``test_hostile.py``'s."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from ray import serve  # noqa: E402

from solaris.config import load_config  # noqa: E402
from tests.tiny import train_tiny  # noqa: E402

T0 = 1.9e9
TIMEOUT_S = 15.0  # a client's patience; nothing may take longer
OPERATOR = {"Authorization": "Bearer test-operator-token-0123"}  # the app's, set below


RAY_ENV = {"SOLARIS_OPERATOR_TOKEN": OPERATOR["Authorization"].split()[1]}  # conftest.py


@pytest.fixture(scope="module")
def app(tmp_path_factory, serve_ray, deploy_app):
    art = train_tiny(tmp_path_factory.mktemp("artifacts"))
    conf = tmp_path_factory.mktemp("conf") / "serve.yaml"
    knn_uri = tmp_path_factory.mktemp("knn")
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 2, "deadline_ms": 200.0},
                                "serve": {"max_candidates": 300, "profile": "replay"},
                                "knn": {"table_uri": str(knn_uri), "poll_s": 0.5, "k": 10,
                                        "recall_queries": 50}}))
    base = deploy_app({"artifacts": str(art), "config": str(conf), "app_id": "test"},
                      healthy=False)
    return {"base": base, "num_items": 200, "num_users": 300, "knn_uri": str(knn_uri),
            "knn_cfg": load_config(conf).knn, "artifacts": art, "metrics": serve_ray.metrics}


def _rank(app, **kw) -> requests.Response:
    body = {"user_id": 3, "candidates": list(range(50)), "task": "click", "now": T0}
    body.update(kw)
    return requests.post(app["base"] + "/rank", json=body, timeout=TIMEOUT_S)


def test_rank_answers_every_candidate_with_provenance(app):
    r = _rank(app)
    assert r.status_code == 200, r.text
    out = r.json()
    import serve_app

    serve_app.RankResponse.model_validate(out)  # the documented response schema
    assert len(out["scores"]) == len(out["tiers"]) == len(out["ages_s"]) == 50
    assert all(0.0 < s < 1.0 for s in out["scores"])
    assert set(out["tiers"]) <= {"none", "pair", "user_neighbour", "item_neighbour"}
    assert out["versions"]["vm"] and out["versions"]["fm"] == out["versions"]["vm"]
    # the VM alone and the inline FM answer the same request too
    for mode in ("vm", "inline"):
        r = _rank(app, mode=mode)
        assert r.status_code == 200 and r.json()["mode"] == mode
    assert set(_rank(app, mode="inline").json()["tiers"]) == {"pair"}


def test_stats_name_the_served_artifacts_and_no_control_lag_before_a_change(app):
    stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
    assert stats["serve"]["artifacts_dir"] == str(Path(app["artifacts"]).resolve())  # an arg
    assert stats["control"]["revision"] == 0 and stats["control"]["lag_s"] is None


def test_precompute_fills_the_cache_for_repeated_requests(app):
    cands = list(range(100, 160))
    for k in range(3):
        assert _rank(app, user_id=7, candidates=cands, now=T0 + k).status_code == 200
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tiers = _rank(app, user_id=7, candidates=cands, now=T0 + 10).json()["tiers"]
        if "pair" in tiers:
            break
        time.sleep(0.5)
    # the verifier's top 20% were precomputed by the FM workers and are now served
    assert tiers.count("pair") >= int(0.2 * len(cands))
    # /stats: the FM's cost (the ledger) per 1,000 of the router's requests and the shards'
    # duplicates and endings, from one report (the gauges are polled every 2 s)
    while time.monotonic() < deadline + 30:
        stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
        spec = stats["precompute"]["speculation"]
        if (spec["evaluations"] or 0) >= tiers.count("pair"):
            break
        time.sleep(0.5)
    assert spec["evaluations"] >= tiers.count("pair") and spec["duplicates"] >= 0
    assert 4 <= spec["served"] <= stats["after_answer"]["requests"]
    assert spec["evaluations_per_1k"] == pytest.approx(1000 * spec["evaluations"]
                                                       / spec["served"])


def test_a_surface_the_data_never_held_is_read_as_the_last_and_breaks_no_pair(app):
    """A surface past the tables is scored as the VM alone reads it (its last surface), and
    what the history and the FM workers then read of it leaves the user's pairs computable."""
    from solaris.artifacts import Artifacts

    last = Artifacts.open(app["artifacts"]).spec.num_surfaces - 1
    cands = list(range(60, 100))
    far = _rank(app, user_id=11, candidates=cands, surface=999_999, now=T0)
    assert far.status_code == 200, far.text
    same = _rank(app, user_id=11, candidates=cands, surface=last, now=T0)
    assert far.json()["scores"] == same.json()["scores"]
    for k in range(1, 3):
        assert _rank(app, user_id=11, candidates=cands, surface=999_999,
                     now=T0 + k).status_code == 200
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tiers = _rank(app, user_id=11, candidates=cands, surface=0, now=T0 + 10).json()["tiers"]
        if "pair" in tiers:
            break
        time.sleep(0.5)
    assert tiers.count("pair") >= int(0.2 * len(cands)), tiers


def test_scales_switch_a_correction_off_at_runtime_and_misses_score_as_the_vm_alone(app):
    """Runs after the precompute test: user 7's candidates are cached (tier pair)."""
    cands = list(range(100, 160))
    state = requests.get(app["base"] + "/scales", timeout=TIMEOUT_S).json()
    (key, vm), = [(k, v) for k, v in state.items() if k.endswith("/click")]
    assert vm["residual"] and set(vm["validation"]["pair"]) >= {"0", "1"}
    trained = vm["scales"]
    # an operator can switch a correction on as well: the own pair at 1, whatever validation
    # chose on this tiny world
    body = {"task": "click", "slot": "pair", "tier": "pair", "scale": 1.0}
    assert requests.post(app["base"] + "/scales", json=body, timeout=TIMEOUT_S,
                          headers=OPERATOR).status_code == 200
    scales = {"pair": {**trained["pair"], "pair": 1.0}, "aggregate": trained["aggregate"]}
    out = _rank(app, user_id=7, candidates=cands, now=T0 + 20).json()
    # an imputed tier or the aggregate at scale 0 (switched off on validation) is not looked
    # up; the own pair always is (its misses are what the FM workers precompute)
    off_tiers = {t for t, s in scales["pair"].items() if s == 0} - {"pair"}
    assert not off_tiers & set(out["tiers"])
    if scales["aggregate"] == 0:
        assert not any(out["aggregate"])
    alone = np.array(_rank(app, user_id=7, candidates=cands, now=T0 + 20, mode="vm"
                           ).json()["scores"])
    on = np.array(out["scores"])
    miss = (np.array(out["tiers"]) == "none") & ~np.array(out["aggregate"], bool)
    assert np.array_equal(on[miss], alone[miss])  # no SOLARIS input: the VM alone, exactly
    own = np.array(out["tiers"]) == "pair"
    assert own.any() and not np.array_equal(on[own], alone[own])  # the correction is applied
    # every correction switched off at runtime: the VM alone on every candidate
    on_scales = [("pair", t) for t, s in scales["pair"].items() if s > 0]
    on_scales += [("aggregate", None)] if scales["aggregate"] > 0 else []
    for slot, tier in on_scales:
        body = {"task": "click", "slot": slot, "scale": 0.0, **({"tier": tier} if tier else {})}
        r = requests.post(app["base"] + "/scales", json=body, timeout=TIMEOUT_S,
                          headers=OPERATOR)
        assert r.status_code == 200, r.text
    off = _rank(app, user_id=7, candidates=cands, now=T0 + 20).json()
    assert np.array_equal(np.array(off["scores"]), alone)
    assert not any(off["aggregate"]) and set(off["tiers"]) <= {"none", "pair"}
    assert "pair" in off["tiers"]  # the own pair is still looked up (verifier, precision)
    stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
    assert stats["scales"][key]["scales"]["pair"]["pair"] == 0.0
    for body, field in (({"task": "click", "slot": "pair", "tier": "pair", "scale": 1.5},
                         "scale"),
                        ({"task": "nope", "slot": "aggregate", "scale": 0.5}, "task"),
                        ({"task": "click", "slot": "pair", "scale": 0.5}, "tier")):
        r = requests.post(app["base"] + "/scales", json=body, timeout=TIMEOUT_S,
                          headers=OPERATOR)
        assert r.status_code == 422 and field in r.text, (body, r.text)
    for slot, tier in on_scales:  # back as trained
        value = trained["aggregate"] if tier is None else trained["pair"][tier]
        body = {"task": "click", "slot": slot, "scale": value, **({"tier": tier} if tier else {})}
        assert requests.post(app["base"] + "/scales", json=body,
                             timeout=TIMEOUT_S, headers=OPERATOR).status_code == 200


def test_stats_split_the_router_time_and_count_the_lookup_rounds(app):
    """The lookups are answered by the router's read replica (serve.cache_reads: replica,
    the default): no lookup round of shard calls, the replica's own steps timed."""
    before = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
    for k in range(3):
        assert _rank(app, user_id=11, now=T0 + k).status_code == 200
    assert _rank(app, user_id=11, mode="vm").status_code == 200
    stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
    replica, client = stats["cache_replica"], stats["cache_client"]
    # the VM-alone request looks nothing up; no request made a shard call
    assert replica["lookups"] == before["cache_replica"]["lookups"] + 3
    assert client["lookups"] == before["cache_client"]["lookups"] == 0
    assert len(replica["seq"]) == len(replica["refreshes"]) == 2  # per shard
    assert min(replica["refreshes"]) >= 1 and replica["rounds"] >= 1
    assert all(a is not None and a < 10.0 for a in replica["age_s"])  # pulled lately
    sol, vm = stats["phases_p50"]["solaris"], stats["phases_p50"]["vm"]
    steps = ("lookup_plan_ms", "lookup_answer_ms", "lookup_assemble_ms")
    assert all(sol[k] > 0 for k in ("enrich_ms", "vm_ms", "answer_ms", *steps))
    assert sum(sol[k] for k in steps) <= sol["enrich_ms"] * 1.5  # the lookup's steps, medians
    assert not any(k in vm for k in steps)
    # serve.overlap (the default): the VM alone ran beside the lookup, the residual VM's
    # corrections in the router; a VM-alone request has none to run
    assert sol["head_ms"] > 0 and "head_ms" not in vm


def test_unknown_ids_are_served_through_fallbacks(app):
    r = _rank(app, user_id=10**12, candidates=[0, 10**9, 2**62])
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == 3


@pytest.mark.parametrize("body,status,field", [
    ({"user_id": -1}, 422, "user_id"),
    ({"candidates": []}, 422, "candidates"),
    ({"candidates": [1, -5]}, 422, "candidates"),
    ({"candidates": list(range(301))}, 422, "candidates"),
    ({"task": "nope"}, 422, "task"),
    ({"user_id": "abc"}, 422, "user_id"),
    ({"surface": -2}, 422, "surface"),
    ({"extra": 1}, 422, "extra"),
])
def test_malformed_requests_get_a_4xx_naming_the_field(app, body, status, field):
    r = _rank(app, **body)
    assert r.status_code == status, r.text
    assert field in json.dumps(r.json()["detail"])


def test_nan_time_and_bad_json_and_oversized_body(app):
    raw = '{"user_id": 1, "candidates": [1], "task": "click", "now": NaN}'
    r = requests.post(app["base"] + "/rank", data=raw, timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 422 and "now" in r.text
    r = requests.post(app["base"] + "/rank", data="{not json", timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = requests.post(app["base"] + "/rank", data=b"x" * 2_000_000, timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert _rank(app).status_code == 200  # still serving


def test_a_chunked_body_meets_the_same_limit(app):
    """Sent chunked (no Content-Length), a body is counted as it arrives: over the limit is a
    413, under it parses as usual."""
    def chunks(data: bytes, size: int = 64 * 1024):
        for i in range(0, len(data), size):
            yield data[i:i + size]

    big = b'{"user_id": 1, "task": "click", "candidates": [' + b"1, " * 700_000 + b'1]}'
    r = requests.post(app["base"] + "/rank", data=chunks(big), timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body" in r.text
    small = json.dumps({"user_id": 1, "task": "click", "candidates": [1, 2, 3],
                        "now": T0 + 5}).encode()
    r = requests.post(app["base"] + "/rank", data=chunks(small, 16), timeout=TIMEOUT_S,
                      headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == 3


def test_feedback_and_healthz_and_schema(app):
    r = requests.post(app["base"] + "/feedback", timeout=TIMEOUT_S,
                      json={"user_id": 3, "items": [1, 2], "labels": [[1, 0], [0, 0]],
                            "now": T0 + 1})
    assert r.status_code == 200, r.text
    r = requests.post(app["base"] + "/feedback", timeout=TIMEOUT_S,
                      json={"user_id": 3, "items": [1, 2], "labels": [[1, 0]]})
    assert r.status_code == 422 and "labels" in r.text
    h = requests.get(app["base"] + "/healthz", timeout=TIMEOUT_S).json()
    assert h["ok"] and h["tasks"] == ["click", "conversion"]
    paths = requests.get(app["base"] + "/openapi.json", timeout=TIMEOUT_S).json()["paths"]
    assert {"/rank", "/feedback", "/healthz"} <= set(paths)


def test_schema_fuzz_finds_no_5xx(app):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(app["base"] + "/openapi.json")
    seen: list[int] = []

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=schema["/rank"]["POST"].as_strategy() | schema["/feedback"]["POST"].as_strategy())
    def fuzz(case) -> None:
        resp = case.call(base_url=app["base"], timeout=TIMEOUT_S)
        seen.append(resp.status_code)
        assert resp.status_code < 500, (case.body, resp.status_code, resp.text[:300])

    fuzz()
    assert len(seen) >= 60
    assert _rank(app).status_code == 200  # still serving


def _vm_replicas(task: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and f"#VM_{task}#" in a["name"]]


def test_shard_then_vm_replica_killed_under_load(app):
    from actors.cache import CacheGroup
    from solaris.config import CacheConfig

    results: list[tuple[int, float, str]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(k: int) -> None:
        rng = np.random.default_rng(k)
        while not stop.is_set():
            body = {"user_id": int(rng.integers(300)), "task": "click", "now": T0 + 100,
                    "candidates": rng.choice(200, 40, replace=False).tolist()}
            t = time.monotonic()
            try:
                r = requests.post(app["base"] + "/rank", json=body, timeout=TIMEOUT_S)
                status, retry = r.status_code, r.headers.get("retry-after", "")
            except requests.RequestException as e:
                status, retry = 0, type(e).__name__
            with lock:
                results.append((status, time.monotonic() - t, retry))

    with ThreadPoolExecutor(3) as pool:
        for k in range(3):
            pool.submit(client, k)
        time.sleep(2)
        group = CacheGroup.connect(CacheConfig(dim=16, num_shards=2), "test")
        group.shards[0].crash.remote()  # the shard's process exits; Ray restarts it
        time.sleep(3)
        name = _vm_replicas("click")[0]
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        deadline = time.monotonic() + 60  # Serve starts a replacement replica
        while time.monotonic() < deadline and not any(n != name for n in _vm_replicas("click")):
            time.sleep(0.5)
        time.sleep(3)
        stop.set()
    statuses = [s for s, _, _ in results]
    assert len(results) > 20
    assert max(t for _, t, _ in results) < TIMEOUT_S  # none hung
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert all(r for s, _, r in results if s == 503)  # a 503 says when to retry
    assert statuses[-1] == 200 and statuses.count(200) > len(statuses) // 2
    assert group.ping_all() == [True, True]  # the shard came back
    # the restarted shard is another incarnation: the router's replica read it whole
    replica = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["cache_replica"]
    assert replica["whole"][0] >= 2 and replica["whole"][1] == 1


def _publish_knn(app, seed: int, built_from=None, user_dim: int = 64) -> str:
    from solaris.knn import tables as knn

    rng = np.random.default_rng(seed)
    users = np.arange(250)  # users 250.. are not in the table: cold starts
    # 64: the TINY FM's shared width (an unrecorded table: the request tower's vectors)
    emb = rng.normal(size=(len(users), user_dim)).astype(np.float32)
    table, live = knn.build_table("user", users, emb, 10, app["knn_cfg"], built_from=built_from)
    knn.publish(app["knn_uri"], table, app["knn_cfg"], live)
    items = rng.normal(size=(200, 16)).astype(np.float32)
    itable, ilive = knn.build_table("item", np.arange(200), items, 10, app["knn_cfg"],
                                    built_from=built_from)
    knn.publish(app["knn_uri"], itable, app["knn_cfg"], ilive)
    return f"{table.version}|{itable.version}"


def test_knn_publish_swaps_under_live_traffic_with_no_failed_request(app):
    statuses: list[int] = []
    versions: set[str] = set()
    stop = threading.Event()

    def client() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            r = _rank(app, user_id=int(rng.integers(300)), now=T0 + 200,
                      candidates=rng.choice(200, 30, replace=False).tolist())
            statuses.append(r.status_code)
            if r.status_code == 200:
                versions.add(r.json()["versions"]["knn"])

    def healthz_knn() -> str | None:
        return requests.get(app["base"] + "/healthz", timeout=TIMEOUT_S).json()["knn"]

    with ThreadPoolExecutor(2) as pool:
        for _ in range(2):
            pool.submit(client)
        v1 = _publish_knn(app, 1)
        deadline = time.monotonic() + 30
        while healthz_knn() != v1 and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(1.0)
        v2 = _publish_knn(app, 2)
        while healthz_knn() != v2 and time.monotonic() < deadline + 30:
            time.sleep(0.3)
        time.sleep(1.0)
        stop.set()
    assert healthz_knn() == v2
    assert statuses and set(statuses) == {200}
    assert {v1, v2} <= versions  # both builds served, swapped without a restart
    # a user the table lacks gets neighbours from the live index (cold start)
    assert _rank(app, user_id=290, now=T0 + 300).status_code == 200
    stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["knn"]
    assert stats["cold_starts"] >= 1 and stats["errors"] == 0


def test_knn_tables_of_another_fm_version_are_disabled_by_name(app):
    """Runs after the swap test: tables recorded as built from an FM this app does not serve
    are named in /healthz and /stats and give no neighbours (no cold-start query runs); a
    rebuild from the served FM and id map turns them back on."""
    from solaris.artifacts import Artifacts
    from solaris.knn.provenance import BuiltFrom

    art = Artifacts.open(app["artifacts"])
    served = _rank(app).json()["versions"]["fm"]
    assert served == art.version

    def knn_check(version: str) -> dict:
        deadline = time.monotonic() + 30
        while True:
            body = requests.get(app["base"] + "/healthz", timeout=TIMEOUT_S).json()
            if body["knn"] == version or time.monotonic() > deadline:
                return body["checks"]["knn"]
            time.sleep(0.3)

    other = _publish_knn(app, 3, BuiltFrom("another-fm", art.ids().digest()))
    check = knn_check(other)
    assert not check["ok"] and set(check["disabled"]) == {"user", "item"}
    user_v = other.split("|")[0]
    assert f"user table {user_v} disabled: built from FM another-fm" in check["detail"]
    assert served in check["detail"]
    before = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["knn"]
    assert len(before["disabled"]) == 2
    assert _rank(app, user_id=291, now=T0 + 300).status_code == 200  # a cold user
    after = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["knn"]
    assert after["cold_starts"] == before["cold_starts"]  # no index to query
    ours = _publish_knn(app, 4, BuiltFrom(served, art.ids().digest()))
    check = knn_check(ours)
    assert check["ok"] and check["disabled"] == {} and "disabled" not in check["detail"]
    # a table built from the clicked items' mean (the job's default records it): a cold
    # user is embedded the same way, in the item vectors' width, and queried
    from solaris.artifacts import load_models

    fm, _, _ = load_models(app["artifacts"])
    width = int(fm.item_vectors().shape[1])
    clicked = _publish_knn(app, 5, BuiltFrom(served, art.ids().digest(), "clicked_items"),
                           user_dim=width)
    assert knn_check(clicked)["ok"]
    before = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["knn"]
    assert _rank(app, user_id=292, now=T0 + 300).status_code == 200  # a cold user
    after = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["knn"]
    assert after["cold_starts"] == before["cold_starts"] + 1
    assert after["errors"] == before["errors"] == 0


def test_replay_profile_refuses_a_time_beyond_the_skew(app):
    """Runs last: the router's reference is the latest event time it has accepted (T0 + 300
    by now); one far-future request is a 422 naming ``now`` and moves nothing."""
    refused = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()["clock"]
    # no FM worker writes between the probes: the workers stop after their current step, and
    # the probe is read until a write still in flight has landed
    serve.get_deployment_handle("Precompute", app_name="default").pause.remote().result()

    def probe() -> dict:
        got = _rank(app, user_id=7, candidates=list(range(100, 160)), now=T0 + 300).json()
        return {"tiers": got["tiers"], "ages_s": got["ages_s"]}

    before, again = None, probe()
    for _ in range(20):
        if again == before:
            break
        before = again
        time.sleep(0.5)
        again = probe()
    for path, body in (("/rank", {"user_id": 7, "candidates": [1], "task": "click",
                                  "now": 1e11}),
                       ("/feedback", {"user_id": 7, "items": [1], "labels": [[1, 0]],
                                      "now": 1e11})):
        r = requests.post(app["base"] + path, json=body, timeout=TIMEOUT_S)
        assert r.status_code == 422 and "now" in r.text and "max_skew_s" in r.text, r.text
    assert probe() == before
    stats = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()
    assert stats["clock"]["clock_refused"] == refused["clock_refused"] + 2  # (the fuzz's too)


def _history_events() -> int:
    from actors.cache import CacheGroup
    from solaris.config import CacheConfig

    got = CacheGroup.connect(CacheConfig(dim=16, num_shards=2), "test").metrics(timeout_s=30)
    return sum(s["history"]["events"] for s in got["shards"])


def test_a_router_killed_mid_traffic_loses_at_most_its_unflushed_buffer(app):
    """Runs last (it replaces the router). Three clients rank without pause, each request a
    new user, so every answered request adds exactly ``impressions_top_k`` history events
    once its router flushes. The router is killed mid-traffic; Serve starts another, which
    reads the shards whole into its replica. What was lost is what the dead router had not
    flushed: its buffer (fewer than ``serve.flush_requests`` requests) and the after-answer
    work of requests answered but not yet buffered (at most the clients in flight). The
    cache itself lost nothing: it lives in the shards."""
    cfg = load_config(None)
    top_k, flush_requests, clients = cfg.serve.impressions_top_k, cfg.serve.flush_requests, 3
    router = serve.get_deployment_handle("LookupRouter", app_name="default")
    # a pair the cache holds now is still served as a pair by the router that replaces this one
    held = _rank(app, user_id=7, candidates=list(range(100, 160)), now=T0 + 300).json()
    pairs_before = [i for i, t in enumerate(held["tiers"]) if t == "pair"]
    router.flush_now.remote().result()
    events0 = _history_events()
    answered = [0]
    users = iter(range(10_000, 10**6))
    lock, stop = threading.Lock(), threading.Event()

    def client() -> None:
        while not stop.is_set():
            with lock:
                user = next(users)
            try:
                r = requests.post(app["base"] + "/rank", timeout=TIMEOUT_S, json={
                    "user_id": user, "candidates": list(range(40)), "task": "click",
                    "now": T0 + 300})
                ok = r.status_code == 200
            except requests.RequestException:
                ok = False
            if ok:
                with lock:
                    answered[0] += 1

    def routers() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == "serve" and "#LookupRouter#" in a["name"]]

    old = routers()
    assert len(old) == 1
    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(client)
        time.sleep(1.5)
        ray.kill(ray.get_actor(old[0], namespace="serve"), no_restart=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # (a VM-alone probe: no after-answer work)
            if routers() not in ([], old) and _rank(app, user_id=7, candidates=[1],
                                                    mode="vm").status_code == 200:
                break
            time.sleep(0.5)
        time.sleep(2.0)
        stop.set()
    serve.get_deployment_handle("LookupRouter", app_name="default").flush_now.remote().result()
    recorded = _history_events() - events0
    assert recorded % top_k == 0 and answered[0] > 20
    lost = answered[0] - recorded // top_k  # answered requests whose impressions never landed
    print(f"router killed mid-traffic: {answered[0]} requests answered, {lost} lost "
          f"(bound {flush_requests - 1 + clients})")
    assert 0 <= lost <= flush_requests - 1 + clients, (lost, answered[0])
    again = _rank(app, user_id=7, candidates=list(range(100, 160)), now=T0 + 300).json()
    assert [again["tiers"][i] for i in pairs_before] == ["pair"] * len(pairs_before)


def _fm_worker_pids() -> list[int]:
    """PIDs of this machine's FM worker actors (their process titles name the class)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if b"ray::FMWorker" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_every_metric_the_dashboard_and_the_alerts_name_is_on_the_prometheus_endpoint(app):
    """Runs last: the requests, errors, shard and VM kills above have made every metric. An
    FM worker is killed here (Ray restarts it; the pool counts the crash), so the worker
    error counter exists too. Then Ray's Prometheus endpoint is read until every
    ``ray_solaris_*`` name of deploy/ is exported (Ray exports custom metrics every ~10 s)."""
    import os
    import signal

    from tests.dashboard import named_metrics

    # a test above paused the FM workers' owner; the pool's gauges and its error count are
    # published by its ticks
    serve.get_deployment_handle("Precompute", app_name="default").resume.remote().result()
    pids = _fm_worker_pids()
    if not Path("/proc").is_dir() or not pids:
        pytest.skip("no FM worker process found through /proc")
    os.kill(pids[0], signal.SIGKILL)
    for k in range(6):  # work for the restarted worker: new users' picks
        _rank(app, user_id=200 + k, candidates=list(range(40)), now=T0 + 400 + k)
    # what the module's earlier tests made, made here too (so it holds when run on its own):
    # an error answer, and a user slot served (user 250's pairs written, the aggregate on)
    assert _rank(app, user_id=7, candidates=list(range(301))).status_code == 422
    from actors.cache import CacheGroup
    from solaris.config import CacheConfig

    version = requests.get(app["base"] + "/stats", timeout=TIMEOUT_S).json()[
        "rollout"]["active"]["click"]
    group = CacheGroup.connect(CacheConfig(dim=16, num_shards=2), "test")
    group.put(np.full(5, 250), np.arange(5), np.ones((5, 16), np.float32), version, T0 + 430)
    group.flush_records()
    agg = {"task": "click", "slot": "aggregate"}
    trained = requests.get(app["base"] + "/scales", timeout=TIMEOUT_S).json()
    (before,) = [v["scales"]["aggregate"] for k, v in trained.items() if k.endswith("/click")]
    assert requests.post(app["base"] + "/scales", json={**agg, "scale": 1.0}, headers=OPERATOR,
                         timeout=TIMEOUT_S).status_code == 200
    router = serve.get_deployment_handle("LookupRouter", app_name="default")
    try:
        router.refresh_now.remote().result()  # the read replica pulls the write now
        out = _rank(app, user_id=250, candidates=list(range(10, 30)), now=T0 + 431).json()
        assert any(out["aggregate"])
        router.flush_now.remote().result()
    finally:
        requests.post(app["base"] + "/scales", json={**agg, "scale": before}, headers=OPERATOR,
                      timeout=TIMEOUT_S)
    wanted = named_metrics()
    deadline = time.monotonic() + 90
    missing = wanted
    while time.monotonic() < deadline:
        text = requests.get(app["metrics"], timeout=TIMEOUT_S).text
        exported = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
                    if line.startswith("ray_solaris_")}
        missing = wanted - exported
        if not missing:
            break
        time.sleep(2.0)
    assert not missing, f"named in deploy/ but not on the endpoint: {sorted(missing)}"
