"""One client cannot harm the service: the app in the serving profile (its default) over real
HTTP on a local Ray, sent hostile requests at volume (bounded, loopback only).

Refused requests -- a far-future, far-past, NaN or infinite event time, the debug fields
(``mode``, ``features_for``), oversized candidate lists and bodies, NaN ids, control calls
without or with a wrong token -- get a 4xx naming the field, and afterwards the cache's
entries, the stores' clocks, the history, the queue and a fixed probe request's tiers are
what they were (its ages older by the wall time that passed). Accepted odd requests (unknown
ids, the largest id, a full candidate list) leave every store's latest event time at or
before the wall clock: no entry is written after the time it is read at.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from tests.tiny import train_tiny  # noqa: E402

TIMEOUT_S = 15.0
TOKEN = "hostile-suite-operator-token"  # the app's operator token (RAY_ENV, never a default)
REPEAT = 12  # each refused case is sent this many times, 4 at once
PROBE = {"user_id": 5, "candidates": list(range(20, 30)), "task": "click"}
JSON = {"content-type": "application/json"}
FUTURE = 1e11  # the year 5138

# (name, method, path, body: dict or raw JSON text, headers, status, field named)
REFUSED = [
    ("future now", "post", "/rank", {**PROBE, "now": FUTURE}, {}, 422, "now"),
    ("past now", "post", "/rank", {**PROBE, "now": 0.0}, {}, 422, "now"),
    ("present now", "post", "/rank", {**PROBE, "now": 1.7e9}, {}, 422, "now"),
    ("nan now", "post", "/rank", '{"user_id": 5, "candidates": [20], "task": "click", '
     '"now": NaN}', JSON, 422, "now"),
    ("inf now", "post", "/rank", '{"user_id": 5, "candidates": [20], "task": "click", '
     '"now": Infinity}', JSON, 422, "now"),
    ("negative now", "post", "/rank", {**PROBE, "now": -5.0}, {}, 422, "now"),
    ("mode inline", "post", "/rank", {**PROBE, "mode": "inline"}, {}, 422, "mode"),
    ("mode vm", "post", "/rank", {**PROBE, "mode": "vm"}, {}, 422, "mode"),
    ("features_for", "post", "/rank", {**PROBE, "features_for": [0, 1]}, {}, 422,
     "features_for"),
    ("reads shards", "post", "/rank", {**PROBE, "reads": "shards"}, {}, 422, "reads"),
    ("feedback now", "post", "/feedback", {"user_id": 5, "items": [20], "labels": [[1, 0]],
                                           "now": FUTURE}, {}, 422, "now"),
    ("nan id", "post", "/rank", '{"user_id": 5, "candidates": [NaN], "task": "click"}', JSON,
     422, "candidates"),
    ("too many candidates", "post", "/rank", {**PROBE, "candidates": list(range(301))}, {},
     422, "candidates"),
    ("huge body", "post", "/rank", '{"user_id": 5, "task": "click", "candidates": ['
     + "1, " * 400_000 + "1]}", JSON, 413, "body"),
    ("scales, no token", "post", "/scales", {"task": "click", "slot": "pair", "tier": "pair",
                                             "scale": 0.0}, {}, 401, "authorization"),
    ("scales, wrong token", "post", "/scales", {"task": "click", "slot": "pair",
                                                "tier": "pair", "scale": 0.0},
     {"Authorization": "Bearer " + "x" * len(TOKEN)}, 401, "authorization"),
    ("scales, basic auth", "post", "/scales", {"task": "click", "slot": "aggregate",
                                               "scale": 0.0},
     {"Authorization": "Basic " + TOKEN}, 401, "authorization"),
]

# accepted, though odd: every store must stay at or before the wall clock
ACCEPTED = [
    {"user_id": 10**12, "candidates": [20, 21], "task": "click"},  # an unknown user
    {"user_id": 5, "candidates": [0, 2**62], "task": "click"},  # the largest id
    {"user_id": 7, "candidates": list(range(300)), "task": "click"},  # the full list
]


RAY_ENV = {"SOLARIS_OPERATOR_TOKEN": TOKEN}  # the app's processes read it (conftest.py)


@pytest.fixture(scope="module")
def app(tmp_path_factory, deploy_app):
    art = train_tiny(tmp_path_factory.mktemp("artifacts"))
    conf = tmp_path_factory.mktemp("conf") / "serving.yaml"
    conf.write_text(json.dumps({"cache": {"dim": 16, "num_shards": 2, "deadline_ms": 500.0},
                                "serve": {"max_candidates": 300, "flush_ms": 50.0}}))
    return {"base": deploy_app({"artifacts": str(art), "config": str(conf),
                                "app_id": "hostile"})}


def send(app, method: str, path: str, body, headers: dict) -> requests.Response:
    kw = {"data": body} if isinstance(body, str) else {"json": body}
    return getattr(requests, method)(app["base"] + path, timeout=TIMEOUT_S, headers=headers,
                                     **kw)


def probe(app) -> tuple[list[str], list[float], float]:
    r = send(app, "post", "/rank", PROBE, {})
    assert r.status_code == 200, r.text
    return r.json()["tiers"], r.json()["ages_s"], time.time()


def state(app) -> dict:
    """The stores as the shards and the queue report them, once the router's buffered
    after-answer work is sent and the FM workers are idle."""
    from actors import names
    from actors.cache import CacheGroup
    from actors.queue import QueueClient
    from solaris.config import CacheConfig

    group = CacheGroup.connect(CacheConfig(dim=16, num_shards=2), "hostile")
    queue = QueueClient(ray.get_actor(names.queue("hostile")))
    deadline = time.monotonic() + 60
    while True:  # the queue drained: nothing pending or leased
        q = queue.metrics(timeout_s=10)
        if q["depth"] == 0 and q["leased"] == 0:
            break
        assert time.monotonic() < deadline, q
        time.sleep(0.3)
    time.sleep(0.5)  # past serve.flush_ms: the router's history writes are sent
    shards = group.metrics(timeout_s=10)["shards"]
    return {"entries": [s["entries"] for s in shards],
            "expired": [s["expired"] for s in shards],
            "latest": [s["latest_event_s"] for s in shards],
            "refused": [s["clock_refused"] for s in shards]
            + [s["history"]["clock_refused"] for s in shards] + [q["clock_refused"]],
            "history": [s["history"]["events"] for s in shards],
            "queue_put": q["put"]}


def test_refused_requests_leave_the_service_as_it_was(app):
    deadline = time.monotonic() + 90
    while "pair" not in probe(app)[0]:  # the FM workers cache the verifier's bets
        assert time.monotonic() < deadline, "no pair embedding was ever cached"
        time.sleep(0.5)
    tiers, ages, t_before = probe(app)
    before = state(app)
    assert sum(before["entries"]) > 0 and not any(before["refused"])

    answers: list[tuple[str, int, str]] = []

    def one(case) -> None:
        name, method, path, body, headers, _, _ = case
        r = send(app, method, path, body, headers)
        answers.append((name, r.status_code, r.text))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, [c for c in REFUSED for _ in range(REPEAT)]))
    assert len(answers) == len(REFUSED) * REPEAT
    for name, _, _, _, _, status, field in REFUSED:
        got = [(s, t) for n, s, t in answers if n == name]
        assert all(s == status and field in t for s, t in got), (name, got[0])
    after = state(app)
    assert after == before  # not one entry, expiry, clock, event or queued pair changed
    tiers2, ages2, t_after = probe(app)
    assert tiers2 == tiers  # the same provenance, each age older by the wall time passed
    for a, b in zip(ages, ages2):
        assert a <= b <= a + (t_after - t_before) + 1.0
    assert all(a >= 0 for a in ages2)
    stats = send(app, "get", "/stats", None, {}).json()  # read-only: open, no token set
    assert stats["auth_refused"]["operator"] >= 3 * REPEAT


def test_accepted_odd_requests_write_nothing_from_the_future(app):
    for body in ACCEPTED * 4:
        r = send(app, "post", "/rank", body, {})
        assert r.status_code == 200, r.text
        assert all(a >= 0 for a in r.json()["ages_s"])
    after = state(app)
    now = time.time()
    assert all(t is None or t <= now for t in after["latest"]), (after["latest"], now)
    assert not any(after["refused"])  # nothing reached a store with a time ahead


def test_control_calls_need_the_operator_token(app):
    body = {"task": "click", "slot": "aggregate", "scale": 1.0}
    r = send(app, "post", "/scales", body, {"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    r = send(app, "post", "/scales", body, {})
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
    assert send(app, "get", "/healthz", None, {}).status_code == 200
    assert send(app, "get", "/scales", None, {}).status_code == 200
