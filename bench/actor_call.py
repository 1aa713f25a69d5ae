"""What one Ray actor call costs this machine: round trip and CPU on each side.

    python bench/actor_call.py [--json runs/bench_actor_call.json] [--calls 1500]

A lookup round is one call per cache shard; this times the same call shape (one ``bytes``
argument of a shard query's size, a small ``bytes`` answer) against a no-op actor of each
kind a shard could be: plain, threaded (``max_concurrency``, as ``CacheShard``), threaded
with a concurrency group, async, and plain with Ray's task events on. Per kind: the median
round trip from a blocking caller, and the CPU seconds per call of the actor's process and of
the caller (this process), from /proc (Linux). Calls run back to back on an otherwise idle
local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Noop:
    def answer(self, query: bytes) -> bytes:
        return query[:2048]

    def pid(self) -> int:
        return os.getpid()


class _AsyncNoop:
    async def answer(self, query: bytes) -> bytes:
        return query[:2048]

    def pid(self) -> int:
        return os.getpid()


def measure(calls: int, arg_bytes: int) -> dict[str, dict[str, float]]:
    import ray

    base = {"num_cpus": 0.1, "enable_task_events": False}
    kinds = {
        "plain": ray.remote(**base)(_Noop),
        "threaded": ray.remote(max_concurrency=4, **base)(_Noop),
        "threaded_group": ray.remote(max_concurrency=4, concurrency_groups={"g": 1},
                                     **base)(_Noop),
        "async": ray.remote(**base)(_AsyncNoop),
        "plain_task_events": ray.remote(num_cpus=0.1)(_Noop),
    }
    arg = bytes(arg_bytes)
    out = {}
    for name, cls in kinds.items():
        actor = cls.remote()
        pid = ray.get(actor.pid.remote())
        for _ in range(100):  # warm
            ray.get(actor.answer.remote(arg))
        rtt = []
        callee0, caller0 = _cpu_s(pid), _cpu_s(os.getpid())
        for _ in range(calls):
            t = time.perf_counter()
            ray.get(actor.answer.remote(arg))
            rtt.append(time.perf_counter() - t)
        out[name] = {"rtt_ms_p50": float(np.median(rtt)) * 1e3,
                     "callee_cpu_ms": (_cpu_s(pid) - callee0) / calls * 1e3,
                     "caller_cpu_ms": (_cpu_s(os.getpid()) - caller0) / calls * 1e3}
        ray.kill(actor)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--calls", type=int, default=1500)
    p.add_argument("--arg-bytes", type=int, default=45_000,
                   help="argument size (a 500-candidate query with item neighbours: ~45 KB)")
    p.add_argument("--num-cpus", type=int, default=2)
    args = p.parse_args()
    import ray

    ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=100 * 1024**2,
             include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        res = measure(args.calls, args.arg_bytes)
    finally:
        ray.shutdown()
    print(f"{'actor kind':<20}{'rtt p50 ms':>12}{'actor CPU ms':>14}{'caller CPU ms':>15}")
    for k, r in res.items():
        print(f"{k:<20}{r['rtt_ms_p50']:>12.3f}{r['callee_cpu_ms']:>14.3f}"
              f"{r['caller_cpu_ms']:>15.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from machine import NO_FM, machine

        args.json.write_text(json.dumps({"kinds": res, "config": vars(args) | {
            "json": str(args.json)}, "machine": machine(NO_FM)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
