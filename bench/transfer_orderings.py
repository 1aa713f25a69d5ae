"""Benchmark: how often the small pipeline's orderings hold, across data seeds and thread counts.

    python bench/transfer_orderings.py --json runs/bench_orderings.json [--seeds 3] [--threads 1,2]

The transfer report on a small synthetic world (1,500 users, 800 items, 60k interactions, the
small FM of the unit tests) for each data seed x torch thread count. A thread count changes how
reductions split, so training floats differ in their last bits as they do between processors.
Reported per run, not asserted (tests/unit/test_pipeline.py keeps what holds whatever the
floats): the FM beats the VM (BCE and AUC), the full-coverage pair VM beats the VM, and
TR(pair 100%) > TR(pair 20%). Prints one table, writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the default synthetic data shrunk, with the small FM of the unit tests
SMALL = {
    "data.synthetic.num_users": 1500, "data.synthetic.num_items": 800,
    "data.synthetic.days": 30.0, "data.synthetic.target_interactions": 60000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 5,
    "train.fm_epochs": 4, "train.vm_epochs": 6,
    "report.seeds": 1, "report.coverages": [1.0, 0.2], "report.vm_lrs": [1e-2],
    "report.kd_alphas": [0.5], "report.bootstrap": 200,
}


def _one(data_seed: int, threads: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.eval.transfer import run_transfer

    cfg = load_config(None, {**SMALL, "data.synthetic.seed": data_seed, "train.threads": threads})
    t0 = time.perf_counter()
    r = run_transfer(cfg, load_dataset(cfg.data))
    bce, auc, tr = r["bce"], r["auc"], r["tr_ungated"]
    return {
        "data_seed": data_seed, "threads": threads, "seconds": round(time.perf_counter() - t0, 1),
        "bce": bce, "auc": auc, "tr": tr, "gap_significant": r["gap_significant"],
        "holds": {
            "fm_beats_vm": bool(bce["fm"] < bce["vm"] and auc["fm"] > auc["vm"]),
            "pair_100_beats_vm": bool(bce["vm_pair_100"] < bce["vm"]
                                      and auc["vm_pair_100"] > auc["vm"]),
            "tr_pair_100_gt_pair_20": bool(tr["pair_100"] > tr["pair_20"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, type=Path, help="where to write the numbers")
    ap.add_argument("--seeds", type=int, default=3, help="data seeds 0..N-1")
    ap.add_argument("--threads", default="1,2", help="torch thread counts, comma separated")
    ap.add_argument("--procs", type=int, default=2, help="runs side by side")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.seeds < 1 or any(t < 1 for t in threads):
        ap.error(f"--seeds={args.seeds}, --threads={args.threads}: must be >= 1")
    grid = [(s, t) for s in range(args.seeds) for t in threads]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(max(1, args.procs)) as pool:
        runs = pool.starmap(_one, grid)
    print(f"{'seed':>4} {'thr':>3} {'BCE fm':>8} {'BCE vm':>8} {'BCE p100':>8} "
          f"{'TR p100':>8} {'TR p20':>8}  fm>vm  p100>vm  tr100>tr20")
    for r in runs:
        h = r["holds"]
        print(f"{r['data_seed']:>4} {r['threads']:>3} {r['bce']['fm']:8.4f} {r['bce']['vm']:8.4f} "
              f"{r['bce']['vm_pair_100']:8.4f} {r['tr']['pair_100']:8.3f} {r['tr']['pair_20']:8.3f}"
              f"  {h['fm_beats_vm']!s:5}  {h['pair_100_beats_vm']!s:7}  {h['tr_pair_100_gt_pair_20']}")
    share = {k: sum(r["holds"][k] for r in runs) / len(runs) for k in runs[0]["holds"]}
    for k, v in share.items():
        print(f"  {k}: holds in {v:.0%} of {len(runs)} runs")
    wall = time.perf_counter() - t0
    print(f"bench/transfer_orderings.py wall time: {wall:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    from machine import IN_PROCESS, machine

    args.json.write_text(json.dumps({"wall_s": round(wall, 1), "runs": runs, "share": share,
                                     "machine": machine(IN_PROCESS)}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
