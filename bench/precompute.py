"""Benchmark: pairs/s of one CPU FM worker actor, request-side sharing vs the per-pair forward.

    python bench/precompute.py --json runs/bench_precompute.json [--trials 7] [--pairs 16000]
        [--history-len 128] [--seq-layers 1] [--history static|live] [--no-production]

Two FM shapes, each trained for one epoch on the default synthetic data (speed is measured,
not quality) and measured the same way, one after the other:

- **default**: the project's FMConfig, EncoderConfig and FeatureConfig (history_len 32, one
  self-attention layer) -- the headline keys of the JSON;
- **production-shaped**: the same FM reading a longer behaviour sequence (``--history-len``,
  default 128, and ``--seq-layers``, default 1), as production FMs do -- under the JSON key
  ``production_shaped``. The request part is what grows with the sequence, so the share of
  FLOPs that sharing saves grows with it. The project's default config is not changed.

The history store holds every logged event; the benchmark's requests come after the log.
Histories are padded to ``history_len``, so the FM's cost does not depend on how full they
are. ``--history static`` (the default, comparable with earlier runs): every worker holds a
copy of that store. ``--history live``: the production wiring -- the store is seeded into the
cache shards (``CacheGroup.history.replay_log``) and each lease's histories are read from them in
one parallel round, inside the timed loop.

Per trial, lease size and candidates-per-request C in 10, 50, 200: ``--pairs`` pairs in
requests of C distinct items, put in the queue actor (not timed), then one worker actor
drains it end to end -- lease, FM, encoder, cache write (two shard actors), ack, ledger
report -- timed from the driver around one pipelined ``drain`` call. ``shared`` runs
``PrecomputeWorker.run`` (request part once per request), ``naive`` the same artifact's
plain per-pair forward (``run_naive``) on the same batches. Settings are interleaved, the
order rotating per trial; the numbers are medians over trials. The headline is at
``--lease-pairs`` (1024); QueueConfig's default lease (256) is measured beside it (default
shape only), where the per-lease round trips (lease, cache write, ack: a few ms each on 2
cores) weigh more.

``user_side_flop_share``: FLOPs of the FM's request part over the FLOPs of one pair's plain
forward (``solaris/models/flops.py``; matmul-like ops only). With share s the FLOP ceiling of
sharing at C candidates is 1 / (1 - s + s / C); it is printed beside the measurement. It is
not a bound on the measured speedup: the counter sees no embedding gathers, elementwise ops
or layer norms, and those -- (pairs, L, D) tensors in the naive forward -- are mostly
request-side, so the request part's share of the *time* is larger than its share of FLOPs.
What bounds the measured speedup on 2 cores is the per-lease work outside the FM (cache
write, ledger, lease and ack round trips), which sharing does not shrink: the table also
shows the FM alone in process (``fm_only_pairs_per_s``: ``run`` vs ``run_naive`` on the
same leases, no actors), the sharing the FM split itself delivers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import runpy
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
if str(ROOT) not in sys.path:  # ``actors`` is a folder of the repo, not an installed package
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("bench.precompute")

CANDIDATES = (10, 50, 200)
TARGET_SPEEDUP_50 = 3.0
TRAIN = {"train.fm_epochs": 1, "encoder.epochs": 1, "train.vm_epochs": 1, "train.threads": 1}


def build(work: Path, shape: dict | None = None) -> dict:
    """Train the artifacts (``shape``: config overrides, e.g. the history length) unless
    ``work`` already holds them, fill the history store; the FLOP split of one pair."""
    import torch

    from solaris.config import HistoryConfig, load_config
    from solaris.data.load import load_dataset
    from solaris.features import FeatureTables
    from solaris.history import HistoryStore
    from solaris.models.flops import fm_candidate_flops, fm_request_flops, flops_per_pair
    from solaris.artifacts import SideTables, load_models
    from solaris.train.artifacts import train_artifacts

    torch.set_num_threads(1)
    cfg = load_config(None, {**TRAIN, **(shape or {})})
    ds = load_dataset(cfg.data)
    t0 = time.perf_counter()
    if (work / "manifest.json").exists():  # trained earlier with the same shape: reused
        manifest, train_s = json.loads((work / "manifest.json").read_text()), 0.0
        got = {k: manifest["config"][k.split(".")[0]][k.split(".")[1]] for k in shape or {}}
        if got != dict(shape or {}):
            raise SystemExit(f"{work}: trained with {got}, not the asked {shape}")
    else:
        manifest = train_artifacts(cfg, ds, work)
        train_s = time.perf_counter() - t0
    ft = FeatureTables(ds, cfg.features)
    hs = HistoryStore(HistoryConfig(max_events=2 * cfg.features.history_len,
                                    max_users=ds.num_users))
    hs.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts)
    fm, _, _ = load_models(work)
    fm.eval()
    batch = ft.batch(np.arange(ft.num_rows - 512, ft.num_rows))  # late rows: full histories
    req, cand, pair = (fm_request_flops(fm, batch), fm_candidate_flops(fm, batch),
                       flops_per_pair(fm, batch))
    return {"cfg": cfg, "version": manifest["version"], "tables": SideTables.from_features(ft),
            "history": hs, "num_users": ds.num_users, "num_items": ds.num_items,
            "t0": float(ft.ts.max()) + 60.0, "num_surfaces": ds.spec.num_surfaces,
            "train_s": train_s, "history_cfg": hs.cfg,
            "log": (ft.user, ft.item, ft.surface, ft.labels, ft.ts),
            "flops": {"request_per_pair": req, "candidate_per_pair": cand,
                      "plain_forward_per_pair": pair}}


def batch_of(w: dict, c: int, pairs: int, seed: int) -> tuple[np.ndarray, ...]:
    """``pairs // c`` requests of ``c`` distinct items, distinct users, one event time each."""
    rng = np.random.default_rng(seed)
    n_req = max(1, pairs // c)
    users = rng.choice(w["num_users"], n_req, replace=n_req > w["num_users"])
    items = np.concatenate([rng.choice(w["num_items"], c, replace=False) for _ in users])
    now = np.repeat(w["t0"] + np.arange(n_req, dtype=float), c)
    surf = np.repeat(rng.integers(0, w["num_surfaces"], n_req), c)
    return np.repeat(users, c), items, rng.random(n_req * c), now, surf


def leases_of(w: dict, version: str, c: int, pairs: int, lease_pairs: int, seed: int
              ) -> list[list]:
    """``batch_of``'s requests as request groups, cut into leases of ``lease_pairs`` pairs
    (whole groups, at least one per lease)."""
    from solaris.precompute.pqueue import Group

    users, items, prio, now, surf = batch_of(w, c, pairs, seed)
    groups = [Group(int(users[k]), float(now[k]), int(surf[k]), version, items[k:k + c],
                    prio[k:k + c]) for k in range(0, len(users), c)]
    per = max(1, lease_pairs // c)
    return [groups[k:k + per] for k in range(0, len(groups), per)]


def measure_fm_only(w: dict, work: Path, trials: int, pairs: int, lease_pairs: int) -> dict:
    """The same batches through ``PrecomputeWorker.run`` / ``run_naive`` in this process
    (no Ray, no cache, queue or ledger): what sharing saves in the FM itself. Per C, the
    median over interleaved trials of pairs/s."""
    import torch

    from solaris.artifacts import load_models
    from solaris.precompute.worker import PrecomputeWorker

    torch.set_num_threads(1)
    fm, enc, version = load_models(work)
    pw = PrecomputeWorker(fm, enc, w["history"], w["tables"], version)
    out: dict = {str(c): {"shared": [], "naive": []} for c in CANDIDATES}
    for trial in range(-1, trials):  # trial -1 warms up
        for c in CANDIDATES:
            leases = leases_of(w, version, c, pairs, lease_pairs, seed=1000 * max(trial, 0) + c)
            n_pairs = sum(len(g.items) for lease in leases for g in lease)
            modes = [("shared", pw.run), ("naive", pw.run_naive)]
            for mode, fn in modes if trial % 2 else modes[::-1]:
                t0 = time.perf_counter()
                for lease in leases:
                    fn(lease)
                if trial >= 0:
                    out[str(c)][mode].append(n_pairs / (time.perf_counter() - t0))
    return medians(out)


def measure(w: dict, work: Path, trials: int, pairs: int, lease_sizes: list[int],
            history: str = "static", num_cpus: int = 2) -> dict:
    """Interleaved trials on one local Ray; per lease size, C and mode, pairs/s per trial.
    ``history``: ``static`` (a copy in the worker) or ``live`` (read from the shards)."""
    import ray

    from actors.cache import CacheGroup
    from actors.ledger import LedgerActor
    from actors.precompute import WorkerPool
    from actors.queue import create_queue
    from solaris.config import CacheConfig, PrecomputeConfig, QueueConfig
    from solaris.precompute.ledger import speculation_report

    ray.init(address="local", num_cpus=num_cpus, object_store_memory=300 * 1024**2,
             include_dashboard=False, logging_level="warning",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        cfg = w["cfg"]
        cache = CacheGroup.create(CacheConfig(dim=cfg.encoder.width, num_shards=2,
                                              capacity=1_000_000), history=w["history_cfg"])
        cache.wait_ready()
        if history == "live":
            cache.history.replay_log(*w["log"])
        queue = create_queue(QueueConfig(capacity=max(100_000, 2 * pairs),
                                         snapshot_uri=str(work / "queue")))
        ledger = LedgerActor.remote()
        pool = WorkerPool(PrecomputeConfig(workers=1, device="cpu", threads=1), work,
                          w["tables"], w["history"] if history == "static" else None, queue,
                          cache, ledger, num_cpus=1.0)
        pool.wait_ready()
        worker = pool.workers[0]
        runs = [(lp, c, naive) for lp in lease_sizes for c in CANDIDATES
                for naive in (False, True)]
        out: dict = {str(lp): {str(c): {"shared": [], "naive": []} for c in CANDIDATES}
                     for lp in lease_sizes}
        # the worker's phase seconds (and FM seconds) per setting, summed over the trials:
        # read before and after each timed drain, outside the timing
        phases: dict = {}
        pairs_done: dict = {}
        for trial in range(-1, trials):  # trial -1 warms up every path
            k = trial % len(runs)
            for lp, c, naive in runs[k:] + runs[:k]:  # the order rotates per trial
                args = batch_of(w, c, pairs, seed=1000 * max(trial, 0) + c)
                new = ray.get(queue.put.remote(*args, w["version"]))
                m0 = ray.get(worker.metrics.remote())
                t0 = time.perf_counter()
                got = ray.get(worker.drain.remote(naive=naive, lease_pairs=lp))
                dt = time.perf_counter() - t0
                if got["pairs"] != new:
                    raise RuntimeError(f"drained {got['pairs']} of {new} pairs")
                if trial >= 0:
                    mode = "naive" if naive else "shared"
                    out[str(lp)][str(c)][mode].append(new / dt)
                    m1 = ray.get(worker.metrics.remote())
                    key = (str(lp), str(c), mode)
                    ph = phases.setdefault(key, {"wall": 0.0})
                    ph["wall"] += dt
                    ph["fm"] = ph.get("fm", 0.0) + m1["fm_seconds"] - m0["fm_seconds"]
                    for name, v in m1["phase_seconds"].items():
                        ph[name] = ph.get(name, 0.0) + v - m0["phase_seconds"][name]
                    pairs_done[key] = pairs_done.get(key, 0) + new
            log.info("trial %d done", trial)
        phase_us: dict = {}
        for (lp, c, mode), ph in phases.items():
            phase_us.setdefault(lp, {}).setdefault(c, {})[mode] = {
                name: 1e6 * v / pairs_done[(lp, c, mode)] for name, v in ph.items()}
        led = speculation_report(ray.get(ledger.report.remote()), cache.metrics()["shards"], 0)
        wm = ray.get(worker.metrics.remote())
        pool.shutdown()
        cache.shutdown()
        return {"trials": out, "phase_us_per_pair": phase_us,
                "ledger": {k: led[k] for k in ("evaluations", "duplicates", "fm_seconds")},
                "worker": {k: wm[k] for k in ("leases", "pairs", "written", "late_acks",
                                              "fm_seconds", "device", "phase_seconds",
                                              "history")}}
    finally:
        ray.shutdown()


def medians(trials: dict) -> dict:
    return {c: {mode: float(np.median(v)) for mode, v in d.items()} for c, d in trials.items()}


def summarize(w: dict, m: dict, lease_pairs: int, fm_only: dict) -> dict:
    """The reported numbers of one FM shape from its measurements."""
    by_lease = {lp: medians(t) for lp, t in m["trials"].items()}
    med = by_lease[str(lease_pairs)]
    f = w["flops"]
    share = f["request_per_pair"] / f["plain_forward_per_pair"]
    head = m["trials"][str(lease_pairs)]["50"]
    cfg = w["cfg"]
    return {
        "history_len": cfg.features.history_len, "seq_layers": cfg.fm.seq_layers,
        "pairs_per_s": med,
        "sharing_speedup_50": med["50"]["shared"] / med["50"]["naive"],
        # the same from each interleaved trial's own pair of runs, then the median
        "sharing_speedup_50_trial_median": float(np.median(
            np.divide(head["shared"], head["naive"]))),
        "user_side_flop_share": share,
        "flop_ceiling": {str(c): 1.0 / (1.0 - share + share / c) for c in CANDIDATES},
        "flops": f,
        # the FM alone, in process (no actors): the sharing the FM split itself delivers
        "fm_only_pairs_per_s": fm_only,
        "fm_only_speedup_50": fm_only["50"]["shared"] / fm_only["50"]["naive"],
        "pairs_per_s_by_lease_pairs": by_lease,
        "trials_pairs_per_s": m["trials"],
        "version": w["version"], "fm": dataclasses.asdict(cfg.fm),
        "ledger": m["ledger"], "worker": m["worker"], "train_s": w["train_s"],
        # where one worker's time goes, per pair (wall: the driver's timing of the drain;
        # compute / write / lease / ack / write_wait: wall seconds of the worker's phases;
        # compute_cpu / write_cpu: CPU seconds of the threads that ran them; fm: FM seconds)
        "phase_us_per_pair": m["phase_us_per_pair"],
    }


def table(r: dict) -> str:
    shapes = [("default", r)]
    if r.get("production_shaped"):
        shapes.append(("production-shaped", r["production_shaped"]))
    lines = [f"{'FM shape':<19}{'lease pairs':<12}{'cands/request':<15}{'shared pairs/s':>15}"
             f"{'naive pairs/s':>15}{'speedup':>9}{'FLOP ceiling':>14}"]
    for name, x in shapes:
        label = f"{name} (L={x['history_len']}, layers={x['seq_layers']})"
        lines.append(label)
        for lp, by_c in x["pairs_per_s_by_lease_pairs"].items():
            for c in CANDIDATES:
                p = by_c[str(c)]
                head = "  (headline)" if int(lp) == r["lease_pairs"] else ""
                lines.append(f"{'':<19}{lp:<12}{c:<15}{p['shared']:>15,.0f}{p['naive']:>15,.0f}"
                             f"{p['shared'] / p['naive']:>9.2f}"
                             f"{x['flop_ceiling'][str(c)]:>14.2f}{head}")
    lines.append("the FM alone, in process (no actors), same batches, lease "
                 f"{r['lease_pairs']}:")
    for name, x in shapes:
        f = x["fm_only_pairs_per_s"]
        lines.append(f"{name:<19}" + "".join(
            f"C={c}: {f[str(c)]['shared']:,.0f} / {f[str(c)]['naive']:,.0f} = "
            f"{f[str(c)]['shared'] / f[str(c)]['naive']:.2f}x   " for c in CANDIDATES))
    lines.append(f"where one worker's time goes at lease {r['lease_pairs']}, 50 candidates "
                 "(us per pair, summed over trials):")
    for name, x in shapes:
        ph = x["phase_us_per_pair"][str(r["lease_pairs"])]["50"]
        for mode in ("shared", "naive"):
            lines.append(f"{name:<19}{mode:<7}" + "  ".join(
                f"{k} {ph[mode][k]:.1f}" for k in ("wall", "fm", "compute", "compute_cpu",
                                                   "lease", "write_wait", "write",
                                                   "write_cpu")))
    for name, x in shapes:
        ok = x["sharing_speedup_50"] >= TARGET_SPEEDUP_50
        lines.append(f"{name}: sharing_speedup_50 = {x['sharing_speedup_50']:.2f} at lease "
                     f"{r['lease_pairs']}, per-trial median "
                     f"{x['sharing_speedup_50_trial_median']:.2f}  (target >= "
                     f"{TARGET_SPEEDUP_50:.0f}: {'PASS' if ok else 'FAIL'}; FLOP ceiling "
                     f"{x['flop_ceiling']['50']:.2f})")
        lines.append(f"{name}: user_side_flop_share = {x['user_side_flop_share']:.3f}  "
                     f"(request part {x['flops']['request_per_pair'] / 1e6:.2f} MFLOP of "
                     f"{x['flops']['plain_forward_per_pair'] / 1e6:.2f} MFLOP per pair)")
    lines.append(f"one CPU worker actor (1 torch thread, pipelined drain, {r['history']} "
                 f"history), {r['pairs_per_trial']} pairs per setting and trial, median of "
                 f"{r['trials']} interleaved trials; {r['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where to write the numbers")
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=16000, help="pairs per trial and setting")
    ap.add_argument("--lease-pairs", type=int, default=1024,
                    help="pairs per lease of the headline numbers")
    ap.add_argument("--also-lease-pairs", type=int, nargs="*", default=[256],
                    help="further lease sizes measured alongside (256: QueueConfig's default; "
                         "default shape only)")
    ap.add_argument("--history-len", type=int, default=128,
                    help="history length of the production-shaped FM")
    ap.add_argument("--seq-layers", type=int, default=1,
                    help="self-attention layers of the production-shaped FM")
    ap.add_argument("--no-production", action="store_true",
                    help="measure the default shape only")
    ap.add_argument("--history", choices=("static", "live"), default="static",
                    help="the worker's history: a static copy, or live from the cache shards")
    ap.add_argument("--num-cpus", type=int, default=2,
                    help="logical CPUs of the local Ray (2: the 2-core profile)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    t0 = time.perf_counter()
    sizes = sorted({args.lease_pairs, *args.also_lease_pairs})
    prod = {"features.history_len": args.history_len, "fm.seq_layers": args.seq_layers}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "default"
        fm_trials = max(1, min(args.trials, 3))
        w = build(work)
        fm_only = measure_fm_only(w, work, fm_trials, args.pairs, args.lease_pairs)
        r = summarize(w, measure(w, work, args.trials, args.pairs, sizes, args.history,
                                 args.num_cpus),
                      args.lease_pairs, fm_only)
        if not args.no_production:
            work = Path(tmp) / "production"
            w = build(work, prod)
            fm_only = measure_fm_only(w, work, fm_trials, args.pairs, args.lease_pairs)
            r["production_shaped"] = summarize(
                w, measure(w, work, args.trials, args.pairs, [args.lease_pairs], args.history,
                           args.num_cpus),
                args.lease_pairs, fm_only)
    r.update(trials=args.trials, pairs_per_trial=args.pairs, lease_pairs=args.lease_pairs,
             history=args.history, target_speedup_50=TARGET_SPEEDUP_50,
             num_cpus=args.num_cpus)
    r["wall_s"] = time.perf_counter() - t0
    machine = sibling("machine").machine
    r["machine"] = machine({v["worker"]["device"] for v in r.values()
                            if isinstance(v, dict) and "worker" in v})
    print(table(r))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
