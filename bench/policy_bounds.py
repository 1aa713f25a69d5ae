"""Benchmark: how much of the speculation policies' gap to the oracle any policy could close.

    python bench/policy_bounds.py RUN_DIR [RUN_DIR ...] --json OUT.json [--plot OUT.png]

Each RUN_DIR is a finished closed loop (``solaris simulate`` or ``solaris replay
--closed-loop``: its ``closed_loop.json`` and ``arms.npz``). On each run's shadow-arm log,
with the run's schedule, the key-level simulation runs the verifier, the learned and
allocated policies, and three bounds that foresee the log: ``returns`` (the verifier's bet
at returning users only), ``hindsight`` (the learned policy's features and model fitted on
the log's own outcomes, in sample: how well those features could rank at all) and the
``oracle``. Every point's coverage of shown items is split by slot: the ranked slots (the
arm's top k) and the exploration slot (drawn uniformly from the ranks below k), which no
policy can foresee short of computing every candidate. Reported per run:

* each policy's and bound's coverage at the verifier's FM cost (``at_verifier_cost``), the
  share of the verifier-to-oracle gap it closes there (``gap_closed``) and the FM
  evaluations it needs to match the verifier (``cost_to_match_verifier``, a share of the
  verifier's) -- #17's policy bars: closes >= 0.3, or matches with <= 0.7;
* the same on the ranked slots alone (``ranked``);
* ``explore_share_of_gap``: the part of the verifier-to-oracle gap (in shown items
  covered) that lies on exploration slots.

Prints one table, writes every number as JSON, and with ``--plot`` draws every curve (one
panel per run).
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
sys.path.insert(0, str(ROOT))
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
shadow_inputs = sibling("closed_loop").shadow_inputs

from solaris.config import VerifierConfig  # noqa: E402
from solaris.eval.render import to_json  # noqa: E402
from solaris.replay.policies import HindsightPolicy, make_policy  # noqa: E402
from solaris.replay.closed_loop import POLICY_FRACTIONS  # noqa: E402
from solaris.replay.coverage import (cost_at_coverage, coverage_at_cost,  # noqa: E402
                                     policy_curves)

POLICIES = ("verifier", "learned", "allocated")
# the hindsight bound allocates over the whole log: a share of all its candidates
HINDSIGHT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
RETURNS_MORE = (0.7, 1.0)


def judged(curves: dict[str, list[dict]], ver: dict, orc: dict, key: str) -> dict:
    """Coverage at the verifier's cost, share of the gap to the oracle closed there, and FM
    evaluations to match the verifier, on coverage ``key`` (pair: all shown; ranked)."""
    gap = orc[key] - ver[key]
    out = {"verifier": ver[key], "oracle": orc[key], "gap": gap}
    for name, c in curves.items():
        if name in ("verifier", "oracle"):
            continue
        pts = [{"fm_evals": p["fm_evals"], "pair": p[key]} for p in c]
        at = coverage_at_cost(pts, ver["fm_evals"])
        cost = cost_at_coverage(pts, ver[key])
        out[name] = {"at_verifier_cost": at,
                     "gap_closed": None if at is None or gap <= 0 else (at - ver[key]) / gap,
                     "cost_to_match_verifier": None if cost is None else cost / ver["fm_evals"]}
    return out


def per_run(run: Path, fraction: float) -> dict:
    rep = json.loads((run / "closed_loop.json").read_text())
    closed, base, kw, pos, explore_slot = shadow_inputs(run, rep)
    r, c = closed.candidates.shape
    ranked = np.zeros((r, c), bool)
    explore = np.zeros((r, c), bool)
    rows = np.repeat(np.arange(r), pos.shape[1])
    ranked[rows, pos.ravel()] = ~explore_slot.ravel()
    explore[rows, pos.ravel()] = explore_slot.ravel()
    ttl, lag = kw["read_ttl_s"], kw["lag_s"]
    t0 = time.perf_counter()
    hind = HindsightPolicy.from_log(closed, base, ttl, lag)
    fit_s = time.perf_counter() - t0

    def fresh_hindsight() -> HindsightPolicy:
        return HindsightPolicy(hind.prob, hind.users, hind.ts)

    def named(name: str):
        return lambda: make_policy(name, seed=kw["seed"], read_ttl_s=ttl, lag_s=lag,
                                   request_log=closed)

    fr = tuple(sorted(set(POLICY_FRACTIONS) | {fraction}))
    slots = {"ranked": ranked, "explore": explore}

    def curves_of(makers: dict, fractions) -> dict:
        return policy_curves(closed, base, makers, fractions, masks=slots, **kw)

    curves = curves_of({name: named(name) for name in POLICIES + ("oracle",)}, fr)
    # the returns bound bets at a share of the requests only: its curve goes further
    curves |= curves_of({"returns": named("returns")}, fr + RETURNS_MORE)
    curves |= curves_of({"hindsight": fresh_hindsight}, HINDSIGHT_FRACTIONS)
    ver = next(p for p in curves["verifier"] if p["fraction"] == fraction)
    orc = curves["oracle"][0]
    n_lab, n_exp = int(closed.labelled.sum()), int(explore.sum())
    gap_items = (orc["pair"] - ver["pair"]) * n_lab
    explore_gap = ((orc["explore"] - ver["explore"]) * n_exp
                   if n_exp and orc["explore"] is not None else 0.0)
    return {"run": str(run), "seed": kw["seed"], "requests": r, "candidates": c,
            "shown": int(pos.shape[1]), "shown_items": n_lab, "explore_items": n_exp,
            "hindsight_fit_s": round(fit_s, 1), "curves": curves,
            "all_shown": judged(curves, ver, orc, "pair"),
            "ranked": judged(curves, ver, orc, "ranked"),
            "explore_share_of_gap": explore_gap / gap_items if gap_items > 0 else None}


def _f(x, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--fraction", type=float, default=VerifierConfig.fraction,
                   help="the verifier's fraction the others are judged against")
    a = p.parse_args(argv)
    for run in a.runs:
        for name in ("closed_loop.json", "arms.npz"):
            if not (run / name).is_file():
                raise SystemExit(f"{run}: no {name} (not a finished closed loop)")
    from tqdm import tqdm

    mach = sibling("machine")
    t0 = time.perf_counter()
    rows = [per_run(run, a.fraction) for run in tqdm(a.runs, desc="runs", unit="run")]
    res = {"runs": rows, "fraction": a.fraction, "seconds": round(time.perf_counter() - t0, 1),
           "machine": mach.machine(mach.IN_PROCESS)}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(to_json(res))
    print(f"{'run':<28} {'slots':<8} {'policy':<10} {'cov@cost':>9} {'gap':>7} {'cost':>6}")
    for row in rows:
        for slots in ("all_shown", "ranked"):
            j = row[slots]
            print(f"{Path(row['run']).name:<28} {slots:<8} {'verifier':<10} "
                  f"{_f(j['verifier'], '{:.4f}'):>9}   (oracle {j['oracle']:.4f})")
            for name in ("learned", "allocated", "returns", "hindsight"):
                m = j[name]
                print(f"{'':<28} {'':<8} {name:<10} {_f(m['at_verifier_cost'], '{:.4f}'):>9} "
                      f"{_f(m['gap_closed']):>7} {_f(m['cost_to_match_verifier']):>6}")
        print(f"{'':<28} exploration slots' share of the verifier-to-oracle gap: "
              f"{_f(row['explore_share_of_gap'])}")
    if a.plot is not None:
        from solaris.replay.plots import policy_cost_plot

        policy_cost_plot({f"{Path(r['run']).name} (seed {r['seed']})": r["curves"]
                          for r in rows}, a.plot)
        print(f"plot: {a.plot}")
    print(f"json: {a.json} ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
