"""Benchmark: the closed loop pooled over training seeds of one window.

    python bench/closed_loop.py RUN_DIR [RUN_DIR ...] --json OUT.json [--resamples 2000]
        [--against RUN_DIR ...]

Each RUN_DIR is a finished ``solaris simulate`` or ``solaris replay --closed-loop`` (its
``closed_loop.json`` and ``arms.npz``). The expected clicks per request of every arm are
pooled over the runs with a paired bootstrap (one request draw shared by every arm and, the
runs replaying the same window, by every seed): each arm's gain over the VM alone,
``click_lift`` (SOLARIS's share of the FM inline's gain), ``lift_oracle`` (the share the FM
inline on the covered candidates would get) and their ratio. Per run: the same figures, the
shadow arm's coverage against its ceiling and oracle bound, the speculation policies at the
verifier's cost (and the returns bound: the share of requests whose user comes back within
the TTL, the verifier-to-oracle gap the verifier's bet closes when made only there, and the
FM evaluations it then needs to match the verifier), the FM's excess BCE over the VM alone's, for live runs the live arm against
the in-process one, and, where the run has them, the off-policy (SNIPS) estimates of the
click lift from the shadow arm's log beside the exact counterfactual and the on-policy lift.
``--against`` takes the same seeds' runs of another configuration, one per RUN_DIR in the same
order (same window, same seed): each shared arm's paired difference in expected clicks per
request, RUN_DIR minus AGAINST, per run and pooled (one request draw shared by both sides and
every seed), beside the FM evaluations of each side.
Prints one table, writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
sys.path.insert(0, str(ROOT))

from solaris.eval.render import to_json  # noqa: E402
from solaris.replay.closed_loop import paired_lift  # noqa: E402


def load(run: Path) -> tuple[dict, dict[str, np.ndarray], np.ndarray]:
    rep = json.loads((run / "closed_loop.json").read_text())
    with np.load(run / "arms.npz") as f:
        clicks = {k.split("/")[0]: f[k].sum(1) for k in f.files if k.endswith("/p_true")}
        rid = f["request_id"]
    return rep, clicks, rid


def shadow_inputs(run: Path, rep: dict) -> tuple:
    """(closed-loop log, VM-alone scores, schedule arguments): the run's shadow-arm log as the
    policies read it (which items were shown) and the schedule it ran with, for
    ``solaris.replay.coverage``'s simulation; plus the (R, shown) positions it showed and
    whether each was the exploration slot (propensity below 1)."""
    from solaris.config import VerifierConfig
    from solaris.replay.closed_loop import empty_log, shown_log
    from solaris.simulate.log import RequestLog

    with np.load(run / "arms.npz") as f:
        r, c = f["candidates"].shape
        lg = RequestLog(user=f["user"], ts=f["ts"], surface=np.zeros(r, np.int32),
                        candidates=f["candidates"],
                        labels=np.full((r, c, 1), np.nan, np.float32), tasks=("click",))
        shadow = empty_log(r, f["vm/pos"].shape[1])
        shadow.pos = f["vm/pos"]
        explore = f["vm/propensity"] < 1.0
        base = f["base"]
    closed = shown_log(lg, shadow)  # the policies read only which items were shown
    kw = dict(horizon_s=float(rep.get("horizon_s", VerifierConfig.horizon_s)),
              read_ttl_s=float(rep["read_ttl_s"]), lag_s=float(rep["lag_s"]),
              tick_s=float(rep["tick_s"]), budget_per_hour=float(rep["budget_per_hour"]),
              seed=int(rep["options"]["seed"]))
    return closed, base, kw, shadow.pos, explore


def recompute_policies(run: Path, rep: dict) -> dict:
    """Every policy of ``solaris.precompute.speculation`` again on the run's shadow-arm log (runs made
    before a policy existed), with the run's schedule."""
    from solaris.config import VerifierConfig
    from solaris.replay.closed_loop import POLICY_FRACTIONS
    from solaris.replay.coverage import compare_policies

    closed, base, kw, _, _ = shadow_inputs(run, rep)
    return compare_policies(
        closed, base, fraction=float(rep.get("fraction", VerifierConfig.fraction)),
        fractions=POLICY_FRACTIONS, **kw)


def per_run(run: Path, rep: dict) -> dict:
    pol, cov, lift = rep["policies"], rep["shadow_coverage"], rep["lift"]
    at = pol["at_verifier_cost"]
    out = {"run": str(run), "seed": rep["options"]["seed"], "requests": rep["requests"],
           "clicks_per_request": lift["clicks_per_request"],
           "gain_over_vm": lift["gain_over_vm"], "click_lift": lift.get("click_lift"),
           "lift_oracle": lift.get("lift_oracle"),
           "click_lift_over_lift_oracle": lift.get("click_lift_over_lift_oracle"),
           "lift_by_arm": lift.get("lift_by_arm"),
           "shadow_pair": cov["pair"], "shadow_ceiling": cov["ceiling"],
           "shadow_pair_over_ceiling": cov["pair_over_ceiling"],
           "shadow_effective": cov["effective"],
           "effective_oracle_bound": cov["effective_oracle_bound"],
           "effective_over_bound": cov["effective_over_bound"],
           "fm_evals_per_1k": at["fm_evals_per_1k"], "policy_pair_at_verifier_cost": at["pair"],
           "oracle_policy": at["oracle"], "verifier_over_random": pol["verifier_over_random"],
           "gap_closed": pol["gap_closed"], "cost_to_match_verifier": pol["cost_to_match_verifier"],
           "returns_bound": pol.get("returns_bound"),
           "candidate_recurrence": rep["candidate_recurrence_closed_loop"],
           "excess_bce": {a: m["excess_bce"] for a, m in rep["arms"].items()},
           "fm_excess_over_vm_excess": rep.get("fm_excess_over_vm_excess")}
    if rep.get("live"):
        out["live"] = rep["live"]
    if rep.get("off_policy"):
        out["off_policy"] = rep["off_policy"]
    return out


def paired_difference(new: list[np.ndarray], old: list[np.ndarray], resamples: int = 2000,
                      seed: int = 0) -> dict:
    """The paired bootstrap of mean(new) - mean(old) over requests, pooled over the runs
    (``paired_lift``'s draws: ``old`` in the VM alone's place)."""
    return paired_lift({"vm": old, "new": new}, resamples=resamples,
                       seed=seed)["gain_over_vm"]["new"]


def against(runs: list[Path], reps: tuple, clicks: tuple, rids: tuple, others: list[Path],
            resamples: int) -> dict:
    """Each arm's paired difference in expected clicks per request, ``runs`` minus
    ``others`` (one per run, the same seed and requests), per run and pooled."""
    if len(others) != len(runs):
        raise SystemExit(f"--against: {len(others)} runs for {len(runs)} RUN_DIRs (one each)")
    o_reps, o_clicks, o_rids = zip(*(load(r) for r in others))
    for run, other, rep, o_rep, rid, o_rid in zip(runs, others, reps, o_reps, rids, o_rids):
        if rep["options"]["seed"] != o_rep["options"]["seed"] or not np.array_equal(rid, o_rid):
            raise SystemExit(f"--against: {other} is not the same seed and requests as {run}")
    arms = [k for k in clicks[0] if all(k in c for c in clicks + o_clicks)]
    return {"against": [str(r) for r in others],
            "fm_evals": [{"run": rep["fm_evals"], "against": o["fm_evals"]}
                         for rep, o in zip(reps, o_reps)],
            "difference": {k: {"pooled": paired_difference([c[k] for c in clicks],
                                                           [c[k] for c in o_clicks], resamples),
                               "per_run": [paired_difference([c[k]], [o[k]], resamples, seed=i)
                                           for i, (c, o) in enumerate(zip(clicks, o_clicks))]}
                           for k in arms}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--policies", action="store_true",
                   help="recompute the policy comparison from each run's shadow-arm log")
    p.add_argument("--against", nargs="+", type=Path, default=None, metavar="RUN_DIR",
                   help="the same seeds' runs of another configuration, in the same order: "
                        "each arm's paired difference in clicks per request")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    reps, clicks, rids = zip(*(load(r) for r in a.runs))
    if a.policies:
        for run, rep in zip(a.runs, reps):
            rep["policies"] = recompute_policies(run, rep)
    if any(not np.array_equal(rids[0], r) for r in rids[1:]):
        raise SystemExit("the runs did not replay the same requests: pool only one window")
    arms = [k for k in clicks[0] if all(k in c for c in clicks)]
    pooled = paired_lift({k: [c[k] for c in clicks] for k in arms}, resamples=a.resamples)
    rows = [per_run(r, rep) for r, rep in zip(a.runs, reps)]
    mach = sibling("machine")  # solaris simulate runs every arm in process
    res = {"runs": rows, "pooled": pooled, "seconds": round(time.perf_counter() - t0, 1),
           "machine": mach.machine(mach.IN_PROCESS)}
    if a.against:
        res["against"] = against(a.runs, reps, clicks, rids, a.against, a.resamples)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(to_json(res))

    def _rb(b: dict | None, key: str) -> str:  # a figure of the returns bound
        x = (b or {}).get(key)
        return "n/a" if x is None else f"{x:.2f}"

    def ci(d: dict | None) -> str:
        if not d or d.get("point") is None or not d.get("ci"):
            return "n/a"
        return f"{d['point']:.3f} [{d['ci'][0]:.3f}, {d['ci'][1]:.3f}]"

    print(f"{'seed':<6}{'vm':>7}{'solaris':>9}{'fm':>7}{'oracle':>8}{'click_lift':>25}"
          f"{'lift_oracle':>25}{'pair/ceil':>10}{'eff/bound':>10}{'ver/rand':>9}"
          f"{'best gap':>9}{'best cost':>10}{'returning':>10}{'ret gap':>8}{'ret cost':>9}")
    for r in rows:
        c = r["clicks_per_request"]
        print(f"{r['seed']:<6}{c['vm']:>7.3f}{c.get('solaris', float('nan')):>9.3f}"
              f"{c.get('fm', float('nan')):>7.3f}{c.get('oracle', float('nan')):>8.3f}"
              f"{ci(r['click_lift']):>25}{ci(r['lift_oracle']):>25}"
              f"{r['shadow_pair_over_ceiling']:>10.3f}{r['effective_over_bound']:>10.3f}"
              f"{r['verifier_over_random']:>9.2f}"
              f"{max(v for v in r['gap_closed'].values() if v is not None):>9.2f}"
              f"{min(v for v in r['cost_to_match_verifier'].values() if v is not None):>10.2f}"
              f"{_rb(r['returns_bound'], 'requests_returning'):>10}"
              f"{_rb(r['returns_bound'], 'gap_closed_within_verifier_cost'):>8}"
              f"{_rb(r['returns_bound'], 'cost_to_match_verifier'):>9}")
    print("pooled: gain over vm " + ", ".join(f"{k} {ci(v)}" for k, v in
                                               pooled["gain_over_vm"].items()))
    print(f"pooled: click_lift {ci(pooled.get('click_lift'))}, lift_oracle "
          f"{ci(pooled.get('lift_oracle'))}, ratio {ci(pooled.get('click_lift_over_lift_oracle'))}")
    ope = [r for r in rows if r.get("off_policy")]
    for r in ope:
        o = r["off_policy"]
        ex, on, inside = o["exact_counterfactual"], o["on_policy"], o["within_snips_interval"]
        print(f"seed {r['seed']}: off-policy (SNIPS) SOLARIS gain "
              f"{ci(o['targets']['solaris']['gain_snips'])} (exact {ex['gain_solaris']:.3f}, "
              f"on-policy {on['gain_solaris']:.3f}); click_lift {ci(o.get('click_lift_snips'))}"
              f" (exact {ex['click_lift'] if ex['click_lift'] is None else round(ex['click_lift'], 3)}"
              f" in: {inside['click_lift_exact']}; on-policy "
              f"{on['click_lift'] if on['click_lift'] is None else round(on['click_lift'], 3)}"
              f" in: {inside['click_lift_on_policy']})")
    if ope:
        k = sum(bool(r["off_policy"]["within_snips_interval"]["click_lift_on_policy"])
                for r in ope)
        print(f"the on-policy click_lift lies in the SNIPS interval in {k} of {len(ope)} runs")
    if a.against:
        ag = res["against"]
        evals = " / ".join(f"{e['run']} vs {e['against']}" for e in ag["fm_evals"])
        print(f"against {' '.join(ag['against'])}: FM evaluations {evals}")
        for k, d in ag["difference"].items():
            print(f"  {k}: clicks per request, paired difference pooled {ci(d['pooled'])}; per "
                  f"run " + ", ".join(ci(x) for x in d["per_run"]))
    print(f"wrote {a.json} ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
