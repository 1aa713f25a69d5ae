"""Benchmark: the replay on the routers' read replica gives the shard path's figures.

    python bench/replica_replay.py --out runs/replica-replay [--dataset synthetic]
        [--data-dir DIR | --fetch] [--max-requests N] [--set KEY=VALUE ...] [--json OUT]

Runs ``solaris replay`` twice on one dataset, the same artifacts (trained by the first run,
copied for the second): ``serve.cache_reads=shards`` (a round of shard calls per request)
and ``serve.cache_reads=replica`` (every lookup answered by the router's replica, pulled at
the replay's barrier), and compares every number of the two ``replay.json`` (wall-clock
fields left out) and the printed summaries. Exit 0 when nothing differs.

``--live`` adds a third run on the replica without the barrier (``--no-refresh-barrier``):
the replica pulls on its own timer, as in live serving, and the next tick's requests may
read it before it took the last writes. Its pair coverage, FM evaluations and duplicate
evaluations beside the shard path's are what that staleness costs on this trace.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rekeyed_replay import compare  # noqa: E402


def run(args: argparse.Namespace, reads: str, out: Path, barrier: bool = True
        ) -> tuple[dict, str, float]:
    import re
    import subprocess
    import time

    cmd = [sys.executable, "-m", "solaris.cli", "replay", "--dataset", args.dataset,
           "--out", str(out), "--port", str(args.port), "--no-progress",
           "--set", f"serve.cache_reads={reads}"]
    if args.data_dir:
        cmd += ["--data-dir", str(args.data_dir)]
    if args.fetch:
        cmd.append("--fetch")
    if args.max_requests:
        cmd += ["--max-requests", str(args.max_requests)]
    if not barrier:
        cmd.append("--no-refresh-barrier")
    if args.demo:
        cmd += ["--rollover-at", "0.5"]
    for s in args.set:
        cmd += ["--set", s]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"replay ({reads}) failed:\n{done.stdout[-4000:]}\n"
                         f"{done.stderr[-4000:]}")
    summary = re.sub(r"\d+(\.\d+)? s\b", "T s", done.stdout.replace(str(out), "OUT"))
    return (json.loads((out / "replay.json").read_text()), summary,
            round(time.perf_counter() - t0, 1))


def _costs(rep: dict) -> dict:
    cov = rep.get("coverage") or {}
    return {"pair_coverage": cov.get("pair"),
            "any_tier_coverage": cov.get("item_neighbour"),  # cumulative: every tier
            "fm_evals": rep.get("fm_evals"), "fm_duplicates": rep.get("fm_duplicates"),
            "speculation_precision": rep.get("speculation_precision"),
            "errors": rep.get("errors")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dataset", choices=["synthetic", "movielens"], default="synthetic")
    p.add_argument("--data-dir", type=Path)
    p.add_argument("--fetch", action="store_true")
    p.add_argument("--max-requests", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--json", type=Path)
    p.add_argument("--demo", action="store_true",
                   help="the demo's replay: the synthetic default with the FM v2 rollover "
                   "half-way (solaris demo)")
    p.add_argument("--live", action="store_true",
                   help="also the replica without the barrier (live staleness)")
    args = p.parse_args(argv)
    runs = {}
    kinds = [("shards", "shards", True), ("replica", "replica", True)]
    if args.live:
        kinds.append(("replica_live", "replica", False))
    for name, reads, barrier in kinds:
        out = args.out / name
        for art in (args.out / "shards").glob("artifacts*") if name != "shards" else []:
            shutil.rmtree(out / art.name, ignore_errors=True)
            shutil.copytree(art, out / art.name)
        runs[name] = dict(zip(("report", "summary", "seconds"),
                              run(args, reads, out, barrier)))
    a, b, figures, timed, differ = compare(runs["shards"]["report"], runs["replica"]["report"])
    same = runs["shards"]["summary"] == runs["replica"]["summary"]
    result = {"dataset": args.dataset, "max_requests": args.max_requests, "sets": args.set,
              "figures_compared": len(figures), "figures_differing": differ[:50],
              "differing_values": {k: [a.get(k), b.get(k)] for k in differ[:50]},
              "timing_fields_skipped": len(timed), "summary_identical": same,
              "seconds": {k: runs[k]["seconds"] for k in runs},
              "summary": runs["shards"]["summary"]}
    result["staleness"] = {k: _costs(r["report"]) for k, r in runs.items()}
    print(f"replay seconds: shards {runs['shards']['seconds']}, replica "
          f"{runs['replica']['seconds']}")
    print(f"figures compared: {len(figures)}, differing: {len(differ)}; printed summary "
          f"identical: {same}")
    for k in differ[:20]:
        print(f"  {k}: shards {a.get(k)!r} replica {b.get(k)!r}")
    print(runs["shards"]["summary"])
    if not same:
        print("--- replica's summary ---")
        print(runs["replica"]["summary"])
    print(f"{'run':<14}{'pair cov':>10}{'any tier':>10}{'FM evals':>10}{'duplicates':>11}"
          f"{'spec prec':>10}")
    for k, c in result["staleness"].items():
        print(f"{k:<14}{c['pair_coverage']:>10.4f}{c['any_tier_coverage']:>10.4f}"
              f"{c['fm_evals']:>10}{c['fm_duplicates']:>11}"
              f"{c['speculation_precision'] or float('nan'):>10.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if not differ and same else 1


if __name__ == "__main__":
    sys.exit(main())
