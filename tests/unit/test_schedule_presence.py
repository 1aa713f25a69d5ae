"""The schedule simulation's presence pattern on the test period (``c_sim``): one flag per
test row, set only where the simulated cache held the row's pair, and more speculation never
covers fewer rows."""

import dataclasses

import numpy as np
import pytest

from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.eval.schedule import candidate_scores, simulated_presence, window_log
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


def test_presence_is_per_test_row_and_grows_with_speculation(world):
    cfg, exp, base, _, lg = world
    p = exp.periods
    shares = []
    for fraction in (0.05, 0.2, 1.0):
        c = dataclasses.replace(cfg, verifier=dataclasses.replace(cfg.verifier,
                                                                  fraction=fraction),
                                schedule=dataclasses.replace(cfg.schedule, budget_per_hour=0))
        sim = simulated_presence(c, exp.ds, exp.tables, p, base, lg)
        assert sim["mask"].shape == (len(p.test),) and sim["mask"].dtype == bool
        assert sim["c_sim"] == sim["mask"].mean()
        assert sim["labelled_mapped"] > 0.5
        shares.append(sim["c_sim"])
    # with no budget, a larger verifier fraction enqueues a superset: never fewer found
    assert shares[0] <= shares[1] <= shares[2] and shares[2] > 0
