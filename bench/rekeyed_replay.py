"""Benchmark: a team's log with string ids replays as its integer-keyed twin does.

    python bench/rekeyed_replay.py --out runs/rekeyed [--max-requests 400] [--full]
        [--set KEY=VALUE ...] [--json OUT.json]

The synthetic default (small settings unless ``--full``) is written by ``solaris export``
twice: as it is (integer ids) and with ``--string-ids`` (opaque strings in an order unlike
the integers'). Each log goes through ``solaris replay --dataset generic`` -- training, the
KNN job, the live app over HTTP with raw ids on the wire -- and the two runs' printed
summaries and every number of their ``replay.json`` are compared. Prints one table; writes
the comparison as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the small world the integration tests replay (quality is not under test here)
SMALL = {
    "data.synthetic.num_users": 300, "data.synthetic.num_items": 200,
    "data.synthetic.days": 10.0, "data.synthetic.target_interactions": 8000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 1,
    "train.fm_epochs": 1, "train.vm_epochs": 1, "train.threads": 1,
    "report.vm_lrs": [1e-2], "residual.epochs": 1, "residual.folds": 2, "cache.dim": 16,
}


def numbers(obj, path: str = "") -> dict[str, float]:
    """Every number of a JSON document by its path."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(numbers(v, f"{path}.{k}"))
    elif isinstance(obj, list):
        for j, v in enumerate(obj):
            out.update(numbers(v, f"{path}[{j}]"))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[path] = float(obj)
    return out


# wall-clock figures differ from run to run whatever is compared
TIMING = ("seconds", "_s.", "latency", "_ms", "wall", "per_s", "elapsed", "time")


def compare(rep_a: dict, rep_b: dict) -> tuple[dict, dict, list[str], list[str], list[str]]:
    """Two ``replay.json`` documents number by number: (numbers of a, numbers of b, the
    figures compared, the timing fields left out, the figures that differ; NaN equals NaN)."""
    a, b = numbers(rep_a), numbers(rep_b)
    keys = sorted(set(a) | set(b))
    timed = [k for k in keys if any(t in k for t in TIMING)]
    figures = [k for k in keys if k not in timed]
    differ = [k for k in figures if not (k in a and k in b and (
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k]))))]
    return a, b, figures, timed, differ


def replay(mapping: Path, out: Path, sets: list[str], max_requests: int, port: int
           ) -> tuple[dict, str, float]:
    cmd = [sys.executable, "-m", "solaris.cli", "replay", "--dataset", "generic",
           "--data-dir", str(mapping), "--out", str(out), "--max-requests", str(max_requests),
           "--knn-every-h", "6", "--port", str(port), "--no-progress", *sets]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"replay of {mapping} failed:\n{done.stdout}\n{done.stderr}")
    # the wall-clock seconds in the summary's first line differ from run to run
    summary = re.sub(r"\d+(\.\d+)? s\b", "T s", done.stdout.replace(str(out), "OUT"))
    return json.loads((out / "replay.json").read_text()), summary, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-requests", type=int, default=400)
    p.add_argument("--full", action="store_true", help="the embedded default's own sizes")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    from solaris.config import load_config, parse_overrides
    from solaris.data.export import export_generic
    from solaris.data.load import load_dataset

    ov = {} if args.full else dict(SMALL)
    ov.update(parse_overrides(args.set))
    sets = [a for k, v in ov.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    cfg = load_config(None, ov)
    ds = load_dataset(cfg.data)
    runs = {}
    for kind, string_ids in (("integer", False), ("string", True)):
        mapping = export_generic(ds, args.out / f"log-{kind}", string_ids=string_ids)
        rep, summary, seconds = replay(mapping, args.out / f"run-{kind}", sets,
                                       args.max_requests, args.port)
        runs[kind] = {"report": rep, "summary": summary, "seconds": round(seconds, 1)}
    a, b, figures, timed, differ = compare(runs["integer"]["report"], runs["string"]["report"])
    same_summary = runs["integer"]["summary"] == runs["string"]["summary"]
    result = {"max_requests": args.max_requests, "full": args.full,
              "figures_compared": len(figures), "figures_differing": differ[:50],
              "timing_fields_skipped": len(timed), "summary_identical": same_summary,
              "seconds": {k: runs[k]["seconds"] for k in runs},
              "summary": runs["integer"]["summary"]}
    print(f"{'':28}{'integer ids':>14}{'string ids':>14}")
    print(f"{'replay seconds':28}{runs['integer']['seconds']:>14}{runs['string']['seconds']:>14}")
    print(f"figures compared: {len(figures)}, differing: {len(differ)}; printed summary "
          f"identical: {same_summary}")
    print(runs["integer"]["summary"])
    if not same_summary:
        print("--- string ids' summary ---")
        print(runs["string"]["summary"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if not differ and same_summary else 1


if __name__ == "__main__":
    sys.exit(main())
