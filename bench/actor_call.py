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

With ``--callers`` (and ``--rate``) the paced rounds run once per way a caller can wait for a
round, interleaved over ``--caller-trials``: ``get`` (one blocking ``ray.get``, as ``collect``),
``await_each`` (an asyncio future per ref, ``asyncio.wait`` over them: the router's round
before) and ``await_round`` (``actors.cache.collect_async``: one future for the round, the
router's now); the caller's CPU per call shows what the event loop's wake-ups cost.

    python bench/actor_call.py --rate 25 --fanout 2 --paced-only --callers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
CALLERS = ("get", "await_each", "await_round")


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


async def _await_each(refs: list) -> None:
    await asyncio.wait([asyncio.ensure_future(r) for r in refs], timeout=5.0)


async def _paced_async(actors: list, arg: bytes, rate: float, rounds: int, t0: float,
                       caller: str) -> list[float]:
    from actors.cache import collect_async

    rtt = []
    for r in range(rounds):
        wait = t0 + r / rate - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        t = time.perf_counter()
        refs = [a.answer.remote(arg) for a in actors]
        if caller == "await_each":
            await _await_each(refs)
        else:
            await collect_async(dict(enumerate(refs)), time.monotonic() + 5.0)
        rtt.append(time.perf_counter() - t)
    return rtt


def measure_paced(rate: float, fanout: int, rounds: int, arg_bytes: int,
                  caller: str = "get") -> dict[str, float]:
    """CPU per call, each side, of ``rounds`` rounds of ``fanout`` parallel calls (one per
    threaded-group no-op actor) at ``rate`` rounds a second, less the same processes' idle
    CPU over as long a window, measured first; ``caller`` (``CALLERS``): how the caller
    waits for a round."""
    if not rate > 0 or fanout < 1 or rounds < 1 or caller not in CALLERS:
        raise ValueError(f"rate={rate!r}, fanout={fanout!r}, rounds={rounds!r}, "
                         f"caller={caller!r}: need rate > 0, fanout >= 1, rounds >= 1, "
                         f"caller in {CALLERS}")
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
    if caller == "get":
        for r in range(rounds):
            _sleep_until(t0 + r / rate)
            t = time.perf_counter()
            ray.get([a.answer.remote(arg) for a in actors])
            rtt.append(time.perf_counter() - t)
    else:
        rtt = asyncio.run(_paced_async(actors, arg, rate, rounds, t0, caller))
    wall = time.perf_counter() - t0
    a2, c2 = cpu()
    calls = rounds * fanout
    for a in actors:
        ray.kill(a)
    return {"caller": caller, "rate": rate, "fanout": fanout, "rounds": rounds,
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
    p.add_argument("--callers", action="store_true",
                   help=f"paced rounds once per way of waiting ({', '.join(CALLERS)})")
    p.add_argument("--caller-trials", type=int, default=3,
                   help="interleaved trials of the callers (--callers)")
    args = p.parse_args()
    if (args.paced_only or args.callers) and not args.rate > 0:
        p.error("--paced-only and --callers need --rate > 0")
    if args.caller_trials < 1:
        p.error(f"--caller-trials {args.caller_trials}: must be >= 1")
    import ray

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # actors.cache, for the await_round caller
    ray.init(address="local", num_cpus=args.num_cpus, object_store_memory=100 * 1024**2,
             include_dashboard=False, logging_level="error", log_to_driver=False)
    callers: dict[str, list[dict]] = {}
    try:
        res = {} if args.paced_only else measure(args.calls, args.arg_bytes)
        paced = (measure_paced(args.rate, args.fanout, args.rounds, args.arg_bytes)
                 if args.rate > 0 else None)
        if args.callers:
            for trial in range(args.caller_trials):
                order = CALLERS if trial % 2 == 0 else CALLERS[::-1]
                for c in order:
                    callers.setdefault(c, []).append(measure_paced(
                        args.rate, args.fanout, args.rounds, args.arg_bytes, c))
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
    summary = {c: {k: float(np.median([t[k] for t in trials]))
                   for k in ("callee_cpu_ms", "caller_cpu_ms", "round_rtt_ms_p50")}
               for c, trials in callers.items()}
    for c, m in summary.items():
        per = ", ".join(f"{t['caller_cpu_ms']:.3f}" for t in callers[c])
        print(f"caller {c:<12} per call: caller {m['caller_cpu_ms']:.3f} ms (per trial {per}), "
              f"actors {m['callee_cpu_ms']:.3f} ms; round trip p50 {m['round_rtt_ms_p50']:.3f} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        mach = sibling("machine")
        args.json.write_text(json.dumps({"kinds": res, "paced": paced, "callers": summary,
                                         "caller_trials": callers, "config": vars(args) | {
            "json": str(args.json)}, "machine": mach.machine(mach.NO_FM)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
