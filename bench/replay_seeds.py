"""Benchmark: online TR pooled over several training seeds' replays of one window.

    python bench/replay_seeds.py RUN_DIR [RUN_DIR ...] --json OUT.json [--resamples 2000]
        [--against RUN_DIR [RUN_DIR ...]]

Each RUN_DIR is a finished ``solaris replay`` (replay.json, feature_log.npz, artifacts/). Its
labelled rows are loaded and scored as ``solaris.replay.report.transfer_report`` does (rows
without an interaction row dropped, the VM alone re-scored without SOLARIS inputs, the
served scores and the teacher's probabilities clipped), then ``solaris.replay.pool`` gives
the raw and the base-calibrated TR per seed and pooled, with paired bootstrap intervals that
draw seeds and whole requests (one request draw shared by every seed: the runs replay the
same window). The per-seed point values must equal the run's own replay.json
(``tr_online_raw``, ``tr_online_base_calibrated``); the table shows both, and replay.json's
row-level interval next to the request-level one. Prints one table, writes every number as
JSON.

``--against`` names a second arm's runs, one per seed in the same order (e.g. the same seeds
replayed with another setting): each must score the same rows as its counterpart with the
same VM alone and FM (checked bit for bit: the arms share the base, the row order and the
window), is pooled with the same draws, and the table adds TR(runs) - TR(against) per seed
and pooled with the interval of the per-draw differences (``solaris.replay.pool.
paired_difference``), raw and base-calibrated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solaris.eval.render import to_json  # NaN (no FM-VM gap in a draw) as null
from solaris.replay.pool import (RunProbs, paired_difference, pooled_tr,
                                 pooled_tr_base_calibrated)


def load_run(run: Path) -> tuple[RunProbs, dict, np.ndarray]:
    """One replay's rows as ``transfer_report`` scores them (``report.mapped``), its
    replay.json and the rows' request times."""
    from solaris.replay.evaluate import ServedRows, halves
    from solaris.replay.report import mapped
    from solaris.online.scoring import Artifacts

    rep = json.loads((run / "replay.json").read_text())
    art_dir = run / "artifacts"
    task = Artifacts.open(art_dir).tasks[0]  # as ``jobs/replay.py --evaluate-only``
    with np.load(run / "feature_log.npz") as f:
        data = {k: f[k] for k in f.files}
    row = data.pop("row")
    m = mapped(art_dir, task, ServedRows(**data), row, float(rep["read_ttl_s"]))
    first, _ = halves(m.rows)
    probs = RunProbs(y=m.rows.y, p_alone=m.p_alone, p_served=m.p_served, p_fm=m.p_fm,
                     request=m.rows.req, first=first)
    return probs, rep, m.rows.ts


def same_window(runs: list[RunProbs], ts: list[np.ndarray]) -> bool:
    """Whether every request id means the same request (the same event time) in every run."""
    req = np.concatenate([r.request for r in runs])
    t = np.concatenate(ts)
    keys, inv = np.unique(req, return_inverse=True)
    lo = np.full(len(keys), np.inf)
    hi = np.full(len(keys), -np.inf)
    np.minimum.at(lo, inv, t)
    np.maximum.at(hi, inv, t)
    return bool((lo == hi).all())


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="replay run directories, one per seed")
    ap.add_argument("--json", required=True, type=Path, help="where to write the numbers")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--alpha", type=float, default=0.05, help="1 - interval coverage")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--per-seed-requests", action="store_true",
                    help="draw each run's requests on their own (runs of different windows)")
    ap.add_argument("--against", nargs="+", type=Path, default=None,
                    help="a second arm's run directories, one per seed in the same order: "
                         "the paired difference TR(runs) - TR(against)")
    args = ap.parse_args(argv)
    if args.against is not None and len(args.against) != len(args.runs):
        ap.error(f"--against: {len(args.against)} runs for {len(args.runs)} seeds")
    if args.resamples < 1 or not 0 < args.alpha < 1:
        ap.error(f"--resamples={args.resamples}, --alpha={args.alpha}: need >= 1 and (0, 1)")
    for run in args.runs + (args.against or []):
        if not (run / "replay.json").exists() or not (run / "feature_log.npz").exists():
            ap.error(f"{run}: no replay.json / feature_log.npz (run `solaris replay` first)")
    t0 = time.perf_counter()
    probs, reps, ts = [], [], []
    for run in tqdm(args.runs, desc="scoring the VM alone", unit="run"):
        p, rep, t = load_run(run)
        probs.append(p)
        reps.append(rep)
        ts.append(t)
    other = []
    for i, run in enumerate(tqdm(args.against or [], desc="scoring the other arm", unit="run")):
        p, _, _ = load_run(run)
        q = probs[i]
        for name in ("y", "request", "p_alone", "p_fm", "first"):
            if not np.array_equal(getattr(p, name), getattr(q, name)):
                ap.error(f"--against {run}: {name} differs from {args.runs[i]}'s (not the same "
                         "seed's base, rows and window)")
        other.append(p)
    t_load = time.perf_counter() - t0
    shared = not args.per_seed_requests
    if shared and not same_window(probs, ts):
        ap.error("the runs' request ids name different event times (not one window); "
                 "pass --per-seed-requests")
    t1 = time.perf_counter()
    kw = {"resamples": args.resamples, "alpha": args.alpha, "seed": args.seed,
          "share_requests": shared, "keep_draws": args.against is not None}
    raw = pooled_tr([p.losses() for p in probs], **kw)
    t_raw = time.perf_counter() - t1
    t2 = time.perf_counter()
    cal = pooled_tr_base_calibrated(probs, **kw)
    t_cal = time.perf_counter() - t2

    def f(x: float | None) -> str:
        return "n/a" if x is None or not math.isfinite(x) else f"{x:7.3f}"

    def ci(c: list) -> str:
        return f"[{f(c[0])}, {f(c[1])}]"

    pct = f"{100 * (1 - args.alpha):.0f}%"
    print(f"{'run':<22}{'rows':>7}{'TR raw':>8}  {pct + ' CI (requests)':<20}"
          f"{'json':>8}  {'json CI (rows)':<20}{'TR base-cal':>12}  {pct + ' CI':<20}{'json':>8}")
    for i, run in enumerate(args.runs):
        rep = reps[i]
        print(f"{run.name:<22}{raw['rows'][i]:>7}{f(raw['per_seed'][i]):>8}  "
              f"{ci(raw['per_seed_ci'][i]):<20}{f(rep.get('tr_online_raw')):>8}  "
              f"{ci(rep.get('tr_online_raw_ci') or [None, None]):<20}"
              f"{f(cal['per_seed'][i]):>12}  {ci(cal['per_seed_ci'][i]):<20}"
              f"{f(rep.get('tr_online_base_calibrated')):>8}")
    print(f"{'pooled (' + str(raw['seeds']) + ' seeds)':<22}{sum(raw['rows']):>7}"
          f"{f(raw['tr']):>8}  {ci([raw['ci_low'], raw['ci_high']]):<20}{'':>8}  {'':<20}"
          f"{f(cal['tr']):>12}  {ci([cal['ci_low'], cal['ci_high']]):<20}")
    print(f"  requests drawn: {raw['requests']} ({'shared by' if shared else 'per'} seed), "
          f"{args.resamples} resamples; finite draws: raw {raw['finite_share']:.3f}, "
          f"base-calibrated {cal['finite_share']:.3f}")
    print(f"  pooled BCE raw: vm alone {raw['bce']['vm_alone']:.5f}, served "
          f"{raw['bce']['served']:.5f}, fm {raw['bce']['fm']:.5f}")
    paired = None
    if other:
        o_raw = pooled_tr([p.losses() for p in other], **kw)
        o_cal = pooled_tr_base_calibrated(other, **kw)
        paired = {"against": [str(r) for r in args.against],
                  "raw": paired_difference(raw, o_raw, args.alpha),
                  "base_calibrated": paired_difference(cal, o_cal, args.alpha),
                  "against_raw": o_raw, "against_base_calibrated": o_cal}
        print(f"paired with {len(other)} runs of the other arm (same base, rows, draws): "
              "TR(runs) - TR(against)")
        for name in ("raw", "base_calibrated"):
            d = paired[name]
            print(f"  {name:<16} per seed {', '.join(f(x).strip() for x in d['per_seed'])}; "
                  f"pooled {f(d['diff']).strip()} {ci([d['ci_low'], d['ci_high']])}")
    print(f"bench/replay_seeds.py: load {t_load:.1f} s, bootstrap raw {t_raw:.1f} s, "
          f"base-calibrated {t_cal:.1f} s")
    out = {"runs": [str(r) for r in args.runs], "resamples": args.resamples,
           "alpha": args.alpha, "seed": args.seed, "share_requests": shared,
           "raw": raw, "base_calibrated": cal, "paired": paired,
           "replay_json": [{k: rep.get(k) for k in ("tr_online_raw", "tr_online_raw_ci",
                                                   "tr_online_base_calibrated")}
                           for rep in reps],
           "seconds": {"load": round(t_load, 1), "raw": round(t_raw, 2),
                       "base_calibrated": round(t_cal, 2)}}
    from machine import machine, run_devices

    out["machine"] = machine(run_devices(args.runs))
    for block in (raw, cal, *((paired["against_raw"], paired["against_base_calibrated"])
                              if paired else ())):
        block.pop("draw_trs", None)  # the draws themselves stay out of the JSON
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(to_json(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
