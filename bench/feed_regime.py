"""Benchmark: SOLARIS in the feed world (the paper's regime), over training seeds.

    python bench/feed_regime.py --out runs/feed [--seeds 0 1 2] [--profile feed]
        [--set KEY=VALUE ...] [--no-closed-loop] [--port 8000] [--summarize-only]

Per training seed, in the ``feed`` profile of the synthetic generator
(``solaris/data/profiles.py``): ``solaris replay`` of the window (the live system; it trains
the artifacts and predicts the window from the data before it), ``solaris simulate`` (the
closed loop, the same artifacts) and ``solaris estimate`` (the prediction beside the replay);
a run whose output exists is not run again. Then the seeds are pooled with
``bench/replay_seeds.py`` (online TR, paired over seeds and requests) and
``bench/closed_loop.py`` (the click lift), and the figures the feed world is held to are
printed beside their bars. Every number goes to ``OUT/feed_regime.json``. ``--set`` adds
config overrides after the profile's serving settings (e.g. ``verifier.fraction=1.0``);
``--no-closed-loop`` runs the replay and the estimate only.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solaris.eval.render import to_json  # noqa: E402


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` (its output to ``log``); seconds taken. A failure names the log."""
    t = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}: see {log}")
    return time.perf_counter() - t


def seed_runs(out: Path, seed: int, profile: str, sets: list[str], closed_loop: bool,
              port: int = 8000) -> dict:
    from solaris.data.profiles import SERVING

    world = ["--dataset", "synthetic", "--set", f"data.synthetic.profile={profile}"]
    for k, v in SERVING[profile].items():
        world += ["--set", f"{k}={v}"]
    for kv in sets:
        world += ["--set", kv]
    sched = SERVING[profile]
    schedule = [*(["--lag-s", str(sched["schedule.lag_s"])] if "schedule.lag_s" in sched else []),
                *(["--budget", str(sched["schedule.budget_per_hour"])]
                  if "schedule.budget_per_hour" in sched else [])]
    rp, sim, est = out / f"replay-s{seed}", out / f"simulate-s{seed}", out / f"estimate-s{seed}"
    solaris = [sys.executable, "-m", "solaris.cli"]
    took = {}
    if not (rp / "replay.json").exists():
        rp.mkdir(parents=True, exist_ok=True)
        took["replay_s"] = run([*solaris, "replay", *world, *schedule, "--seed", str(seed),
                                "--out", str(rp), "--port", str(port), "--no-progress"],
                               out / f"replay-s{seed}.log")
    if closed_loop and not (sim / "closed_loop.json").exists():
        took["simulate_s"] = run([*solaris, "simulate", *world, "--seed", str(seed),
                                  "--artifacts", str(rp / "artifacts"), "--out", str(sim)],
                                 out / f"simulate-s{seed}.log")
    if not (est / "estimate.json").exists():
        took["estimate_s"] = run([*solaris, "estimate", *world, "--seed", str(seed),
                                  "--artifacts", str(rp / "artifacts"), "--replay", str(rp),
                                  "--out", str(est)], out / f"estimate-s{seed}.log")
    return took


def pooled(out: Path, seeds: list[int], closed_loop: bool) -> tuple[dict, dict | None]:
    py = sys.executable
    rp = [str(out / f"replay-s{s}") for s in seeds]
    sim = [str(out / f"simulate-s{s}") for s in seeds]
    run([py, "bench/replay_seeds.py", *rp, "--json", str(out / "replay_seeds.json")],
        out / "replay_seeds.log")
    if not closed_loop:
        return json.loads((out / "replay_seeds.json").read_text()), None
    run([py, "bench/closed_loop.py", *sim, "--json", str(out / "closed_loop.json")],
        out / "closed_loop.log")
    return (json.loads((out / "replay_seeds.json").read_text()),
            json.loads((out / "closed_loop.json").read_text()))


def tier_steps(rep: dict) -> list[tuple[str, float | None]]:
    """The cumulative online TR tier by tier (pair, + user neighbour, ...)."""
    return [(k, v.get("tr")) for k, v in rep["tr_online_by_tier"].items()]


def summarize(out: Path, seeds: list[int], took: dict, closed_loop: bool = True) -> dict:
    reps = {s: json.loads((out / f"replay-s{s}" / "replay.json").read_text()) for s in seeds}
    ests = {s: json.loads((out / f"estimate-s{s}" / "estimate.json").read_text())
            for s in seeds}
    sims = {s: json.loads((out / f"simulate-s{s}" / "closed_loop.json").read_text())
            for s in seeds} if closed_loop else {}
    pool_rp, pool_cl = pooled(out, seeds, closed_loop)
    per_seed = {}
    for s in seeds:
        r, e = reps[s], ests[s]
        man = json.loads((out / f"replay-s{s}" / "artifacts" / "manifest.json").read_text())
        per_seed[s] = {
            "requests": r["requests"], "labelled_pairs": r["labelled_pairs"],
            "candidate_recurrence_6h": r.get("candidate_recurrence_6h"),
            "candidate_recurrence_ttl": r.get("candidate_recurrence"),
            "coverage": r["coverage"], "tr_online": r["tr_online"],
            "tr_online_ci": r.get("tr_online_ci"), "tr_online_raw": r.get("tr_online_raw"),
            "tr_online_by_tier": tier_steps(r), "tr_offline_pair_100": r["tr_offline_pair_100"],
            "fm_evals_per_1k_requests": r["fm_evals_per_1k_requests"],
            "estimate_check": e.get("check"),
            "replay_seconds": r["seconds"], "artifacts_seconds": r["artifacts_seconds"],
            "scales": {t: v["scales"] for t, v in man["vms"].items()},
            "closed_loop_lift": sims[s]["lift"].get("click_lift") if closed_loop else None,
        }
    def mean(get) -> float:
        return sum(get(per_seed[s]) for s in seeds) / len(seeds)

    summary = {"seeds": seeds, "per_seed": per_seed, "took": took,
               "mean_tr_online": mean(lambda r: r["tr_online"]),
               "mean_tr_online_raw": mean(lambda r: r["tr_online_raw"]),
               "mean_pair_coverage": mean(lambda r: r["coverage"]["pair"]),
               "mean_effective_coverage": mean(lambda r: r["coverage"]["effective"]),
               "pooled_replay": pool_rp, "pooled_closed_loop": pool_cl}
    (out / "feed_regime.json").write_text(to_json(summary))
    return summary


def table(sm: dict) -> str:
    def f(x) -> str:
        return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"

    lines = [f"{'seed':<6}{'rec6h':>7}{'pair':>7}{'eff':>7}{'TR cal':>8}{'CI':>17}"
             f"{'TR raw':>8}{'evals/1k':>9}{'lift':>7}"]
    for s, r in sm["per_seed"].items():
        ci = r["tr_online_ci"] or [None, None]
        lift = r["closed_loop_lift"]
        lift = lift.get("point") if isinstance(lift, dict) else lift
        lines.append(f"{s:<6}{f(r['candidate_recurrence_6h']):>7}{f(r['coverage']['pair']):>7}"
                     f"{f(r['coverage']['effective']):>7}{f(r['tr_online']):>8}"
                     f"  [{f(ci[0])}, {f(ci[1])}]{f(r['tr_online_raw']):>8}"
                     f"{r['fm_evals_per_1k_requests']:>9.0f}{f(lift):>7}")
        lines.append("      tiers: "
                     + ", ".join(f"{k} {f(v)}" for k, v in r["tr_online_by_tier"]))
    lines.append(f"mean TR calibrated {f(sm['mean_tr_online'])}, "
                 f"raw {f(sm['mean_tr_online_raw'])}; pair {f(sm['mean_pair_coverage'])}, "
                 f"effective {f(sm['mean_effective_coverage'])}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/feed"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--profile", default="feed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides after the profile's serving settings")
    ap.add_argument("--no-closed-loop", action="store_true",
                    help="the replay and the estimate only")
    ap.add_argument("--port", type=int, default=8000, help="the replays' Serve HTTP port")
    ap.add_argument("--summarize-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    took = {}
    if not args.summarize_only:
        for s in args.seeds:
            took[s] = seed_runs(args.out, s, args.profile, args.set, not args.no_closed_loop,
                                args.port)
            print(f"seed {s}: {took[s]}", flush=True)
    sm = summarize(args.out, args.seeds, took, not args.no_closed_loop)
    print(table(sm))
    print(f"wrote {args.out / 'feed_regime.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
