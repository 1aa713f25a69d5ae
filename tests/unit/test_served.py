"""Simulated serving (``solaris.simulate.served``): the worker's z over the event log equals the
teacher's, the own-pair tier equals the key-level simulation's presence, the tiers come in
lookup order with ages inside the read TTL, and what it trains (imputed tiers, aggregate)
leaves the own pair and the rows without inputs exactly as they were."""

import dataclasses

import numpy as np
import pytest
import torch

from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.simulate.schedule import candidate_scores, window_log
from solaris.simulate.served import (TableHistory, knn_tables_as_of, select_slots,
                                 simulate_serving, write_vectors)
from solaris.eval.transfer import TransferExperiment
from solaris.history import HistoryStore
from solaris.models.residual import ResidualVM
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.tiers import Tier
from solaris.eval.metrics import clustered_se
from solaris.train.residual import (GUARDED_INPUTS, IMPUTED, choose_scale_guarded, family_z,
                                     guard_z)
from solaris.train.teacher import teacher_outputs
from solaris.train.vertical import VMSpec, train_vm
from tests.tiny import THREADS, TINY


@pytest.fixture(scope="module")
def world():
    cfg = load_config(None, {**TINY, "train.threads": THREADS})
    exp = TransferExperiment(cfg, load_dataset(cfg.data))
    teacher = exp.teacher(0)
    _, inputs = exp.inputs(teacher)
    p = exp.periods
    base, _ = train_vm(inputs, VMSpec("vm"), cfg.vm, cfg.train, task=0, teacher_rows=p.vm,
                       absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2, seed=0,
                       num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    lg = window_log(cfg, exp.ds, p, "test")
    c = lg.candidates.shape[1]
    scores = candidate_scores(base, exp.tables, np.repeat(lg.user, c), lg.candidates.ravel(),
                              np.repeat(lg.surface, c)).reshape(-1, c)
    knn = knn_tables_as_of(teacher.fm, exp.tables, float(p.cuts[2]), cfg)
    served = simulate_serving(cfg, exp.ds, exp.tables, lg, scores, p.test, teacher.fm,
                              teacher.encoder, teacher.version, knn, seed=0)
    return cfg, exp, teacher, base, inputs, lg, scores, served


def test_table_history_window_equals_the_history_store(world):
    """The event-log provider gives the window the live history store gives for the same
    events, at request times inside and between events."""
    cfg, exp, *_ = world
    t = exp.tables
    # a ring long enough to hold every event: the whole log goes in before any read
    store = HistoryStore(dataclasses.replace(cfg.history, max_events=t.num_rows))
    store.replay_log(t.user, t.item, t.surface, t.labels.astype(np.int8), t.ts)
    rng = np.random.default_rng(0)
    rows = rng.choice(t.num_rows, 200, replace=False)
    users = t.user[rows]
    now = t.ts[rows].astype(np.float64) + rng.choice([0.0, 1.0, 0.5, -30.0], len(rows))
    want = store.window(users, now, t.history_len)
    got = TableHistory(t).window(users, now, t.history_len)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


def test_worker_vectors_over_the_event_log_equal_the_teachers(world):
    """z written by simulated serving is the teacher's z of the same (user, item, surface)
    at the same time: the worker's request/candidate split over ``TableHistory``."""
    _, exp, teacher, *_ = world
    t = exp.tables
    rows = exp.periods.val[:300]
    wr = {"user": t.user[rows], "item": t.item[rows], "surface": t.surface[rows],
          "written_at": t.req_ts[rows].astype(np.float64)}
    got = write_vectors(teacher.fm, teacher.encoder, t, teacher.version, wr, chunk=7)
    np.testing.assert_allclose(got, teacher_outputs(teacher, t, rows)[1], atol=1e-5)


def test_the_worker_can_read_the_history_as_of_the_write_s_release(world):
    """``history_at="visible"``: each write's z is the teacher's at ``visible_at`` (the
    worker then reads the feedback that arrived after the betting request); the default
    keeps ``written_at``; any other value names itself."""
    from solaris.config import ScheduleConfig
    from solaris.errors import ConfigError

    _, exp, teacher, *_ = world
    t = exp.tables
    rows = exp.periods.val[:300]
    # released 900 s after the request: the time the teacher's z is taken at moves with it
    later = t.req_ts[rows].astype(np.float64) + 900.0
    wr = {"user": t.user[rows], "item": t.item[rows], "surface": t.surface[rows],
          "written_at": t.req_ts[rows].astype(np.float64), "visible_at": later}
    from solaris.train.teacher import pair_embeddings_as_of

    got = write_vectors(teacher.fm, teacher.encoder, t, teacher.version, wr, chunk=7,
                        history_at="visible")
    want = pair_embeddings_as_of(teacher, t, exp.cfg.features, rows, later)
    np.testing.assert_allclose(got, want, atol=1e-5)
    default = write_vectors(teacher.fm, teacher.encoder, t, teacher.version, wr, chunk=7)
    np.testing.assert_allclose(default, teacher_outputs(teacher, t, rows)[1], atol=1e-5)
    assert not np.allclose(got, default, atol=1e-5)  # some user's history moved in 900 s
    with pytest.raises(ConfigError, match="'written'"):
        write_vectors(teacher.fm, teacher.encoder, t, teacher.version, wr,
                      history_at="written")
    with pytest.raises(ConfigError, match="schedule.history_at"):
        ScheduleConfig(history_at="lease")


def test_simulated_serving_reads_the_history_time_of_the_config(world):
    """``simulate_serving`` under ``schedule.history_at=visible``: the same tiers, ages and
    rows reached, other z in some of them (the training's served inputs follow the config)."""
    from solaris.config import with_overrides

    cfg, exp, teacher, _, _, lg, scores, served = world
    knn = knn_tables_as_of(teacher.fm, exp.tables, float(exp.periods.cuts[2]), cfg)
    vis = simulate_serving(with_overrides(cfg, {"schedule.history_at": "visible"}), exp.ds,
                           exp.tables, lg, scores, exp.periods.test, teacher.fm,
                           teacher.encoder, teacher.version, knn, seed=0)
    assert np.array_equal(vis.pair_tier, served.pair_tier)
    assert np.array_equal(vis.pair_age_s, served.pair_age_s)
    own = served.pair_tier == Tier.PAIR
    assert own.any() and not np.array_equal(vis.pair_emb[own], served.pair_emb[own])


def test_own_pair_tier_is_the_key_simulations_presence(world):
    """Every labelled row the key-level simulation finds is served as its own pair, and no
    other; imputed tiers fill only rows without one; ages lie inside the read TTL."""
    cfg, exp, _, _, _, lg, scores, served = world
    info = served.info
    assert info["own_pair_agrees_with_key_simulation"] == 1.0
    assert served.mapped.mean() > 0.95
    s = cfg.schedule
    sim = simulate_pair_coverage(lg, scores, fraction=cfg.verifier.fraction,
                                 horizon_s=cfg.verifier.horizon_s,
                                 read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=s.lag_s,
                                 tick_s=s.tick_s, budget_per_hour=s.budget_per_hour, seed=0)
    assert (served.pair_tier[served.mapped] == Tier.PAIR).mean() == pytest.approx(sim["pair"])
    on = served.pair_tier != Tier.NONE
    assert (served.pair_tier > Tier.PAIR).any()  # some imputed tier is served
    assert np.all(served.pair_age_s[on] <= cfg.cache.read_ttl_s)
    assert np.all(served.pair_age_s[on] >= s.lag_s - s.tick_s)
    assert np.all(served.pair_emb[~on] == 0)
    assert served.agg_present.any() and np.all(served.agg_emb[~served.agg_present] == 0)


def test_writes_are_logged_in_release_order_and_visible_after_the_lag(world):
    cfg, _, _, _, _, lg, scores, _ = world
    s = cfg.schedule
    sim = simulate_pair_coverage(lg, scores, fraction=cfg.verifier.fraction,
                                 horizon_s=cfg.verifier.horizon_s,
                                 read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=s.lag_s,
                                 tick_s=s.tick_s, budget_per_hour=s.budget_per_hour, seed=0,
                                 record_writes=True)
    w = sim["writes"]
    assert len(w["user"]) == sim["fm_evals"] > 0
    assert np.all(np.diff(w["visible_at"]) >= 0)
    assert np.all(w["visible_at"] - w["written_at"] >= s.lag_s)


def test_select_slots_keeps_only_the_asked_tiers():
    tier = np.array([0, 1, 2, 3, 1])
    emb = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    out = select_slots(tier, emb, np.full(5, 60.0), emb, np.array([1, 0, 1, 1, 0], bool),
                       {Tier.PAIR, Tier.ITEM_NEIGHBOUR}, agg=False)
    np.testing.assert_array_equal(out.pair_tier, [0, 1, 0, 3, 1])
    np.testing.assert_array_equal(out.pair_present, [False, True, False, True, True])
    assert np.all(out.pair_emb[[0, 2]] == 0) and np.all(out.pair_age_s[[0, 2]] == 0)
    assert not out.agg_present.any() and np.all(out.agg_emb == 0)


def test_imputed_correction_never_moves_the_own_pair_or_the_misses(world):
    """A residual VM with an imputed-tier correction scores own-pair rows as its pair
    correction does and rows without inputs as the VM alone, whatever the imputed weights."""
    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    torch.manual_seed(0)
    plain = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=False)
    both = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=False,
                      imputed=True)
    both.pair.load_state_dict(plain.pair.state_dict())
    with torch.no_grad():
        for p in both.imputed.parameters():
            p.add_(torch.randn_like(p))
    for t in (Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR):
        both.set_scale("pair", int(t), 1.0)
    idx = np.arange(len(served.rows))
    b = served.batch(exp.tables, idx, ttl, None, False)
    with torch.no_grad():
        a, z, alone = plain(b), both(b), base(b)
    own = served.pair_tier == Tier.PAIR
    none = served.pair_tier == Tier.NONE
    imp = served.pair_tier > Tier.PAIR
    assert torch.equal(a[own], z[own]) and torch.equal(z[none], alone[none])
    assert not torch.equal(z[imp], a[imp])


def test_guarded_scale_switches_off_a_gain_validation_cannot_tell_from_noise(world):
    """A correction that only adds noise gets scale 0; with no guard (z = 0) the best scale
    on the curve is taken whenever it gains at all."""
    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    m = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=True)
    idx = np.arange(len(served.rows))
    b = served.batch(exp.tables, idx, ttl)
    with torch.no_grad():
        bl = base(b)
    y = torch.from_numpy(exp.tables.labels[served.rows, 0])
    g = choose_scale_guarded(m, "agg", 1, (0.0, 0.5, 1.0), b, bl, y, min_gain_z=50.0)
    assert g["scale"] == 0.0 and float(m.scale[1, 1]) == 0.0
    assert set(g["curve"]) == {"0", "0.5", "1"}
    g0 = choose_scale_guarded(m, "agg", 1, (0.0, 0.5, 1.0), b, bl, y, min_gain_z=0.0)
    best = min(g0["curve"], key=lambda k: (g0["curve"][k], -float(k)))
    assert g0["scale"] == (float(best) if g0["gain"] > 0 else 0.0)


def test_the_guard_s_standard_error_counts_a_user_once_not_once_per_row():
    """The aggregate is one vector per user: rows of a user are not independent draws."""
    rng = np.random.default_rng(0)
    d = rng.normal(size=400)
    naive = clustered_se(d)
    assert naive == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    # one row per user: the clustered SE is the naive one
    assert clustered_se(d, np.arange(len(d))) == pytest.approx(naive)
    # 40 users, each with 10 rows of one shared gain: 40 draws, not 400
    u = np.repeat(np.arange(40), 10)
    shared = rng.normal(size=40)[u]
    assert clustered_se(shared, u) > 2.5 * clustered_se(shared)
    assert clustered_se(shared, u) == pytest.approx(
        shared[::10].std(ddof=1) / np.sqrt(40), rel=1e-9)
    assert clustered_se(d, np.zeros(len(d))) == float("inf")  # one user: nothing to tell


def test_family_z_is_bonferroni_over_one_sided_tests():
    from statistics import NormalDist

    n = NormalDist()
    assert family_z(2.0, 1) == pytest.approx(2.0)
    assert family_z(2.0, 3) == pytest.approx(2.4284, abs=1e-4)
    for z in (0.5, 1.0, 2.0, 3.0):
        for k in (2, 3, 10):
            zk = family_z(z, k)
            assert zk > family_z(z, k - 1)  # more inputs, a higher bar
            assert k * (1 - n.cdf(zk)) == pytest.approx(1 - n.cdf(z), rel=1e-9)
    assert family_z(0.0, 3) == 0.0  # no guard stays no guard
    with pytest.raises(ValueError, match="k=0"):
        family_z(2.0, 0)
    cfg = load_config(None, {"residual.min_gain_z": 2.0})
    assert GUARDED_INPUTS == 3
    assert guard_z(cfg.residual) == pytest.approx(family_z(2.0, 3))


def test_the_guard_judges_the_three_inputs_as_one_family(world):
    """Each guarded input is served only if its validation gain is at least
    ``family_z(min_gain_z, 3)`` standard errors: an input that clears ``min_gain_z`` itself
    but not the family's Bonferroni bar is switched off."""
    from solaris.models.residual import AGG_TIER
    from solaris.train.residual import fit_served_tiers

    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    torch.manual_seed(0)  # the pair model's initial weights, whatever test ran before
    pair = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=False)
    pair.set_scale("pair", int(Tier.PAIR), 0.5)
    b = served.batch(exp.tables, np.arange(len(served.rows)), ttl)
    with torch.no_grad():
        bl = base(b).numpy()

    def fit(z: float):
        res = dataclasses.replace(cfg.residual, hidden=8, epochs=2, min_gain_z=z)
        return fit_served_tiers(pair, exp.tables, res, cfg.train, task=0, train_slots=served,
                                base_logits=bl, val_slots=served, read_ttl_s=ttl, seed=0)

    free = fit(0.0)
    assert free.info["guard_z"] == 0.0  # no guard stays no guard
    stats = [r["gain"] / r["se"] for r in free.info["guard"].values() if r["scale"] > 0]
    assert stats, free.info["guard"]  # the tiny world serves some input with no guard
    z = min(stats) / 2  # below every served input's statistic
    fam = fit(z)
    bar = fam.info["guard_z"]
    assert bar == family_z(z, GUARDED_INPUTS) > z
    for f in (free, fam):
        g = f.info["guard"]
        for name, r in g.items():
            served_it = r["gain"] > 0 and r["gain"] >= f.info["guard_z"] * r["se"]
            assert (r["scale"] > 0) == served_it, (name, r)
        for t in IMPUTED:
            assert float(f.model.scale[0, int(t)]) == g[t.label]["scale"]
        assert float(f.model.scale[1, AGG_TIER]) == g["aggregate"]["scale"]
    # the tiny world has an input past min_gain_z and short of the family's bar: off
    assert any(z * r["se"] <= r["gain"] < bar * r["se"] and r["scale"] == 0
               for r in fam.info["guard"].values()), fam.info["guard"]


def _served_fits(world, field: str, arms: tuple[str, ...], scale: float | None = None,
                 epochs: int = 1):
    """A pair-only residual VM (its own-pair scale ``scale`` where given), the base logits of
    the served rows, and ``fit_served_tiers`` over them with ``residual.<field>`` at each of
    ``arms``: (pair model, base logits, {arm: fit})."""
    from solaris.train.residual import fit_served_tiers

    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    pair = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=False)
    if scale is not None:
        pair.set_scale("pair", int(Tier.PAIR), scale)
    b = served.batch(exp.tables, np.arange(len(served.rows)), ttl)
    with torch.no_grad():
        bl = base(b).numpy()
    fits = {}
    for where in arms:
        res = dataclasses.replace(cfg.residual, hidden=8, epochs=epochs, **{field: where})
        fits[where] = fit_served_tiers(pair, exp.tables, res, cfg.train, task=0,
                                       train_slots=served, base_logits=bl, val_slots=served,
                                       read_ttl_s=ttl, seed=0)
    return pair, bl, fits


def test_the_guard_needs_a_gain_of_z_standard_errors_clustered_by_user():
    """A change is served only if its validation gain is positive and at least z standard
    errors, clustered by user: a gain that one user carries does not pass."""
    from solaris.train.residual import passes_guard

    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(40), 10)
    even = 0.01 + 0.002 * rng.standard_normal(400)  # every user gains a little
    ok, rec = passes_guard(even, users, 2.43)
    assert ok and rec["val_gain"] > 2.43 * rec["val_se"]
    one = np.where(users == 0, 0.4, 0.0) + 0.001 * rng.standard_normal(400)  # one user's gain
    ok, rec = passes_guard(one, users, 2.43)
    assert rec["val_gain"] > 0 and not ok
    assert not passes_guard(-even, users, 0.0)[0]  # a loss never passes, even at z = 0


def test_present_affine_maps_only_the_rows_a_pair_tier_is_served(world):
    """``present_affine`` is the identity until set; set for the own pair, it maps exactly
    the rows served that tier (alpha + beta * logit) and no other row moves, misses included;
    a bad map is refused by name."""
    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    m = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=True)
    b = served.batch(exp.tables, np.arange(len(served.rows)), ttl)
    with torch.no_grad():
        before = m(b)
        m.set_present_affine(int(Tier.PAIR), 0.7, 1.5)
        after = m(b)
        alone = base(b)
    own = torch.from_numpy(served.pair_tier == int(Tier.PAIR))
    none = torch.from_numpy((served.pair_tier == int(Tier.NONE)) & ~served.agg_present)
    assert own.any() and none.any() and (~own).any()
    assert torch.allclose(after[own], 0.7 + 1.5 * before[own])
    assert torch.equal(after[~own], before[~own])
    assert torch.equal(after[none], alone[none])
    m.set_scale("pair", int(Tier.PAIR), 0.0)  # a tier switched off is a miss: no map
    with torch.no_grad():
        off = m(b)
    assert torch.equal(off[own & torch.from_numpy(~served.agg_present)],
                       alone[own & torch.from_numpy(~served.agg_present)])
    with pytest.raises(ValueError, match="beta > 0"):
        m.set_present_affine(int(Tier.PAIR), 0.0, -1.0)
    with pytest.raises(ValueError, match="tier=0"):
        m.set_present_affine(int(Tier.NONE), 0.0, 1.0)


def test_present_affine_is_fitted_on_served_rows_and_kept_only_past_the_guard(world):
    """``residual.present_affine = "served"``: the own pair's map is the Platt fit of the
    training rows served that tier; it is set only when its validation gain passes the guard
    (an impossible guard leaves the identity), and rows without an input stay the VM alone.
    "off" fits nothing."""
    from solaris.eval.metrics import fit_platt_logits
    from solaris.train.residual import fit_present_affine

    cfg, exp, _, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    _, bl, fits = _served_fits(world, "present_affine", ("off", "served"))
    assert "present_affine" not in fits["off"].info
    ident = torch.tensor([0.0, 1.0])
    assert all(torch.equal(r, ident) for r in fits["off"].model.present_affine)
    f = fits["served"]
    rec = f.info["present_affine"]["pair"]
    own = np.flatnonzero(served.pair_tier == int(Tier.PAIR))
    assert rec["train_rows"] == len(own) >= 50
    # the map is the Platt fit over the own-pair rows' logits with every input as served
    probe = fits["off"].model
    with torch.no_grad():
        x = probe(served.batch(exp.tables, own, ttl), base_logit=torch.from_numpy(bl)[own])
    beta, alpha = fit_platt_logits(exp.tables.labels[served.rows[own], 0], x.double().numpy())
    assert rec["alpha"] == pytest.approx(alpha, abs=1e-6)
    assert rec["beta"] == pytest.approx(beta, abs=1e-6)
    got = f.model.present_affine[int(Tier.PAIR)]
    if rec["kept"]:
        assert rec["gain"] > 0 and rec["gain"] >= f.info["guard_z"] * rec["se"]
        assert got.tolist() == pytest.approx([alpha, beta], abs=1e-6)
    else:
        assert torch.equal(got, ident)
    # the manifest (and so GET /stats) records the map wherever it is not the identity
    from solaris.train.residual import residual_meta
    meta = residual_meta(f)["present_affine"]
    assert ("pair" in meta) == rec["kept"] and "pair" not in residual_meta(fits["off"])[
        "present_affine"]
    # an impossible guard keeps the identity, whatever the fit
    m = fits["off"].model
    with torch.no_grad():
        out = fit_present_affine(m, exp.tables, task=0, train_slots=served,
                                 base_logits=torch.from_numpy(bl), val_slots=served,
                                 val_base=torch.from_numpy(bl), read_ttl_s=ttl,
                                 min_gain_z=1e9)
    assert out["pair"]["kept"] is False and torch.equal(m.present_affine[int(Tier.PAIR)], ident)
    none = np.flatnonzero((served.pair_tier == int(Tier.NONE)) & ~served.agg_present)
    bn = served.batch(exp.tables, none, ttl)
    with torch.no_grad():
        assert torch.equal(f.model(bn), base(bn))


def test_the_training_period_is_ranked_by_the_cross_fitted_models(world):
    """The VM period's simulation ranks by the cross-fitted models' out-of-sample scores
    (``CrossFit.verifier``), not by the base that trained on those rows; later periods keep
    the base."""
    from solaris.simulate.served import simulate_period
    from solaris.train.residual import crossfit_base, training_verifier

    cfg, exp, teacher, base, inputs, *_ = world
    p, t = exp.periods, exp.tables
    cf = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, task=0, rows=p.vm,
                       absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2, seed=0,
                       num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    assert training_verifier(cf, t, "val") is None and training_verifier(cf, t, "test") is None
    verify = training_verifier(cf, t, "vm")
    lg = window_log(cfg, exp.ds, p, "vm")
    c = lg.candidates.shape[1]
    scores = verify(np.repeat(lg.user, c), lg.candidates.ravel(),
                    np.repeat(lg.surface, c)).reshape(-1, c)
    knn = knn_tables_as_of(teacher.fm, t, float(p.cuts[0]), cfg)
    want = simulate_serving(cfg, exp.ds, t, lg, scores, p.vm, teacher.fm, teacher.encoder,
                            teacher.version, knn, seed=0)
    args = (cfg, exp.ds, t, p, base, teacher.fm, teacher.encoder, teacher.version, "vm", 0, lg)
    got = simulate_period(*args, verifier=verify)
    in_sample = simulate_period(*args)
    np.testing.assert_array_equal(got.pair_tier, want.pair_tier)
    own = got.pair_tier == int(Tier.PAIR)
    assert own.any() and not np.array_equal(own, in_sample.pair_tier == int(Tier.PAIR))


def test_serving_another_history_time_than_trained_is_named():
    """Artifacts trained under one ``schedule.history_at`` and served under the other: the
    note names both settings and the retraining override; the same setting (or a manifest
    from before the setting, trained as ``request``) gives None."""
    from solaris.config import config_to_dict, load_config
    from solaris.artifacts import served_unlike_trained

    cfg = load_config(None, {})
    manifest = {"version": "fm-7", "config": config_to_dict(cfg)}
    assert served_unlike_trained(manifest, cfg) is None
    assert served_unlike_trained({"version": "old", "config": {}}, cfg) is None
    why = served_unlike_trained(manifest, load_config(None, {"schedule.history_at": "visible"}))
    assert "fm-7" in why and "'request'" in why and "'visible'" in why
    assert "--set schedule.history_at=visible" in why


def test_the_imputed_tiers_train_a_correction_of_their_own_held_near_the_pair_s(world):
    """``imputed_fit="own"`` moves the imputed correction's delta (``"gate"`` leaves it the
    own pair's); the own pair's correction is never moved; a larger ``imputed_prox`` keeps
    the imputed weights nearer where they started."""
    torch.manual_seed(0)
    pair, _, fits = _served_fits(world, "imputed_fit", ("own", "gate"), epochs=2)

    def moved(fit) -> float:
        a, b = fit.model.imputed.delta.state_dict(), pair.pair.delta.state_dict()
        return float(sum(((a[k] - b[k]) ** 2).sum() for k in a))

    for fit in fits.values():
        for k, v in pair.pair.state_dict().items():
            assert torch.equal(fit.model.pair.state_dict()[k], v)
    assert moved(fits["gate"]) == 0.0
    assert moved(fits["own"]) > 0.0
    assert fits["own"].info["imputed_fit"] == "own"
    torch.manual_seed(0)
    _, _, held = _served_fits(world, "imputed_prox", (10.0,), epochs=2)
    assert moved(held[10.0]) < moved(fits["own"])


def test_the_candidate_table_codes_each_item_s_features_and_or_fm_vector(world):
    """``candidate_table``: one-hot categories, the multi-hot codes' indicators (pad left
    out) and the continuous features; the FM's item vectors beside them for "both"."""
    from solaris.train.residual import candidate_table

    _, exp, teacher, *_ = world
    t = exp.tables
    feats = candidate_table("features", teacher.fm, t).numpy()
    fm = candidate_table("fm", teacher.fm, t).numpy()
    both = candidate_table("both", teacher.fm, t).numpy()
    assert candidate_table("off", teacher.fm, t) is None
    n = len(t.item_cat)
    assert feats.shape[0] == fm.shape[0] == n and both.shape[1] == feats.shape[1] + fm.shape[1]
    np.testing.assert_array_equal(both[:, feats.shape[1]:], fm)
    np.testing.assert_array_equal(fm, teacher.fm.item_vectors().detach().numpy())
    i = 3
    width = int(t.item_cat[:, 0].max()) + 1
    assert feats[i, :width].sum() == 1 and feats[i, t.item_cat[i, 0]] == 1
    tags = {int(c) for c in t.item_mh[i, 0] if c > 0}
    mh_width = int(t.item_mh[:, 0].max())
    block = feats[i, width:width + mh_width]
    assert {int(j) + 1 for j in np.flatnonzero(block)} == tags
    cont = t.item_cont.shape[1]
    np.testing.assert_array_equal(feats[:, -cont:], t.item_cont)


def test_the_aggregate_meets_the_candidate_when_given_a_candidate_table(world):
    """With a candidate table the served aggregate correction reads the candidate (its
    table holds it, standardised, and the meta says its shape); without: it does not."""
    from solaris.train.residual import candidate_table, fit_served_tiers, residual_meta

    cfg, exp, teacher, base, _, _, _, served = world
    ttl = float(cfg.cache.read_ttl_s)
    pair = ResidualVM(base, served.pair_emb.shape[1], 8, use_pair=True, use_agg=False)
    b = served.batch(exp.tables, np.arange(len(served.rows)), ttl)
    with torch.no_grad():
        bl = base(b).numpy()
    table = candidate_table("features", teacher.fm, exp.tables)
    res = dataclasses.replace(cfg.residual, hidden=8, epochs=1)
    out = {k: fit_served_tiers(pair, exp.tables, res, cfg.train, task=0, train_slots=served,
                               base_logits=bl, val_slots=served, read_ttl_s=ttl, seed=0,
                               item_table=v)
           for k, v in (("crossed", table), ("plain", None))}
    agg = out["crossed"].model.agg
    assert agg.crossed and tuple(agg.item_vec.shape) == (table.shape[0] + 1, table.shape[1])
    assert residual_meta(out["crossed"])["agg_items"] == list(table.shape)
    assert not out["plain"].model.agg.crossed
    assert residual_meta(out["plain"])["agg_items"] is None
