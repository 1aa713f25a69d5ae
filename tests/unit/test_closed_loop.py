"""The closed loop's pure parts: the ground truth's random numbers and session state, what a
request shows, the paired click lift, and the arrivals against the generated dataset."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.config import SyntheticConfig
from solaris.data.synthetic import build, generate
from solaris.data.synthetic_stream import SATIATION, _click_logit, _sigmoid
from solaris.data.schema import TS, USER
from solaris.data.synthetic_truth import SessionTruth, arrivals, uniforms
from solaris.errors import ConfigError
from solaris.replay.closed_loop import LoopOptions, choose_shown, delivered, paired_lift
from solaris.tiers import Tier

SMALL = SyntheticConfig(num_users=200, num_items=150, days=6.0, target_interactions=3000)


def test_uniforms_are_fixed_per_key_whatever_the_shape() -> None:
    rid = np.array([[7], [8]])
    items = np.array([[1, 2, 3], [1, 2, 3]])
    u = uniforms(0, rid, items, 0)
    assert u.shape == (2, 3) and ((0 <= u) & (u < 1)).all()
    # the same key gives the same number alone or in a batch
    assert uniforms(0, np.array([8]), np.array([2]), 0)[0] == u[1, 1]
    # any part of the key changes it
    assert uniforms(1, rid, items, 0)[0, 0] != u[0, 0]
    assert uniforms(0, rid, items, 1)[0, 0] != u[0, 0]
    assert len(np.unique(u)) == 6
    big = uniforms(3, np.arange(20_000), np.zeros(20_000, np.int64), 0)
    assert abs(big.mean() - 0.5) < 0.01 and abs((big < 0.2).mean() - 0.2) < 0.01


def test_choose_shown_takes_the_top_then_explores_below_with_its_propensity() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.7, 0.3, 0.2])
    pos, prop = choose_shown(scores, 2, 1, np.array([0.0]))
    assert pos[:2].tolist() == [1, 3]  # the top two, best first
    assert pos[2] == 2  # u = 0: the best of the rest (ranks below the top two)
    assert prop.tolist() == [1.0, 1.0, 0.25]
    pos, _ = choose_shown(scores, 2, 1, np.array([0.999]))
    assert pos[2] == 0  # the last of the rest
    pos, prop = choose_shown(scores, 2, 2, np.array([0.0, 0.0]))
    assert len(set(pos.tolist())) == 4 and prop.tolist() == [1, 1, 0.25, 1 / 3]
    pos, prop = choose_shown(scores, 10, 1, np.array([0.5]))  # fewer candidates than slots
    assert sorted(pos.tolist()) == list(range(6)) and (prop == 1).all()


def test_loop_options_name_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="shown=0"):
        LoopOptions(shown=0)
    with pytest.raises(ConfigError, match="arms="):
        LoopOptions(arms=("solaris",))
    with pytest.raises(ConfigError, match="knn_every_h=-1"):
        LoopOptions(knn_every_h=-1)


@pytest.fixture(scope="module")
def small_world():
    return build(SMALL), generate(SMALL)


def test_arrivals_regenerate_the_datasets_requests(small_world) -> None:
    world, ds = small_world
    req = ds.requests
    ts = req.column(TS).to_numpy()
    start = int(np.quantile(ts, 0.6))
    arr = arrivals(world, start)
    keep = ts >= start
    assert arr.request_id.tolist() == req.column("request_id").to_numpy()[keep].tolist()
    assert (arr.user == req.column(USER).to_numpy()[keep]).all()
    assert (arr.ts == ts[keep]).all()
    cands = np.stack(req.column("candidates").to_pylist())[keep]
    assert (arr.candidates == cands).all()
    assert arr.interest.shape == (keep.sum(), SMALL.latent_dim)
    assert np.allclose(np.linalg.norm(arr.interest, axis=1), 1.0, atol=1e-5)


def test_session_truth_follows_the_arms_own_clicks(small_world) -> None:
    world, ds = small_world
    arr = arrivals(world, int(np.quantile(ds.requests.column(TS).to_numpy(), 0.5)))
    # a session with at least two requests
    sess, counts = np.unique(arr.session, return_counts=True)
    s = sess[np.argmax(counts)]
    r0, r1 = np.flatnonzero(arr.session == s)[:2]
    items = arr.candidates[r0, :5]
    truth = SessionTruth(world, arr)
    p, pv = truth.probs(r0, items)
    # before any click: the world's click model on the request's interest
    logit, _ = _click_logit(world, arr.interest[r0:r0 + 1].astype(np.float64), items[None],
                            arr.user[r0:r0 + 1], arr.surface[r0:r0 + 1])
    assert np.allclose(p, _sigmoid(logit[0] + world.click_bias))
    assert ((0 < pv) & (pv < 1)).all()
    before = truth.probs(r1, items)[0]
    other = SessionTruth(world, arr)
    truth.observe(r0, items, np.array([True, False, False, False, False]))
    after = truth.probs(r1, items)[0]
    # the next request of the session: interest pulled toward the clicked item, which is
    # satiated; the arm that did not click is unchanged
    from solaris.data.synthetic_world import unit

    pulled = unit(arr.interest[r1].astype(np.float64)
                  + world.cfg.session_intent * world.item_vec[items[0]])[None]
    want, _ = _click_logit(world, pulled, items[None], arr.user[r1:r1 + 1],
                           arr.surface[r1:r1 + 1])
    want = want[0] - SATIATION * (np.arange(5) == 0)
    assert np.allclose(after, _sigmoid(want + world.click_bias))
    assert not np.allclose(after, before)
    assert np.array_equal(other.probs(r1, items)[0], before)


def test_paired_lift_recovers_a_known_share_and_refuses_without_a_gap() -> None:
    rng = np.random.default_rng(0)
    vm = rng.uniform(0.5, 1.5, size=4000)
    gain = rng.uniform(0.0, 1.0, size=4000)
    clicks = {"vm": [vm], "solaris": [vm + 0.3 * gain], "fm": [vm + gain],
              "oracle": [vm + 0.6 * gain]}
    out = paired_lift(clicks, resamples=500)
    assert out["fm_gap_excludes_0"]
    assert out["click_lift"]["point"] == pytest.approx(0.3)
    lo, hi = out["click_lift"]["ci"]
    assert lo <= 0.3 <= hi and hi - lo < 1e-6  # exact share in every draw
    assert out["click_lift_over_lift_oracle"]["point"] == pytest.approx(0.5)
    noise = rng.normal(0, 0.5, size=4000)
    flat = {"vm": [vm], "solaris": [vm + noise], "fm": [vm - noise]}
    out = paired_lift(flat, resamples=500)
    assert not out["fm_gap_excludes_0"] and out["click_lift"] is None
    # several seeds of one window share a request draw; seeds of other sizes draw their own
    two = paired_lift({"vm": [vm, vm[:100]], "fm": [vm + gain, vm[:100] + gain[:100]]},
                      resamples=200)
    assert two["gain_over_vm"]["fm"]["point"] == pytest.approx(
        (gain.mean() + gain[:100].mean()) / 2)


def test_a_tier_at_scale_0_is_not_delivered_to_the_oracle() -> None:
    tiers = np.array([Tier.NONE, Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR, Tier.PAIR,
                      Tier.ITEM_NEIGHBOUR], np.int8)
    # the click VM of a trained synthetic world: its own pair served, both neighbours off
    scales = np.array([0.0, 1.0, 0.0, 0.0], np.float32)
    assert delivered(tiers, scales).tolist() == [False, True, False, False, True, False]
    scales = np.array([0.0, 0.75, 0.0, 0.5], np.float32)
    assert delivered(tiers, scales).tolist() == [False, True, False, True, True, True]
    # no slot is never delivered, whatever a scale array holds in its "none" column
    assert not delivered(np.array([Tier.NONE]), np.ones(4, np.float32)).any()
    assert not delivered(tiers, np.zeros(4, np.float32)).any()


def test_an_arms_interaction_log_is_what_it_showed_after_the_log_before() -> None:
    """The log the closed loop's KNN job reads: the rows before the window, then one row per
    item an arm showed at the given log rows, in the order its history took them, the click
    and conversion under the first two tasks."""
    import pyarrow as pa

    from solaris.data.schema import interaction_schema
    from solaris.replay.closed_loop import arm_interactions, empty_log
    from solaris.simulate.log import RequestLog

    tasks = ("like", "love")
    before = pa.table({"seq": [0, 1], "user_id": [4, 5], "item_id": [9, 8], "ts": [10, 11],
                       "surface": pa.array([0, 1], pa.int32()),
                       "like": pa.array([1.0, 0.0], pa.float32()),
                       "love": pa.array([0.0, 0.0], pa.float32())})
    lg = RequestLog(user=np.array([4, 6, 5]), ts=np.array([20, 30, 40]),
                    surface=np.array([1, 0, 1]), candidates=np.arange(12).reshape(3, 4),
                    labels=np.full((3, 4, 2), np.nan, np.float32), tasks=tasks)
    arm = empty_log(3, 2)
    arm.item[:] = [[3, 1], [7, 5], [11, 8]]
    arm.click[:] = [[True, False], [False, False], [True, True]]
    arm.conv[:] = [[True, False], [False, False], [False, True]]
    got = arm_interactions(before, lg, arm, np.array([0, 2]), tasks)  # row 1 not answered
    assert got.schema == interaction_schema(tasks)
    assert got.column("seq").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert got.column("user_id").to_pylist() == [4, 5, 4, 4, 5, 5]
    assert got.column("item_id").to_pylist() == [9, 8, 3, 1, 11, 8]
    assert got.column("ts").to_pylist() == [10, 11, 20, 20, 40, 40]
    assert got.column("surface").to_pylist() == [0, 1, 1, 1, 1, 1]
    assert got.column("like").to_pylist() == [1, 0, 1, 0, 1, 1]
    assert got.column("love").to_pylist() == [0, 0, 1, 0, 0, 1]
