"""The own pair as the cache serves it: z as of the write (``pair_embeddings_as_of``), the VM
inputs carrying it with its age (``VMInputs.served_as``), and the age draws."""

import numpy as np
import pytest
import torch

from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.data.split import time_split
from solaris.features import FeatureTables
from solaris.train.residual import draw_ages
from solaris.train.teacher import build_teacher, pair_embeddings_as_of, teacher_outputs, vm_inputs
from tests.tiny import TINY


@pytest.fixture(scope="module")
def world():
    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    tables = FeatureTables(ds, cfg.features)
    periods = time_split(ds, cfg.split)
    teacher = build_teacher(tables, periods.fm, cfg.fm, cfg.encoder, cfg.train, seed=0)
    _, inputs = vm_inputs(teacher, tables, cfg.features)
    return cfg, tables, periods, teacher, inputs


def test_z_as_of_the_request_is_the_rows_own_and_earlier_reads_less_history(world):
    cfg, tables, periods, teacher, _ = world
    rows = periods.test[:200]
    own = teacher_outputs(teacher, tables, rows)[1]
    same = pair_embeddings_as_of(teacher, tables, cfg.features, rows, tables.req_ts[rows])
    assert np.array_equal(own, same)
    # before any event: no history at all, whatever the row -- the z of an empty history
    first = int(tables.ts.min())
    empty = pair_embeddings_as_of(teacher, tables, cfg.features, rows,
                                  np.full(len(rows), first - 10**6))
    at_first = pair_embeddings_as_of(teacher, tables, cfg.features, rows,
                                     np.full(len(rows), first))
    assert np.array_equal(empty, at_first)
    # an hour earlier: rows whose user had events in that hour read a shorter history
    hour = pair_embeddings_as_of(teacher, tables, cfg.features, rows, tables.req_ts[rows] - 3600)
    assert not np.array_equal(hour, own)
    # the tables are not changed by the view
    assert np.array_equal(teacher_outputs(teacher, tables, rows)[1], own)
    with pytest.raises(ValueError, match="as_of"):
        pair_embeddings_as_of(teacher, tables, cfg.features, rows, tables.req_ts[rows][:3])


def test_served_as_sets_the_rows_z_and_age_and_leaves_the_rest(world):
    cfg, tables, periods, _, inputs = world
    rows = periods.val[:50]
    other = periods.val[50:80]
    z = np.random.default_rng(0).normal(size=(len(rows), inputs.dim)).astype(np.float32)
    age = np.full(len(rows), 1800.0)
    served = inputs.served_as(rows, z, age, read_ttl_s=3600.0)
    on = np.ones(len(rows), bool)
    b = served.batch(rows, on, ~on)
    assert torch.equal(b["pair_emb"], torch.from_numpy(z))
    assert torch.allclose(b["pair_age"], torch.full((len(rows),), 0.5))
    assert (b["pair_tier"] == 1).all()
    # absent where the gate is off: age 0, tier none
    off = served.batch(rows, ~on, ~on)
    assert (off["pair_age"] == 0).all() and (off["pair_tier"] == 0).all()
    # other rows: as the fresh inputs give them; the original is untouched
    on2 = np.ones(len(other), bool)
    for k, v in inputs.batch(other, on2, ~on2).items():
        assert torch.equal(v, served.batch(other, on2, ~on2)[k]), k
    assert not torch.equal(inputs.batch(rows, on, ~on)["pair_emb"], b["pair_emb"])
    # a served row at age 0 reads exactly as the fresh inputs do
    fresh = inputs.served_as(rows, inputs.pair.numpy()[rows], np.zeros(len(rows)), 3600.0)
    for k, v in inputs.batch(rows, on, ~on).items():
        assert torch.equal(v, fresh.batch(rows, on, ~on)[k]), k
    with pytest.raises(ValueError, match="age_s"):
        inputs.served_as(rows, z, np.full(len(rows), np.nan), 3600.0)
    with pytest.raises(ValueError, match="read_ttl_s"):
        inputs.served_as(rows, z, age, 0.0)
    with pytest.raises(ValueError, match="pair_emb"):
        inputs.served_as(rows, z[:3], age, 3600.0)


def test_age_draws_come_from_the_found_ages_only():
    found = np.array([np.nan, 300.0, np.nan, 900.0, 4000.0])
    a = draw_ages(found, 1000, seed=0)
    assert set(np.unique(a)) <= {300.0, 900.0, 4000.0} and len(a) == 1000
    assert np.array_equal(a, draw_ages(found, 1000, seed=0))
    with pytest.raises(ValueError, match="found_age_s"):
        draw_ages(np.array([np.nan]), 5, seed=0)
    # with the entries' history ages: the same draws, each paired with its own entry's
    hist = np.array([np.nan, 10.0, np.nan, 20.0, 30.0])
    a2, h2 = draw_ages(found, 1000, seed=0, history_age_s=hist)
    assert np.array_equal(a2, a)
    assert np.array_equal(h2, np.select([a2 == 300.0, a2 == 900.0], [10.0, 20.0], 30.0))
    with pytest.raises(ValueError, match="history_age_s"):
        draw_ages(found, 5, seed=0, history_age_s=np.full(5, np.nan))


def test_the_as_served_correction_reads_z_at_each_entrys_history_age(world):
    """Under ``schedule.history_at: visible`` an entry's z reads the history as of its
    release, later than its write: the correction trained as served gets z at the drawn
    entry's history age and the gate its age since the write, each draw one entry's pair."""
    from solaris.train.residual import fit_pair_as_served, train_base, vm_logits
    from solaris.train.teacher import z_at_age

    cfg, tables, periods, teacher, inputs = world
    common = dict(task=0, rows=periods.vm, absent_rows=periods.vm[:0], val_rows=periods.val,
                  seed=0, num_users=int(tables.user.max()) + 1,
                  num_items=int(tables.item.max()) + 1)
    base, _, _ = train_base(inputs, cfg.vm, cfg.train, cfg.report.vm_lrs[:1], **common)
    z_of = z_at_age(teacher, tables, cfg.features)
    asked = []

    def spy(rows, age_s):
        asked.append(np.asarray(age_s).copy())
        return z_of(rows, age_s)

    found = np.array([np.nan, 900.0, 2400.0, np.nan])
    hist = np.array([np.nan, 540.0, 2040.0, np.nan])
    fit = fit_pair_as_served(base, inputs, cfg.residual, cfg.train, task=0, rows=periods.vm,
                             base_logits=vm_logits(base, inputs, periods.vm),
                             val_rows=periods.val, seed=0, z_as_of=spy, found_age_s=found,
                             read_ttl_s=3600.0, found_history_age_s=hist)
    both = np.concatenate([periods.vm, periods.val])
    ages, hs = draw_ages(found, len(both), 0, hist)
    assert len(asked) == 1 and np.array_equal(asked[0], hs)
    assert set(np.unique(hs)) == {540.0, 2040.0}  # both entries drawn
    on = np.ones(len(both), bool)
    b = fit.served_inputs.batch(both, on, ~on)
    assert torch.allclose(b["pair_age"], torch.from_numpy(ages / 3600.0).float())
    assert torch.equal(b["pair_emb"], torch.from_numpy(z_of(both, hs)))
