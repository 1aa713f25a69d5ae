"""bench/policy_bounds.py: the policies and the bounds on a closed loop's shadow-arm log, with
coverage split into ranked and exploration slots, checked on a small run directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.benches import load_bench

bench = load_bench("policy_bounds")


def _run(path: Path, seed: int = 0) -> Path:
    """200 requests of 10 users over 10 hours, 12 candidates from 30 items, 3 ranked slots
    (the VM's top 3) and one exploration slot below them."""
    rng = np.random.default_rng(seed)
    r, c, k = 200, 12, 3
    ts = np.sort(rng.integers(0, 36000, r))
    user = rng.integers(0, 10, r)
    cand = np.stack([rng.permutation(30)[:c] for _ in range(r)]).astype(np.int64)
    base = rng.random((r, c))
    order = np.argsort(-base, axis=1)
    pos = np.column_stack([order[:, :k], order[np.arange(r), rng.integers(k, c, r)]])
    prop = np.column_stack([np.ones((r, k)), np.full(r, 1.0 / (c - k))])
    path.mkdir(parents=True)
    (path / "closed_loop.json").write_text(json.dumps({
        "options": {"seed": seed}, "read_ttl_s": 7200.0, "lag_s": 300.0, "tick_s": 60.0,
        "budget_per_hour": 0.0, "horizon_s": 0.0}))
    np.savez(path / "arms.npz", user=user, ts=ts, candidates=cand, base=base, **{
        "vm/pos": pos, "vm/propensity": prop})
    return path


def test_every_policy_and_bound_is_judged_on_all_and_on_ranked_slots(tmp_path) -> None:
    from solaris.simulate.coverage import simulate_pair_coverage

    run = _run(tmp_path / "run")
    row = bench.per_run(run, 0.2)
    assert row["run"] == str(run)  # the run's folder, as given
    assert set(row["curves"]) == {"verifier", "learned", "allocated", "returns", "hindsight",
                                  "oracle"}
    assert row["shown_items"] == 200 * 4 and row["explore_items"] == 200
    rep = json.loads((run / "closed_loop.json").read_text())
    closed, base, kw, _, _ = bench.shadow_inputs(run, rep)
    direct = simulate_pair_coverage(closed, base, fraction=0.2, **kw)
    ver = next(p for p in row["curves"]["verifier"] if p["fraction"] == 0.2)
    assert ver["pair"] == direct["pair"] and ver["fm_evals"] == direct["fm_evals"]
    # all shown = ranked slots and the exploration slot, weighted by their counts
    for pts in row["curves"].values():
        for p in pts:
            assert p["pair"] == pytest.approx((600 * p["ranked"] + 200 * p["explore"]) / 800)
    orc = row["curves"]["oracle"][0]
    gap = (orc["pair"] - ver["pair"]) * 800
    assert gap > 0
    assert row["explore_share_of_gap"] == pytest.approx(
        (orc["explore"] - ver["explore"]) * 200 / gap)
    for slots in ("all_shown", "ranked"):
        assert set(row[slots]) >= {"learned", "allocated", "returns", "hindsight"}


def test_the_bench_writes_its_json_and_names_an_unfinished_run(tmp_path, capsys) -> None:
    run = _run(tmp_path / "run")
    out = tmp_path / "b.json"
    assert bench.main([str(run), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["runs"][0]["seed"] == 0 and "gap_closed" in got["runs"][0]["ranked"]["hindsight"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no closed_loop.json"):
        bench.main([str(tmp_path / "empty"), "--json", str(out)])
