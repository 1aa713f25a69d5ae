"""Benchmark: what a router's read replica costs in memory and refresh CPU, and how it grows.

    python bench/replica_scale.py --json runs/bench_replica_scale.json [--entries 10000,100000,1000000]

In one process, no Ray (the costs of the parts, not of the calls): a shard's store filled
with ``--entries`` pairs (width 32, fp32 and int8), then

- **memory**: bytes per entry of the shard's store and of its mirror in a replica (slabs,
  index and running sums), and of the shard's journal per record;
- **a pull**: after ``--changes`` new writes (a share of them rewriting held keys), the
  shard's export (``PairStore.changes`` + the frame) and the replica's apply (decode +
  ``MirrorStore.apply``), thread CPU, medians of ``--reps``;
- **a whole re-read** (a new replica, or a restarted shard): export and apply of every entry.

From these the design note (``docs/design/read-replica.md``) works out the costs at W
writes per second, S shards and R router replicas: each shard answers R pulls per refresh
period, and each router replica applies every change once and holds every entry.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solaris.cache.replica import (MirrorStore, ReadReplica, decode_changes,  # noqa: E402
                                   encode_changes)
from solaris.cache.store import PairStore  # noqa: E402
from solaris.config import CacheConfig  # noqa: E402

T0 = 1.9e9


def _cpu(f) -> float:
    c = time.thread_time()
    f()
    return time.thread_time() - c


def _fill(store: PairStore, n: int, rng: np.random.Generator, users: int) -> None:
    for a in range(0, n, 50_000):
        k = min(50_000, n - a)
        store.put(rng.integers(0, users, k), rng.integers(0, 10**7, k),
                  rng.normal(size=(k, store.cfg.dim)).astype(np.float32), "fm-v1",
                  T0 + rng.uniform(0, 600, k), rng.random(k).astype(np.float32))


def measure(entries: int, codec: str, changes: list[int], reps: int) -> dict:
    cfg = CacheConfig(dim=32, codec=codec, capacity=2 * entries, num_shards=1,
                      journal_records=max(100_000, 2 * max(changes)))
    rng = np.random.default_rng(0)
    users = max(100, entries // 50)
    store = PairStore(cfg)
    _fill(store, entries, rng, users)
    out: dict = {"entries": store.live, "codec": codec}
    m = store.metrics()
    out["shard_bytes_per_entry"] = m["total_bytes"] / store.live
    # a whole re-read: the shard's export of every entry, the replica's apply
    rep = ReadReplica(cfg, stale_s=1e9)
    frame: list[bytes] = []
    out["whole_export_cpu_ms"] = 1e3 * _cpu(lambda: frame.append(
        encode_changes(*store.changes("", 0))))
    out["whole_frame_bytes"] = len(frame[0])
    out["whole_apply_cpu_ms"] = 1e3 * _cpu(lambda: rep.apply(0, frame[0]))
    mirror = rep.mirrors[0]
    out["replica_bytes_per_entry"] = (mirror.table.nbytes + mirror._sums.nbytes) / mirror.live
    out["pulls"] = {}
    for n in changes:
        exp, app, size = [], [], []
        for r in range(reps):
            k_new = n // 2  # half new keys, half rewrites of held ones (a refresh's mix)
            live = store.table.live_slots()
            pick = store.table.records(rng.choice(live, n - k_new, replace=False))
            us = np.concatenate([rng.integers(0, users, k_new), pick["user"]])
            its = np.concatenate([rng.integers(0, 10**7, k_new), pick["item"]])
            store.put(us, its, rng.normal(size=(n, 32)).astype(np.float32), "fm-v1",
                      T0 + 600 + r, rng.random(n).astype(np.float32))
            got: list[bytes] = []
            exp.append(_cpu(lambda: got.append(encode_changes(
                *store.changes(rep.epoch[0], rep.seq[0])))))
            size.append(len(got[0]))
            app.append(_cpu(lambda: rep.apply(0, got[0])))
            assert not decode_changes(got[0])[2], "a pull read the whole store"
        out["pulls"][str(n)] = {"export_cpu_ms": 1e3 * float(np.median(exp)),
                                "apply_cpu_ms": 1e3 * float(np.median(app)),
                                "frame_bytes": float(np.median(size))}
    j = store.journal
    out["journal_bytes_per_record"] = j.nbytes / max(1, j.seq - j.low)
    assert rep.mirrors[0].live == store.live
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--entries", default="10000,100000,1000000")
    p.add_argument("--changes", default="100,1000,10000")
    p.add_argument("--codecs", default="int8,fp32")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    t0 = time.perf_counter()
    changes = [int(x) for x in args.changes.split(",")]
    rows = [measure(int(e), c, changes, args.reps) for c in args.codecs.split(",")
            for e in args.entries.split(",")]
    out = {"rows": rows, "config": vars(args) | {"json": str(args.json)},
           "seconds": round(time.perf_counter() - t0, 1)}
    sys.path.insert(0, str(ROOT / "bench"))
    from machine import machine

    out["machine"] = machine(None)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"{'codec':<6}{'entries':>9}{'shard B/e':>10}{'replica B/e':>12}{'whole exp ms':>13}"
          f"{'whole app ms':>13}" + "".join(f"{'pull ' + c + ' exp/app ms':>24}"
                                            for c in map(str, changes)))
    for r in rows:
        print(f"{r['codec']:<6}{r['entries']:>9}{r['shard_bytes_per_entry']:>10.1f}"
              f"{r['replica_bytes_per_entry']:>12.1f}{r['whole_export_cpu_ms']:>13.1f}"
              f"{r['whole_apply_cpu_ms']:>13.1f}"
              + "".join(f"{r['pulls'][str(c)]['export_cpu_ms']:>12.2f}/"
                        f"{r['pulls'][str(c)]['apply_cpu_ms']:<11.2f}" for c in changes))
    print(f"wrote {args.json} ({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
