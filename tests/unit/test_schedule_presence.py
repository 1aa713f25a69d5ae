"""The schedule simulation's presence pattern on the test period (``c_sim``): one flag per
test row, set only where the simulated cache held the row's pair, never above the coverage
ceiling, and none when nothing is written in time."""

import dataclasses

import numpy as np
import pytest

from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.simulate.schedule import candidate_scores, simulated_presence, window_log
from solaris.eval.transfer import TransferExperiment
from solaris.train.vertical import VMSpec, train_vm
from tests.tiny import THREADS, TINY


@pytest.fixture(scope="module")
def world():
    cfg = load_config(None, {**TINY, "train.threads": THREADS})
    exp = TransferExperiment(cfg, load_dataset(cfg.data))
    _, inputs = exp.inputs(exp.teacher(0))
    p = exp.periods
    base, _ = train_vm(inputs, VMSpec("vm"), cfg.vm, cfg.train, task=0, teacher_rows=p.vm,
                       absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2, seed=0,
                       num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    return cfg, exp, base, inputs, window_log(cfg, exp.ds, p)


def test_candidate_scores_equal_the_vm_on_interaction_rows(world):
    from solaris.train.vertical import predict_vm

    cfg, exp, base, inputs, _ = world
    rows = exp.periods.test[:300]
    t = exp.tables
    got = candidate_scores(base, t, t.user[rows], t.item[rows], t.surface[rows])
    off = np.zeros(len(rows), bool)
    np.testing.assert_allclose(got, predict_vm(base, inputs, rows, off, off), rtol=1e-5)


def _with(cfg, fraction=None, budget=None, lag=None):
    v = cfg.verifier if fraction is None else dataclasses.replace(cfg.verifier, fraction=fraction)
    sc = cfg.schedule
    sc = sc if budget is None else dataclasses.replace(sc, budget_per_hour=budget)
    sc = sc if lag is None else dataclasses.replace(sc, lag_s=lag)
    return dataclasses.replace(cfg, verifier=v, schedule=sc)


def test_presence_is_per_test_row_and_bounded_by_the_ceiling(world):
    from solaris.replay.coverage import coverage_ceiling

    cfg, exp, base, _, lg = world
    p = exp.periods
    # every candidate speculated, no budget: the ranking (so the model's floats) cannot matter
    c = _with(cfg, fraction=1.0, budget=0)
    sim = simulated_presence(c, exp.ds, exp.tables, p, base, lg)
    assert sim["mask"].shape == (len(p.test),) and sim["mask"].dtype == bool
    assert sim["c_sim"] == sim["mask"].mean() > 0
    assert sim["labelled_mapped"] > 0.5
    ceiling = coverage_ceiling(lg, float(cfg.cache.read_ttl_s), cfg.schedule.lag_s)
    assert 0 < sim["pair_simulated"] <= ceiling + 1e-12
    # the read age of each covered row: finite exactly there, at least the lag (written at
    # a request's ts, readable after the lag), within the read TTL
    age = sim["age_s"]
    assert age.shape == sim["mask"].shape
    assert np.array_equal(np.isfinite(age), sim["mask"])
    assert (age[sim["mask"]] >= cfg.schedule.lag_s).all()
    assert (age[sim["mask"]] <= cfg.cache.read_ttl_s).all()
    # the history a covered row's z reads: as of the write under ``request`` (the default);
    # under ``visible`` as of the release -- after the write by at least the lag, never after
    # the read
    assert np.array_equal(sim["history_age_s"], age, equal_nan=True)
    vis = dataclasses.replace(c, schedule=dataclasses.replace(c.schedule, history_at="visible"))
    sv = simulated_presence(vis, exp.ds, exp.tables, p, base, lg)
    assert np.array_equal(sv["mask"], sim["mask"])
    assert np.array_equal(sv["age_s"], age, equal_nan=True)
    h = sv["history_age_s"][sim["mask"]]
    assert (h >= 0).all() and (h <= age[sim["mask"]] - cfg.schedule.lag_s).all()
    assert np.array_equal(np.isfinite(sv["history_age_s"]), sim["mask"])
    # nothing written before the window ends: nothing present
    none = simulated_presence(_with(cfg, lag=1e9), exp.ds, exp.tables, p, base, lg)
    assert none["c_sim"] == 0.0 and none["fm_evals"] == 0 and not none["mask"].any()
