"""bench/closed_loop.py --against: each arm's paired difference in clicks per request between
two sets of runs of the same seeds, checked on small run directories written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.benches import load_bench

bench = load_bench("closed_loop")


def _run(path: Path, seed: int, clicks: dict[str, np.ndarray], fm_evals: int,
         rid: np.ndarray | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "closed_loop.json").write_text(json.dumps({"options": {"seed": seed},
                                                       "fm_evals": fm_evals}))
    n = len(next(iter(clicks.values())))
    arrays = {f"{a}/p_true": c[:, None] * np.array([[0.25, 0.75]]) for a, c in clicks.items()}
    np.savez(path / "arms.npz", request_id=np.arange(n) if rid is None else rid, **arrays)
    return path


def test_the_difference_is_paired_by_request_and_signed_new_minus_old(tmp_path) -> None:
    rng = np.random.default_rng(0)
    vm = rng.random(400)
    # SOLARIS's clicks vary across requests far more than the 0.02 the new runs add to each
    # request: a paired difference finds exactly 0.02, an unpaired one could not
    sol = vm + rng.normal(0.0, 0.5, 400) ** 2
    old = [_run(tmp_path / f"old{s}", s, {"vm": vm, "solaris": sol}, 100) for s in range(2)]
    new = [_run(tmp_path / f"new{s}", s, {"vm": vm, "solaris": sol + 0.02}, 110)
           for s in range(2)]
    reps, clicks, rids = zip(*(bench.load(r) for r in new))
    ag = bench.against(new, reps, clicks, rids, old, resamples=300)
    d = ag["difference"]
    assert d["vm"]["pooled"]["point"] == 0 and d["vm"]["pooled"]["ci"] == [0, 0]
    assert d["solaris"]["pooled"]["point"] == pytest.approx(0.02)
    lo, hi = d["solaris"]["pooled"]["ci"]
    assert lo == pytest.approx(0.02) and hi == pytest.approx(0.02)  # the same gain everywhere
    assert [x["point"] for x in d["solaris"]["per_run"]] == pytest.approx([0.02, 0.02])
    assert ag["fm_evals"] == [{"run": 110, "against": 100}] * 2
    # the other way round, the sign turns
    reps_o, clicks_o, rids_o = zip(*(bench.load(r) for r in old))
    back = bench.against(old, reps_o, clicks_o, rids_o, new, resamples=300)
    assert back["difference"]["solaris"]["pooled"]["point"] == pytest.approx(-0.02)


def test_runs_of_other_seeds_or_requests_are_refused(tmp_path) -> None:
    c = {"vm": np.ones(10), "solaris": np.ones(10)}
    a = _run(tmp_path / "a", 0, c, 5)
    b = _run(tmp_path / "b", 1, c, 5)
    other_rid = _run(tmp_path / "c", 0, c, 5, rid=np.arange(10) + 1)
    with pytest.raises(SystemExit, match="not the same seed and requests"):
        bench.against([a], *zip(bench.load(a)), [b], resamples=10)
    with pytest.raises(SystemExit, match="not the same seed and requests"):
        bench.against([a], *zip(bench.load(a)), [other_rid], resamples=10)
    with pytest.raises(SystemExit, match="one each"):
        bench.against([a], *zip(bench.load(a)), [a, a], resamples=10)
