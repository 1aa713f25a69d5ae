"""A second FM of another architecture (examples/causal_fm.py: a causal transformer over the
behaviour sequence), plugged in by import path through the config alone, through every step:
training, the transfer report beside the built-in FM on the same seeds, the FM workers, the
KNN job and the replay's live serving (Ray Serve over HTTP) of the log as a team's, with
string ids on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("requests")

from tests.tiny import TINY, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAUSAL = {"dim": 16, "layers": 1, "heads": 2, "shared_dim": 64, "dropout": 0.1}


@pytest.mark.slow
def test_the_example_fm_runs_through_every_step(tmp_path):
    from jobs.replay import ReplayOptions, replay
    from solaris.artifacts import Artifacts
    from solaris.config import load_config
    from solaris.data.export import export_generic
    from solaris.data.generic import load_generic_yaml
    from solaris.data.load import load_dataset
    from solaris.eval.transfer import compare_fms
    from solaris.models.api import FMModel

    tiny = {**TINY, "cache.dim": 16, "report.seeds": 1, "report.coverages": [1.0, 0.2]}
    builtin = load_config(None, tiny)
    cfg = load_config(ROOT / "configs" / "example-causal-fm.yaml",
                      {**tiny, "fm.kwargs": CAUSAL})
    assert cfg.fm.cls == "examples.causal_fm:CausalTransformerFM"
    ds = load_dataset(cfg.data)

    # the transfer report: both FMs on the same seed, every arm but the FM's own shared
    rep = compare_fms({"fm-v1": builtin, "causal-v1": cfg}, ds)
    a, b = rep["fms"]["fm-v1"], rep["fms"]["causal-v1"]
    assert a["bce"]["vm"] == b["bce"]["vm"]  # the same VM alone: paired
    assert a["bce"]["fm"] != b["bce"]["fm"] and np.isfinite(b["bce"]["fm"])
    assert "pair_100" in b["tr"] and "kd" in b["tr"]
    assert set(rep["fm_bce_difference"]) == {"fm-v1 - causal-v1"}

    # training, the FM workers, the KNN job and serving: the replay through the live system,
    # of the same log as a team's with opaque string ids (the same rows and codes): /rank and
    # /feedback carry those strings, the router translates them with the artifacts' id map
    team = load_generic_yaml(export_generic(ds, tmp_path / "log", string_ids=True))
    assert team.interactions.equals(ds.interactions)
    raw = team.users.column("raw_id").to_pylist()
    assert all(isinstance(u, str) for u in raw) and raw != sorted(raw)
    opts = ReplayOptions(workers=1, max_requests=60, knn_every_h=6.0, port=free_port(),
                         progress=False, num_cpus=3, predict=False)
    out = replay(cfg, team, tmp_path / "causal", opts, say=lambda m: None)
    art_ids = Artifacts.open(tmp_path / "causal" / "artifacts").ids()
    assert art_ids.users.raw.to_pylist() == raw and not art_ids.users.identity
    art = Artifacts.open(tmp_path / "causal" / "artifacts")
    fm, _, version = art.models()
    assert type(fm).__module__ == "examples.causal_fm" and isinstance(fm, FMModel)
    assert version == "causal-v1+enc16" and art.manifest["config"]["fm"]["kwargs"] == CAUSAL
    assert out["requests"] == 60 and out["errors"] == 0
    assert out["fm_evals"] > 0  # the FM workers precomputed pairs with it
    assert out["coverage"]["pair"] > 0  # and the VMs were served them
    assert len(out["knn_rebuilds"]) >= 2  # the KNN job indexed its user vectors
    tables = sorted((tmp_path / "causal" / "knn").rglob("*user*"))
    assert tables, "no user KNN table written"
    assert out["all_slots_off"]["equal"]  # with every slot off: the VM alone, bit for bit
    saved = json.loads((tmp_path / "causal" / "replay.json").read_text())
    assert saved["fm_evals"] == out["fm_evals"]
