"""A tiny train + transfer report on small synthetic data: the FM beats the VM, the pair
embedding transfers, runs are deterministic, artifacts reload with weights_only."""

import json

import pytest

from solaris.cli import main
from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.eval.transfer import run_transfer
from solaris.models.fm import FoundationModel
from solaris.train.artifacts import train_artifacts
from solaris.train.checkpoint import load_checkpoint
from solaris.errors import CheckpointError

TINY = {
    "data.synthetic.num_users": 400, "data.synthetic.num_items": 300,
    "data.synthetic.days": 12.0, "data.synthetic.target_interactions": 16000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 5,
    "train.fm_epochs": 4, "train.vm_epochs": 6, "train.threads": 1,
    "report.seeds": 1, "report.coverages": [1.0, 0.2], "report.vm_lrs": [1e-2],
    "report.kd_alphas": [0.5], "report.bootstrap": 200,
}
# the default synthetic data with the small FM: big enough for the FM's edge to show
LEARNABLE = {**TINY, "data.synthetic.num_users": 1500, "data.synthetic.num_items": 800,
             "data.synthetic.days": 30.0, "data.synthetic.target_interactions": 60000}


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, TINY)


@pytest.fixture(scope="module")
def ds(cfg):
    return load_dataset(cfg.data)


@pytest.fixture(scope="module")
def report(cfg, ds):
    return run_transfer(cfg, ds)


def test_fm_beats_vm_and_pair_embedding_transfers():
    cfg = load_config(None, LEARNABLE)
    report = run_transfer(cfg, load_dataset(cfg.data))
    bce, auc = report["bce"], report["auc"]
    assert bce["fm"] < bce["vm"] and auc["fm"] > auc["vm"]
    assert bce["vm_pair_100"] < bce["vm"] and auc["vm_pair_100"] > auc["vm"]
    assert report["tr"]["pair_100"] > report["tr"]["pair_20"]


def test_report_is_deterministic_and_complete(cfg, ds, report):
    again = run_transfer(cfg, ds)
    assert again["bce"] == report["bce"]
    assert report["teacher_protocol"] == "temporal"
    assert set(report["tasks"]) == {"conversion"}
    for key in ("fm", "vm", "vm_kd", "vm_agg", "vm_pair_100", "vm_pair_20"):
        assert key in report["bce_cal"] and 0.0 < report["auc"][key] <= 1.0


def test_artifacts_reload_with_weights_only(cfg, ds, tmp_path):
    manifest = train_artifacts(cfg, ds, tmp_path, seed=0, coverage=0.5)
    assert set(manifest["vms"]) == {"click", "conversion"}
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


def test_cli_report_writes_json_table_and_plot(tmp_path, capsys):
    args = ["report", "transfer", "--dataset", "synthetic", "--out", str(tmp_path)]
    for k, v in TINY.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vm_pair_100" in out and "FM vs VM BCE gap" in out
    rep = json.loads((tmp_path / "transfer.json").read_text())
    for key in ("bce", "auc", "bce_cal", "tr", "tr_cal", "tr_std", "gap_significant", "warm",
                "cold", "tasks", "teacher_protocol", "periods", "seeds", "seconds"):
        assert key in rep
    png = (tmp_path / "transfer_coverage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["report", "transfer", "--dataset", "movielens", "--data-dir",
                 str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "nowhere" in capsys.readouterr().err
