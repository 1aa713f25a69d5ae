"""The residual VM: no harm by construction (misses score as the VM alone, bit for bit),
a frozen base, scales as kill switches; its training on cross-fitted base logits."""

import numpy as np
import pytest
import torch

from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.simulate.schedule import candidate_scores
from solaris.eval.transfer import TransferExperiment
from solaris.models.residual import ResidualVM
from solaris.train.residual import crossfit_base, train_residual, vm_logits
from solaris.train.vertical import VMSpec, train_vm
from tests.unit.test_models import TINY_SPEC, make_batch, make_vm


def _residual(**kw) -> ResidualVM:
    torch.manual_seed(1)
    return ResidualVM(make_vm(False, False), slot_dim=4, hidden=8, **kw).eval()


def _perturb(rvm: ResidualVM) -> None:
    with torch.no_grad():  # non-trivial corrections (a fresh gate is exactly 1)
        for p in [p for m in (rvm.pair, rvm.agg) if m is not None for p in m.parameters()]:
            p.add_(torch.randn_like(p))


def test_rows_with_every_slot_missing_score_as_the_vm_alone_bit_for_bit():
    rvm = _residual()
    _perturb(rvm)
    rvm.set_scale("pair", 2, 1.0)
    rvm.set_scale("pair", 3, 1.0)
    batch = make_batch(TINY_SPEC, B=64, seed=3)
    present = batch["pair_present"] > 0
    batch["pair_tier"] = torch.where(present, batch["pair_tier"].clamp(min=1), 0)
    none = (batch["pair_present"] == 0) & (batch["agg_present"] == 0)
    assert none.any() and (~none).any()
    batch["pair_emb"][batch["pair_present"] == 0] = float("nan")  # absent: anything, even NaN
    batch["agg_emb"][batch["agg_present"] == 0] = float("nan")
    with torch.no_grad():
        got, base = rvm(batch), rvm.base(batch)
    assert torch.isfinite(got).all()
    assert torch.equal(got[none], base[none])
    assert (got[~none] != base[~none]).all()  # a present slot moves the score



@pytest.mark.parametrize("case", ["none", "own_pair", "imputed", "aggregate", "mixed"])
def test_without_gradients_an_unread_correction_is_skipped_and_changes_no_bit(case):
    """Serving and evaluation (no gradients) skip a correction no row of the batch reads; the
    scores equal, bit for bit, those with gradients on, where every correction runs."""
    rvm = ResidualVM(make_vm(False, False), slot_dim=4, hidden=8, imputed=True).eval()
    torch.manual_seed(1)
    _perturb(rvm)
    with torch.no_grad():
        for p in rvm.imputed.parameters():
            p.add_(torch.randn_like(p))
        rvm.present_affine[1] = torch.tensor([0.3, 1.2])
        rvm.present_affine[3] = torch.tensor([-0.2, 0.9])
    for t in (2, 3):
        rvm.set_scale("pair", t, 1.0)
    batch = make_batch(TINY_SPEC, B=64, seed=5)
    rows = torch.arange(64)
    pair = {"none": rows < 0, "own_pair": rows % 2 == 0, "imputed": rows % 3 == 0,
            "aggregate": rows < 0, "mixed": rows % 2 == 0}[case]
    agg = {"aggregate": rows % 4 == 0, "mixed": rows % 5 == 0}.get(case, rows < 0)
    batch["pair_present"] = pair.float()
    tier = torch.where(pair, 2 + rows % 2 if case == "imputed" else 1 + rows % 3, 0)
    batch["pair_tier"] = tier if case != "own_pair" else torch.where(pair, 1, 0)
    batch["agg_present"] = agg.float()
    batch["pair_emb"][~pair] = float("nan")
    batch["agg_emb"][~agg] = float("nan")
    with torch.enable_grad():
        full = rvm(batch).detach()
    with torch.inference_mode():
        lazy = rvm(batch)
        base = rvm.base(batch)
    assert torch.equal(full, lazy)
    moved = pair | agg
    assert torch.equal(lazy[~moved], base[~moved]) and (lazy[moved] != base[moved]).all()

def test_a_tier_at_scale_zero_is_switched_off():
    rvm = _residual(use_agg=False)
    _perturb(rvm)
    batch = make_batch(TINY_SPEC, B=64, seed=4)
    batch["pair_present"][:] = 1.0
    batch["pair_tier"] = torch.arange(64) % 3 + 1  # pair, user neighbour, item neighbour
    with torch.no_grad():
        base = rvm.base(batch)
        got = rvm(batch)
    # untrained imputed tiers start switched off; the own pair is on
    own = batch["pair_tier"] == 1
    assert torch.equal(got[~own], base[~own]) and (got[own] != base[own]).all()
    rvm.set_scale("pair", 1, 0.0)
    with torch.no_grad():
        assert torch.equal(rvm(batch), base)
    with pytest.raises(ValueError, match="scale=1.5"):
        rvm.set_scale("pair", 1, 1.5)
    with pytest.raises(ValueError, match="tier=0"):
        rvm.set_scale("pair", 0, 1.0)


def test_the_base_must_be_the_vm_alone():
    with pytest.raises(ValueError, match="VM alone"):
        ResidualVM(make_vm(True, False), slot_dim=4, hidden=8)


TINY = {
    "data.synthetic.num_users": 300, "data.synthetic.num_items": 200,
    "data.synthetic.days": 10.0, "data.synthetic.target_interactions": 8000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 1,
    "train.fm_epochs": 1, "train.vm_epochs": 2, "residual.epochs": 2, "report.vm_lrs": [1e-2],
}


@pytest.fixture(scope="module")
def world():
    from tests.tiny import THREADS

    cfg = load_config(None, {**TINY, "train.threads": THREADS})
    exp = TransferExperiment(cfg, load_dataset(cfg.data))
    probs, inputs = exp.inputs(exp.teacher(0))
    return cfg, exp, inputs


def test_training_leaves_the_base_untouched_and_cross_fitted_logits_are_out_of_sample(world):
    cfg, exp, inputs = world
    p = exp.periods
    base, _ = train_vm(inputs, VMSpec("vm"), cfg.vm, cfg.train, task=0, teacher_rows=p.vm,
                       absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2, seed=0,
                       num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    cf = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, task=0, rows=p.vm,
                       absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2, seed=0,
                       num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    b = cf.logits
    assert b.shape == (len(p.vm),) and np.isfinite(b).all()
    # not the base's own (in-sample) logits: each fold's model never saw its rows
    assert not np.array_equal(b, vm_logits(base, inputs, p.vm))
    _verifier_scores_each_row_out_of_sample(cf, exp.tables, p.vm)
    fit = train_residual(base, inputs, cfg.residual, cfg.train, task=0, rows=p.vm,
                         base_logits=b, val_rows=p.val, slot="pair", use_z=True, seed=0)
    for k, v in base.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert fit.model.base is base
    curve = fit.scale_curves["pair"]
    assert set(curve) == {f"{s:g}" for s in cfg.residual.scales}
    chosen = float(fit.model.scale[0, 1])
    assert fit.val_bce == curve[f"{chosen:g}"] == min(curve.values())
    # scale 0 on validation is the base itself
    from solaris.eval import metrics as M
    pv = 1 / (1 + np.exp(-vm_logits(base, inputs, p.val).astype(np.float64)))
    assert curve["0"] == pytest.approx(M.bce(inputs.labels[p.val, 0].numpy(), pv), abs=1e-5)


def test_the_vm_alone_is_calibrated_on_validation_and_old_checkpoints_load_uncalibrated(world):
    """The base every arm shares carries a Platt fit on validation, so a correction on top of
    it is not paid for recalibrating the base."""
    import dataclasses

    from solaris.eval import metrics as M

    cfg, exp, inputs = world
    p = exp.periods
    kw = dict(task=0, teacher_rows=p.vm, absent_rows=exp.absent_rows, val_rows=p.val, lr=1e-2,
              seed=0, num_users=exp.ds.num_users, num_items=exp.ds.num_items)
    cal, v_cal = train_vm(inputs, VMSpec("vm"), cfg.vm, cfg.train, **kw)
    raw, v_raw = train_vm(inputs, VMSpec("vm"), dataclasses.replace(cfg.vm, calibrate=False),
                          cfg.train, **kw)
    a, b = (float(t) for t in cal.calibration)
    assert raw.calibration.tolist() == [1.0, 0.0] and (a, b) != (1.0, 0.0)
    # same weights, same seed: the calibrated logits are the raw ones through (a, b)
    x_raw, x_cal = vm_logits(raw, inputs, p.val), vm_logits(cal, inputs, p.val)
    np.testing.assert_allclose(x_cal, a * x_raw + b, rtol=1e-5, atol=1e-5)
    # on validation it is now its own best Platt fit, and no worse than the raw model
    y = inputs.labels[p.val, 0].numpy()
    a2, b2 = M.fit_platt_logits(y, x_cal)
    assert a2 == pytest.approx(1.0, abs=1e-3) and b2 == pytest.approx(0.0, abs=1e-3)
    assert v_cal <= v_raw + 1e-6
    # a checkpoint written before the calibration existed loads as the identity
    state = {k: v for k, v in cal.state_dict().items() if k != "calibration"}
    cal.load_state_dict(state)
    assert cal.calibration.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="calibration"):
        cal.set_calibration(-1.0, 0.0)


def _verifier_scores_each_row_out_of_sample(cf, t, rows):
    """The training-period verifier scores a candidate that is a training row by the fold
    model that did not train on it (its probability is sigmoid of the cross-fitted logit), and
    an unseen pair by model ``key % folds``."""
    verify = cf.verifier(t)
    first = np.unique(t.user[rows] * t.num_items + t.item[rows], return_index=True)[1]
    r = rows[np.sort(first)[:400]]  # pairs with one first row each
    got = verify(t.user[r], t.item[r], t.surface[r])
    np.testing.assert_allclose(got, torch.sigmoid(torch.from_numpy(
        cf.logits[np.searchsorted(rows, r)])).numpy(), rtol=1e-4, atol=1e-6)
    seen = set((t.user[rows] * t.num_items + t.item[rows]).tolist())
    u, i = np.meshgrid(np.arange(5), np.arange(t.num_items))
    key = (u * t.num_items + i).ravel()
    new = np.array([k not in seen for k in key])
    uu, ii = u.ravel()[new][:50], i.ravel()[new][:50]
    s = np.zeros(len(uu), np.int64)
    want = [float(candidate_scores(cf.models[(a * t.num_items + b) % len(cf.models)], t,
                                   np.array([a]), np.array([b]), np.array([0]))[0])
            for a, b in zip(uu, ii)]
    np.testing.assert_allclose(verify(uu, ii, s), want, rtol=1e-5)


def _crossed(seed: int = 1) -> ResidualVM:
    """A residual VM whose aggregate correction meets the candidate (11 items, vectors of
    width 5), every weight perturbed."""
    rvm = _residual(agg_items=(11, 5))
    _perturb(rvm)
    rvm.agg.set_item_vectors(torch.randn(11, 5, generator=torch.Generator().manual_seed(seed)))
    return rvm


def test_the_crossed_aggregate_reads_the_candidate_and_misses_stay_the_vm_alone():
    """One user's aggregate, several candidates: the crossed correction's term differs by
    candidate (the uncrossed one's depends on the candidate only through the base logit); a
    row without an input still scores as the VM alone, bit for bit."""
    rvm = _crossed()
    batch = make_batch(TINY_SPEC, B=32, seed=4)
    batch["pair_present"] = torch.zeros(32)
    batch["agg_present"] = (torch.arange(32) % 4 != 0).float()
    batch["agg_emb"] = batch["agg_emb"][:1].expand(32, -1).clone()  # one aggregate for all
    batch["agg_emb"][batch["agg_present"] == 0] = float("nan")
    with torch.no_grad():
        b = rvm.base(batch)
        got = rvm(batch, base_logit=b)
        # the same rows with every candidate's base logit equal: only the item can differ
        flat = rvm(batch, base_logit=torch.zeros_like(b))
    on = batch["agg_present"] > 0
    assert torch.isfinite(got).all()
    assert torch.equal(got[~on], b[~on])
    items = batch["item"][on]
    assert len(set(items.tolist())) > 3
    assert len(set(flat[on].tolist())) > 3  # the term varies with the candidate alone
    rvm.agg.item_vec.zero_()  # no item vectors: the cross is 0 for every candidate
    with torch.no_grad():
        flat0 = rvm(batch, base_logit=torch.zeros_like(b))
    assert len(set(flat0[on].tolist())) == 1


def test_an_item_serving_does_not_know_reads_the_zero_row():
    rvm = _crossed()
    batch = make_batch(TINY_SPEC, B=8, seed=2)
    batch["pair_present"] = torch.zeros(8)
    batch["agg_present"] = torch.ones(8)
    with torch.no_grad():
        b = torch.zeros(8)
        known_zero = rvm.agg.item_vec[-1].clone()
        batch["item"] = torch.full((8,), 11)  # the out-of-vocabulary id
        oov = rvm(batch, base_logit=b)
        batch["item"] = torch.full((8,), 500)  # further out: clamped to the same row
        far = rvm(batch, base_logit=b)
    assert torch.equal(known_zero, torch.zeros(5))
    assert torch.equal(oov, far)


def test_item_vectors_are_standardised_and_checked():
    rvm = _residual(agg_items=(11, 5))
    v = torch.randn(11, 5) * 7 + 3
    rvm.agg.set_item_vectors(v)
    t = rvm.agg.item_vec[:-1]
    assert torch.allclose(t.mean(0), torch.zeros(5), atol=1e-5)
    assert torch.allclose(t.std(0), torch.ones(5), atol=1e-5)
    with pytest.raises(ValueError, match=r"shape \(10, 5\)"):
        rvm.agg.set_item_vectors(torch.randn(10, 5))
    with pytest.raises(ValueError, match="finite"):
        rvm.agg.set_item_vectors(torch.full((11, 5), float("nan")))
    with pytest.raises(ValueError, match="reads no candidate"):
        _residual().agg.set_item_vectors(v)


def test_a_correction_that_reads_no_candidate_needs_no_item_ids():
    """The slots alone (no ``item`` key, as the router's head builds them for a VM whose
    aggregate correction reads no candidate) score an aggregate; a crossed one refuses them."""
    from solaris.models.batch import SLOT_KEYS

    batch = make_batch(TINY_SPEC, B=8, seed=6)
    batch["pair_present"] = torch.zeros(8)
    batch["agg_present"] = torch.ones(8)
    slots_only = {k: batch[k] for k in SLOT_KEYS}
    b = torch.zeros(8)
    plain = _residual()
    _perturb(plain)
    with torch.no_grad():
        assert torch.equal(plain(slots_only, base_logit=b), plain(batch, base_logit=b))
        with pytest.raises(ValueError, match="pass its item ids"):
            _crossed()(slots_only, base_logit=b)
