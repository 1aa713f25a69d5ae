"""Named synthetic profiles: what a profile may change, the feed world's recurrence, and the
stateful retrieval that gives it."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.config import (SyntheticConfig, config_from_dict, config_to_dict, load_config,
                            parse_overrides)
from solaris.data.profiles import DEMO_SIZE, PROFILE_FIELDS, PROFILES
from solaris.data.split import time_split
from solaris.data.synthetic import build, generate
from solaris.data.synthetic_stream import RetrievalState, retrieval_state
from solaris.errors import ConfigError
from solaris.replay.coverage import candidate_recurrence
from solaris.simulate.log import build_request_log

SIX_H = 6 * 3600


def feed_cfg(**kw):
    syn = {"profile": "feed", **DEMO_SIZE["feed"], **kw}
    return config_from_dict({"data": {"synthetic": syn}})


def test_a_profile_changes_only_the_request_process_and_the_tastes():
    """Everything but the request process and the taste fields -- the click model, the
    catalogue, the FM, the VM and their training -- keeps the default's values in every
    profile."""
    default = config_to_dict(config_from_dict({}))
    for name in PROFILES:
        assert set(PROFILES[name]) <= set(PROFILE_FIELDS), name
        cfg = config_to_dict(config_from_dict({"data": {"synthetic": {"profile": name}}}))
        for key in (*PROFILE_FIELDS, "profile"):
            cfg["data"]["synthetic"].pop(key)
            default["data"]["synthetic"].pop(key, None)
        assert cfg == default, name
    assert config_from_dict({"data": {"synthetic": {"profile": "classic"}}}) == config_from_dict({})


def test_the_keys_a_config_sets_win_over_its_profile_and_round_trip():
    cfg = load_config(None, {"data.synthetic.profile": "feed", "data.synthetic.num_users": 50})
    syn = cfg.data.synthetic
    assert syn.num_users == 50 and syn.retrieval_memory_h == PROFILES["feed"]["retrieval_memory_h"]
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_an_unknown_profile_is_named():
    with pytest.raises(ConfigError, match=r"synthetic.profile='tiktok'.*known: classic, feed, cohorts"):
        config_from_dict({"data": {"synthetic": {"profile": "tiktok"}}})
    with pytest.raises(ConfigError, match="synthetic.profile='x'"):
        SyntheticConfig(profile="x")
    with pytest.raises(ConfigError, match="synthetic.retrieval_memory_h=-1"):
        SyntheticConfig(retrieval_memory_h=-1)


def test_retrieval_state_holds_within_a_session_and_forgets_over_hours():
    rng = np.random.default_rng(0)
    st = RetrievalState.empty(num_users=3000, dim=4, num_items=50)
    users = np.arange(3000)
    memory = 3600.0
    a = retrieval_state(rng, st, memory, users, np.zeros(3000))
    same = retrieval_state(rng, st, memory, users, np.zeros(3000))  # no time passed
    later = retrieval_state(rng, st, memory, users, np.full(3000, memory))
    far = retrieval_state(rng, st, memory, users, np.full(3000, 30 * memory))
    np.testing.assert_array_equal(a[0], same[0])
    np.testing.assert_array_equal(a[1], same[1])
    for k in (0, 1):  # stationary: unit variance; correlation exp(-dt / memory)
        assert abs(far[k].var() - 1.0) < 0.05
        r_later = np.corrcoef(a[k].ravel(), later[k].ravel())[0, 1]
        r_far = np.corrcoef(later[k].ravel(), far[k].ravel())[0, 1]
        assert abs(r_later - np.exp(-1.0)) < 0.03 and abs(r_far) < 0.03


def test_retrieval_state_steps_each_users_requests_in_time_order():
    """Two requests of one user handed over out of order: the earlier one is stepped first."""
    st1 = RetrievalState.empty(2, 2, 3)
    st2 = RetrievalState.empty(2, 2, 3)
    users, ts = np.array([0, 0, 1]), np.array([7200.0, 0.0, 10.0])
    a = retrieval_state(np.random.default_rng(1), st1, 3600.0, users, ts)
    b = retrieval_state(np.random.default_rng(1), st2, 3600.0, users[[1, 0, 2]], ts[[1, 0, 2]])
    np.testing.assert_array_equal(a[0][[1, 0, 2]], b[0])
    assert st1.last.tolist() == [7200.0, 10.0]


@pytest.fixture(scope="module")
def feed_world():
    cfg = feed_cfg()
    ds = generate(cfg.data.synthetic)
    lg = build_request_log(ds, time_split(ds, cfg.split).cuts[2])
    return cfg, ds, lg


def test_the_feed_worlds_candidates_recur_within_six_hours_as_the_papers_do(feed_world):
    """The paper's regime: 60-75% of a request's candidates were candidates of the same user
    in the past 6 h; the classic world's (the same size) well under it."""
    cfg, _, lg = feed_world
    assert lg.num_requests >= 1500
    assert 0.60 <= candidate_recurrence(lg, SIX_H) <= 0.75
    classic = config_from_dict({"data": {"synthetic": {**DEMO_SIZE["feed"]}}})
    ds_c = generate(classic.data.synthetic)
    lg_c = build_request_log(ds_c, time_split(ds_c, classic.split).cuts[2])
    assert candidate_recurrence(lg_c, SIX_H) < 0.45


def test_the_feeds_pilot_refits_the_click_bias_to_the_same_rate(feed_world):
    cfg, ds, _ = feed_world
    feed_bias = build(cfg.data.synthetic).click_bias
    classic_bias = build(SyntheticConfig()).click_bias
    assert feed_bias != classic_bias  # refit on its own retrieval ...
    rate = float(np.mean(ds.interactions.column("click").to_numpy()))
    assert abs(rate - cfg.data.synthetic.click_rate) < 0.06  # ... to the same target rate



def test_the_retrieval_state_is_what_makes_candidates_recur():
    """The same users and sessions: a retrieval that keeps its noise in the user's state
    hands a user more of the same candidates than one that redraws it per request."""
    def recurrence(**kw):
        cfg = feed_cfg(days=3.0, target_interactions=30_000, **kw)
        ds = generate(cfg.data.synthetic)
        return candidate_recurrence(build_request_log(ds, time_split(ds, cfg.split).cuts[2]),
                                    SIX_H)

    held, fresh = recurrence(retrieval_persistence=1.0), recurrence(retrieval_persistence=0.0)
    assert held > fresh + 0.05


def test_each_profiles_serving_settings_are_config_keys():
    from solaris.data.profiles import SERVING

    assert set(SERVING) == set(PROFILES) >= set(DEMO_SIZE)  # the demo's worlds have a size
    for name, serving in SERVING.items():
        cfg = load_config(None, dict(serving))
        for dotted, value in serving.items():
            section, key = dotted.split(".")
            assert getattr(getattr(cfg, section), key) == value, (name, dotted)


def test_the_demo_runs_in_the_feed_world_and_the_classic_one_on_request(monkeypatch):
    """``solaris demo`` hands the replay the feed world at the demo's size with its serving
    settings (the replay's own schedule options too); ``--profile classic`` the defaults; a
    user's --set wins. The replay itself is not run (its parser is the real one)."""
    from jobs import replay
    from solaris import cli

    seen = {}

    def run_from_args(ns):
        seen["ns"] = ns
        return 0

    monkeypatch.setattr(replay, "run_from_args", run_from_args)
    assert cli.main(["demo", "--out", "x", "--set", "data.synthetic.num_users=410"]) == 0
    ns = seen["ns"]
    cfg = load_config(ns.config, parse_overrides(ns.set))
    syn = cfg.data.synthetic
    assert syn.profile == "feed" and syn.num_users == 410
    assert syn.target_interactions == DEMO_SIZE["feed"]["target_interactions"]
    assert cfg.verifier.fraction == 0.5 and ns.lag_s == 60.0 and ns.budget == 0.0
    assert ns.rollover_at == 0.5 and ns.dataset == "synthetic" and ns.max_requests == 1564
    assert cli.main(["demo", "--out", "x", "--profile", "classic"]) == 0
    ns = seen["ns"]
    cfg = load_config(ns.config, parse_overrides(ns.set))
    assert cfg.data.synthetic == SyntheticConfig()
    assert ns.lag_s == 300.0 and cfg.verifier.fraction == 0.2 and ns.max_requests is None


def _small(**kw):
    return config_from_dict({"data": {"synthetic": {"num_users": 120, "num_items": 200,
                                                    "days": 4.0, "target_interactions": 6000,
                                                    **kw}}}).data.synthetic


def test_cohorts_make_near_twins_tied_to_no_user_feature():
    """With cohorts, users of one cohort start alike and users of two cohorts do not; the
    cohorts come from a stream of their own, so every user and item table (and every other
    hidden draw) is the same as without them."""
    plain, coh = build(_small()), build(_small(cohorts=6, cohort_spread=0.3))
    assert plain.user_cohort is None and coh.user_cohort is not None
    c, v = coh.user_cohort, coh.user_vec0
    same = c[:, None] == c[None, :]
    cos = v @ v.T
    off_diag = ~np.eye(len(c), dtype=bool)
    assert cos[same & off_diag].mean() > 0.8 > 0.3 > cos[~same].mean()
    assert plain.users.equals(coh.users) and plain.items.equals(coh.items)
    np.testing.assert_array_equal(plain.user_bias, coh.user_bias)
    np.testing.assert_array_equal(plain.surface_offset, coh.surface_offset)
    with pytest.raises(ConfigError, match="synthetic.cohorts=-1"):
        SyntheticConfig(cohorts=-1)
    with pytest.raises(ConfigError, match="synthetic.rank_noise=-0.5"):
        SyntheticConfig(rank_noise=-0.5)


def test_a_taste_memory_keeps_interests_near_home():
    """Over the horizon a random walk carries interests away from where they started; with
    a taste memory of a day they stay near it."""
    from solaris.data.synthetic_stream import iter_events

    def home_cos(world) -> float:
        last = {}
        for ev in iter_events(world):
            for u, x in zip(ev.user, ev.interest):
                last[int(u)] = x
        u = np.array(sorted(last))
        x = np.stack([last[k] for k in u])
        h = world.user_vec0[u] + world.surface_offset[u].mean(1)
        h /= np.linalg.norm(h, axis=1, keepdims=True)
        return float((x * h).sum(1).mean())

    walk = home_cos(build(_small(drift=1.0)))
    held = home_cos(build(_small(drift=1.0, taste_memory_days=1.0)))
    assert held > walk + 0.1, (held, walk)


def test_the_cohorts_profile_is_the_feed_s_request_process_with_lasting_cohorts():
    from solaris.data.profiles import SERVING

    feed, coh = PROFILES["feed"], PROFILES["cohorts"]
    assert {k: coh[k] for k in feed} == feed  # the same request process
    assert coh["cohorts"] > 0 and coh["taste_memory_days"] > 0 and coh["rank_noise"] < 3.0
    assert SERVING["cohorts"]["split.vm_surface"] == 0
    cfg = load_config(None, {"data.synthetic.profile": "cohorts"})
    assert cfg.data.synthetic.cohorts == coh["cohorts"]
