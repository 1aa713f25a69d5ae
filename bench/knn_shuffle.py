"""Benchmark: the KNN job's user embedding step under Ray Data's two shuffles for its group-by.

    python bench/knn_shuffle.py [--rounds 5] [--users 300] [--json runs/bench_knn_shuffle.json]

A small synthetic world (``--users`` users, 8,000 interactions; models trained for one epoch:
their quality is not measured), its artifacts and its Parquet log written to a temporary
directory, then ``jobs.rebuild_knn.user_embeddings`` on a local Ray of 2 CPUs, the strategies
alternating round by round after one warm-up each (so both meet the same warm worker pool):
``sort_shuffle_pull_based`` (the job's ``SHUFFLE``) and ``shuffle_v2`` (Ray Data's default,
a hash shuffle whose aggregator actors start with each run). Reports each strategy's median
seconds, their paired ratio with its min and max over rounds, and whether the two give the
same user ids and embeddings to the bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("sort_shuffle_pull_based", "shuffle_v2")


def world(root: Path, users: int):
    """(artifacts dir, Parquet data dir) of a small synthetic world."""
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.replay.prepare import write_data_dir
    from solaris.train.artifacts import train_artifacts

    cfg = load_config(None, {
        "data.synthetic.num_users": users, "data.synthetic.num_items": 200,
        "data.synthetic.days": 10.0, "data.synthetic.target_interactions": 8000,
        "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
        "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 1,
        "train.fm_epochs": 1, "train.vm_epochs": 1, "train.threads": 1,
        "residual.epochs": 1, "residual.folds": 2})
    ds = load_dataset(cfg.data)
    train_artifacts(cfg, ds, root / "artifacts", seed=0)
    return root / "artifacts", write_data_dir(ds, root / "data")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--users", type=int, default=300)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: must be >= 1")
    sys.path.insert(0, str(ROOT))  # jobs/ as the job runs it
    import ray

    import jobs.rebuild_knn as job
    from solaris.artifacts import load_models

    with tempfile.TemporaryDirectory() as tmp:
        art, data = world(Path(tmp), a.users)
        fm = load_models(art)[0]
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        try:
            seconds = {s: [] for s in STRATEGIES}
            out = {}
            for r in range(a.rounds + 1):  # round 0 warms each strategy up, not counted
                for s in STRATEGIES:
                    job.SHUFFLE = s
                    t = time.perf_counter()
                    out[s] = job.user_embeddings(job.open_data(data, art), fm, None, 1, 256,
                                                 0.25, False, 0.25, True)
                    if r:
                        seconds[s].append(time.perf_counter() - t)
                print(f"round {r}: " + ", ".join(f"{s} {seconds[s][-1]:.2f} s" if r else
                                                 f"{s} (warm-up)" for s in STRATEGIES),
                      flush=True)
        finally:
            ray.shutdown()
    sort, hash_ = (np.array(seconds[s]) for s in STRATEGIES)
    ratio = hash_ / sort
    same = all(np.array_equal(x, y) for x, y in zip(out[STRATEGIES[0]][:2],
                                                      out[STRATEGIES[1]][:2]))
    rep = {"users": a.users, "rounds": a.rounds,
           "median_s": {s: round(float(np.median(seconds[s])), 2) for s in STRATEGIES},
           "ratio_hash_over_sort": {"median": round(float(np.median(ratio)), 2),
                                    "min": round(float(ratio.min()), 2),
                                    "max": round(float(ratio.max()), 2)},
           "same_embeddings": same}
    print(json.dumps(rep, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rep, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
