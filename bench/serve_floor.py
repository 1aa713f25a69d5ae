"""How close a SOLARIS request is to its cost floor: one actor call's CPU and the serving
benchmark at 2 and 4 cache shards, in one run.

    python bench/serve_floor.py --json runs/bench_serve_floor.json [--trials 5] [--shards 2,4]

Runs ``bench/actor_call.py`` (what one actor call costs each side, the threaded kind a cache
shard is), then ``bench/serve.py`` at 500 candidates, the VM alone and SOLARIS only, a
quarter of the VM-alone saturation rate, KNN tables published and every tier forced on
(``--all-tiers``: every VM's scales set to 1, so no tier is skipped), once per shard count.
For each it reports SOLARIS's extra CPU per request over the VM alone (medians over
interleaved trials, every process of the run summed) against its floor:

    actor calls per SOLARIS request x one call's CPU (caller + actor) + 1.5 ms

where the calls per request are measured in the same run: lookup calls (one per shard a
request asks: ``shard_answer_ms`` calls over the SOLARIS requests of the timed rounds) plus
the after-answer calls (history writes and queue puts, per SOLARIS request, from ``/stats``).
Each step is a subprocess with its own local Ray, one after another.

That call's CPU is measured back to back, every Ray thread busy; a serving app makes its calls
a few dozen times a second and wakes Ray's threads on both sides for each. So after each serve
run the floor is priced a second way (``bound_paced_ms``): ``bench/actor_call.py --rate R
--fanout N --paced-only``, rounds of N parallel calls (N: the run's lookup calls per request,
rounded) at the run's offered rate R, idle CPU subtracted; its CPU per call prices every
actor call of the request, the after-answer ones included.
"""

from __future__ import annotations

import argparse
import json
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
SLACK_MS = 1.5


def _run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def floor_of(serve: dict, call: dict, size: int = 500, paced: dict | None = None) -> dict:
    """The floor check of one ``bench/serve.py`` JSON given ``bench/actor_call.py``'s (and,
    if given, its ``paced`` block at this run's rate: the bound priced with it too)."""
    cpu = serve["cpu_ms_per_request"]
    vm, sol = sum(cpu[f"vm_{size}"].values()), sum(cpu[f"solaris_{size}"].values())
    lookups = lookup_calls(serve)
    after = serve.get("after_answer") or {}
    writes = ((serve.get("cache_client") or {}).get("history_writes") or {}).get("sent", 0)
    n_after = max(1, int(after.get("requests", 0)))
    after_calls = (writes + int(after.get("queue_calls", 0))) / n_after
    one = call["kinds"]["threaded_group"]
    per_call = one["caller_cpu_ms"] + one["callee_cpu_ms"]
    calls = lookups + after_calls
    bound = calls * per_call + SLACK_MS
    out = {"vm_cpu_ms": vm, "solaris_cpu_ms": sol, "extra_cpu_ms": sol - vm,
            "lookup_calls_per_request": lookups, "after_answer_calls_per_request": after_calls,
            "actor_calls_per_request": calls, "one_call_cpu_ms": per_call,
            "floor_ms": calls * per_call, "bound_ms": bound, "within_bound": sol - vm <= bound,
            f"p50_overhead_{size}": serve[f"p50_overhead_{size}"],
            f"p50_overhead_{size}_per_trial": serve[f"p50_overhead_{size}_per_trial"],
            "p50_within_1_30": serve[f"p50_overhead_{size}"] <= 1.30,
            "tier_share": serve.get("tier_share"), "errors": serve.get("errors")}
    if paced is not None:
        per_paced = paced["caller_cpu_ms"] + paced["callee_cpu_ms"]
        out.update(paced_call_cpu_ms=per_paced, paced_rate=paced["rate"],
                   paced_fanout=paced["fanout"], floor_paced_ms=calls * per_paced,
                   bound_paced_ms=calls * per_paced + SLACK_MS,
                   within_bound_paced=sol - vm <= calls * per_paced + SLACK_MS)
    return out


def lookup_calls(serve: dict) -> float:
    """Lookup calls per SOLARIS request of one ``bench/serve.py`` JSON."""
    cfg = serve["config"]
    rounds = (cfg["trials"] + cfg["warmup_trials"]) * cfg["requests"]
    return sum(v["calls"] for v in serve["shard_answer_ms"].values()) / rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--shards", default="2,4")
    p.add_argument("--load", type=float, default=0.25)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--no-overlap", action="store_true",
                   help="serve.overlap false: the slots travel to the VM replica, which runs "
                        "one forward after the lookup round (the request path before the "
                        "overlap), for an A/B")
    args = p.parse_args()
    t0 = time.perf_counter()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="solaris-floor-") as tmp:
        tmp_p = Path(tmp)
        _run([py, "bench/actor_call.py", "--json", str(tmp_p / "call.json"),
              "--num-cpus", str(args.num_cpus)])
        call = json.loads((tmp_p / "call.json").read_text())
        out = {"actor_call": call, "by_shards": {}}
        for n in [int(x) for x in args.shards.split(",")]:
            cfg = tmp_p / f"shards{n}.yaml"
            cfg.write_text(f"cache:\n  num_shards: {n}\n"
                           + ("serve:\n  overlap: false\n" if args.no_overlap else ""))
            js = tmp_p / f"serve{n}.json"
            _run([py, "bench/serve.py", "--json", str(js), "--sizes", "500", "--modes",
                  "vm,solaris", "--load", str(args.load), "--trials", str(args.trials),
                  "--requests", str(args.requests), "--config", str(cfg), "--all-tiers",
                  "--num-cpus", str(args.num_cpus)])
            serve = json.loads(js.read_text())
            pj = tmp_p / f"paced{n}.json"
            rate = serve["rates"]["500"]["offered_rps"]
            _run([py, "bench/actor_call.py", "--json", str(pj), "--paced-only", "--rate",
                  f"{rate:.3f}", "--fanout", str(max(1, round(lookup_calls(serve)))),
                  "--num-cpus", str(args.num_cpus)])
            paced = json.loads(pj.read_text())["paced"]
            out["by_shards"][str(n)] = {"floor": floor_of(serve, call, paced=paced),
                                        "paced_call": paced, "serve": serve}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["config"] = vars(args) | {"json": str(args.json)}
    devices = next(iter(out["by_shards"].values()))["serve"]["machine"].get("fm_devices") \
        if out["by_shards"] else None
    out["machine"] = sibling("machine").machine(devices)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"{'shards':<8}{'extra CPU ms':>14}{'calls/req':>11}{'call CPU ms':>13}"
          f"{'bound ms':>10}{'ok':>5}{'paced call':>12}{'bound':>8}{'ok':>5}{'p50 ovh':>9}")
    for n, r in out["by_shards"].items():
        f = r["floor"]
        print(f"{n:<8}{f['extra_cpu_ms']:>14.2f}{f['actor_calls_per_request']:>11.2f}"
              f"{f['one_call_cpu_ms']:>13.3f}{f['bound_ms']:>10.2f}"
              f"{'yes' if f['within_bound'] else 'no':>5}{f['paced_call_cpu_ms']:>12.3f}"
              f"{f['bound_paced_ms']:>8.2f}{'yes' if f['within_bound_paced'] else 'no':>5}"
              f"{f['p50_overhead_500']:>9.3f}")
    print(f"wrote {args.json} ({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
