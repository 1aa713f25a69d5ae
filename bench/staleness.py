"""Benchmark: how the pair correction's transfer decays with the age of a cached z.

    python bench/staleness.py --dataset synthetic --seed 0 --json runs/bench_staleness.json

One seed of the transfer report's set-up (FM + encoder, the VM alone, cross-fitted base
logits). Two pair corrections: trained on fresh z (the report's) and trained on z as of
``request time - a`` with ``a`` log-uniform in [300 s, read TTL] (the age fed to the gate).
Each is scored on every test row with its z computed ``age`` seconds before the request,
for ages 0, 300, 900, 3600 and 14000 s: TR(100%) against the VM alone and the FM.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic", choices=["synthetic", "movielens"])
    ap.add_argument("--data-dir", help="MovieLens-100K directory (default: fetch into the cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ages", default="0,300,900,3600,14000")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)

    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.eval import metrics as M
    from solaris.eval.transfer import TransferExperiment
    from solaris.train.residual import crossfit_base, train_base, train_residual
    from solaris.train.teacher import z_at_age
    from solaris.train.vertical import predict_vm

    t0 = time.perf_counter()
    ov = {"data.dataset": args.dataset, "train.threads": 1}
    if args.data_dir:
        ov["data.data_dir"] = args.data_dir
    cfg = load_config(None, ov)
    ds = load_dataset(cfg.data, fetch=True)
    exp = TransferExperiment(cfg, ds)
    p, tb, seed = exp.periods, exp.tables, args.seed
    teacher = exp.teacher(seed)
    probs, inputs = exp.inputs(teacher)
    common = dict(task=0, rows=p.vm, absent_rows=exp.absent_rows, val_rows=p.val, seed=seed,
                  num_users=ds.num_users, num_items=ds.num_items)
    base, lr, _ = train_base(inputs, cfg.vm, cfg.train, cfg.report.vm_lrs, **common)
    b_oos = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, lr=lr, **common).logits
    ttl = float(cfg.cache.read_ttl_s)

    z_at = z_at_age(teacher, tb, cfg.features)
    rng = np.random.default_rng(seed)
    both = np.concatenate([p.vm, p.val])
    ages = np.round(np.exp(rng.uniform(np.log(300.0), np.log(ttl), len(both))))
    stale_in = inputs.served_as(both, z_at(both, ages), ages, ttl)
    fits = {name: train_residual(base, x, cfg.residual, cfg.train, task=0, rows=p.vm,
                                 base_logits=b_oos, val_rows=p.val, slot="pair", use_z=True,
                                 seed=seed)
            for name, x in (("fresh_trained", inputs), ("stale_trained", stale_in))}
    y = tb.labels[p.test, 0]
    on, off = np.ones(len(p.test), bool), np.zeros(len(p.test), bool)
    b_vm = M.bce(y, predict_vm(base, inputs, p.test, off, off))
    b_fm = M.bce(y, probs[p.test, 0])
    out: dict = {"dataset": ds.name, "seed": seed, "bce_vm": b_vm, "bce_fm": b_fm, "tr": {}}
    print(f"{ds.name} seed {seed}: TR(100%) by the age of z (BCE VM {b_vm:.4f}, FM {b_fm:.4f})")
    print(f"{'age s':>8} {'fresh-trained':>14} {'stale-trained':>14}")
    for a in (int(x) for x in args.ages.split(",")):
        age = np.full(len(p.test), float(a))
        x = inputs if a == 0 else inputs.served_as(p.test, z_at(p.test, age), age, ttl)
        row = {name: M.transfer_ratio(b_vm, M.bce(y, predict_vm(f.model, x, p.test, on, off)),
                                      b_fm) for name, f in fits.items()}
        out["tr"][str(a)] = row
        print(f"{a:>8} {row['fresh_trained']:>14.3f} {row['stale_trained']:>14.3f}")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    from machine import IN_PROCESS, machine

    out["machine"] = machine(IN_PROCESS)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json} ({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
