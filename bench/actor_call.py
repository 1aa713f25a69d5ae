"""What one Ray actor call costs this machine: round trip and CPU on each side.

    python bench/actor_call.py [--json runs/bench_actor_call.json] [--calls 1500]

A lookup round is one call per cache shard; this times the same call shape (one ``bytes``
argument of a shard query's size, a small ``bytes`` answer) against a no-op actor of each
kind a shard could be: plain, threaded (``max_concurrency``, as ``CacheShard``), threaded
with a concurrency group, async, and plain with Ray's task events on. Per kind: the median
round trip from a blocking caller, and the CPU seconds per call of the actor's process and of
the caller (this process), from /proc (Linux). Calls run back to back on an otherwise idle
local Ray.

With ``--rate R`` it also times calls the way a serving app makes them (``paced``): rounds of
``--fanout N`` parallel calls, one to each of N threaded actors with a concurrency group (as
the cache shards are), ``R`` rounds a second, every process asleep between rounds. Each call
then pays for waking Ray's threads on both sides, which back-to-back calls never do: at a
lookup round per request and a few dozen requests a second that is most of a call's CPU.
The processes' idle CPU over an equal idle window, measured just before, is subtracted.

    python bench/actor_call.py --rate 25 --fanout 2 [--rounds 400]
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
        "threaded_group": _group_noop(),
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


def _group_noop():
    import ray

    return ray.remote(num_cpus=0.1, enable_task_events=False, max_concurrency=4,
                      concurrency_groups={"g": 1})(_Noop)


def _sleep_until(t: float) -> None:
    while (left := t - time.perf_counter()) > 0:
        time.sleep(left)


def measure_paced(rate: float, fanout: int, rounds: int, arg_bytes: int) -> dict[str, float]:
    """CPU per call, each side, of ``rounds`` rounds of ``fanout`` parallel calls (one per
    threaded-group no-op actor) at ``rate`` rounds a second, less the same processes' idle
    CPU over as long a window, measured first."""
    if not rate > 0 or fanout < 1 or rounds < 1:
        raise ValueError(f"rate={rate!r}, fanout={fanout!r}, rounds={rounds!r}: need rate > 0, "
                         "fanout >= 1, rounds >= 1")
    import ray

    actors = [_group_noop().remote() for _ in range(fanout)]
    pids = ray.get([a.pid.remote() for a in actors])
    arg = bytes(arg_bytes)
    for _ in range(100):  # warm
        ray.get([a.answer.remote(arg) for a in actors])
    me = os.getpid()

    def cpu() -> tuple[float, float]:
        return sum(_cpu_s(p) for p in pids), _cpu_s(me)

    window = rounds / rate
    a0, c0 = cpu()
    time.sleep(window)
    a1, c1 = cpu()
    idle_callee, idle_caller = (a1 - a0) / window, (c1 - c0) / window  # CPU s per second
    rtt = []
    t0 = time.perf_counter()
    for r in range(rounds):
        _sleep_until(t0 + r / rate)
        t = time.perf_counter()
        ray.get([a.answer.remote(arg) for a in actors])
        rtt.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    a2, c2 = cpu()
    calls = rounds * fanout
    for a in actors:
        ray.kill(a)
    return {"rate": rate, "fanout": fanout, "rounds": rounds,
            "round_rtt_ms_p50": float(np.median(rtt)) * 1e3,
            "callee_cpu_ms": max(0.0, (a2 - a1) - idle_callee * wall) / calls * 1e3,
            "caller_cpu_ms": max(0.0, (c2 - c1) - idle_caller * wall) / calls * 1e3,
            "idle_callee_cpu_ms_per_s": idle_callee * 1e3,
            "idle_caller_cpu_ms_per_s": idle_caller * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--calls", type=int, default=1500)
    p.add_argument("--arg-bytes", type=int, default=45_000,
                   help="argument size (a 500-candidate query with item neighbours: ~45 KB)")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.0,
                   help="also time paced rounds at this many rounds a second (0: not)")
    p.add_argument("--fanout", type=int, default=2, help="parallel calls per paced round")
    p.add_argument("--rounds", type=int, default=400, help="paced rounds")
    p.add_argument("--paced-only", action="store_true", help="skip the back-to-back kinds")
    args = p.parse_args()
    if args.paced_only and not args.rate > 0:
        p.error("--paced-only needs --rate > 0")
    import ray

    ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=100 * 1024**2,
             include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        res = {} if args.paced_only else measure(args.calls, args.arg_bytes)
        paced = (measure_paced(args.rate, args.fanout, args.rounds, args.arg_bytes)
                 if args.rate > 0 else None)
    finally:
        ray.shutdown()
    if res:
        print(f"{'actor kind':<20}{'rtt p50 ms':>12}{'actor CPU ms':>14}{'caller CPU ms':>15}")
    for k, r in res.items():
        print(f"{k:<20}{r['rtt_ms_p50']:>12.3f}{r['callee_cpu_ms']:>14.3f}"
              f"{r['caller_cpu_ms']:>15.3f}")
    if paced is not None:
        print(f"paced: {args.rounds} rounds of {args.fanout} parallel calls at {args.rate:g}/s: "
              f"round trip p50 {paced['round_rtt_ms_p50']:.3f} ms, per call "
              f"{paced['callee_cpu_ms']:.3f} ms in the actors, {paced['caller_cpu_ms']:.3f} ms "
              "in the caller (idle CPU subtracted)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from machine import NO_FM, machine

        args.json.write_text(json.dumps({"kinds": res, "paced": paced, "config": vars(args) | {
            "json": str(args.json)}, "machine": machine(NO_FM)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
