"""The VM alone's own CPU per request: this tree against an earlier commit, A/B.

    python bench/vm_ab.py --baseline REV --json runs/bench_vm_ab.json [--rounds 3]

Serving SOLARIS must not make the VM alone dearer. This runs ``bench/serve.py`` of the
baseline commit (extracted with ``git archive`` into a temporary directory, nothing in this
checkout changes) and of this tree alternately, ``--rounds`` times each, the order flipped
every round (ABBA...), each run with its own local Ray and the same options: 500 candidates,
the VM alone and SOLARIS, ``--load`` of the VM-alone saturation rate, no KNN tables (the VM
alone reads none). Per run it takes the VM alone's CPU per request (every process of the run
summed, medians over the run's interleaved trials, ``cpu_ms_per_request.vm_500``); it reports
per arm the median over rounds, the per-round values, and the ratio of the medians (this
tree / baseline) with the per-round ratios of adjacent runs. Both arms run in this
interpreter (its packages); each imports its own tree's code (``bench/serve.py`` puts its
tree first on the path and in the workers' ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import runpy
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
SIZE = 500


def extract(rev: str, into: Path) -> str:
    """The tree of commit ``rev`` under ``into``; returns the full commit id."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "archive", "--format=tar", sha], cwd=ROOT, check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return sha


def vm_cpu(serve_json: dict) -> dict[str, float]:
    """The VM alone's CPU ms per request by role and in all, from a ``bench/serve.py`` JSON."""
    roles = serve_json["cpu_ms_per_request"][f"vm_{SIZE}"]
    return {**roles, "total": float(sum(roles.values()))}


def summary(runs: list[dict]) -> dict:
    """Medians per arm, their ratio, and the ratio of each round's adjacent pair."""
    arms = {a: [r["vm_cpu_ms"]["total"] for r in runs if r["arm"] == a]
            for a in ("baseline", "current")}
    med = {a: float(np.median(v)) for a, v in arms.items()}
    pairs = [c / b for b, c in zip(arms["baseline"], arms["current"])]
    return {"vm_cpu_ms_median": med, "vm_cpu_ms_per_round": arms,
            "ratio_of_medians": med["current"] / med["baseline"],
            "ratio_per_round": pairs, "ratio_per_round_median": float(np.median(pairs)),
            "p50_ms_vm_median": {a: float(np.median([r["p50_ms_vm"] for r in runs
                                                     if r["arm"] == a]))
                                 for a in ("baseline", "current")}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="the commit to compare against")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=2, help="runs per arm (ABBA order)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--load", type=float, default=0.25)
    p.add_argument("--num-cpus", type=int, default=2)
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    t0 = time.perf_counter()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="solaris-vm-ab-") as tmp:
        base_root = Path(tmp) / "baseline"
        sha = extract(args.baseline, base_root)
        trees = {"baseline": base_root, "current": ROOT}
        for i in range(args.rounds):
            order = ("baseline", "current") if i % 2 == 0 else ("current", "baseline")
            for arm in order:
                js = Path(tmp) / f"{arm}_{i}.json"
                cmd = [sys.executable, str(trees[arm] / "bench" / "serve.py"), "--json",
                       str(js), "--sizes", str(SIZE), "--modes", "vm,solaris", "--load",
                       str(args.load), "--trials", str(args.trials), "--requests",
                       str(args.requests), "--knn-data", "none", "--num-cpus",
                       str(args.num_cpus)]
                print(f"round {i + 1}/{args.rounds}: {arm}", flush=True)
                subprocess.run(cmd, cwd=trees[arm], check=True)
                out = json.loads(js.read_text())
                runs.append({"arm": arm, "round": i, "vm_cpu_ms": vm_cpu(out),
                             "p50_ms_vm": out["latency_ms"][f"vm_{SIZE}"]["p50"],
                             "vm_saturation_rps": out["rates"][str(SIZE)]["vm_saturation_rps"],
                             "errors": out.get("errors"),
                             "fm_devices": (out.get("machine") or {}).get("fm_devices")})
    res = {"baseline": sha, "current": "working tree", "runs": runs, **summary(runs),
           "config": vars(args) | {"json": str(args.json)},
           "seconds": round(time.perf_counter() - t0, 1)}
    machine = sibling("machine").machine
    res["machine"] = machine(next((r["fm_devices"] for r in runs
                                   if r["arm"] == "current" and r["fm_devices"]), None))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    med = res["vm_cpu_ms_median"]
    print(f"VM alone CPU ms per request (median of {args.rounds} runs): baseline "
          f"{med['baseline']:.2f}, current {med['current']:.2f}; ratio "
          f"{res['ratio_of_medians']:.3f} (per round "
          f"{', '.join(f'{r:.3f}' for r in res['ratio_per_round'])})")
    print(f"wrote {args.json} ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
