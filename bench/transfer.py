"""Benchmark: the transfer report on the synthetic default and on MovieLens-100K.

    python bench/transfer.py --json runs/bench_transfer.json [--seeds 5] [--data-dir DIR]
        [--set KEY=VALUE ...]

The two datasets run side by side in two processes (one torch thread each: this machine has
two cores). MovieLens comes from --data-dir or is fetched into the cache dir
($SOLARIS_CACHE, default ~/.cache/solaris). Prints one table per dataset and the issue's
checks, writes every number as JSON.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import runpy
import sys
import time
from pathlib import Path

# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]


def _run(name: str, data_dir: str | None, seeds: int, out: str,
         overrides: dict | None = None) -> dict:
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.eval.render import coverage_plot, to_json, transfer_table
    from solaris.eval.transfer import run_transfer

    ov = {"data.dataset": name, "report.seeds": seeds, "train.threads": 1}
    if data_dir:
        ov["data.data_dir"] = data_dir
    ov.update(overrides or {})
    cfg = load_config(None, ov)
    ds = load_dataset(cfg.data, fetch=True)
    report = run_transfer(cfg, ds)
    d = Path(out) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "transfer.json").write_text(to_json(report))
    coverage_plot(report, d / "transfer_coverage.png")
    report["table"] = transfer_table(report)
    return report


def checks(r: dict) -> list[tuple[str, bool]]:
    """The residual VM's targets: no harm at any coverage, linear in coverage, transfer
    beyond the no-z control, misses scored as the VM alone."""
    tr, paired = r["tr"], r.get("tr_paired", {})
    second = next(iter((r.get("tasks") or {}).values()), None)
    covs = sorted(int(k.split("_")[1]) for k in tr
                  if k.startswith("pair_") and k.split("_")[1].isdigit())
    out = [
        ("gap_significant", bool(r["gap_significant"])),
        ("tr.pair_100 >= 0.70", tr["pair_100"] >= 0.70),
        ("tr.pair_100 >= 2 x tr.kd", tr["pair_100"] >= 2 * tr["kd"]),
        ("tr_vs_control (calibrated) >= 0.70",
         r.get("tr_vs_control", {}).get("cal", float("nan")) >= 0.70),
    ]
    for c in covs:
        ci = paired.get(f"pair_{c}", {})
        out.append((f"pair_{c}: TR >= 0 and CI low >= -0.02",
                    tr[f"pair_{c}"] >= 0 and ci.get("ci_low", -1) >= -0.02))
        if c < 100:
            out.append((f"pair_{c} >= 0.8 x {c / 100:g} x pair_100",
                        tr[f"pair_{c}"] >= 0.8 * c / 100 * tr["pair_100"]))
    sim = r.get("schedule") or {}
    if "c_sim" in sim:
        c = sim["c_sim"]
        out.append((f"pair_sim (c_sim {c:.3f}) >= 0.8 x c_sim x pair_100",
                    tr["pair_sim"] >= 0.8 * c * tr["pair_100"]))
        out.append(("pair_sim: CI low >= -0.02", paired["pair_sim"]["ci_low"] >= -0.02))
        if "fm_on_sim" in tr:  # the FM's own edge on the covered rows bounds what they give
            out.append((f"pair_sim >= 0.8 x fm_on_sim ({tr['fm_on_sim']:.3f}, the FM on the "
                        "covered rows)", tr["pair_sim"] >= 0.8 * tr["fm_on_sim"]))
    for name, w in (r.get("tier_worth") or {}).items():  # simulated serving, cumulative
        off = all(x == 0 for x in w["scale_per_seed"])
        out.append((f"tier_worth {name}: step {w['step']:+.4f} "
                    f"[{w['ci_low']:+.4f}, {w['ci_high']:+.4f}]"
                    + (" (scale 0 in every seed: not delivered)" if off else "")
                    + " >= 0", w["step"] >= 0))
    for k, m in r.get("miss_rows", {}).items():
        out.append((f"miss rows of {k}: BCE = VM alone's (<= 1e-6)", m["max_abs_diff"] <= 1e-6))
    if second is not None and second.get("gap_significant"):  # TR only where the gap is
        out.append(("second task tr.pair_100 >= 0.50", second["tr"]["pair_100"] >= 0.50))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, type=Path, help="where to write the numbers")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--data-dir", help="MovieLens-100K directory (default: fetch into the cache)")
    ap.add_argument("--out", default="runs/bench_transfer", help="reports and plots per dataset")
    ap.add_argument("--datasets", default="synthetic,movielens")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                    help="override a config field on both datasets, e.g. "
                    "--set residual.present_affine=served")
    args = ap.parse_args(argv)
    from solaris.config import load_config, parse_overrides

    overrides = parse_overrides(args.set)
    load_config(None, overrides)  # a bad KEY=VALUE fails here, by name, before any work
    names = args.datasets.split(",")
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(names)) as pool:
        jobs = {n: pool.apply_async(_run, (n, args.data_dir if n == "movielens" else None,
                                           args.seeds, args.out, overrides)) for n in names}
        results = {n: j.get() for n, j in jobs.items()}
    wall = time.perf_counter() - t0
    summary = {"wall_s": round(wall, 1), "seeds": args.seeds, "set": args.set, "datasets": {}}
    for n, r in results.items():
        print(r.pop("table"))
        ok = checks(r)
        for label, passed in ok:
            print(f"  [{'ok' if passed else 'MISS'}] {n}: {label}")
        print()
        summary["datasets"][n] = {**r, "checks": {label: passed for label, passed in ok}}
    print(f"bench/transfer.py wall time: {wall:.0f} s ({len(names)} datasets side by side)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    from solaris.eval.render import to_json

    mach = sibling("machine")
    summary["machine"] = mach.machine(mach.IN_PROCESS)
    args.json.write_text(to_json(summary))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
