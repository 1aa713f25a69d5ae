"""Benchmark: what a served tier says about the label, period by period, in simulated serving.

    python bench/presence_rates.py RUN_DIR [RUN_DIR ...] --json OUT.json [--task TASK]

Each RUN_DIR is a finished ``solaris replay`` (``replay-config.yaml``, ``artifacts/``). With the
run's shipped FM, encoder and VM alone, serving is simulated on the VM, validation and test
periods (``solaris.simulate.served.simulate_period``, the code training uses), and for each period
and tier served (own pair, imputed: user or item neighbour, none) the table gives the rows, the
positive rate with its 95% interval, and the VM alone's mean probability there. Where the
positive rate stands above the VM alone's mean, the tier's presence carries information the VM
alone lacks (the verifier bet on the pair, or it was asked for before), and a map fitted on one
period (``residual.present_affine``) transfers to another only if the periods agree. The VM
period is in sample for the VM alone (it trained there), and here the VM alone also ranks its
candidates; training itself ranks them by the cross-fitted models (out of sample, not kept in
the artifacts: ``solaris.train.residual.training_verifier``), and records what it saw per tier
in the manifest (``vms.<task>.served.presence``: training and validation rows).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

GROUPS = ("own", "imputed", "none")


def rates(y: np.ndarray, p: np.ndarray, tier: np.ndarray) -> dict[str, dict]:
    """Per group of ``tier`` (Tier codes): rows, positive rate [95% normal interval] and the
    VM alone's mean probability ``p``."""
    from solaris.tiers import Tier

    masks = {"own": tier == int(Tier.PAIR), "imputed": tier > int(Tier.PAIR),
             "none": tier == int(Tier.NONE)}
    out = {}
    for g, m in masks.items():
        n = int(m.sum())
        if n == 0:
            out[g] = {"rows": 0, "positive_rate": None, "ci": None, "vm_alone_mean_p": None}
            continue
        r = float(y[m].mean())
        h = 1.96 * math.sqrt(max(r * (1 - r), 1e-12) / n)
        out[g] = {"rows": n, "positive_rate": r, "ci": [r - h, r + h],
                  "vm_alone_mean_p": float(p[m].mean())}
    return out


def run_rates(run: Path, task: str | None) -> dict:
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.data.split import time_split
    from solaris.simulate.schedule import candidate_scores
    from solaris.simulate.served import simulate_period
    from solaris.features import FeatureTables
    from solaris.artifacts import Artifacts, load_models

    cfg = load_config(run / "replay-config.yaml", stored=True)
    ds = load_dataset(cfg.data)
    task = task or ds.tasks[0]
    if task not in ds.tasks:
        raise SystemExit(f"--task={task!r}: one of {', '.join(ds.tasks)}")
    t = list(ds.tasks).index(task)
    periods = time_split(ds, cfg.split)
    tables = FeatureTables(ds, cfg.features)
    art = run / "artifacts"
    fm, encoder, version = load_models(art)
    base, _, _ = Artifacts.open(art).vm_alone(task)
    out: dict = {"run": str(run), "task": task}
    for per in ("vm", "val", "test"):
        sv = simulate_period(cfg, ds, tables, periods, base, fm, encoder, version, per, 0)
        r = sv.rows
        p = candidate_scores(base, tables, tables.user[r], tables.item[r], tables.surface[r])
        out[per] = rates(tables.labels[r, t].astype(np.float64), p, sv.pair_tier)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--task", default=None, help="the task (default: the dataset's first)")
    a = ap.parse_args(argv)
    for run in a.runs:
        if not (run / "replay-config.yaml").exists() or not (run / "artifacts").is_dir():
            raise SystemExit(f"{run}: not a finished replay (replay-config.yaml, artifacts/)")
    res = []
    print(f"{'run':<28}{'period':<8}" + "".join(f"{g + ' rate [ci] / p (n)':<46}" for g in GROUPS))
    for run in a.runs:
        r = run_rates(run, a.task)
        res.append(r)
        for per in ("vm", "val", "test"):
            cells = []
            for g in GROUPS:
                c = r[per][g]
                cells.append("-" if not c["rows"] else
                             f"{c['positive_rate']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] / "
                             f"{c['vm_alone_mean_p']:.3f} (n={c['rows']})")
            print(f"{run.name:<28}{per:<8}" + "".join(f"{x:<46}" for x in cells), flush=True)
    from machine import IN_PROCESS, machine

    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"runs": res, "machine": machine(IN_PROCESS)}, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
