"""Benchmark: build time, one-user query latency and recall@10 of the user KNN index.

    python bench/knn.py --json runs/bench_knn.json [--sizes 100k,1m] [--threads 1]

Data: ``n`` users x 64-d from a pinned Gaussian mixture (seed 0): 1024 components with
1/sqrt(rank) weights, centres ~ N(0, I), per-component spread ~ U(0.8, 1.6) -- overlapping
clusters, not uniform noise (on which every index looks bad) nor well separated blobs (on
which every index looks perfect).

Per size, the job's own code (``solaris.knn.tables``) with the default ``KnnConfig``: exact
``IndexFlatIP`` below ``exact_max`` (1M) rows, IVF at or above it.

- ``build_s``: index build (k-means on a sample + add) plus the nprobe tuning to
  ``min_recall + recall_margin`` on 1,000 random users (exact ground truth included);
- ``recall_at_10``: on 1,000 *other* random users against exact search, self excluded --
  what the job checks before publishing;
- ``query_ms_p50`` / ``p99``: ``LiveIndex.query`` for one user, k=100 (the cold-start
  call: normalise, search, map rows to ids), over 200 random users;
- ``table_s_per_1k``: filling 1,000 users' neighbour lists in batch (``knn.neighbours``),
  to extrapolate the job's table fill.

faiss runs ``--threads`` OpenMP threads (default 1: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("bench.knn")

DIM = 64
COMPONENTS = 1024
SEED = 0
NAMES = {100_000: "users_100k", 1_000_000: "users_1m"}
TARGET_RECALL = 0.95
TARGET_BUILD_1M_S = 600.0


def mixture(n: int, d: int = DIM, seed: int = SEED) -> np.ndarray:
    """(n, d) float32 from the pinned Gaussian mixture (module docstring)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(COMPONENTS, d)).astype(np.float32)
    w = 1.0 / np.sqrt(np.arange(1, COMPONENTS + 1))
    comp = rng.choice(COMPONENTS, size=n, p=w / w.sum())
    spread = rng.uniform(0.8, 1.6, size=COMPONENTS).astype(np.float32)
    x = rng.standard_normal(size=(n, d), dtype=np.float32)
    x *= spread[comp, None]
    x += centres[comp]
    return x


def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "km" else s) * mult)


def name_of(n: int) -> str:
    return NAMES.get(n, f"users_{n}")


def measure(n: int, exact_max: int, queries: int = 200) -> dict:
    from solaris.config import KnnConfig
    from solaris.knn.tables import (LiveIndex, build_index, index_name, neighbours, normalise,
                             recall_at_10, tune_nprobe)

    cfg = KnnConfig(exact_max=exact_max)
    t = time.perf_counter()
    x = normalise(mixture(n))
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    index = build_index(x, cfg)
    index_s = time.perf_counter() - t
    tune_nprobe(index, x, cfg)
    build_s = time.perf_counter() - t
    rng = np.random.default_rng(SEED + 7)
    check = rng.choice(n, cfg.recall_queries, replace=False)
    t = time.perf_counter()
    recall = recall_at_10(index, x, check)
    recall_s = time.perf_counter() - t
    live = LiveIndex(index, np.arange(n), "bench")
    lat = []
    for r in rng.choice(n, queries, replace=False):
        t = time.perf_counter()
        live.query(x[r], 100)
        lat.append((time.perf_counter() - t) * 1e3)
    t = time.perf_counter()
    neighbours(index, x[:1000], 100)  # rows of the first 1000 users' lists (self not in them)
    table_s = time.perf_counter() - t
    out = {"n": n, "dim": DIM, "index": index_name(index), "build_s": round(build_s, 2),
           "index_s": round(index_s, 2), "tune_s": round(build_s - index_s, 2),
           "recall_at_10": round(recall, 4), "recall_check_s": round(recall_s, 2),
           "query_ms_p50": round(float(np.median(lat)), 3),
           "query_ms_p99": round(float(np.percentile(lat, 99)), 3),
           "table_s_per_1k": round(table_s, 3), "gen_s": round(gen_s, 2),
           "exact": n < cfg.exact_max}
    log.info("%s: %s", name_of(n), out)
    return out


def table(r: dict) -> str:
    lines = [f"{'size':<12}{'index':<30}{'build s':>9}{'query ms p50':>14}{'p99':>8}"
             f"{'recall@10':>11}{'fill s/1k':>11}"]
    for name, m in r["results"].items():
        lines.append(f"{name:<12}{m['index']:<30}{m['build_s']:>9.1f}{m['query_ms_p50']:>14.3f}"
                     f"{m['query_ms_p99']:>8.2f}{m['recall_at_10']:>11.4f}"
                     f"{m['table_s_per_1k']:>11.2f}")
    ok_recall = all(m["recall_at_10"] >= TARGET_RECALL for m in r["results"].values())
    big = r["results"].get("users_1m")
    ok_build = big is None or (big["build_s"] < TARGET_BUILD_1M_S and not big["exact"])
    lines.append(f"targets: recall@10 >= {TARGET_RECALL} at every size: "
                 f"{'PASS' if ok_recall else 'FAIL'}; 1M approximate and built < "
                 f"{TARGET_BUILD_1M_S:.0f} s: {'PASS' if ok_build else 'FAIL' if big else 'n/a'}")
    lines.append(f"{r['dim']}-d pinned Gaussian mixture, k=100 for one user, faiss threads "
                 f"{r['threads']}, {r['wall_s']:.0f} s in all (a shared 2-core machine)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where to write the numbers")
    ap.add_argument("--sizes", default="100k,1m",
                    help="comma-separated user counts, e.g. 20k,100k (default 100k,1m)")
    ap.add_argument("--threads", type=int, default=1, help="faiss OpenMP threads")
    ap.add_argument("--exact-max", type=int, default=None,
                    help="rows from which the index is IVF (default: KnnConfig's, 1M)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    import faiss

    faiss.omp_set_num_threads(args.threads)
    from solaris.config import KnnConfig

    exact_max = args.exact_max or KnnConfig().exact_max
    t0 = time.perf_counter()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    results = {}
    for n in sizes:
        print(f"measuring {name_of(n)} ...", file=sys.stderr, flush=True)
        results[name_of(n)] = measure(n, exact_max)
    r = {**results, "results": results, "dim": DIM, "threads": args.threads,
         "exact_max": exact_max, "components": COMPONENTS, "seed": SEED, "faiss": faiss.__version__,
         "wall_s": round(time.perf_counter() - t0, 1)}
    print(table(r))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    from machine import NO_FM, machine

    out = {k: v for k, v in r.items() if k != "results"} | {"machine": machine(NO_FM)}
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
