"""The installed ``solaris`` console script, run as users run it: real processes, real Parquet."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import THREADS

SOLARIS = shutil.which("solaris") or ""
SMALL = ["--set", "data.synthetic.num_users=300", "--set", "data.synthetic.num_items=200",
         "--set", "data.synthetic.days=8", "--set", "fm.emb_dim=16", "--set", "fm.shared_dim=64",
         "--set", "features.history_len=8", "--set", "train.fm_epochs=2",
         "--set", "train.vm_epochs=2", "--set", "encoder.epochs=2", "--set", f"train.threads={THREADS}",
         "--set", "report.vm_lrs=[0.01]", "--set", "report.kd_alphas=[0.5]",
         "--set", "report.coverages=[1.0,0.5]", "--set", "report.bootstrap=100"]


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [SOLARIS, *args] if SOLARIS else [sys.executable, "-m", "solaris.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_generate_parquet_then_report_from_it(tmp_path: Path):
    data = tmp_path / "data"
    r = run("data", "--out", str(data), "--interactions", "6000", *SMALL)
    assert r.returncode == 0, r.stderr
    for name in ("interactions", "requests", "users", "items"):
        assert (data / f"{name}.parquet").stat().st_size > 0
    meta = json.loads((data / "meta.json").read_text())
    assert meta["tasks"] == ["click", "conversion"]

    out = tmp_path / "report"
    r = run("report", "transfer", "--dataset", "synthetic", "--data-dir", str(data),
            "--seeds", "1", "--out", str(out), *SMALL)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "transfer.json").read_text())
    assert rep["dataset"] == "synthetic" and rep["seeds"] == 1
    assert rep["periods"]["fm"]["ts_max"] < rep["periods"]["vm"]["ts_min"]
    assert "vm_pair_100" in r.stdout


def test_corrupt_parquet_is_a_clear_error_not_a_traceback(tmp_path: Path):
    data = tmp_path / "data"
    assert run("data", "--out", str(data), "--interactions", "3000", *SMALL).returncode == 0
    (data / "interactions.parquet").write_bytes(b"PAR1 this is not parquet")
    r = run("report", "transfer", "--dataset", "synthetic", "--data-dir", str(data),
            "--out", str(tmp_path / "o"), *SMALL)
    assert r.returncode == 2
    assert "interactions.parquet" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad, field", [("fm.emb_dim=-3", "fm.emb_dim=-3"),
                                        ("nosuch.field=1", "nosuch")])
def test_bad_config_names_the_field(tmp_path: Path, bad: str, field: str):
    r = run("report", "transfer", "--dataset", "synthetic", "--out", str(tmp_path), "--set", bad)
    assert r.returncode == 2 and field in r.stderr


@pytest.mark.parametrize("how", ["console script", "python -m solaris.cli"])
def test_both_ways_in_list_the_registered_commands(how: str):
    """``solaris`` and ``python -m solaris.cli`` (which the replay's tests and the guides'
    workers run) find the commands registered by entry points, the research ones included."""
    if how == "console script" and not SOLARIS:
        pytest.skip("no solaris console script on PATH (install the package: pip install -e .)")
    cmd = [SOLARIS] if how == "console script" else [sys.executable, "-m", "solaris.cli"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("train", "demo", "replay", "simulate", "estimate"):
        assert command in out.stdout
