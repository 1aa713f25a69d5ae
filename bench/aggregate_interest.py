"""Benchmark: how much of a user's recent interest the aggregated embedding holds.

    python bench/aggregate_interest.py ARTIFACTS [--hours 24] [--folds 5] [--json OUT]

On the synthetic world ``ARTIFACTS`` was trained on (``solaris train``), at the start of the
test period (the replay window): the world's hidden interest of each user (the mean of its
requests' unit interests over the ``--hours`` before) regressed linearly (ridge, ``--folds``
cross-validation over users) on

* the user's aggregate (the mean of the FM snapshot's pair embeddings over its rows in the
  aggregate window, ``solaris.features.aggregate_embeddings``, as of its last request before
  the cut: what the user slot holds);
* the VM alone's user-id embedding (the stable taste the VM already knows);
* both together;

and, over items, the hidden item vectors regressed on what the aggregate's correction can
read of a candidate (``solaris.train.residual.candidate_table``: the FM's item vectors, the
side features). R^2 is 1 - SSE / SST summed over the interest's dimensions, on held-out users; the step from
the id alone to id + aggregate is what the aggregate adds to what the VM knows of the user.
Users with a request in the hours before the cut and an aggregate are scored. Research only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """A bench module by its file path (``bench/`` never goes on ``sys.path``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ridge_r2(x: np.ndarray, y: np.ndarray, folds: int, seed: int = 0,
             lam: float = 1e-2) -> float:
    """Held-out R^2 (summed over y's columns) of a ridge fit of ``y`` (N, k) on ``x`` (N, p)
    with an intercept, ``folds``-fold cross-validation; x standardised on each training fold."""
    n = len(x)
    part = np.random.default_rng(seed).permutation(n) % folds
    pred = np.empty_like(y)
    for f in range(folds):
        tr, te = part != f, part == f
        mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-9
        a = np.c_[np.ones(tr.sum()), (x[tr] - mu) / sd]
        reg = lam * len(a) * np.eye(a.shape[1])
        reg[0, 0] = 0.0
        w = np.linalg.solve(a.T @ a + reg, a.T @ y[tr])
        pred[te] = np.c_[np.ones(te.sum()), (x[te] - mu) / sd] @ w
    sse = float(((y - pred) ** 2).sum())
    sst = float(((y - y.mean(0)) ** 2).sum())
    return 1.0 - sse / sst


def measure(art_dir: Path, hours: float, folds: int) -> dict:
    import torch

    from solaris.artifacts import Artifacts
    from solaris.data.split import time_split
    from solaris.data.synthetic import generate
    from solaris.features import FeatureTables, aggregate_embeddings
    from solaris.train.teacher import FitResult, Teacher, teacher_outputs

    nq = _load("neighbour_quality")
    art = Artifacts.open(art_dir)
    cfg = art.config
    fm, enc, version = art.models()
    ds = generate(cfg.data.synthetic)
    t = FeatureTables(ds, cfg.features)
    cut = float(time_split(ds, cfg.split).cuts[2])
    interest, has = nq.interests_at(cfg.data.synthetic, int(cut), hours)
    rows = np.flatnonzero((t.ts < cut) & (t.ts >= cut - cfg.features.agg_window_s - 86_400))
    teacher = Teacher(fm, enc, FitResult(float("nan"), 0, 0), version)
    with torch.no_grad():
        _, z = teacher_outputs(teacher, t, rows)
    # the aggregate as of a request at the cut: every row of the window before it
    probe_user = np.unique(t.user[rows])
    users = np.r_[t.user[rows], probe_user]
    items = np.r_[t.item[rows], np.full(len(probe_user), -1)]
    ts = np.r_[t.ts[rows], np.full(len(probe_user), cut)]
    zz = np.r_[z, np.zeros((len(probe_user), z.shape[1]), z.dtype)]
    agg, present = aggregate_embeddings(users, items, ts, zz, cfg.features.agg_window_s,
                                        cfg.features.history_ties)
    agg, present = agg[len(rows):], present[len(rows):]
    keep = present & has[probe_user]
    u = probe_user[keep]
    y = interest[u]
    # controls: the mean of the clicked items' vectors over the same window rows, the FM's
    # and the world's true ones (what the clicks say of the interest at best)
    from solaris.data.synthetic import build

    clicked = t.labels[rows, 0] > 0
    true_vec = build(cfg.data.synthetic).item_vec
    fm_vec = fm.item_vectors().detach().numpy()

    def clicked_mean(vec: np.ndarray) -> np.ndarray:
        s = np.zeros((len(probe_user), vec.shape[1]))
        at = np.searchsorted(probe_user, t.user[rows][clicked])
        np.add.at(s, at, vec[t.item[rows][clicked]])
        return (s / np.maximum(np.bincount(at, minlength=len(probe_user)), 1)[:, None])[keep]

    # the item side: how much of the hidden item vectors what a correction can read of a
    # candidate holds (the FM's item-id vectors; the side features as ``candidate_table``
    # codes them), over items
    from solaris.train.residual import candidate_table

    item_side = {k: ridge_r2(candidate_table(k, fm, t).numpy(), true_vec, folds)
                 for k in ("fm", "features")}
    out = {"users": int(len(u)), "hours": hours, "folds": folds, "r2": {},
           "item_side": item_side, "controls": {
        "FM item vectors, mean over the clicked": ridge_r2(clicked_mean(fm_vec), y, folds),
        "true item vectors, mean over the clicked": ridge_r2(clicked_mean(true_vec), y, folds)}}
    for task in art.tasks:
        vm = art.vm_alone(task)[0]
        ids = vm.user_emb.weight.detach().numpy()[u]
        out["r2"][task] = {"user id (VM alone)": ridge_r2(ids, y, folds),
                           "aggregate": ridge_r2(agg[keep], y, folds),
                           "user id + aggregate": ridge_r2(np.c_[ids, agg[keep]], y, folds)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = measure(args.artifacts, args.hours, args.folds)
    print(f"{out['users']} users; held-out R^2 of the hidden {args.hours:g} h interest:")
    for task, r in out["r2"].items():
        print(f"  {task}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    print("  the hidden item vectors from the candidate table: " + ", ".join(
        f"{k} {v:.3f}" for k, v in out["item_side"].items()))
    print("  controls (the window's clicks): " + ", ".join(f"{k} {v:.3f}"
                                                          for k, v in out["controls"].items()))
    if args.json:
        machine = _load("machine")
        args.json.write_text(json.dumps({**out, "machine": machine.machine(machine.IN_PROCESS)},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
