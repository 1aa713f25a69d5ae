"""Serving benchmark: the VM alone vs SOLARIS vs the FM inline, real HTTP on loopback.

    python bench/serve.py --json runs/bench_serve.json [--artifacts DIR] [--trials 5]

One local Ray, the app of ``serve_app.py``; its FM workers fill the cache during the warm-up
and are paused for the timed trials unless ``--workers-during-trials`` (on 2 cores they would
take the serving CPU; on a cluster they run on GPU nodes of their own). The JSON says which,
and how many pairs they wrote. Per candidate count (100, 500): the VM-alone saturation rate
is measured closed-loop (the median of ``--sat-runs`` runs), then the three modes run
open-loop (Poisson arrivals) at half that rate in interleaved trials of ``--requests`` each
(mode order shuffled per trial), after ``--warmup-trials`` (1) rounds run the same way and
not counted: latencies of every mode settle over the first rounds at that rate. Overheads are
medians over trials of per-trial ratios. A request whose final answer is non-2xx after at
most one retry counts as an error. Per trial, the CPU seconds of every process of the run
(from /proc, by role: proxy, router, VM, cache shards, queue, ...) are read before and
after, so ``cpu_ms_per_request`` shows what each mode costs the machine and where.
Before the app starts, the KNN rebuild job (``jobs/rebuild_knn.py``, Ray Data) publishes
user and item neighbour tables once, so the SOLARIS lookups probe neighbours' pairs in
every shard as a deployed app's do (``--knn-data none``: own pairs and the aggregate only).
``fm_vm_compute_ratio`` is measured in-process: per-pair compute time of the FM (the plain
per-pair forward + encoder, as the inline mode runs it) over the VM, on the same batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("vm", "solaris", "inline")
URL = "http://127.0.0.1:8000/rank"
# this run's operator token (POST /scales for --all-tiers): made per run, never stored
OPERATOR_TOKEN = secrets.token_urlsafe(24)
T0 = 1.9e9  # event time of the run (epoch seconds); requests advance it by 1 s each
TIMEOUT_S = 60.0  # a client's patience: an overloaded mode shows as latency, not as errors


def _workload(num_users: int, num_items: int, size: int, pool: int, seed: int
              ) -> list[tuple[int, list[int]]]:
    """A pool of users, each with one fixed candidate list (repeat requests hit the cache)."""
    rng = np.random.default_rng(seed)
    users = rng.choice(num_users, min(pool, num_users), replace=False)
    return [(int(u), rng.choice(num_items, size, replace=False).tolist()) for u in users]


class Client:
    def __init__(self, session: Any):
        self.session = session
        self.tick = 0
        self.idle_ms: float | None = None  # a VM-alone request on the idle server

    async def rank(self, user: int, cands: list[int], mode: str) -> tuple[float, int, int, dict]:
        """(latency ms, final status, retries, body) of one request, one retry on non-2xx."""
        import aiohttp

        self.tick += 1
        mode, _, reads = mode.partition(":")  # "solaris:shards": the lookup path too
        body = {"user_id": user, "candidates": cands, "task": "click", "mode": mode,
                "now": T0 + self.tick}
        if reads:
            body["reads"] = reads
        retries, status, out = 0, 0, {}
        t = time.perf_counter()
        for attempt in (0, 1):
            try:
                async with self.session.post(URL, json=body,
                                             timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
                    status = r.status
                    out = await r.json() if r.status == 200 else {}
            except Exception:
                status = 599
            if 200 <= status < 300:
                break
            retries += attempt == 0
        return (time.perf_counter() - t) * 1000.0, status, retries, out


async def _closed_loop(client: Client, work: list, mode: str, n: int, conc: int) -> float:
    """Requests per second with ``conc`` clients back to back (the saturation rate)."""
    it = iter(range(n))

    async def one() -> None:
        for _ in it:
            u, c = random.choice(work)
            await client.rank(u, c, mode)
    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(conc)))
    return n / (time.perf_counter() - t)


async def _settle(client: Client, work: list, limit_s: float = 60.0) -> None:
    """Wait until a VM-alone request answers about as fast as on the idle server (an
    overloaded trial's backlog has drained), at most ``limit_s``."""
    t_end = time.perf_counter() + limit_s
    while time.perf_counter() < t_end:
        lat = (await client.rank(*work[0], "vm"))[0]
        if client.idle_ms is None or lat <= 3 * client.idle_ms:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(0.5)


async def _trial(client: Client, work: list, mode: str, n: int, rate: float, seed: int
                 ) -> dict[str, Any]:
    """One timed open-loop round, then a settle; with the CPU ms per request of each process
    role over both (the after-answer work and the settle's few VM-alone probes included)."""
    cpu0 = cpu_by_role()
    r = await _open_loop(client, work, mode, n, rate, seed)
    await _settle(client, work)  # an overloaded round's backlog drains first
    cpu1 = cpu_by_role()
    r["cpu_ms_per_request"] = {k: 1e3 * (cpu1[k] - cpu0.get(k, 0.0)) / n for k in cpu1}
    return r


async def _sweep(client: Client, work: list, loads: list[float], sat: float,
                 args: argparse.Namespace) -> dict[str, Any]:
    """VM alone vs SOLARIS at each offered load (a share of the VM-alone saturation rate
    ``sat``), interleaved: per trial every load, both modes in a shuffled order."""
    per: dict[float, dict[str, list]] = {x: {"vm": [], "solaris": []} for x in loads}
    for trial in range(args.trials):
        for x in loads:
            order = ["vm", "solaris"]
            random.Random(7919 * trial + int(1000 * x)).shuffle(order)
            for m in order:
                r = await _trial(client, work, m, args.requests, sat * x, 5000 + trial)
                per[x][m].append(r)
                logging.info("sweep trial %d load %.3f %s: p50 %.1f ms, %d errors", trial, x,
                             m, r["p50"], r["errors"])
    out = {}
    for x, rs in per.items():
        ratios = [a["p50"] / b["p50"] for a, b in zip(rs["solaris"], rs["vm"])]
        out[f"{x:g}"] = {
            "offered_rps": sat * x, "p50_overhead": float(np.median(ratios)),
            "p50_overhead_per_trial": ratios,
            "p50_ms": {m: float(np.median([r["p50"] for r in rs[m]])) for m in rs},
            "p99_ms": {m: float(np.median([r["p99"] for r in rs[m]])) for m in rs},
            "cpu_ms_per_request": {m: float(np.median([sum(r["cpu_ms_per_request"].values())
                                                       for r in rs[m]])) for m in rs},
            "errors": int(sum(r["errors"] for m in rs for r in rs[m]))}
    return out


def plot_sweep(sweep: dict[str, Any], size: int, path: Path) -> Path:
    """p50 overhead (per trial and median) and each mode's p50 against the offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = sorted(sweep, key=float)
    load = [float(x) for x in xs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for x in xs:
        pts = sweep[x]["p50_overhead_per_trial"]
        a.scatter([float(x)] * len(pts), pts, color="0.6", s=12)
    a.plot(load, [sweep[x]["p50_overhead"] for x in xs], "o-", label="median over trials")
    a.axhline(1.3, color="tab:red", ls="--", lw=1, label="target 1.3")
    a.set(xlabel="offered load / VM-alone saturation rate",
          ylabel=f"SOLARIS p50 / VM-alone p50 ({size} candidates)")
    a.legend()
    for m, label in (("vm", "VM alone"), ("solaris", "SOLARIS")):
        b.plot(load, [sweep[x]["p50_ms"][m] for x in xs], "o-", label=label)
    b.set(xlabel="offered load / VM-alone saturation rate", ylabel="p50 latency (ms)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def _open_loop(client: Client, work: list, mode: str, n: int, rate: float, seed: int
                     ) -> dict[str, Any]:
    rng = random.Random(seed)
    tasks = []
    start = time.perf_counter()
    at = 0.0
    for _ in range(n):
        at += rng.expovariate(rate)
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        u, c = rng.choice(work)
        tasks.append(asyncio.create_task(client.rank(u, c, mode)))
    res = await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    lat = np.array([r[0] for r in res])
    ok = [r for r in res if 200 <= r[1] < 300]
    tiers: dict[str, int] = {}
    for r in ok:
        for t in r[3].get("tiers", []):
            tiers[t] = tiers.get(t, 0) + 1
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "rps": len(ok) / wall, "errors": len(res) - len(ok),
            "retries": sum(r[2] for r in res), "tiers": tiers}


# the processes of a local run by role, from their titles (``ray::<actor class>``, Serve's
# replicas name their deployment); CPU seconds from /proc (Linux; empty elsewhere)
ROLES = (("router", "LookupRouter"), ("vm", "VM_"), ("proxy", "ProxyActor"),
         ("cache_shards", "CacheShard"), ("queue", "PrecomputeQueue"), ("ledger", "Ledger"),
         ("fm_workers", "FMWorker"), ("precompute", "Precompute"),
         ("serve_controller", "ServeController"))


def cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of this machine's Ray processes by role, this
    process (the load generator) as ``client``, raylet and GCS as ``ray_core``."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    for pid in (os.listdir("/proc") if os.path.isdir("/proc") else []):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                name = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == os.getpid():
            role = "client"
        elif name.startswith("ray::"):
            role = next((r for r, key in ROLES if key in name), "ray_other")
        elif name.endswith(("/raylet", "/gcs_server")):
            role = "ray_core"
        else:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def shard_answers(app_id: str) -> dict[str, list[float]]:
    """Per kind of lookup query (the user's own shard, neighbour probes only), summed over
    the app's cache shards: [calls, thread CPU s, wall s] inside ``CacheShard.answer``."""
    import ray

    from actors.shard import shard_name

    out: dict[str, list[float]] = {}
    s = 0
    while True:
        try:
            shard = ray.get_actor(shard_name(app_id, s))
        except ValueError:
            return out
        for kind, a in ray.get(shard.metrics.remote(), timeout=30).get("answers", {}).items():
            o = out.setdefault(kind, [0, 0.0, 0.0])
            o[0], o[1], o[2] = o[0] + a["calls"], o[1] + a["cpu_s"], o[2] + a["wall_s"]
        s += 1


def publish_knn(args: argparse.Namespace, art_dir: str, tmp: Path) -> dict[str, Any]:
    """One run of the KNN rebuild job (Ray Data, on the local Ray) into ``tmp``, and the
    app's config (``--config`` with ``knn.table_uri`` set) written beside it."""
    import yaml

    from jobs.rebuild_knn import rebuild
    from solaris.config import config_to_dict, load_config

    cfg = load_config(args.config, {"knn.table_uri": str(tmp / "knn")})
    data = args.knn_data
    if data == "synthetic":
        from solaris.data.synthetic import generate_to_parquet

        data = str(tmp / "data")
        generate_to_parquet(cfg.data.synthetic, data)
    t = time.perf_counter()
    summary = rebuild(data, art_dir, str(tmp / "knn"), cfg.knn, encoders=1,
                      encoder_cpus=0.25, task_cpus=0.25, use_gpu=False)
    logging.info("KNN tables %s published in %.1f s", summary["version"],
                 time.perf_counter() - t)
    path = tmp / "app-config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return {"config": path, "version": summary["version"],
            "users": summary["user"]["rows"], "items": summary["item"]["rows"],
            "seconds": summary["seconds"]}


def compute_ratio(artifacts: str, size: int = 500, reps: int = 15) -> dict[str, float]:
    """Per-pair compute time of the FM over the VM on one batch of ``size`` candidates."""
    import torch

    from solaris.config import HistoryConfig
    from solaris.history import HistoryStore
    from solaris.online.scoring import Artifacts, InlineFM, ScoreRequest, VMScorer

    torch.set_num_threads(1)
    art = Artifacts.open(artifacts)
    side = art.side_tables()
    hist = HistoryStore(HistoryConfig())
    rng = np.random.default_rng(0)
    for k in range(40):  # a history for user 0
        hist.record_impressions(0, rng.choice(art.num_items, 1), 0, T0 - 4000 + 60 * k)
    items = rng.choice(art.num_items, min(size, art.num_items), replace=False)
    vm = VMScorer(art, art.tasks[0], side)
    fms = {"per_pair": InlineFM(art, side, hist, sharing=False),
           "shared": InlineFM(art, side, hist, sharing=True)}
    slots = fms["shared"].slots(0, items, 0, T0)

    def med(f) -> float:
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))
    t_vm = med(lambda: vm.score([ScoreRequest(0, items, 0, slots)]))
    out = {"vm_ms": t_vm * 1e3}
    for k, fm in fms.items():
        t = med(lambda fm=fm: fm.embed(0, items, 0, T0))
        out[f"fm_{k}_ms"] = t * 1e3
        out[f"ratio_{k}"] = t / t_vm
    return out


def _force_all_tiers(art: Any) -> dict[str, Any]:
    """Set every scale of every VM of ``art`` to 1 through ``POST /scales``; returns the
    scales the router reports after."""
    import requests

    from solaris.online.scales import PAIR_TIERS

    for task in art.tasks:
        for slot, tier in [("pair", t) for t in PAIR_TIERS] + [("aggregate", None)]:
            r = requests.post(URL.replace("/rank", "/scales"), timeout=30, json={
                "task": task, "slot": slot, "tier": tier, "scale": 1.0},
                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
            r.raise_for_status()
    return requests.get(URL.replace("/rank", "/scales"), timeout=30).json()


async def _run(args: argparse.Namespace, art_dir: str) -> dict[str, Any]:
    import aiohttp
    import requests

    from solaris.online.scoring import Artifacts

    art = Artifacts.open(art_dir)
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"latency_ms": {}, "throughput_rps": {}, "trials": {}, "rates": {}}
    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn) as session:
        client = Client(session)
        works = {s: _workload(art.num_users, art.num_items, s, args.pool, s) for s in sizes}
        if args.all_tiers:  # every tier and the aggregate looked up and applied, whatever
            # the scales the VMs chose on validation (the cost of the full lookup)
            out["scales_forced"] = _force_all_tiers(art)
        for s in sizes:  # warm every path once, then let speculation fill the cache a while
            for m in MODES:
                await client.rank(*works[s][0], m)
            await _open_loop(client, works[s], "solaris", args.warmup, 20.0, 1)
        client.idle_ms = min([(await client.rank(*works[sizes[0]][0], "vm"))[0]
                              for _ in range(5)])
        if not args.workers_during_trials:  # on a cluster they run on their own GPU nodes
            from ray import serve

            paused = serve.get_deployment_handle("Precompute", app_name="default").pause.remote()
            out["fm_workers_paused_for_trials"] = await paused
        for s in sizes:  # the median of a few closed-loop runs: one alone varies a lot here
            runs = [await _closed_loop(client, works[s], "vm", args.sat_requests, args.conc)
                    for _ in range(args.sat_runs)]
            sat = float(np.median(runs))
            out["rates"][str(s)] = {"vm_saturation_rps": sat, "offered_rps": sat * args.load,
                                    "vm_saturation_runs": runs}
            logging.info("size %d: VM-alone saturation %.1f rps; offering %.1f", s, sat,
                         sat * args.load)
        modes = [m for m in MODES if m in args.modes.split(",") or m != "inline"]
        answers0 = shard_answers("bench")
        per: dict[str, list[dict]] = {f"{m}_{s}": [] for m in modes for s in sizes}
        warm: dict[str, list[dict]] = {f"{m}_{s}": [] for m in modes for s in sizes}
        # the first --warmup-trials rounds run exactly like a trial but are not counted: at
        # the offered rate the app's latencies settle over the first rounds (kept in the JSON)
        for trial in range(-args.warmup_trials, args.trials):
            for s in sizes:
                order = list(modes)
                random.Random(trial * 31 + s).shuffle(order)
                for m in order:
                    r = await _trial(client, works[s], m, args.requests,
                                     out["rates"][str(s)]["offered_rps"], trial)
                    (per if trial >= 0 else warm)[f"{m}_{s}"].append(r)
                    logging.info("trial %d %s_%d: p50 %.1f p99 %.1f ms, %.1f rps, %d errors",
                                 trial, m, s, r["p50"], r["p99"], r["rps"], r["errors"])
        if args.sweep_loads:  # the same app and cache, after the trials, at the largest size
            big = max(sizes)
            out["load_sweep"] = await _sweep(
                client, works[big], sorted({float(x) for x in args.sweep_loads.split(",")}),
                out["rates"][str(big)]["vm_saturation_rps"], args)
    # inside the shards over every timed round (the warm-up round and any sweep included),
    # per answer call
    out["shard_answer_ms"] = {}
    for kind, (n, cpu, wall) in shard_answers("bench").items():
        n0, cpu0, wall0 = answers0.get(kind, (0, 0.0, 0.0))
        calls = int(n - n0)
        out["shard_answer_ms"][kind] = {"calls": calls,
                                        "cpu_ms_mean": 1e3 * (cpu - cpu0) / max(1, calls),
                                        "wall_ms_mean": 1e3 * (wall - wall0) / max(1, calls)}
    for k, rs in per.items():
        out["latency_ms"][k] = {"p50": float(np.median([r["p50"] for r in rs])),
                                "p99": float(np.median([r["p99"] for r in rs]))}
        out["throughput_rps"][k] = float(np.median([r["rps"] for r in rs]))
        out["trials"][k] = rs
    # what the SOLARIS lookups found: candidates by tier over the timed trials
    out["tier_share"] = {}
    for k, rs in per.items():
        if not k.startswith("solaris"):
            continue
        counts: dict[str, int] = {}
        for r in rs:
            for t, n in r["tiers"].items():
                counts[t] = counts.get(t, 0) + n
        if counts:
            out["tier_share"][k] = {t: n / sum(counts.values()) for t, n in sorted(counts.items())}
    out["cpu_ms_per_request"] = {
        k: {role: float(np.median([r["cpu_ms_per_request"].get(role, 0.0) for r in rs]))
            for role in sorted({x for r in rs for x in r["cpu_ms_per_request"]})}
        for k, rs in per.items()}
    # errors and retries count every timed request, the uncounted warm-up rounds' included
    out["errors"] = int(sum(r["errors"] for d in (per, warm) for rs in d.values() for r in rs))
    out["errors_by_mode"] = {k: int(sum(r["errors"] for r in rs)) for k, rs in per.items()}
    out["retries"] = int(sum(r["retries"] for d in (per, warm) for rs in d.values() for r in rs))
    big = max(sizes)

    def ratio(a: str, b: str, q: str) -> float:
        return float(np.median([x[q] / y[q] for x, y in zip(per[f"{a}_{big}"], per[f"{b}_{big}"])]))
    out["warmup_trials"] = warm
    out[f"p50_overhead_{big}_per_trial"] = [x["p50"] / y["p50"] for x, y in
                                            zip(per[f"solaris_{big}"], per[f"vm_{big}"])]
    out[f"p50_overhead_{big}"] = ratio("solaris", "vm", "p50")
    out[f"p99_overhead_{big}"] = ratio("solaris", "vm", "p99")
    if "inline" in modes:
        out[f"inline_slowdown_{big}"] = ratio("inline", "solaris", "p50")
    stats = requests.get(URL.replace("/rank", "/stats"), timeout=30).json()
    # the router's own median split per mode over its last 2,000 requests of that mode (both
    # sizes): awaiting the lookup round, awaiting the VM, building the answer
    out["router_phases_p50_ms"] = stats.get("phases_p50")
    # the router's lookup rounds over the whole run (warm-up included): shard answers that
    # missed the deadline (``cache.deadline_ms``, read as misses) or failed, per shard
    out["cache_client"] = {k: (stats.get("cache_client") or {}).get(k)
                           for k in ("lookups", "late", "failed", "history_writes")}
    # the after-answer work over the whole run: SOLARIS requests, flushes, queue calls
    out["after_answer"] = stats.get("after_answer")
    pre = stats.get("precompute") or {}
    workers = [w for ws in (pre.get("workers") or {}).values() for w in ws if w]
    out["fm_workers"] = {"ran_in_warmup": bool(workers),
                         "ran_in_trials": bool(args.workers_during_trials),
                         "count": len(workers),
                         "pairs_written": int(sum(w.get("written", 0) for w in workers)),
                         "devices": pre.get("fm_devices"),
                         "queue": {k: (pre.get("queue") or {}).get(k) for k in
                                   ("depth", "accepted", "dropped", "acked_pairs", "lag_s_mean")}}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--artifacts", help="artifact dir (default: the embedded default, built once)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--requests", type=int, default=400, help="requests per trial and mode")
    p.add_argument("--warmup-trials", type=int, default=1,
                   help="interleaved rounds run before the trials and not counted")
    p.add_argument("--sizes", default="100,500")
    p.add_argument("--modes", default=",".join(MODES),
                   help="modes to time (vm and solaris always; leaving out inline makes a "
                        "quicker A/B, without inline_slowdown)")
    p.add_argument("--config", help="the app's config tree (YAML; default: the defaults)")
    p.add_argument("--knn-data", default="synthetic",
                   help="the data (a `solaris data` directory) the KNN rebuild job reads "
                        "before the app starts, so lookups probe user and item neighbours; "
                        "'synthetic' (default) writes the embedded default's to a temporary "
                        "directory, 'none' serves without KNN tables (own pairs and the "
                        "aggregate only)")
    p.add_argument("--num-cpus", type=int, default=2,
                   help="logical CPUs of the local Ray (2: the 2-core profile)")
    p.add_argument("--load", type=float, default=0.5, help="offered load / VM-alone saturation")
    p.add_argument("--sweep-loads", default="",
                   help="after the trials: VM alone vs SOLARIS at these loads too (e.g. "
                        "0.125,0.25,0.375,0.5; largest size, --trials interleaved rounds), "
                        "in the JSON as load_sweep and plotted beside it (.png)")
    p.add_argument("--pool", type=int, default=300, help="users in the workload")
    p.add_argument("--warmup", type=int, default=200, help="SOLARIS requests before the trials")
    p.add_argument("--sat-requests", type=int, default=200)
    p.add_argument("--sat-runs", type=int, default=3,
                   help="closed-loop runs whose median is the VM-alone saturation rate")
    p.add_argument("--conc", type=int, default=8, help="clients of the saturation run")
    p.add_argument("--all-tiers", action="store_true",
                   help="set every VM's scales to 1 first (POST /scales), so every tier and "
                        "the aggregate are looked up and applied: the full lookup's cost")
    p.add_argument("--workers-during-trials", action="store_true",
                   help="keep the FM workers running in the timed trials (default: they fill "
                        "the cache in the warm-up, then pause: on 2 cores they would take the "
                        "serving CPU, on a cluster they have GPU nodes of their own)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")

    import ray
    from ray import serve

    import serve_app
    from solaris.config import load_config
    from solaris.online.serving import default_artifacts_dir
    from solaris.train.artifacts import ensure_artifacts

    if args.artifacts and args.knn_data == "synthetic":
        p.error("--artifacts: pass --knn-data DIR (the data they were trained on) or none")
    art_dir = args.artifacts or str(ensure_artifacts(load_config(), default_artifacts_dir(load_config())))
    t0 = time.perf_counter()
    ratio = compute_ratio(art_dir)
    tmp = tempfile.TemporaryDirectory(prefix="solaris-bench-serve-")
    ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=300 * 1024**2,
             include_dashboard=False,
             logging_level="warning", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT),
                                       "SOLARIS_OPERATOR_TOKEN": OPERATOR_TOKEN}})
    try:
        app_args = {"artifacts": art_dir, "app_id": "bench", "profile": "replay"}  # `now`, `mode`
        knn = None
        if args.knn_data != "none":
            knn = publish_knn(args, art_dir, Path(tmp.name))
            app_args["config"] = str(knn["config"])
        elif args.config:
            app_args["config"] = args.config
        serve.run(serve_app.build_app(app_args), blocking=False)
        out = asyncio.run(_run(args, art_dir))
        out["knn"] = knn and {k: v for k, v in knn.items() if k != "config"}
    finally:
        serve.shutdown()
        ray.shutdown()
        tmp.cleanup()
    out["fm_vm_compute_ratio"] = ratio["ratio_per_pair"]
    out["compute_ms_500"] = ratio
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["config"] = vars(args) | {"json": str(args.json), "artifacts": art_dir}
    from machine import machine

    out["machine"] = machine(out["fm_workers"]["devices"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    keys = [k for k in out["latency_ms"]]
    print(f"{'mode_size':<14}{'p50 ms':>10}{'p99 ms':>10}{'rps':>8}")
    for k in sorted(keys, key=lambda k: (int(k.split('_')[1]), MODES.index(k.split('_')[0]))):
        print(f"{k:<14}{out['latency_ms'][k]['p50']:>10.2f}{out['latency_ms'][k]['p99']:>10.2f}"
              f"{out['throughput_rps'][k]:>8.1f}")
    big = max(int(s) for s in args.sizes.split(","))
    for k, target in ((f"p50_overhead_{big}", "<= 1.3"), (f"p99_overhead_{big}", "(report)"),
                      ("fm_vm_compute_ratio", ">= 20"), (f"inline_slowdown_{big}", ">= 5"),
                      ("errors", "= 0"), ("retries", "")):
        if k not in out:
            continue
        print(f"{k:<24}{out[k]:>10.3f}  {target}" if isinstance(out[k], float)
              else f"{k:<24}{out[k]:>10}  {target}")
    cpu = out["cpu_ms_per_request"]
    order = ["client", *(r for r, _ in ROLES), "ray_core", "ray_other"]
    roles = [r for r in order if any(r in v for v in cpu.values())]  # every role measured
    print("CPU ms per request by process (medians over trials): " + " ".join(roles))
    for k in sorted(cpu, key=lambda k: (int(k.split('_')[1]), MODES.index(k.split('_')[0]))):
        print(f"{k:<14}" + " ".join(f"{cpu[k].get(r, 0.0):.2f}" for r in roles)
              + f"  total {sum(cpu[k].values()):.2f}")
    if "load_sweep" in out:
        print("load sweep (offered load: p50 overhead, VM alone / SOLARIS p50 ms, CPU ms per "
              "request):")
        for x, r in sorted(out["load_sweep"].items(), key=lambda kv: float(kv[0])):
            print(f"  {float(x):.3f} ({r['offered_rps']:.1f} rps): {r['p50_overhead']:.3f}  "
                  f"{r['p50_ms']['vm']:.1f} / {r['p50_ms']['solaris']:.1f}  "
                  f"{r['cpu_ms_per_request']['vm']:.1f} / {r['cpu_ms_per_request']['solaris']:.1f}")
        print(f"  plot: {plot_sweep(out['load_sweep'], big, args.json.with_suffix('.png'))}")
    for k, share in out["tier_share"].items():
        print(f"{k} candidates by tier: " + ", ".join(f"{t} {v:.3f}" for t, v in share.items()))
    fw = out["fm_workers"]
    print(f"FM workers: ran in the warm-up ({fw['pairs_written']} pairs written), "
          f"{'ran' if fw['ran_in_trials'] else 'paused'} in the trials; wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
