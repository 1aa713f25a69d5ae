"""Benchmark: the history seeding command's throughput against a running app's cache shards.

    python bench/seed_history.py [--users 1500 --interactions 60000] [--shards 2]
        [--chunk-rows 10000 50000] [--repeats 3] [--json OUT.json]

A synthetic log (the embedded generator at the given size) is exported with string ids and
a deployment id map; a local Ray holds the cache shards an app named ``bench`` would run (in
Serve's namespace). For each chunk size, ``jobs/seed_history.py`` runs as its own process
(the command a user runs): a first run into empty shards, then the same command again (every
event already held: the idempotent path). Reports the command's own events per second (the
sending part) and its wall time (log loading and Ray start included), medians of
``--repeats`` fresh shard groups. Prints one table; writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(gcs: str, app: str, mapping: Path, art: Path, shards: int, chunk: int, state: Path
        ) -> tuple[dict, float]:
    cmd = [sys.executable, str(ROOT / "jobs" / "seed_history.py"), "--address", gcs,
           "--app-id", app, "--data", str(mapping), "--artifacts", str(art),
           "--chunk-rows", str(chunk), "--state", str(state), "--set",
           f"cache.num_shards={shards}"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"seed_history failed:\n{p.stderr}")
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("{")][-1]), wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1500)
    ap.add_argument("--interactions", type=int, default=60_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[10_000, 50_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/solaris-seed-bench"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import ray

    from actors.cache import CacheGroup
    from solaris.config import CacheConfig, HistoryConfig, SyntheticConfig
    from solaris.data.export import export_generic
    from solaris.data.generic import load_generic_yaml
    from solaris.data.synthetic import generate
    from solaris.ids import IdMap

    ds = generate(SyntheticConfig(num_users=args.users,
                                  target_interactions=args.interactions))
    mapping = export_generic(ds, args.work / "log", string_ids=True)
    art = args.work / "artifacts"
    IdMap.from_dataset(load_generic_yaml(mapping)).save(art)
    ctx = ray.init(address="local", num_cpus=2, object_store_memory=300 * 1024**2,
                   include_dashboard=False, logging_level="warning",
                   runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    gcs = ctx.address_info["gcs_address"]
    rows = []
    try:
        for chunk in args.chunk_rows:
            got: dict[str, list] = {"first_eps": [], "again_eps": [], "first_wall": [],
                                    "again_wall": [], "events": []}
            for rep in range(args.repeats):
                app = f"bench{chunk}r{rep}"
                group = CacheGroup.create(CacheConfig(num_shards=args.shards), group_id=app,
                                          namespace="serve", history=HistoryConfig())
                group.wait_ready()
                state = args.work / f"{app}.json"
                state.unlink(missing_ok=True)
                first, w1 = run(gcs, app, mapping, art, args.shards, chunk, state)
                state.unlink()
                again, w2 = run(gcs, app, mapping, art, args.shards, chunk, state)
                got["first_eps"].append(first["events_per_s"])
                got["again_eps"].append(again["events_per_s"])
                got["first_wall"].append(w1)
                got["again_wall"].append(w2)
                got["events"].append(first["events"])
                group.shutdown()
            rows.append({"chunk_rows": chunk, "events": got["events"][0],
                         **{k: round(statistics.median(v), 1) for k, v in got.items()
                            if k != "events"}, "runs": got})
    finally:
        ray.shutdown()
    print(f"{args.users} users, {args.interactions} interactions target, {args.shards} shards; "
          f"medians of {args.repeats}")
    print(f"{'chunk rows':>10} {'events':>8} {'first ev/s':>11} {'again ev/s':>11} "
          f"{'first wall s':>13} {'again wall s':>13}")
    for r in rows:
        print(f"{r['chunk_rows']:>10} {r['events']:>8} {r['first_eps']:>11} {r['again_eps']:>11}"
              f" {r['first_wall']:>13} {r['again_wall']:>13}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
