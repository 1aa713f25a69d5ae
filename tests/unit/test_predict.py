"""The prediction of a replay window's figures from the past alone (``solaris.replay.predict``):
it reads nothing of the window (deleted or scrambled, the figures are the same to the bit),
it serves as the router would (tiers at scale 0 not looked up), and ``solaris estimate``
writes them with the online figures beside."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pytest

from solaris.cli import main
from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.data.schema import TS
from solaris.errors import ConfigError, DataError
from solaris.replay.predict import before, compare, predict, window_start
from tests.tiny import TINY


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from solaris.train.artifacts import train_artifacts

    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    art = tmp_path_factory.mktemp("predict") / "artifacts"
    train_artifacts(cfg, ds, art, seed=0)
    manifest = json.loads((art / "manifest.json").read_text())
    return cfg, ds, art, manifest


@pytest.fixture(scope="module")
def full(world):
    _, ds, art, _ = world
    return predict(art, ds, resamples=50)


def scrambled(ds, start: int):
    """``ds`` with every label of the window flipped and the window's requests' labels too."""
    inter = ds.interactions
    win = inter.column(TS).to_numpy() >= start
    cols = {}
    for name in inter.column_names:
        col = inter.column(name).to_numpy()
        if name in ds.tasks:
            col = np.where(win, 1.0 - col, col).astype(np.float32)
        cols[name] = col
    inter = pa.table(cols, schema=inter.schema)
    req = ds.requests
    if req is not None:
        keep = req.column(TS).to_numpy() < start
        req = req.filter(pa.array(keep))  # the window's requests gone altogether
    return dataclasses.replace(ds, interactions=inter, requests=req)


def test_the_window_is_never_read(world, full) -> None:
    _, ds, art, manifest = world
    start = window_start(manifest)
    assert start == manifest["cuts"][2]
    past = before(ds, start)
    assert past.interactions.column(TS).to_numpy().max() < start
    assert past.requests.column(TS).to_numpy().max() < start
    assert past.interactions.num_rows < ds.interactions.num_rows
    deleted = predict(art, past, resamples=50)
    assert json.dumps(deleted, sort_keys=True) == json.dumps(full, sort_keys=True)
    other = predict(art, scrambled(ds, start), resamples=50)
    assert json.dumps(other, sort_keys=True) == json.dumps(full, sort_keys=True)


def test_the_prediction_is_the_validation_period_served(world, full) -> None:
    _, ds, _, manifest = world
    src = full["from"]
    assert src["ts_min"] == manifest["cuts"][1] and src["ts_end"] == manifest["cuts"][2]
    assert src["rows"] > 0 and src["rows"] <= src["rows_in_period"]
    assert src["rows_in_period"] == manifest["periods"]["val"]["rows"]
    # the store's own pairs are the key-level schedule's, and so its pair coverage
    assert src["own_pair_agrees_with_key_simulation"] == 1.0
    cov = full["coverage_predicted"]
    assert cov["pair"] == pytest.approx(src["pair_simulated_keys"])
    assert 0.0 <= cov["pair"] <= cov["user_neighbour"] <= cov["item_neighbour"] \
        <= cov["effective"] <= 1.0
    # the manifest (read by GET /stats) carries the logit map where a tier is served: none
    # here (residual.present_affine is off by default)
    assert manifest["vms"][manifest["tasks"][0]]["present_affine"] == {}
    # a tier at scale 0 in the served VM is not looked up, as the router does
    scales = manifest["vms"][manifest["tasks"][0]]["scales"]
    if scales["pair"]["item_neighbour"] == 0.0:
        assert cov["item_neighbour"] == cov["user_neighbour"]
    if scales["aggregate"] == 0.0:
        assert cov["aggregate"] == 0.0
    assert full["fm_evals_predicted"] > 0
    assert full["fm_evals_per_1k_requests_predicted"] == pytest.approx(
        1000.0 * full["fm_evals_predicted"] / src["requests"])
    for key in ("tr_predicted", "tr_predicted_raw", "tr_predicted_base_calibrated",
                "tr_predicted_crossfit"):
        v = full[key]
        assert v is None or isinstance(v, float)
    g = full["gain_per_row"]
    assert set(g) == {"fm", "served"} and set(g["fm"]) == {"present", "missing"}
    # rows without a SOLARIS input are scored as the VM alone: no gain there
    assert g["served"]["missing"] is None or abs(g["served"]["missing"]) < 1e-6
    # the calibrated figure as the replay measures it, and both halves measured beside it
    for key in ("tr_predicted", "tr_predicted_crossfit"):
        ci = full[f"{key}_ci"]
        if ci is not None and math.isfinite(full[key]):
            assert ci[0] <= ci[1] and full[f"{key}_sd"] >= 0.0
    lo, hi = full["tr_predicted_raw_ci"]
    if math.isfinite(full["tr_predicted_raw"]):
        assert lo <= full["tr_predicted_raw"] <= hi


def test_bad_inputs_name_the_value(world) -> None:
    _, ds, art, manifest = world
    with pytest.raises(DataError, match="inside the replay window"):
        predict(art, ds, start_ts=manifest["cuts"][1])
    with pytest.raises(ConfigError, match="task='nope'"):
        predict(art, ds, task="nope")
    small = dataclasses.replace(ds, users=ds.users.slice(0, ds.num_users - 1))
    with pytest.raises(DataError, match="artifacts were trained on"):
        predict(art, small)
    with pytest.raises(DataError, match="no interactions before"):
        before(ds, int(ds.interactions.column(TS).to_numpy().min()))


def test_compare_applies_the_bars() -> None:
    pred = {"tr_predicted": 0.10, "tr_predicted_raw": 0.02,
            "coverage_predicted": {"pair": 0.10, "effective": 0.30},
            "fm_evals_per_1k_requests_predicted": 1200.0}
    rep = {"tr_online": 0.05, "tr_online_raw": 0.04,
           "coverage": {"pair": 0.12, "effective": 0.20}, "fm_evals_per_1k_requests": 1000.0}
    c = compare(pred, rep)
    assert c["tr"]["error"] == pytest.approx(0.05) and c["tr"]["tolerance"] == 0.03
    assert not c["tr"]["within"]
    assert c["tr_raw"]["within"]  # |0.02 - 0.04| <= 0.03
    assert c["coverage_pair"]["within"] and not c["coverage_effective"]["within"]
    assert c["fm_evals_per_1k_requests"]["ratio"] == pytest.approx(1.2)
    big = compare({**pred, "tr_predicted": 0.64}, {**rep, "tr_online": 0.5})
    assert big["tr"]["tolerance"] == pytest.approx(0.15) and big["tr"]["within"]
    # each side's sampling noise rides along where it was measured, and only there
    assert c["tr"]["online_sd"] is None and c["tr"]["predicted_sd"] is None
    noisy = compare({**pred, "tr_predicted_sd": 0.02}, {**rep, "tr_online_sd": 0.025})
    assert noisy["tr"]["predicted_sd"] == 0.02 and noisy["tr"]["online_sd"] == 0.025
    assert noisy["tr"]["within"] == c["tr"]["within"]  # the bar itself is unchanged
    # 0.05 of error against sqrt(0.02^2 + 0.025^2) of noise
    assert noisy["tr"]["error_sd"] == pytest.approx(0.032016, abs=1e-6)
    assert noisy["tr"]["error_z"] == pytest.approx(0.05 / 0.032016, rel=1e-4)
    assert "error_z" not in c["tr"]
    shared = compare(pred, {**rep, "tr_online_within_bar_share": 0.4})
    assert shared["tr"]["online_within_bar_share"] == 0.4


def test_estimate_command_writes_json_and_plot(world, full, tmp_path, capsys) -> None:
    _, _, art, _ = world
    rep = {"tr_online": 0.0, "tr_online_raw": 0.0, "tr_online_base_calibrated": 0.0,
           "coverage": {k: 0.0 for k in ("pair", "user_neighbour", "item_neighbour",
                                         "aggregate", "effective")},
           "fm_evals_per_1k_requests": 100.0, "window_start": 0}
    (tmp_path / "replay.json").write_text(json.dumps(rep))
    out = tmp_path / "est"
    argv = ["estimate", "--set", "data.synthetic.num_users=300"]
    argv += [f"--set={k}={json.dumps(v)}" for k, v in TINY.items()
             if k.startswith("data.")]
    argv += ["--artifacts", str(art), "--out", str(out), "--replay", str(tmp_path)]
    assert main(argv) == 0
    got = json.loads((out / "estimate.json").read_text())
    assert got["prediction"]["coverage_predicted"] == full["coverage_predicted"]
    assert got["check"]["coverage_pair"]["online"] == 0.0
    assert (out / "estimate.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "TR (calibrated)" in printed and "estimate.json" in printed
    assert main(["estimate", "--artifacts", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_backtest_serves_the_validation_period_with_models_trained_before_it(
        world, full, tmp_path) -> None:
    _, ds, art, manifest = world
    bt = predict(art, before(ds, manifest["cuts"][2]), backtest=tmp_path / "bt", resamples=20)
    assert bt["method"] == "backtest" and full["method"] == "shipped"
    shifted = json.loads((tmp_path / "bt" / "manifest.json").read_text())
    assert shifted["cuts"][2] == manifest["cuts"][1]  # its test period: the validation period
    assert shifted["periods"]["val"]["ts_max"] < manifest["cuts"][1]
    assert bt["from"] == {**full["from"], "pair_simulated_keys": bt["from"]["pair_simulated_keys"]}
    # the directory is reused, and refused when it holds other artifacts
    again = predict(art, ds, backtest=tmp_path / "bt", resamples=20)
    assert json.dumps(again, sort_keys=True) == json.dumps(bt, sort_keys=True)
    with pytest.raises(ConfigError, match="holds other backtest artifacts"):
        predict(art, ds, backtest=art.parent / "artifacts", resamples=20)


def test_the_table_says_why_a_tr_is_missing() -> None:
    from solaris.replay.predict import prediction_table, tr_missing_reason

    pred = {"from": {"requests": 10, "rows": 50}, "window_start": 0,
            "tr_predicted": float("nan"), "tr_predicted_raw": 0.25,
            "tr_predicted_base_calibrated": float("nan"),
            "coverage_predicted": {"pair": 0.1, "effective": 0.3},
            "fm_evals_per_1k_requests_predicted": 500.0,
            "bce": {"raw": {"vm": 0.50, "x": 0.49, "fm": 0.46},
                    "calibrated_second_half": {"vm": 0.44, "x": 0.44, "fm": 0.45}}}
    lines = prediction_table(pred).splitlines()
    (why,) = [x for x in lines if "is n/a" in x]  # the raw TR was measured: no line for it
    assert why.startswith("TR (calibrated) is n/a: the FM's BCE 0.4500 is not below the VM "
                          "alone's 0.4400 on the period's second half")
    assert tr_missing_reason({"vm": 0.5, "fm": 0.4}, "here") is None
    assert "no labelled rows" in tr_missing_reason({"vm": float("nan"), "fm": 0.4}, "here")
