"""Pure serving pieces: the rollout policy, KNN table swaps, app settings, the VM scorer's
handling of unknown ids and absent slots, the inline FM against the plain forward."""

from __future__ import annotations

import pytest

from solaris.config import KnnConfig
from solaris.errors import ConfigError
from solaris.online.rollout import RolloutPolicy
from solaris.knn.neighbours import KnnSnapshot
from solaris.online.serving import KnnTables, settings_from_args


def test_rollout_switches_only_after_catching_up_and_never_back():
    p = RolloutPolicy({"click": ["v1", "v2"], "conv": ["v1"]}, threshold=0.8, min_lookups=100,
                      decay=1.0)
    assert p.active == {"click": "v1", "conv": "v1"}
    assert p.pending("click") == "v2" and p.pending("conv") is None
    assert p.live_versions() == ["v1", "v2"]
    p.observe("v1", 50, 100)  # 50% coverage of the active version
    p.observe("v2", 30, 60)  # 50%, but too few lookups yet
    assert not p.maybe_switch("click")
    p.observe("v2", 5, 60)  # 35/120 = 29% < 0.8 * 50%
    assert not p.maybe_switch("click")
    p.observe("v2", 60, 80)  # 95/200 = 47.5% >= 40%
    assert p.maybe_switch("click")
    assert p.active["click"] == "v2" and p.pending("click") is None
    p.observe("v2", 0, 1000)
    assert not p.maybe_switch("click") and p.active["click"] == "v2"
    assert p.active["conv"] == "v1"  # a task without a new VM keeps its version


def test_rollout_rejects_bad_threshold():
    with pytest.raises(ConfigError, match="threshold"):
        RolloutPolicy({"click": ["v1"]}, threshold=0.0)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_knn_tables_poll_and_swap_without_restart():
    published = {"v": "k1"}
    loads = []

    def probe(uri: str) -> str | None:
        return published["v"]

    def loader(uri: str) -> KnnSnapshot:
        loads.append(published["v"])
        return KnnSnapshot(published["v"], None, None)

    clock = FakeClock()
    t = KnnTables(KnnConfig(table_uri="mem://x", poll_s=5.0), loader, probe, clock)
    assert t.current().version == "k1"
    published["v"] = "k2"
    clock.t = 1.0
    assert t.current().version == "k1"  # not polled yet
    clock.t = 6.0
    assert t.current().version == "k2" and t.swaps == 2 and loads == ["k1", "k2"]
    clock.t = 20.0
    assert t.current().version == "k2" and loads == ["k1", "k2"]  # unchanged: no reload


def test_knn_tables_peek_never_polls_and_due_says_when_current_would():
    probes = []

    def probe(uri: str) -> str:
        probes.append(uri)
        return "k1"

    clock = FakeClock()
    t = KnnTables(KnnConfig(table_uri="mem://x", poll_s=5.0),
                  lambda uri: KnnSnapshot("k1", None, None), probe, clock)
    assert t.due() and t.peek() is None and probes == []  # nothing read yet
    assert t.current().version == "k1" and len(probes) == 1
    clock.t = 4.0
    assert not t.due() and t.peek().version == "k1"
    clock.t = 5.0
    assert t.due() and t.peek().version == "k1" and len(probes) == 1  # peeking reads nothing


def test_knn_tables_keep_the_old_version_when_a_read_fails():
    clock = FakeClock()
    state = {"fail": False}

    def probe(uri: str) -> str:
        if state["fail"]:
            raise OSError("storage down")
        return "k1"

    t = KnnTables(KnnConfig(table_uri="mem://x", poll_s=1.0),
                  lambda uri: KnnSnapshot("k1", None, None), probe, clock)
    assert t.version is None and t.current().version == "k1"
    state["fail"] = True
    clock.t = 5.0
    assert t.current().version == "k1" and t.errors == 1


def test_settings_name_unknown_args():
    with pytest.raises(ConfigError, match="bogus"):
        settings_from_args({"bogus": "1"})
    s = settings_from_args({"artifacts": "a,b", "mode": "vm", "precompute": "false"})
    assert len(s["artifact_dirs"]) == 2 and s["overrides"] == {"serve.mode": "vm"}
    assert s["precompute"] is False
    with pytest.raises(ConfigError, match="serve.mode"):
        settings_from_args({"mode": "turbo"})


def test_after_answer_buffers_and_drains_per_version():
    import numpy as np

    from solaris.online.serving import AfterAnswer

    b = AfterAnswer(max_requests=3)
    assert not b.add(1, np.array([5, 6, 7]), 0, 10.0, {"v1": (np.array([5]), np.array([0.9]))})
    assert not b.add(2, np.array([8]), 1, 11.0, {"v1": (np.array([], np.int64), np.array([])),
                                                 "v2": (np.array([8]), np.array([0.5]))})
    assert b.add(3, np.array([9, 4]), 0, 12.0, {"v1": (np.array([9, 4]), np.array([0.7, 0.6]))})
    impressions, picks = b.drain()
    assert [r[0] for r in impressions] == [1, 2, 3] and len(b) == 0
    users, items, prios, nows, surfaces = picks["v1"]
    assert users.tolist() == [1, 3, 3] and items.tolist() == [5, 9, 4]
    assert prios.tolist() == [0.9, 0.7, 0.6] and nows.tolist() == [10.0, 12.0, 12.0]
    assert surfaces.tolist() == [0, 0, 0]
    assert picks["v2"][0].tolist() == [2] and picks["v2"][4].tolist() == [1]
    assert b.drain() == ([], {})


def test_after_answer_counts_requests_without_impressions():
    import numpy as np

    from solaris.online.serving import AfterAnswer

    b = AfterAnswer(max_requests=2)
    assert not b.add(1, np.array([], np.int64), 0, 1.0, {})  # impressions_top_k = 0
    assert b.add(2, np.array([3]), 0, 2.0, {}) and len(b) == 2
    impressions, picks = b.drain()
    assert [r[0] for r in impressions] == [2] and picks == {} and len(b) == 0


def test_cold_start_inputs_serve_a_user_the_fm_lacks_from_its_history() -> None:
    """A known user's inputs are the store's own batch; a user past the FM's table (arrived
    after training) reads its live history with zero side features instead of failing."""
    import numpy as np

    from solaris.artifacts import SideTables
    from solaris.config import HistoryConfig
    from solaris.history import HistoryStore
    from solaris.online.serving import cold_start_inputs
    from solaris.precompute.worker import WindowHistory

    side = SideTables(user_cat=np.array([[1, 2], [3, 0]]), user_cont=np.ones((2, 1), np.float32),
                      item_cat=np.arange(10).reshape(5, 2), item_mh=np.zeros((5, 1, 1), np.int64),
                      item_cont=np.zeros((5, 0), np.float32))
    store = HistoryStore(HistoryConfig(max_events=8, max_users=10))
    new = 2**61 + 17  # a provisional code
    for user in (1, new):
        store.record_impressions(user, np.array([4, 2]), 0, 100.0)
    history = WindowHistory(store.window)
    known = cold_start_inputs(history, 1, 200.0, 1, 4, side)
    want = store.batch(np.array([1]), np.array([200.0]), np.array([1]), 4, side.item_cat,
                       side.user_cat, side.user_cont)
    for k in want:
        np.testing.assert_array_equal(known[k], want[k], err_msg=k)
    cold = cold_start_inputs(history, new, 200.0, 1, 4, side)
    np.testing.assert_array_equal(cold["hist_item"], known["hist_item"])  # its own events
    assert not cold["user_cat"].any() and not cold["user_cont"].any()
