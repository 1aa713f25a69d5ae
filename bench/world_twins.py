"""Benchmark: are there near-twins in a synthetic world? The ideal 10-nearest cosine, swept.

    python bench/world_twins.py [--profile cohorts] [--set KEY=VALUE ...]
        [--sweep KEY=V1,V2,...] [--hours 24] [--json OUT]

For the world a profile (plus ``--set`` overrides of ``data.synthetic``) generates: at the
start of the replay window (the test period), each user's hidden interest over the
``--hours`` before (the mean of its requests' unit interests, ``bench/neighbour_quality.py``)
and the mean cosine with its 10 nearest users by those interests -- what no user encoder can
beat -- beside the mean cosine of random pairs. ``--sweep KEY=...`` repeats it for each value
of one field (e.g. ``drift=0.1,0.2,0.4``). A world property: no model is trained.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str) -> dict:
    """A bench module's globals, run from its file path (``bench/`` never goes on sys.path)."""
    return runpy.run_path(str(ROOT / "bench" / f"{name}.py"))


def twins(overrides: dict[str, str], hours: float, k: int = 10) -> dict:
    from solaris.config import load_config, parse_overrides
    from solaris.data.split import time_split
    from solaris.data.synthetic import generate

    cfg = load_config(None, parse_overrides([f"data.synthetic.{key}={v}"
                                             for key, v in overrides.items()]))
    syn = cfg.data.synthetic
    ds = generate(syn)
    at = int(time_split(ds, cfg.split).cuts[2])
    v, has = _bench("neighbour_quality")["interests_at"](syn, at, hours)
    x = v[has]
    s = x @ x.T
    pairs = s[np.triu_indices(len(x), 1)]
    np.fill_diagonal(s, -np.inf)
    top = np.sort(s, axis=1)[:, -k:]
    return {"overrides": overrides, "users": int(len(x)), "ideal_knn_cosine": float(top.mean()),
            "random_cosine": float(pairs.mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cohorts")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a data.synthetic field")
    ap.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = {"profile": args.profile, **dict(s.split("=", 1) for s in args.set)}
    runs = [base]
    for sw in args.sweep:
        key, values = sw.split("=", 1)
        runs += [{**base, key: v} for v in values.split(",")]
    out = []
    for ov in runs:
        r = twins(ov, args.hours)
        out.append(r)
        what = ", ".join(f"{k}={v}" for k, v in ov.items())
        print(f"{what}: ideal 10-nearest cosine {r['ideal_knn_cosine']:.3f}, random pairs "
              f"{r['random_cosine']:.3f} ({r['users']} users)", flush=True)
    if args.json:
        machine = _bench("machine")["machine"]
        args.json.write_text(json.dumps({"runs": out, "machine": machine(None)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
