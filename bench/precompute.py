"""Benchmark: pairs/s of one CPU FM worker actor, request-side sharing vs the per-pair forward.

    python bench/precompute.py --json runs/bench_precompute.json [--trials 7] [--pairs 16000]

Artifacts: the default FMConfig and EncoderConfig (the real FM size) trained for one epoch on
the default synthetic data (speed is measured, not quality). The history store holds every
logged event; the benchmark's requests come after the log, so every user reads a full
history of ``features.history_len`` events.

Per trial, lease size and candidates-per-request C in 10, 50, 200: ``--pairs`` pairs in
requests of C distinct items, put in the queue actor (not timed), then one worker actor
drains it end to end -- lease, FM, encoder, cache write (two shard actors), ack, ledger
report -- timed from the driver around one pipelined ``drain`` call. ``shared`` runs
``PrecomputeWorker.run`` (request part once per request), ``naive`` the same artifact's
plain per-pair forward (``run_naive``) on the same batches. Settings are interleaved, the
order rotating per trial; the numbers are medians over trials. The headline is at
``--lease-pairs`` (1024); QueueConfig's default lease (256) is measured beside it, where the
per-lease round trips (lease, cache write, ack: a few ms each on 2 cores) weigh more.

``user_side_flop_share``: FLOPs of the FM's request part over the FLOPs of one pair's plain
forward (``solaris/models/flops.py``; matmul-like ops only). With share s the FLOP ceiling of
sharing at C candidates is 1 / (1 - s + s / C); it is printed beside the measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``actors`` is a folder of the repo, not an installed package
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("bench.precompute")

CANDIDATES = (10, 50, 200)
TARGET_SPEEDUP_50 = 3.0
TRAIN = {"train.fm_epochs": 1, "encoder.epochs": 1, "train.vm_epochs": 1, "train.threads": 1}


def build(work: Path) -> dict:
    """Train the artifacts, fill the history store; the FLOP split of one pair."""
    import torch

    from solaris.config import HistoryConfig, load_config
    from solaris.data.load import load_dataset
    from solaris.features import FeatureTables
    from solaris.history import HistoryStore
    from solaris.models.flops import fm_candidate_flops, fm_request_flops, flops_per_pair
    from solaris.precompute import SideTables, load_models
    from solaris.train.artifacts import train_artifacts

    torch.set_num_threads(1)
    cfg = load_config(None, TRAIN)
    ds = load_dataset(cfg.data)
    t0 = time.perf_counter()
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
            "train_s": train_s,
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


def measure(w: dict, work: Path, trials: int, pairs: int, lease_sizes: list[int]) -> dict:
    """Interleaved trials on one local Ray; per lease size, C and mode, pairs/s per trial."""
    import ray

    from actors.cache import CacheGroup
    from actors.ledger import LedgerActor
    from actors.precompute import WorkerPool
    from actors.queue import create_queue
    from solaris.config import CacheConfig, PrecomputeConfig, QueueConfig

    ray.init(num_cpus=2, object_store_memory=300 * 1024**2, include_dashboard=False,
             logging_level="warning", runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        cfg = w["cfg"]
        cache = CacheGroup.create(CacheConfig(dim=cfg.encoder.width, num_shards=2,
                                              capacity=1_000_000))
        queue = create_queue(QueueConfig(capacity=max(100_000, 2 * pairs),
                                         snapshot_uri=str(work / "queue")))
        ledger = LedgerActor.remote()
        pool = WorkerPool(PrecomputeConfig(workers=1, device="cpu", threads=1), work,
                          w["tables"], w["history"], queue, cache, ledger, num_cpus=1.0)
        cache.wait_ready()
        pool.wait_ready()
        worker = pool.workers[0]
        runs = [(lp, c, naive) for lp in lease_sizes for c in CANDIDATES
                for naive in (False, True)]
        out: dict = {str(lp): {str(c): {"shared": [], "naive": []} for c in CANDIDATES}
                     for lp in lease_sizes}
        for trial in range(-1, trials):  # trial -1 warms up every path
            k = trial % len(runs)
            for lp, c, naive in runs[k:] + runs[:k]:  # the order rotates per trial
                args = batch_of(w, c, pairs, seed=1000 * max(trial, 0) + c)
                new = ray.get(queue.put.remote(*args, w["version"]))
                t0 = time.perf_counter()
                got = ray.get(worker.drain.remote(naive=naive, lease_pairs=lp))
                dt = time.perf_counter() - t0
                if got["pairs"] != new:
                    raise RuntimeError(f"drained {got['pairs']} of {new} pairs")
                if trial >= 0:
                    out[str(lp)][str(c)]["naive" if naive else "shared"].append(new / dt)
            log.info("trial %d done", trial)
        led = ray.get(ledger.report.remote())
        wm = ray.get(worker.metrics.remote())
        pool.shutdown()
        cache.shutdown()
        return {"trials": out, "ledger": {k: led[k] for k in ("evaluations", "duplicates",
                                                              "fm_seconds")},
                "worker": {k: wm[k] for k in ("leases", "pairs", "written", "late_acks",
                                              "fm_seconds", "device", "phase_seconds")}}
    finally:
        ray.shutdown()


def medians(trials: dict) -> dict:
    return {c: {mode: float(np.median(v)) for mode, v in d.items()} for c, d in trials.items()}


def table(r: dict) -> str:
    lines = [f"{'lease pairs':<12}{'cands/request':<15}{'shared pairs/s':>15}"
             f"{'naive pairs/s':>15}{'speedup':>9}{'FLOP ceiling':>14}"]
    for lp, by_c in r["pairs_per_s_by_lease_pairs"].items():
        for c in CANDIDATES:
            p = by_c[str(c)]
            head = "  (headline)" if int(lp) == r["lease_pairs"] else ""
            lines.append(f"{lp:<12}{c:<15}{p['shared']:>15,.0f}{p['naive']:>15,.0f}"
                         f"{p['shared'] / p['naive']:>9.2f}{r['flop_ceiling'][str(c)]:>14.2f}"
                         f"{head}")
    ok = r["sharing_speedup_50"] >= TARGET_SPEEDUP_50
    lines.append(f"sharing_speedup_50 = {r['sharing_speedup_50']:.2f} at lease "
                 f"{r['lease_pairs']}, per-trial median "
                 f"{r['sharing_speedup_50_trial_median']:.2f}  (target >= {TARGET_SPEEDUP_50:.0f}: "
                 f"{'PASS' if ok else 'FAIL'}; FLOP ceiling {r['flop_ceiling']['50']:.2f})")
    lines.append(f"user_side_flop_share = {r['user_side_flop_share']:.3f}  (request part "
                 f"{r['flops']['request_per_pair'] / 1e6:.2f} MFLOP of "
                 f"{r['flops']['plain_forward_per_pair'] / 1e6:.2f} MFLOP per pair)")
    lines.append(f"one CPU worker actor (1 torch thread, pipelined drain), "
                 f"{r['pairs_per_trial']} pairs per setting and trial, median of "
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
                    help="further lease sizes measured alongside (256: QueueConfig's default)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        w = build(work)
        sizes = sorted({args.lease_pairs, *args.also_lease_pairs})
        m = measure(w, work, args.trials, args.pairs, sizes)
    by_lease = {lp: medians(t) for lp, t in m["trials"].items()}
    med = by_lease[str(args.lease_pairs)]
    f = w["flops"]
    share = f["request_per_pair"] / f["plain_forward_per_pair"]
    r = {
        "pairs_per_s": med,
        "sharing_speedup_50": med["50"]["shared"] / med["50"]["naive"],
        # the same from each interleaved trial's own pair of runs, then the median
        "sharing_speedup_50_trial_median": float(np.median(
            np.divide(m["trials"][str(args.lease_pairs)]["50"]["shared"],
                      m["trials"][str(args.lease_pairs)]["50"]["naive"]))),
        "user_side_flop_share": share,
        "flop_ceiling": {str(c): 1.0 / (1.0 - share + share / c) for c in CANDIDATES},
        "flops": f,
        "pairs_per_s_by_lease_pairs": by_lease,
        "trials_pairs_per_s": m["trials"],
        "trials": args.trials, "pairs_per_trial": args.pairs, "lease_pairs": args.lease_pairs,
        "version": w["version"], "fm": dataclasses.asdict(w["cfg"].fm),
        "ledger": m["ledger"], "worker": m["worker"], "train_s": w["train_s"],
        "target_speedup_50": TARGET_SPEEDUP_50,
    }
    r["wall_s"] = time.perf_counter() - t0
    print(table(r))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
