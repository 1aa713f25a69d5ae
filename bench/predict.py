"""Benchmark: finished replays' online figures against their prediction from the past.

    python bench/predict.py RUN_DIR [RUN_DIR ...] --json OUT.json [--data-dir DIR]

Each RUN_DIR is a finished ``solaris replay`` (replay.json, artifacts/). Its dataset is loaded
as the artifacts' config says (MovieLens from ``--data-dir`` or the fetch cache), the window
is deleted (``solaris.replay.predict.before``), and ``predict`` simulates serving on the
validation period with the run's artifacts. Printed per run and as the mean over runs: TR
(calibrated, raw) and pair / effective coverage, predicted and online, with the bars of
``compare`` (|TR error| <= max(0.03, 0.3 |TR online|), |coverage error| <= 0.05) and the
FM evaluations per 1,000 requests. Every number goes into the JSON. ``--backtest``: the
validation period served by artifacts trained before it (``predict``'s ``backtest``).
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

from solaris.config import config_from_dict, with_overrides  # noqa: E402
from solaris.eval.render import to_json  # noqa: E402
from solaris.replay.predict import before, compare, predict, window_start  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, help="MovieLens-100K directory")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--backtest", action="store_true",
                   help="serve the validation period with artifacts trained before it "
                        "(RUN_DIR/backtest, trained once) instead of the shipped ones")
    args = p.parse_args(argv)
    from solaris.data.load import load_dataset

    out: dict = {"runs": {}}
    for run in args.runs:
        art = run / "artifacts"
        manifest = json.loads((art / "manifest.json").read_text())
        cfg = config_from_dict(manifest["config"], stored=True)
        if args.data_dir is not None:
            cfg = with_overrides(cfg, {"data.data_dir": str(args.data_dir)})
        rep = json.loads((run / "replay.json").read_text())
        start = int(rep["window_start"])
        if start != window_start(manifest):
            raise SystemExit(f"{run}: replay window starts at {start}, the artifacts' at "
                             f"{window_start(manifest)}")
        ds = before(load_dataset(cfg.data, fetch=True), start)  # the window is gone
        t0 = time.perf_counter()
        pred = predict(art, ds, start_ts=start, num_candidates=int(
            rep.get("candidates_per_request", 100)), cfg=cfg, resamples=args.resamples,
            backtest=run / "backtest" if args.backtest else None)
        seconds = time.perf_counter() - t0
        chk = compare(pred, rep)
        out["runs"][str(run)] = {"prediction": pred, "check": chk, "seconds": round(seconds, 1)}
        print(f"{run}: {seconds:.0f} s")
        for k in ("tr", "tr_raw", "coverage_pair", "coverage_effective"):
            c = chk[k]
            if c is None:
                continue
            sd = ""
            if c.get("online_sd") is not None and c.get("predicted_sd") is not None:
                sd = (f"  (sd: predicted {c['predicted_sd']:.3f}, online {c['online_sd']:.3f};"
                      f" error {c['error_z']:+.2f} sd)")
                if c.get("online_within_bar_share") is not None:
                    sd += (f"; online resampled within the bar of itself: "
                           f"{c['online_within_bar_share']:.2f}")
            print(f"  {k:<20} predicted {c['predicted']:7.3f}  online {c['online']:7.3f}  "
                  f"error {c['error']:+7.3f}  within {c['tolerance']:.3f}: {c['within']}{sd}")
        if chk["tr"] is not None and pred.get("tr_predicted_crossfit") is not None:
            x = pred["tr_predicted_crossfit"]
            on, sd_x = chk["tr"]["online"], pred.get("tr_predicted_crossfit_sd")
            print(f"  {'tr, cross-fit':<20} predicted {x:7.3f}  online {on:7.3f}  "
                  f"error {x - on:+7.3f}  (sd {'n/a' if sd_x is None else format(sd_x, '.3f')})")
        g_p, g_o = pred.get("gain_per_row"), rep.get("gain_per_row")
        if g_p and g_o:  # what a covered row is worth in each period (raw BCE gain per row)
            def f(v: float | None) -> str:
                return "n/a" if v is None else f"{v:.4f}"
            print(f"  {'gain / covered row':<20} FM {f(g_p['fm']['present'])} -> "
                  f"{f(g_o['fm']['present'])}, served {f(g_p['served']['present'])} -> "
                  f"{f(g_o['served']['present'])} (validation -> window)")
        e = chk["fm_evals_per_1k_requests"]
        print(f"  {'fm evals / 1k req':<20} predicted {e['predicted']:7.0f}  online "
              f"{e['online']:7.0f}  ratio {e['ratio']:.3f}")
    runs = list(out["runs"].values())

    def mean(key: str, side: str) -> float | None:
        v = [r["check"][key][side] for r in runs if r["check"][key] is not None]
        return float(np.mean(v)) if v else None

    # the bars applied to the means over runs, by the same ``compare``
    cov = {k: {"pred": mean(f"coverage_{k}", "predicted"), "on": mean(f"coverage_{k}", "online")}
           for k in ("pair", "effective")}
    mean_pred = {"tr_predicted": mean("tr", "predicted"),
                 "tr_predicted_raw": mean("tr_raw", "predicted"),
                 "coverage_predicted": {k: v["pred"] for k, v in cov.items()},
                 "fm_evals_per_1k_requests_predicted": mean("fm_evals_per_1k_requests",
                                                            "predicted")}
    mean_rep = {"tr_online": mean("tr", "online"), "tr_online_raw": mean("tr_raw", "online"),
                "coverage": {k: v["on"] for k, v in cov.items()},
                "fm_evals_per_1k_requests": mean("fm_evals_per_1k_requests", "online")}
    out["mean_over_runs"] = compare(mean_pred, mean_rep)
    print("mean over runs:")
    for k, c in out["mean_over_runs"].items():
        if c is None or "within" not in c:
            continue
        within = sum(bool(r["check"][k] and r["check"][k]["within"]) for r in runs)
        print(f"  {k:<20} predicted {c['predicted']:7.3f}  online {c['online']:7.3f}  "
              f"within: {c['within']} ({within} of {len(runs)} runs within)")
    from machine import IN_PROCESS, machine, run_devices

    live = run_devices(args.runs)  # the online figures; the predictions run in process
    out["machine"] = machine(None if live is None else live + IN_PROCESS)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(to_json(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
