"""What a user continuous feature is worth to the VM alone: test BCE with and without it.

    python bench/vm_features.py --json runs/bench_vm_features.json [--seeds 0 1 2]

The synthetic world is generated with ``synthetic.user_bias_feature`` on: besides
``activity`` (weakly tied to the click-logit user term ``user_bias``) the users carry
``bias_hint`` (``user_bias`` plus as much noise); every other byte of the data is the default
generator's. Per seed (data and training) the VM alone is trained three times on the same
rows, its spec reading no user continuous feature (``none``), ``activity`` only
(``activity``), and both (``activity+hint``), as ``solaris train`` trains it (``train_base``:
the report's learning-rate grid, early stopping and Platt calibration on the validation
period), and scored on the test period. Reported: each arm's click test BCE per seed, and the
paired differences ``activity - none`` (does ``activity`` carry signal) and
``activity+hint - activity`` (the opt-in feature), each with its mean and a 95% t-interval
over seeds (negative: the feature lowers the BCE).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from solaris.config import load_config  # noqa: E402
from solaris.data.load import load_dataset  # noqa: E402
from solaris.data.split import time_split  # noqa: E402
from solaris.data.synthetic_world import BIAS_HINT  # noqa: E402
from solaris.eval import metrics as M  # noqa: E402
from solaris.features import FeatureTables  # noqa: E402
from solaris.train.residual import train_base  # noqa: E402
from solaris.train.vertical import SlotArrays, VMInputs, predict_vm  # noqa: E402

ARMS = {"none": (), "activity": ("activity",), "activity+hint": ("activity", BIAS_HINT)}
PAIRS = (("activity", "none"), ("activity+hint", "activity"))
# two-sided 95% quantiles of Student's t by degrees of freedom (no scipy in the venv)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    return T975.get(df) or T975[max(k for k in T975 if k <= df)]


def interval(d: list[float]) -> dict:
    """Mean, standard error and 95% t-interval of paired differences ``d``."""
    a = np.asarray(d, np.float64)
    mean = float(a.mean())
    if len(a) < 2:
        return {"mean": mean, "se": None, "lo": None, "hi": None, "n": len(a)}
    se = float(a.std(ddof=1) / np.sqrt(len(a)))
    h = t975(len(a) - 1) * se
    return {"mean": mean, "se": se, "lo": mean - h, "hi": mean + h, "n": len(a)}


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, float]:
    """Test BCE (click) of the VM alone per arm, on the world of ``seed``."""
    cfg = load_config(None, {
        "data.synthetic.seed": seed, "data.synthetic.user_bias_feature": True,
        "data.synthetic.num_users": args.num_users, "data.synthetic.num_items": args.num_items,
        "data.synthetic.target_interactions": args.target_interactions,
        "train.vm_epochs": args.vm_epochs, "train.threads": args.threads})
    ds = load_dataset(cfg.data)
    periods = time_split(ds, cfg.split)
    out = {}
    for arm, cols in ARMS.items():
        spec = dataclasses.replace(ds.spec, user_continuous=cols)
        tables = FeatureTables(dataclasses.replace(ds, spec=spec), cfg.features)
        n = tables.num_rows
        slots = SlotArrays(np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32),
                           np.zeros(n, bool))  # the VM alone reads no slot
        inputs = VMInputs(tables, slots)
        model, lr, _ = train_base(inputs, cfg.vm, cfg.train, cfg.report.vm_lrs, task=0,
                                  rows=periods.vm, absent_rows=periods.fm_vertical,
                                  val_rows=periods.val, seed=seed, num_users=ds.num_users,
                                  num_items=ds.num_items, name=f"vm_{arm}")
        off = np.zeros(len(periods.test), bool)
        p = predict_vm(model, inputs, periods.test, off, off)
        out[arm] = float(M.bce(tables.labels[periods.test, 0], p))
        print(f"  seed {seed} {arm:>14}: test BCE {out[arm]:.5f} (lr {lr:g})", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num-users", type=int, default=3000)
    p.add_argument("--num-items", type=int, default=800)
    p.add_argument("--target-interactions", type=int, default=60_000)
    p.add_argument("--vm-epochs", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    t0 = time.perf_counter()
    per_seed = {}
    for s in args.seeds:
        per_seed[s] = run_seed(s, args)
    diffs = {f"{a} - {b}": [per_seed[s][a] - per_seed[s][b] for s in args.seeds]
             for a, b in PAIRS}
    res = {"test_bce": {str(s): v for s, v in per_seed.items()},
           "paired": {k: {"per_seed": v, **interval(v)} for k, v in diffs.items()},
           "config": vars(args) | {"json": str(args.json)},
           "seconds": round(time.perf_counter() - t0, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(f"\nVM alone, click test BCE ({len(args.seeds)} seeds, {args.num_users} users, "
          f"~{args.target_interactions} interactions)")
    print(f"{'seed':>6} " + " ".join(f"{a:>14}" for a in ARMS))
    for s in args.seeds:
        print(f"{s:>6} " + " ".join(f"{per_seed[s][a]:>14.5f}" for a in ARMS))
    for k, r in res["paired"].items():
        ci = "" if r["lo"] is None else f"  95% CI [{r['lo']:+.5f}, {r['hi']:+.5f}]"
        print(f"{k:>26}: mean {r['mean']:+.5f}{ci}  per seed "
              f"{', '.join(f'{x:+.5f}' for x in r['per_seed'])}")
    print(f"wrote {args.json} ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
