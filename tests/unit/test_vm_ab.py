"""bench/vm_ab.py: the baseline's tree is the commit's, and the summary's arithmetic."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.benches import load_bench
from tests.tiny import ROOT

vm_ab = load_bench("vm_ab")


def _run(arm: str, i: int, total: float, p50: float) -> dict:
    return {"arm": arm, "round": i, "vm_cpu_ms": {"router": total / 2, "total": total},
            "p50_ms_vm": p50}


def test_summary_takes_medians_per_arm_and_ratios_of_adjacent_runs() -> None:
    runs = [_run("baseline", 0, 10.0, 20.0), _run("current", 0, 11.0, 21.0),
            _run("current", 1, 9.0, 19.0), _run("baseline", 1, 12.0, 22.0),
            _run("baseline", 2, 14.0, 24.0), _run("current", 2, 13.0, 23.0)]
    s = vm_ab.summary(runs)
    assert s["vm_cpu_ms_per_round"] == {"baseline": [10.0, 12.0, 14.0],
                                        "current": [11.0, 9.0, 13.0]}
    assert s["vm_cpu_ms_median"] == {"baseline": 12.0, "current": 11.0}
    assert s["ratio_of_medians"] == pytest.approx(11.0 / 12.0)
    assert s["ratio_per_round"] == pytest.approx([1.1, 0.75, 13.0 / 14.0])
    assert s["p50_ms_vm_median"] == {"baseline": 22.0, "current": 21.0}


def test_vm_cpu_sums_the_roles_of_the_vm_alone() -> None:
    out = {"cpu_ms_per_request": {"vm_500": {"router": 3.0, "vm": 2.5, "proxy": 1.0},
                                  "solaris_500": {"router": 9.0}}}
    assert vm_ab.vm_cpu(out) == {"router": 3.0, "vm": 2.5, "proxy": 1.0, "total": 6.5}


def test_the_baseline_is_extracted_from_the_commit(tmp_path: Path) -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    sha = vm_ab.extract("HEAD", tmp_path)
    committed = subprocess.run(["git", "show", "HEAD:pyproject.toml"], cwd=ROOT, check=True,
                               capture_output=True).stdout
    assert len(sha) == 40
    assert (tmp_path / "pyproject.toml").read_bytes() == committed
    with pytest.raises(subprocess.CalledProcessError):
        vm_ab.extract("no-such-revision", tmp_path / "x")
