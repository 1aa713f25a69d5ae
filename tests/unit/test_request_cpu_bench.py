"""bench/request_cpu.py's FM-worker section: both arms measured on every group size, with
the ratios of their medians."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import request_cpu  # noqa: E402

from tests.tiny import train_tiny  # noqa: E402


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
