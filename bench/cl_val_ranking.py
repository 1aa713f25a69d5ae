"""Benchmark: can the validation period tell which closed-loop MovieLens seeds the FM helps?

    python bench/cl_val_ranking.py RUN_DIR [RUN_DIR ...] --truth GROUND_TRUTH.npz \
        --data-dir ML_DIR --json OUT.json

Each RUN_DIR is a finished ``solaris simulate --dataset movielens`` (its ``artifacts/`` and
``closed_loop.json``). On the validation period of the run's relabelled log (the rows the
served VM's scales were chosen on) it scores three rankers -- the VM alone, the served VM
with the own pair present on every row (fresh z, as the scale curve's ``pair`` entries), and
the FM's own probability -- and reports BCE, AUC and the per-user AUC (the mean of each
user's AUC weighted by its positive-negative pairs: the ranking within a user, which is what
choosing a request's top k needs), with a bootstrap over users of each ranker's per-user AUC
minus the VM alone's. Beside them, the run's closed-loop click gains over the VM alone
(``closed_loop.json``): a validation criterion that could have chosen the correction by its
ranking would move with them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def user_auc_parts(y: np.ndarray, x: np.ndarray, user: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per user with both classes: (its AUC, its positive x negative pair count)."""
    from solaris.eval.metrics import auc

    aucs, weights = [], []
    for u in np.unique(user):
        m = user == u
        pos = float(y[m].sum())
        neg = float(m.sum()) - pos
        if pos == 0 or neg == 0:
            continue
        aucs.append(auc(y[m], x[m]))
        weights.append(pos * neg)
    return np.asarray(aucs), np.asarray(weights)


def run_one(run: Path, truth: str, data_dir: str, resamples: int) -> dict:
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.data.rating_truth import relabelled
    from solaris.data.split import time_split
    from solaris.eval import metrics as M
    from solaris.features import FeatureTables
    from solaris.artifacts import Artifacts
    from solaris.artifacts import load_models
    from solaris.train.teacher import Teacher, vm_inputs
    from solaris.train.vertical import vm_logits

    loop = json.loads((run / "closed_loop.json").read_text())
    seed = int(loop["options"]["seed"])
    art = run / "artifacts"
    manifest = json.loads((art / "manifest.json").read_text())
    cfg = load_config(None, {"data.dataset": "movielens", "data.data_dir": data_dir})
    _, ds = relabelled(load_dataset(cfg.data), truth, seed)
    periods = time_split(ds, cfg.split)
    if periods.as_dict() != manifest["periods"]:
        raise SystemExit(f"{run}: the relabelled log's periods differ from the artifacts' "
                         "(another ground truth or config?)")
    tables = FeatureTables(ds, cfg.features)
    fm, enc, version = load_models(art)
    probs, inputs = vm_inputs(Teacher(fm, enc, None, version), tables, cfg.features)
    task = manifest["tasks"][0]
    model, base, meta = Artifacts.open(art).vm(task)
    val = periods.val
    y = tables.labels[val, 0].astype(np.float64)
    user = tables.user[val]
    b = vm_logits(base, inputs, val).astype(np.float64)
    on = np.ones(len(val), bool)
    model.eval()
    with torch.no_grad():
        s = model(inputs.batch(val, on, ~on), base_logit=torch.from_numpy(b).float())
    rankers = {"vm_alone": b, "served_pair": s.double().numpy(), "fm": M.logit(probs[val, 0])}
    parts = {k: user_auc_parts(y, x, user) for k, x in rankers.items()}
    rng = np.random.default_rng(0)
    n = len(parts["vm_alone"][0])
    draws = rng.integers(0, n, size=(resamples, n))
    out = {"run": run.name, "seed": seed, "val_rows": int(len(val)),
           "users_with_both_classes": n, "pair_scale": meta["scales"]["pair"]["pair"],
           "rankers": {}}
    va, w = parts["vm_alone"]
    for k, x in rankers.items():
        a, _ = parts[k]
        diff = [float(((a[d] - va[d]) * w[d]).sum() / w[d].sum()) for d in draws]
        gain = M.point_ci(float(((a - va) * w).sum() / w.sum()), np.asarray(diff))
        out["rankers"][k] = {
            "bce": M.bce(y, M.sigmoid(x)), "auc": M.auc(y, x),
            "user_auc": float((a * w).sum() / w.sum()),
            "user_auc_minus_vm": gain["point"], "user_auc_minus_vm_ci": gain["ci"]}
    gains = loop["lift"]["gain_over_vm"]
    out["loop_gain_over_vm"] = {k: gains[k]["point"] for k in ("solaris", "fm") if k in gains}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--truth", required=True, help="the ground truth the runs were fitted with")
    ap.add_argument("--data-dir", required=True, help="MovieLens-100K directory")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = [run_one(r, a.truth, a.data_dir, a.resamples) for r in a.runs]
    print(f"{'run':10s} {'ranker':12s} {'val BCE':>8s} {'AUC':>7s} {'user AUC':>9s} "
          f"{'- VM alone [95%]':>26s}   loop gain: SOLARIS / FM")
    for r in rows:
        g = r["loop_gain_over_vm"]
        for k, m in r["rankers"].items():
            lo, hi = m["user_auc_minus_vm_ci"]
            tail = (f"   {g.get('solaris', float('nan')):+.3f} / {g.get('fm', float('nan')):+.3f}"
                    if k == "vm_alone" else "")
            print(f"{r['run']:10s} {k:12s} {m['bce']:8.4f} {m['auc']:7.4f} {m['user_auc']:9.4f} "
                  f"{m['user_auc_minus_vm']:+8.4f} [{lo:+.4f}, {hi:+.4f}]{tail}")
    if a.json:
        a.json.write_text(json.dumps({"runs": rows}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
