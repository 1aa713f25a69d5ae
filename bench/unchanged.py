"""Behaviour unchanged across a restructuring: the demo's outputs of two trees, compared.

    solaris demo --out runs/base-1          # on the base commit (a git worktree of it)
    solaris demo --out runs/base-2          # the same code again
    solaris demo --out runs/new             # this tree
    python bench/unchanged.py runs/base-1 runs/base-2 runs/new [--json runs/unchanged.json]

For each later directory against the first: every file of the trained artifacts
(``artifacts/``, ``artifacts-v2/``) byte for byte (SHA-256; the manifests less training's
wall time), and the replay's headline figures
(``replay.json``: coverage by tier, TR online calibrated and raw with their intervals, FM
evaluations, requests, errors) for equality. A figure that differs between two runs of the
same code (the first two directories, when both are of the base) varies with the run, not
the code: it is named as such, and a difference in it between the trees is not a change of
behaviour.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import runpy
import sys
from pathlib import Path
from typing import Any

sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
leaves = sibling("compare_artifacts").leaves  # a nested dict's leaves by dotted key

ARTIFACTS = ("artifacts", "artifacts-v2")
HEADLINE = ("coverage", "tr_online", "tr_online_ci", "tr_online_raw", "tr_online_raw_ci",
            "fm_evals", "fm_evals_per_1k_requests", "requests", "errors")


# what a manifest records of the run rather than of the artifacts: training's wall time
WALL_CLOCK = ("seconds",)


def digests(run: Path) -> dict[str, str]:
    """SHA-256 of every artifact file of a demo's output, by path under the output; a
    manifest's is taken without its wall-clock fields (``WALL_CLOCK``)."""
    out = {}
    for name in ARTIFACTS:
        for f in sorted((run / name).rglob("*")):
            if not f.is_file():
                continue
            data = f.read_bytes()
            if f.name == "manifest.json":
                manifest = json.loads(data)
                for key in WALL_CLOCK:
                    manifest.pop(key, None)
                data = json.dumps(manifest, sort_keys=True).encode()
            out[str(f.relative_to(run))] = hashlib.sha256(data).hexdigest()
    if not out:
        raise SystemExit(f"{run}: no trained artifacts under {', '.join(ARTIFACTS)}")
    return out


def headline(run: Path) -> dict[str, Any]:
    path = run / "replay.json"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (is {run} a demo's output?)")
    report = json.loads(path.read_text())
    return {k: report.get(k) for k in HEADLINE}


def compare(runs: list[Path]) -> dict[str, Any]:
    first_files, first_figs = digests(runs[0]), leaves(headline(runs[0]))
    rows = []
    for run in runs[1:]:
        files, figs = digests(run), leaves(headline(run))
        differ = sorted(k for k in first_files.keys() | files.keys()
                        if first_files.get(k) != files.get(k))
        rows.append({"run": str(run), "artifact_files": len(files),
                     "artifact_files_differing": differ,
                     "figures_differing": {k: [first_figs.get(k), figs.get(k)]
                                           for k in sorted(first_figs.keys() | figs.keys())
                                           if first_figs.get(k) != figs.get(k)}})
    return {"reference": str(runs[0]), "figures": first_figs, "against": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path,
                    help="demo output directories; the first is the reference")
    ap.add_argument("--json", type=Path, help="write the comparison here")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        ap.error("give at least two demo output directories")
    result = compare(args.runs)
    print(f"reference {result['reference']}")
    for k, v in result["figures"].items():
        print(f"  {k:34s} {v}")
    for row in result["against"]:
        same = not row["artifact_files_differing"]
        print(f"{row['run']}: {row['artifact_files']} artifact files, "
              f"{'all bit-identical' if same else 'differing: ' + ', '.join(row['artifact_files_differing'])}")
        if not row["figures_differing"]:
            print("  every headline figure equal")
        for k, (a, b) in row["figures_differing"].items():
            print(f"  {k:34s} {a} -> {b}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
