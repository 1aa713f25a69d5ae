"""The event-time replay through the live system (Serve over HTTP, cache shards, queue, FM
workers, KNN job) on a tiny world: what it serves does not depend on how many FM workers
share the queue, the live schedule agrees with the key-level simulation of the same rules,
and the report carries every figure the protocol defines."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


pytest.importorskip("ray")
pytest.importorskip("requests")

from tests.tiny import THREADS, TINY, free_port  # noqa: E402

REQUESTS = 60  # 7.6 h of the tiny window: the initial KNN build and one on the 6 h schedule
ROOT = Path(__file__).resolve().parents[2]


# a line Ray wrote, not SOLARIS: its Python loggers ("<date> WARNING file.py:N -- ..."), its
# C++ logs ("[<date> E pid tid] file.cc:N: ..."), worker and raylet lines forwarded to the
# driver, Python warnings ("file.py:N: RayDeprecationWarning: ...", any category) and
# tracebacks
RAY_LINE = re.compile(r"^\S+ \S+\s+(WARNING|ERROR|CRITICAL) \S+\.py:\d+ -- "
                      r"|^\[\d{4}-\d\d-\d\d [\d:,]+ [WEF] \d+ \d+\]"
                      r"|\((raylet|pid=\d+)|\.py:\d+: \w*Warning: |Traceback")


def _run(out: Path, workers: int, cfg, ds):
    from jobs.replay import ReplayOptions, replay

    opts = ReplayOptions(workers=workers, max_requests=REQUESTS, knn_every_h=6.0,
                         port=free_port(), progress=False, num_cpus=3)
    return replay(cfg, ds, out, opts, say=lambda m: None)


def _run_cli(out: Path, workers: int) -> tuple[dict, str]:
    """The same replay through ``solaris replay`` in its own process, its lookups answered
    by a round of cache-shard calls (the other run reads the router's replica, the
    default): (replay.json, the console it printed)."""
    sets = [a for k, v in {**TINY, "cache.dim": 16, "serve.cache_reads": "shards"}.items()
            for a in ("--set", f"{k}={json.dumps(v)}")]
    cmd = [sys.executable, "-m", "solaris.cli", "replay", "--dataset", "synthetic",
           "--out", str(out), "--workers", str(workers), "--max-requests", str(REQUESTS),
           "--knn-every-h", "6", "--port", str(free_port()), "--no-progress", *sets]
    # torch's thread count as in this process (tests/conftest.py), so the floats match
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console
    return json.loads((out / "replay.json").read_text()), console


@pytest.mark.slow
def test_replay_is_independent_of_worker_count_and_matches_its_schedule(tmp_path):
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.replay.report import summary_table

    cfg = load_config(None, {**TINY, "cache.dim": 16})
    ds = load_dataset(cfg.data)
    one = _run(tmp_path / "w1", 1, cfg, ds)
    (tmp_path / "w2").mkdir()
    shutil.copytree(tmp_path / "w1" / "artifacts", tmp_path / "w2" / "artifacts")
    two, console = _run_cli(tmp_path / "w2", 2)
    # the default console holds progress and results only: no line from Ray
    assert not [ln for ln in console.splitlines() if RAY_LINE.search(ln)], console
    assert "coverage" in console  # the summary table was printed
    # where the FM ran, as the workers said: the CPU, or which GPU
    assert two["fm_devices"] and all(d == "cpu" or (d.startswith("cuda:") and "(" in d)
                                     for d in two["fm_devices"]), two["fm_devices"]

    for rep in (one, two):
        assert rep["requests"] == REQUESTS
        assert rep["errors"] == 0
        assert rep["fm_evals"] > 0
        assert len(rep["knn_rebuilds"]) >= 2  # the initial build and at least one on schedule
        c = rep["coverage"]
        # cumulative tiers in the fixed order, the effective share covers them all
        assert c["pair"] <= c["user_neighbour"] <= c["item_neighbour"] <= c["effective"]
        assert c["aggregate"] <= c["effective"] <= 1.0
        assert c["pair"] <= rep["coverage_ceiling_no_lag"] + 1e-9
        # the oracle bounds: ordered, and above the pair ceiling (same user, within the TTL)
        b = rep["coverage_bounds"]
        eo = b["effective_oracle"]
        probed = eo[str(b["user_knn_probe"])]  # the probed neighbours (enrich.user_knn_probe)
        assert rep["coverage_ceiling"] <= b["own_history_share"] <= probed <= eo["100"] \
            <= eo["any_user"] <= 1.0
        assert 0.0 <= rep["speculation_signal"]["top_fraction_share"] <= 1.0
        # the re-scored VM reproduces what the VM replicas served
        assert rep["transfer"]["rescored_max_abs_diff"] < 1e-4
        for key in ("tr_online", "tr_online_by_tier", "tr_offline_pair_100", "consistency",
                    "coverage_pair_random", "speculation_precision", "tr_online_teacher_bound"):
            assert key in rep
        # the served VM with every slot off is the VM alone, bit for bit; rows served without
        # a SOLARIS input gain nothing over it (the served scores went through JSON)
        assert rep["all_slots_off"]["equal"]
        g = rep["gain_per_row"]
        assert g["served"]["missing"] is not None and abs(g["served"]["missing"]) < 1e-6
        assert (tmp_path / "w1" / "coverage_over_time.png").stat().st_size > 0
        # calibration slopes on present and missing rows, each with its bootstrap interval
        for v in rep["calibration_slope"].values():
            if v["slope"] is not None:
                assert v["ci_low"] < v["ci_high"]
                # the slope refitted on the window's second half: a number (its sign is a
                # statistic of this small window's one run, not a property of the design)
                half = v["base_calibrated_second_half"]["slope"]
                assert half is None or math.isfinite(half)
                # and the band a calibrated model's slope would fall in on the same rows
                band = v["if_calibrated"]
                assert band["ci_low"] < band["ci_high"] and 0.0 <= band["p_value"] <= 1.0
                assert band["consistent"] == (band["p_value"] >= 0.05)
        assert "calibration slope" in summary_table(rep)
        # each fallback input's worth where it is served, its rows' share beside it
        tw = rep["tier_worth"]
        assert set(tw) == {"user_neighbour", "item_neighbour", "aggregate"}
        assert sum(w["share"] for w in tw.values()) <= 1.0 + 1e-9
        assert "worth of a real pair" in summary_table(rep)
        # the calibrated TR's own noise over whole requests, and how often a like window
        # would land within the prediction bar of this one's figure
        if rep["tr_online_ci"] is not None:
            lo, hi = rep["tr_online_ci"]
            assert lo <= hi and rep["tr_online_sd"] >= 0.0
            assert 0.0 <= rep["tr_online_within_bar_share"] <= 1.0

    # one worker on the router's replica or two on the shard calls: the same pairs, served
    # with the same tiers and the same scores, and the same speculation counted on the shards
    a = np.load(tmp_path / "w1" / "served.npz")
    b = np.load(tmp_path / "w2" / "served.npz")
    assert np.array_equal(a["tiers"], b["tiers"])
    assert np.array_equal(a["agg"], b["agg"])
    assert np.array_equal(a["scores"], b["scores"])
    assert one["coverage"] == two["coverage"]
    assert one["fm_evals"] == two["fm_evals"]
    counted = [k for k in one["speculation"] if k.startswith("shard_")] + [
        "ended", "ended_read", "duplicates", "speculation_precision"]
    assert {k: one["speculation"][k] for k in counted} == \
        {k: two["speculation"][k] for k in counted}
    # the live queue followed the schedule the key-level simulation applies to the same scores
    sim = one["schedule_check"]
    assert sim["pair_simulated_with_served_scores"] == pytest.approx(one["coverage"]["pair"],
                                                                     abs=0.01)
    saved = json.loads((tmp_path / "w1" / "replay.json").read_text())
    assert saved["coverage"] == one["coverage"]
    # the prediction made before serving, from the data before the window only: the same
    # for both runs (same artifacts) and for the dataset with the window deleted
    from solaris.replay.predict import before, predict

    pred = one["prediction"]
    assert "error" not in pred and pred["window_start"] == one["window_start"]
    # exact: each replay's driver predicts before its first KNN build, on THREADS torch
    # threads in both (this process: tests/conftest.py; the CLI's: OMP_NUM_THREADS), and one
    # computation at one thread count gives the same bits every time
    assert json.dumps(pred, sort_keys=True) == json.dumps(two["prediction"], sort_keys=True)
    # the prediction above ran on THREADS, and the FM's outputs round by the count (a few
    # ulps in its BCE at 1 vs 2 threads): predict again on the same count
    import torch

    torch.set_num_threads(THREADS)
    again = predict(tmp_path / "w1" / "artifacts", before(ds, one["window_start"]), cfg=cfg)
    assert again["coverage_predicted"] == pred["coverage_predicted"]
    assert again["tr_predicted_raw"] == pred["tr_predicted_raw"] or \
        (again["tr_predicted_raw"] != again["tr_predicted_raw"]
         and pred["tr_predicted_raw"] != pred["tr_predicted_raw"])  # both NaN
    chk = one["prediction_check"]
    assert chk["coverage_pair"]["online"] == one["coverage"]["pair"]
    assert chk["coverage_pair"]["predicted"] == pred["coverage_predicted"]["pair"]
    assert (tmp_path / "w1" / "estimate.png").stat().st_size > 0


@pytest.mark.slow
def test_a_rollover_inside_the_replay_switches_versions_without_mixing(tmp_path):
    from jobs.replay import ReplayOptions, replay
    from solaris.config import load_config
    from solaris.data.load import load_dataset

    cfg = load_config(None, {**TINY, "cache.dim": 16})
    opts = ReplayOptions(max_requests=250, knn_every_h=0, port=free_port(), progress=False,
                         num_cpus=3, rollover_at=0.3,
                         extra={"serve.rollout_min_lookups": 300,
                                "serve.rollout_threshold": 0.5})
    rep = replay(cfg, load_dataset(cfg.data), tmp_path, opts, say=lambda m: None)
    roll = rep["rollover"]
    assert rep["errors"] == 0
    assert roll["new"] != roll["old"]
    assert roll["requests_served_by_new"] > 0  # the VM switched inside the window
    assert roll["mixed_version_requests"] == 0
    # the old version stops being precomputed: its own-pair coverage decays to nothing
    assert roll["old_coverage_last_tenth"] < roll["old_coverage_first_half"]
    assert (tmp_path / "rollover.png").stat().st_size > 0
