"""bench/request_cpu.py's FM-worker section: both arms measured on every group size, with
the ratios of their medians."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.benches import load_bench
from tests.tiny import train_tiny

request_cpu = load_bench("request_cpu")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("art"))


def test_fm_blocks_reports_both_arms_at_every_group_size(artifacts) -> None:
    import torch

    before = torch.get_num_threads()
    out = request_cpu.fm_blocks(str(artifacts), trials=3, pairs=60, sizes=(4, 30))
    assert torch.get_num_threads() == before  # measured on one thread, the caller's back
    med = out["cpu_ms_per_1k_pairs_median"]
    assert set(med) == {"blocks_c4", "blocks_c30", "one_call_c4", "one_call_c30"}
    assert all(np.isfinite(v) and v > 0 for v in med.values())
    assert all(len(v) == 3 for v in out["per_trial"].values())
    for c in (4, 30):
        assert out["ratio_blocks_to_one_call"][f"c{c}"] == pytest.approx(
            med[f"blocks_c{c}"] / med[f"one_call_c{c}"])
    assert out["block_requests"] > 0 and out["block_pairs"] > 0


def test_baseline_ab_runs_each_tree_in_its_own_process(monkeypatch) -> None:
    seen = []

    def fake_stages_in(root: Path, shards: int, requests: int, holders=None) -> dict:
        seen.append(root)
        assert holders == 30
        assert root.is_dir() and (root / "solaris" / "wire.py").is_file()
        ms = 2.0 if root != request_cpu.ROOT else 1.0  # the baseline costs twice as much
        return {"ms_per_request_median": {k: ms for k in request_cpu.STAGES}}

    monkeypatch.setattr(request_cpu, "_stages_in", fake_stages_in)
    out = request_cpu.baseline_ab("HEAD", shards=2, rounds=3, requests=10, holders=30)
    assert len(out["baseline"]) == 40  # the full commit id
    assert [r == request_cpu.ROOT for r in seen] == [False, True, True, False, False, True]
    assert out["ratio_current_to_baseline"] == 0.5
    assert out["total_ms"]["baseline"] == 2.0 * len(request_cpu.STAGES)


def test_stages_in_a_fresh_process_imports_that_trees_code(tmp_path) -> None:
    out = request_cpu._stages_in(request_cpu.ROOT, 2, 3)  # this tree, end to end, tiny
    assert set(out["ms_per_request_median"]) == set(request_cpu.STAGES)
    assert out["solaris_dir"] == str((request_cpu.ROOT / "solaris").resolve())
    # another tree's package, under this file's workload (what --baseline measures)
    load_bench("vm_ab").extract("HEAD", tmp_path)
    other = request_cpu._stages_in(tmp_path, 2, 3, holders=40)
    assert other["solaris_dir"] == str((tmp_path / "solaris").resolve())
    assert other["holders"] == 40
    assert all(v >= 0 for v in out["ms_per_request_median"].values())


def test_stages_with_few_holders_probe_their_pairs_only() -> None:
    out = request_cpu.stages(2, requests=3, holders=30)  # in this process, tiny
    assert out["holders"] == 30
    assert set(out["ms_per_request_median"]) == set(request_cpu.STAGES)
    with pytest.raises(ValueError, match="holders=0"):
        request_cpu.stages(2, requests=3, holders=0)
