"""Benchmark: speculation policies at equal FM cost, on the request logs of finished replays.

    python bench/policies.py RUN_DIR[:SEED] [RUN_DIR[:SEED] ...] --json OUT.json --plot OUT.png

Each RUN_DIR is a finished ``solaris replay``. Its request log (candidates, users, times) and
the scores the verifier ranked by come from ``served.npz`` (runs written before it held
them: the log is rebuilt from the run's config and window with the replay's ``SEED``, and the
served scores stand in). Every policy of ``solaris.precompute.speculation`` then runs on the key-level
schedule simulation with the run's lag, tick, TTL and budget, over a sweep of fractions
(the oracle once: it computes exactly what will be read); the simulation merges a pending pair
as the live queue does (it stays with the earlier request). Reported per run:

* each policy's cost curve: pair coverage of labelled pairs, FM evaluations (and per 1,000
  requests), precision;
* ``live_check``: the simulated verifier at the run's own fraction against the live run's pair
  coverage (the other policies count only if it is within 0.005);
* at the verifier's cost (its default fraction): every policy's coverage interpolated on its
  curve, ``verifier / random`` and the share of the verifier-to-oracle gap each policy closes;
* the FM evaluations each policy needs to match the verifier's coverage, as a share of the
  verifier's (``cost_to_match_verifier``);
* candidate recurrence (share of candidates that were a candidate of the same user within
  the TTL before).

One plot: coverage against FM evaluations per 1,000 requests, a panel per run.
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

FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.5)


def load_log(run: Path, seed: int):
    """(request log, verifier scores (R, C), replay.json, config, whether the log was
    rebuilt)."""
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.errors import DataError
    from solaris.simulate.log import build_request_log

    rep = json.loads((run / "replay.json").read_text())
    cfg = load_config(run / "replay-config.yaml", stored=True)
    ds = load_dataset(cfg.data)
    lg = build_request_log(ds, int(rep["window_start"]),
                           num_candidates=int(rep["candidates_per_request"]),
                           granularity_s=cfg.features.request_granularity_s, seed=seed)
    with np.load(run / "served.npz") as f:
        saved = {k: f[k] for k in f.files}
    rebuilt = "candidates" not in saved
    if not rebuilt and not (np.array_equal(saved["candidates"], lg.candidates)
                            and np.array_equal(saved["ts"], lg.ts)):
        raise DataError(f"{run}: the rebuilt request log differs from the served one "
                        f"(wrong seed {seed}?)")
    s = saved.get("base_scores", saved["scores"])
    if s.shape != lg.candidates.shape:
        raise DataError(f"{run}: served scores {s.shape} do not fit the log "
                        f"{lg.candidates.shape} (wrong seed {seed}?)")
    return lg, np.nan_to_num(s.astype(np.float64), nan=0.0), rep, cfg, rebuilt


def run_one(run: Path, seed: int, fractions: tuple[float, ...]) -> dict:
    from solaris.replay.coverage import compare_policies

    t0 = time.perf_counter()
    lg, scores, rep, cfg, rebuilt = load_log(run, seed)
    frac = float(rep["fraction"])
    cmp = compare_policies(lg, scores, fraction=frac, fractions=fractions, seed=seed,
                           horizon_s=float(cfg.verifier.horizon_s),
                           read_ttl_s=float(rep["read_ttl_s"]), lag_s=float(rep["lag_s"]),
                           tick_s=float(rep["tick_s"]),
                           budget_per_hour=float(rep["budget_per_hour"]))
    live = float(rep["coverage"]["pair"])
    sim = cmp["at_verifier_cost"]["pair"]["verifier"]
    return {
        "run": str(run), "seed": seed, "dataset": rep["dataset"], "log_rebuilt": rebuilt,
        "requests": int(lg.num_requests), "fraction": frac,
        "live_check": {"live_pair": live, "simulated_pair": sim,
                       "abs_diff": abs(live - sim), "ok": abs(live - sim) <= 0.005},
        **cmp, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from solaris.replay.plots import policy_cost_plot

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="RUN_DIR[:SEED] (SEED: the replay's --seed, 0)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path, required=True)
    p.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    out = []
    for spec in tqdm(a.runs, desc="runs"):
        run, _, seed = spec.partition(":")
        out.append(run_one(Path(run), int(seed or 0), tuple(a.fractions)))
    panels = {f"{r['dataset']} seed {r['seed']}": r["curves"] for r in out}
    policy_cost_plot(panels, a.plot)
    from machine import NO_FM, machine

    res = {"runs": out, "fractions": a.fractions, "plot": str(a.plot),
           "seconds": round(time.perf_counter() - t0, 1),
           "machine": machine(NO_FM)}  # the key-level simulation evaluates no FM
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=2))

    def f(x):
        return "  n/a" if x is None else f"{x:.3f}"

    print(f"{'run':<26}{'live':>7}{'sim':>7}{'evals/1k':>9}{'verif':>7}{'random':>7}"
          f"{'recur':>7}{'learn':>7}{'oracle':>7}{'v/rand':>7}{'lrn gap':>8}{'lrn cost':>9}"
          f"{'recur%':>7}")
    for r in out:
        c, at = r["live_check"], r["at_verifier_cost"]
        print(f"{Path(r['run']).name:<26}{f(c['live_pair']):>7}{f(c['simulated_pair']):>7}"
              f"{at['fm_evals_per_1k']:>9.0f}{f(at['pair']['verifier']):>7}"
              f"{f(at['pair']['random']):>7}{f(at['pair']['recurrence']):>7}"
              f"{f(at['pair']['learned']):>7}"
              f"{f(at['oracle']['pair']):>7}{f(r['verifier_over_random']):>7}"
              f"{f(r['gap_closed']['learned']):>8}"
              f"{f(r['cost_to_match_verifier']['learned']):>9}{f(r['candidate_recurrence']):>7}")
    print("oracle FM evals: " + ", ".join(f"{r['at_verifier_cost']['oracle']['fm_evals']}"
                                          for r in out))
    print(f"wrote {a.json} and {a.plot} ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
