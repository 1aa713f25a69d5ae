"""Benchmark: the request path on the routers' read replica against the round of cache-shard
calls, interleaved in one app, with the FM workers writing during the timed trials.

    python bench/serve_replica.py --json runs/bench_serve_replica.json [--shards 2,4]
        [--trials 5] [--requests 400] [--load 0.25] [--refresh-s 1.0]

Per shard count, a subprocess with its own local Ray runs the app of ``serve_app.py`` (replay
profile, so a request may say which path reads for it: ``reads``), the KNN tables published
and every tier forced on (``--all-tiers`` of ``bench/serve.py``), 500 candidates. Three
modes: the VM alone (``vm``), SOLARIS on the read replica (``replica``) and SOLARIS on the
shard calls (``shards``), interleaved per trial in a shuffled order, at ``--load`` of the
VM-alone saturation rate; the FM workers keep running (``verifier.budget_per_s`` bounds what
they are given), so the shards take writes and the replica pulls them while it is timed.
Reported per mode: p50 / p99 latency, the p50 and p99 overheads over the VM alone (medians of
per-trial ratios), CPU ms per request by process, and SOLARIS's extra CPU per request over
the VM alone with every process of the serving path counted (proxy, router, VMs, shards,
queue, ledger, Serve controller, raylet and GCS; the FM workers, which run on GPU nodes of
their own on a cluster, and the load generator are reported beside it); the saturation rate
of each mode (closed loop, median of runs); cache-shard calls per request on the request
path (answer calls counted inside the shards); the replica's pulls (calls per second and per
request, the shards' export CPU per pull, bytes) and its memory per entry.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # after the project: ``serve`` is the app's package


def _bench_serve():
    """bench/serve.py (its name is the app package's, so it is loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "bench" / "serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sb = _bench_serve()

MODES = {"vm": "vm", "replica": "solaris:replica", "shards": "solaris:shards"}
# not the serving path's CPU: the load generator, and the FM workers (GPU nodes on a cluster)
# with the deployment that drives them
OFF_PATH = ("client", "fm_workers", "precompute")
SIZE = 500


def _shard_metrics(app_id: str, n: int) -> list[dict]:
    """Every shard's metrics (the ``n`` shards of the app's group, found by name)."""
    import ray

    from actors.cache import CacheGroup
    from solaris.config import CacheConfig

    got = CacheGroup.connect(CacheConfig(num_shards=n), app_id).metrics(timeout_s=60)
    down = [s["shard"] for s in got["shards"] if not s["up"]]
    if down:
        raise RuntimeError(f"cache shards {down} did not answer their metrics call")
    return got["shards"]


async def _one(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp
    import requests

    from solaris.online.scoring import Artifacts

    art = Artifacts.open(args.artifacts)
    out: dict[str, Any] = {"shards": args.one}
    stats_url = sb.URL.replace("/rank", "/stats")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        client = sb.Client(session)
        work = sb._workload(art.num_users, art.num_items, SIZE, args.pool, SIZE)
        out["scales_forced"] = bool(sb._force_all_tiers(art))
        for m in MODES.values():
            await client.rank(*work[0], m)
        await sb._open_loop(client, work, "solaris", args.warmup, 20.0, 1)
        client.idle_ms = min([(await client.rank(*work[0], "vm"))[0] for _ in range(5)])
        sat: dict[str, list[float]] = {m: [] for m in MODES}
        for run in range(args.sat_runs):  # interleaved closed-loop runs
            order = list(MODES)
            random.Random(run).shuffle(order)
            for m in order:
                sat[m].append(await sb._closed_loop(client, work, MODES[m], args.sat_requests,
                                                    args.conc))
                await sb._settle(client, work)
        rate = float(np.median(sat["vm"])) * args.load
        out["saturation_rps"] = {m: float(np.median(v)) for m, v in sat.items()}
        out["saturation_runs"] = sat
        out["saturation_ratio"] = {m: out["saturation_rps"][m] / out["saturation_rps"]["vm"]
                                   for m in ("replica", "shards")}
        out["offered_rps"] = rate
        before = requests.get(stats_url, timeout=30).json()
        shards0 = _shard_metrics("bench", args.one)
        per: dict[str, list] = {m: [] for m in MODES}
        t_trials = time.perf_counter()
        for trial in range(-args.warmup_trials, args.trials):
            order = list(MODES)
            random.Random(trial * 31 + args.one).shuffle(order)
            for m in order:
                r = await sb._trial(client, work, MODES[m], args.requests, rate, trial)
                if trial >= 0:
                    per[m].append(r)
                logging.info("shards %d trial %d %s: p50 %.1f p99 %.1f ms, %d errors",
                             args.one, trial, m, r["p50"], r["p99"], r["errors"])
        t_trials = time.perf_counter() - t_trials
        after = requests.get(stats_url, timeout=30).json()
        shards1 = _shard_metrics("bench", args.one)
    n_req = (args.trials + args.warmup_trials) * args.requests
    out["latency_ms"] = {m: {q: float(np.median([r[q] for r in rs])) for q in ("p50", "p99")}
                         for m, rs in per.items()}
    for m in ("replica", "shards"):
        for q in ("p50", "p99"):
            ratios = [x[q] / y[q] for x, y in zip(per[m], per["vm"])]
            out[f"{q}_overhead_{SIZE}_{m}"] = float(np.median(ratios))
            out[f"{q}_overhead_{SIZE}_{m}_per_trial"] = ratios
    cpu = {m: {role: float(np.median([r["cpu_ms_per_request"].get(role, 0.0) for r in rs]))
               for role in sorted({x for r in rs for x in r["cpu_ms_per_request"]})}
           for m, rs in per.items()}
    out["cpu_ms_per_request"] = cpu
    path = {m: sum(v for k, v in c.items() if k not in OFF_PATH) for m, c in cpu.items()}
    out["serving_path_cpu_ms"] = path
    out["extra_cpu_ms"] = {m: path[m] - path["vm"] for m in ("replica", "shards")}
    out["off_path_cpu_ms"] = {m: {k: c.get(k, 0.0) for k in OFF_PATH} for m, c in cpu.items()}
    out["errors"] = int(sum(r["errors"] for rs in per.values() for r in rs))
    out["tier_share"] = {}
    for m in ("replica", "shards"):
        counts: dict[str, int] = {}
        for r in per[m]:
            for t, n in r["tiers"].items():
                counts[t] = counts.get(t, 0) + n
        out["tier_share"][m] = {t: n / max(1, sum(counts.values())) for t, n in counts.items()}
    # shard calls on the request path: answer calls inside the shards over the trials, per
    # request of each SOLARIS mode (the replica mode makes none: all of them are the
    # shards mode's)
    calls = sum(sum(a["calls"] for a in s1["answers"].values())
                - sum(a["calls"] for a in s0["answers"].values())
                for s0, s1 in zip(shards0, shards1))
    n_mode = n_req  # requests of each mode over the counted and warm-up rounds
    rep0, rep1 = before["cache_replica"], after["cache_replica"]
    out["request_path_shard_calls"] = {
        "answer_calls": int(calls),
        "replica_lookups": rep1["lookups"] - rep0["lookups"],
        "shards_lookups": (after["cache_client"]["lookups"]
                           - before["cache_client"]["lookups"]),
        "per_shards_request": calls / n_mode,
        "per_replica_request": 0.0 if rep1["lookups"] > rep0["lookups"] else None}
    pulls = sum(s1["replica_pulls"]["calls"] - s0["replica_pulls"]["calls"]
                for s0, s1 in zip(shards0, shards1))
    pull_cpu = sum(s1["replica_pulls"]["cpu_s"] - s0["replica_pulls"]["cpu_s"]
                   for s0, s1 in zip(shards0, shards1))
    pull_bytes = sum(s1["replica_pulls"]["bytes"] - s0["replica_pulls"]["bytes"]
                     for s0, s1 in zip(shards0, shards1))
    records = sum(rep1["records"]) - sum(rep0["records"])
    sol_requests = 2 * n_mode  # the replica and shards modes' requests (both flush)
    flushes = after["after_answer"]["flushes"] - before["after_answer"]["flushes"]
    out["replica"] = {
        "refresh_s": rep1["refresh_s"], "pull_calls": int(pulls),
        "pull_calls_per_s": pulls / t_trials,
        "pull_calls_per_request": pulls / (3 * n_mode),  # every request of the trials' time
        "shard_export_cpu_ms_per_pull": 1e3 * pull_cpu / max(1, pulls),
        "shard_export_cpu_ms_per_request": 1e3 * pull_cpu / (3 * n_mode),
        "router_refresh_cpu_ms_per_round": 1e3 * (rep1["refresh_cpu_s"] - rep0["refresh_cpu_s"])
        / max(1, rep1["rounds"] - rep0["rounds"]),
        "records_pulled": int(records), "bytes_pulled": int(pull_bytes),
        "entries": rep1["entries"], "bytes": rep1["bytes"],
        "bytes_per_entry": sum(rep1["bytes"]) / max(1, sum(rep1["entries"])),
        "shard_bytes_per_entry": sum(s["total_bytes"] for s in shards1)
        / max(1, sum(s["entries"] for s in shards1)),
        "journal": [s.get("journal") for s in shards1], "stale_answers": rep1["stale_answers"],
        "after_answer_flushes_per_solaris_request": flushes / sol_requests,
        "after_answer_calls_per_solaris_request": flushes * args.one / sol_requests}
    pre = after.get("precompute") or {}
    workers = [w for ws in (pre.get("workers") or {}).values() for w in ws if w]
    out["fm_workers"] = {"ran_in_trials": True, "count": len(workers),
                         "pairs_written": int(sum(w.get("written", 0) for w in workers)),
                         "queue": {k: (pre.get("queue") or {}).get(k)
                                   for k in ("depth", "accepted", "dropped", "acked_pairs")}}
    written = [sum(s1.get("journal", {}).get("seq", 0) for s1 in shards1),
               sum(s0.get("journal", {}).get("seq", 0) for s0 in shards0)]
    out["shard_changes_in_trials"] = written[0] - written[1]
    # the router's median split per mode (solaris:replica, solaris:shards, vm) over its last
    # 2,000 requests of each: where the router's time goes
    out["router_phases_p50_ms"] = after.get("phases_p50")
    # shard-path answers that missed the deadline or failed, per shard, and calls the shards
    # refused for an event time beyond the skew (the bench's clock is its own: none expected)
    out["shard_path_late_failed"] = {k: [a - b for a, b in zip(after["cache_client"][k],
                                                               before["cache_client"][k])]
                                     for k in ("late", "failed")}
    out["clock_refused"] = sum(s.get("clock_refused", 0) for s in shards1)
    out["trials_seconds"] = round(t_trials, 1)
    return out


def run_one(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    import serve_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tmp = tempfile.TemporaryDirectory(prefix="solaris-bench-replica-")
    cfg = Path(tmp.name) / "shards.yaml"
    # the requests' event time advances a second per request whatever the mode, so a shard
    # the replica mode does not call sees time jump: the skew guard is the bench's own clock
    cfg.write_text(json.dumps({"cache": {"num_shards": args.one},
                               "serve": {"replica_refresh_s": args.refresh_s,
                                         "max_skew_s": 1e7},
                               "verifier": {"budget_per_s": args.budget_per_s}}))
    ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=300 * 1024**2,
             include_dashboard=False, logging_level="warning", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT),
                                       "SOLARIS_OPERATOR_TOKEN": sb.OPERATOR_TOKEN}})
    try:
        knn = sb.publish_knn(argparse.Namespace(config=str(cfg), knn_data="synthetic"),
                             args.artifacts, Path(tmp.name))
        serve.run(serve_app.build_app({"artifacts": args.artifacts, "app_id": "bench",
                                       "profile": "replay", "config": str(knn["config"])}),
                  blocking=False)
        out = asyncio.run(_one(args))
    finally:
        serve.shutdown()
        ray.shutdown()
        tmp.cleanup()
    args.json.write_text(json.dumps(out, indent=2))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--shards", default="2,4")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--warmup-trials", type=int, default=1)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--load", type=float, default=0.25)
    p.add_argument("--refresh-s", type=float, default=1.0)
    p.add_argument("--budget-per-s", type=float, default=0.0,
                   help="verifier.budget_per_s: pairs per second handed to the FM workers "
                        "(0: the verifier's fraction alone)")
    p.add_argument("--pool", type=int, default=300)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--sat-requests", type=int, default=200)
    p.add_argument("--sat-runs", type=int, default=3)
    p.add_argument("--conc", type=int, default=8)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--artifacts")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a subprocess: one shard count
    args = p.parse_args()
    if args.artifacts is None:
        from solaris.config import load_config
        from solaris.online.serving import default_artifacts_dir
        from solaris.train.artifacts import ensure_artifacts

        args.artifacts = str(ensure_artifacts(load_config(), default_artifacts_dir(load_config())))
    if args.one is not None:
        return run_one(args)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"by_shards": {}}
    with tempfile.TemporaryDirectory(prefix="solaris-bench-replica-") as tmp:
        for n in [int(x) for x in args.shards.split(",")]:
            js = Path(tmp) / f"shards{n}.json"
            cmd = [sys.executable, __file__, "--one", str(n), "--json", str(js),
                   *[a for k in ("trials", "warmup_trials", "requests", "load", "refresh_s",
                                 "budget_per_s", "pool", "warmup", "sat_requests",
                                 "sat_runs", "conc", "num_cpus", "artifacts")
                     for a in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True)
            result["by_shards"][str(n)] = json.loads(js.read_text())
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    from machine import machine

    result["machine"] = machine(None)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"{'shards':<7}{'path':<9}{'extra CPU ms':>13}{'p50 ovh':>9}{'p99 ovh':>9}"
          f"{'sat ratio':>10}{'shard calls/req':>16}")
    for n, r in result["by_shards"].items():
        for m in ("replica", "shards"):
            calls = (r["request_path_shard_calls"]["per_replica_request"] if m == "replica"
                     else r["request_path_shard_calls"]["per_shards_request"])
            print(f"{n:<7}{m:<9}{r['extra_cpu_ms'][m]:>13.2f}"
                  f"{r[f'p50_overhead_{SIZE}_{m}']:>9.3f}{r[f'p99_overhead_{SIZE}_{m}']:>9.3f}"
                  f"{r['saturation_ratio'][m]:>10.3f}{calls if calls is not None else float('nan'):>16.2f}")
        rp = r["replica"]
        print(f"       replica: {rp['pull_calls_per_s']:.2f} pulls/s "
              f"({rp['pull_calls_per_request']:.3f} per request), shard export "
              f"{rp['shard_export_cpu_ms_per_pull']:.3f} ms/pull, router apply "
              f"{rp['router_refresh_cpu_ms_per_round']:.3f} ms/round, "
              f"{rp['bytes_per_entry']:.1f} B/entry (shard {rp['shard_bytes_per_entry']:.1f}), "
              f"{r['shard_changes_in_trials']} shard changes in the trials, "
              f"errors {r['errors']}")
    print(f"wrote {args.json} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
