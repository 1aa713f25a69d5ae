"""A tiny train + transfer report on small synthetic data: every arm's TR is computed from its
BCEs, the FM learns on its own rows, runs are deterministic, artifacts reload with weights_only.

Whether the FM beats the VM and how TR orders across coverages are statistics of training runs
whose last bits differ between processors: ``bench/transfer_orderings.py`` reports them.
"""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solaris.cli import main
from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.eval import metrics as M
from solaris.eval.transfer import TransferExperiment, run_transfer
from solaris.models.fm import FoundationModel
from solaris.train.artifacts import fm_warnings, train_artifacts, train_steps
from solaris.train.checkpoint import load_checkpoint
from solaris.errors import CheckpointError
from solaris.train.loop import seed_everything
from solaris.train.teacher import train_fm
from tests.tiny import THREADS

TINY = {
    "data.synthetic.num_users": 400, "data.synthetic.num_items": 300,
    "data.synthetic.days": 12.0, "data.synthetic.target_interactions": 16000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 5,
    "train.fm_epochs": 4, "train.vm_epochs": 6, "train.threads": THREADS,
    "report.seeds": 1, "report.coverages": [1.0, 0.2], "report.vm_lrs": [1e-2],
    "report.kd_alphas": [0.5], "report.bootstrap": 200,
}
@pytest.fixture(scope="module")
def cfg():
    return load_config(None, TINY)


@pytest.fixture(scope="module")
def ds(cfg):
    return load_dataset(cfg.data)


@pytest.fixture(scope="module")
def stages() -> list:
    return []


@pytest.fixture(scope="module")
def report(cfg, ds, stages):
    return run_transfer(cfg, ds, progress=stages.append)


ARMS = ("kd", "agg", "pair_100", "pair_20", "control_100", "pair_sim", "pair_sim_fresh",
        "fm_on_sim", "served_pair", "served_user_neighbour", "served_item_neighbour",
        "served_aggregate")


def model_of(arm: str) -> str:
    """The BCE table's name of a TR arm (``fm_on_sim`` is not a VM)."""
    return arm if arm.startswith("fm_") else f"vm_{arm}"


def test_transfer_report_computes_tr_for_every_arm_from_its_bces(report):
    """TR is the DESIGN.md formula over the seed-mean BCEs, for every arm; gated to NaN
    (null) exactly when the FM-VM gap is not significant, whatever the floats came out as."""
    for block, bce, sig in (("tr", "bce", report["gap_significant"]),
                            ("tr_cal", "bce_cal", report["gap_cal"]["significant"])):
        b = report[bce]
        assert set(report[block]) == set(ARMS)
        for arm in ARMS:
            want = M.transfer_ratio(b["vm"], b[model_of(arm)], b["fm"])
            got = report[block][arm]
            if sig and not math.isnan(want):
                assert got == want, (block, arm)
            else:
                assert math.isnan(got), (block, arm)
    for arm in ARMS:
        want = M.transfer_ratio(report["bce"]["vm"], report["bce"][model_of(arm)],
                                report["bce"]["fm"])
        assert report["tr_ungated"][arm] == want or (math.isnan(want) and
                                                     math.isnan(report["tr_ungated"][arm]))
    assert len(report["tr_per_seed"]) == report["seeds"]
    assert set(report["tr_per_seed"][0]) == set(ARMS)


def test_schedule_block_splits_gains_between_covered_and_uncovered_rows(report):
    """Where the FM's and the pair correction's gains fall: per-row means on the rows the
    schedule covers and on the rest, averaged over seeds; the FM-on-covered-rows arm's TR
    is bounded by construction between 0-gain rows and the FM itself."""
    g = report["schedule"]["gain_per_row"]
    assert set(g) == {"fm", "pair_100", "pair_sim"}
    for arm in g.values():
        assert set(arm) == {"covered", "uncovered"}
        assert all(v is None or math.isfinite(v) for v in arm.values())
    b = report["bce"]
    c = report["schedule"]["c_sim"]
    # fm_on_sim is the FM on a c share of rows and the VM alone elsewhere: its BCE gain over
    # the VM alone is c x the FM's mean gain on the covered rows
    want = c * g["fm"]["covered"] if g["fm"]["covered"] is not None else 0.0
    assert b["vm"] - b["fm_on_sim"] == pytest.approx(want, abs=1e-9)


def test_tier_worth_steps_add_up_to_the_full_served_arm(report):
    """tier_worth: one cumulative step per served input in lookup order; the steps sum to the
    TR of the arm with every input on, each step with its paired interval around it, and an
    input served at scale 0 in every seed adds exactly nothing."""
    tw = report["tier_worth"]
    assert list(tw) == ["pair", "user_neighbour", "item_neighbour", "aggregate"]
    b = report["bce"]
    total = M.transfer_ratio(b["vm"], b["vm_served_aggregate"], b["fm"])
    if not math.isnan(total):
        assert sum(v["step"] for v in tw.values()) == pytest.approx(total, abs=1e-9)
    gap = b["vm"] - b["fm"]
    for name, v in tw.items():
        assert math.isnan(v["step"]) == (gap <= 0), name  # a share of a gap that exists
        assert v["ci_low"] <= v["ci_high"] or v["finite_share"] == 0, name
        assert len(v["scale_per_seed"]) == report["seeds"]
        assert 0.0 <= v["rows_share"] <= 1.0
        if all(s == 0.0 for s in v["scale_per_seed"]) and gap > 0:
            assert v["step"] == 0.0, name
    served = report["served"]
    assert served["own_pair_agrees_with_key_simulation"] == [1.0]
    assert sum(served["tier_share"].values()) == pytest.approx(1.0)


def test_pair_correction_as_served_is_chosen_on_served_validation(report):
    """Two pair corrections per seed, one trained on fresh z and one on z as the cache serves
    it (ages drawn from the validation period's schedule simulation); the one served is the
    lower on validation served the same way."""
    (info,) = report["pair_as_served"]
    assert info["chosen"] in ("served", "fresh")
    lo = min(info["val_bce_served_trained"], info["val_bce_fresh_trained"])
    want = "served" if info["val_bce_served_trained"] == lo else "fresh"
    if info["val_bce_served_trained"] != info["val_bce_fresh_trained"]:
        assert info["chosen"] == want
    assert info["ages_drawn_from"] > 0 and info["age_s_median"] >= 0


def test_present_rows_and_calibration_slopes_per_arm(report):
    """Per arm with a presence mask: BCE on its present rows beside the VM alone's and the
    FM's there (the pair at 100% is present everywhere: its present-row BCE is its BCE), and
    Platt slopes on present and on missing rows (none where a side has too few rows)."""
    pr = report["present_rows"]
    assert pr["pair_100"]["rows"] == report["test_rows"]
    assert pr["pair_100"]["bce"] == pytest.approx(report["bce"]["vm_pair_100"], abs=1e-12)
    assert pr["pair_100"]["bce_vm"] == pytest.approx(report["bce"]["vm"], abs=1e-12)
    sl = report["calibration_slope"]
    assert sl["pair_100"]["missing"] is None  # no missing rows at 100%
    assert sl["pair_100"]["present"] is not None and math.isfinite(sl["pair_100"]["present"])
    # missing rows of a residual arm are the VM alone's: the same slope as the VM's there
    assert set(sl) >= {"pair_20", "pair_sim", "agg"}


def test_fm_trains_below_its_initial_loss_on_its_own_rows(cfg, ds):
    """Training lowers the FM's loss on the rows it trained on. Measured on the TINY world
    (threads 1 and 2): 0.693 at initialisation, 0.367 after four epochs; the test asks only for
    a lower loss, which any working optimiser gives on the rows it fits."""
    exp = TransferExperiment(cfg, ds)
    rows = exp.periods.fm
    train_rows = rows[:int(len(rows) * 0.9)]  # train_fm keeps the last 10% as its holdout
    y = torch.from_numpy(exp.tables.labels[train_rows])

    def loss(model) -> float:
        model.eval()
        with torch.no_grad():
            return float(F.binary_cross_entropy_with_logits(
                model(exp.tables.batch(train_rows)), y))

    seed_everything(0)  # the very initialisation train_fm starts from
    init = FoundationModel(cfg.fm, exp.tables.spec, exp.tables.num_users, exp.tables.num_items,
                           exp.tables.tasks, exp.tables.history_len)
    fm, res = train_fm(exp.tables, rows, cfg.fm, cfg.train, seed=0)
    assert res.best_epoch >= 1 and np.isfinite(res.best_val_loss)
    before, after = loss(init), loss(fm)
    assert after < before, (before, after)


def test_report_is_complete(cfg, ds, report, stages):
    from solaris.eval.transfer import transfer_steps

    assert len(stages) == transfer_steps(cfg, ds)  # the progress bar's total is its length
    assert report["teacher_protocol"] == "temporal"
    assert set(report["tasks"]) == {"conversion"}
    for key in ("fm", "vm", "vm_kd", "vm_agg", "vm_pair_100", "vm_pair_20", "vm_control_100"):
        assert key in report["bce_cal"] and 0.0 < report["auc"][key] <= 1.0


def test_artifacts_reload_with_weights_only(cfg, ds, tmp_path):
    stages: list[str] = []
    manifest = train_artifacts(cfg, ds, tmp_path, seed=0, coverage=0.5, progress=stages.append)
    assert set(manifest["vms"]) == {"click", "conversion"}
    assert len(stages) == train_steps(ds) == 13  # the CLI's bar total is the stages reported
    for v in manifest["vms"].values():  # the VM alone's BCE on the test period, beside the FM's
        assert 0.0 < v["vm_alone_test_bce"] < 1.0 and 0.0 < v["fm_test_bce"] < 1.0
    ckpt = load_checkpoint(tmp_path / "fm.pt", "fm")
    assert ckpt["meta"]["version"] == manifest["version"]
    fm_cfg = load_config(None, {f"fm.{k}": v for k, v in ckpt["config"].items()}).fm
    fm = FoundationModel(fm_cfg, ds.spec, ckpt["meta"]["num_users"], ckpt["meta"]["num_items"],
                         tuple(ckpt["meta"]["tasks"]), ckpt["meta"]["history_len"])
    fm.load_state_dict(ckpt["state_dict"])
    with pytest.raises(CheckpointError, match="expected 'vm'"):
        load_checkpoint(tmp_path / "fm.pt", "vm")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_checkpoint(tmp_path / "bad.pt", "fm")


def test_an_fm_no_better_than_the_vm_alone_is_a_plain_warning():
    vms = {"click": {"fm_test_bce": 0.41, "vm_alone_test_bce": 0.43},
           "cart": {"fm_test_bce": 0.2051, "vm_alone_test_bce": 0.2050},
           "old": {"fm_test_bce": 0.5}}  # a manifest written without the VM alone's figure
    (line,) = fm_warnings({"vms": vms})
    assert line.startswith("warning: cart: the FM's test BCE 0.2051 is not below the VM "
                           "alone's 0.2050")
    assert "nothing to transfer" in line and "serve.mode=vm" in line


def test_cli_report_writes_json_table_and_plot(tmp_path, capsys, report):
    """``solaris report transfer`` with the module's settings: its figures are the
    in-process run's (the report is deterministic), written as JSON, a table and a plot."""
    args = ["report", "transfer", "--dataset", "synthetic", "--out", str(tmp_path)]
    for k, v in TINY.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vm_pair_100" in out and "FM vs VM BCE gap" in out
    rep = json.loads((tmp_path / "transfer.json").read_text())
    assert rep["bce"] == json.loads(json.dumps(report["bce"]))  # computed again: the same
    for key in ("bce", "auc", "bce_cal", "tr", "tr_cal", "tr_std", "gap_significant", "warm",
                "cold", "tasks", "teacher_protocol", "periods", "seeds", "seconds"):
        assert key in rep
    png = (tmp_path / "transfer_coverage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["report", "transfer", "--dataset", "movielens", "--data-dir",
                 str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "nowhere" in capsys.readouterr().err
