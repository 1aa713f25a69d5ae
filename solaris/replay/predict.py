"""Know before you deploy: a replay's online transfer, coverage and FM cost predicted from the
past alone.

``predict`` deletes everything at or after the window's start from the dataset first, then
simulates serving on the validation period (the latest period before the window) with the
shipped artifacts: the verifier ranks the period's requests by the VM alone, the speculation
schedule decides which pairs the FM workers compute and when (``solaris.replay.coverage``),
the workers' vectors go into an in-process ``PairStore`` and each request is looked up with
the router's own code (``solaris.simulate.served.simulate_serving``). The rows are then re-scored
exactly as the replay re-scores its feature log (``solaris.replay.evaluate``): the served VM,
the VM alone and the FM snapshot on the same rows, TR raw and calibrated (Platt on the first
half by request time, measured on the second), and beside it the calibrated TR with both
halves measured (``crossfit_tr``), each with its spread over whole requests. Nothing of the
window -- its requests, labels or scores -- is read: a test runs it on a dataset with the
window deleted.

No Ray here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from solaris.config import SolarisConfig, config_from_dict
from solaris.data.schema import TS, Dataset
from solaris.errors import ConfigError, DataError

def before(ds: Dataset, start_ts: int) -> Dataset:
    """``ds`` with every interaction and request at or after ``start_ts`` deleted (the user
    and item tables stay: ids and side features, no events)."""
    inter = ds.interactions
    n = int(np.searchsorted(inter.column(TS).to_numpy(), start_ts, side="left"))
    req = ds.requests
    if req is not None:
        req = req.filter(pa.array(req.column(TS).to_numpy() < start_ts))
    if n == 0:
        raise DataError(f"{ds.name}: no interactions before ts={start_ts}")
    return dataclasses.replace(ds, interactions=inter.slice(0, n), requests=req)


def window_start(manifest: dict) -> int:
    """The first event time after every period the artifacts trained or validated on: the
    split's test cut where the manifest records it, else the test period's first row."""
    cuts = manifest.get("cuts")
    if cuts is not None:
        return int(cuts[2])
    return int(manifest["periods"]["test"]["ts_min"])


def _val_start(manifest: dict, cfg: SolarisConfig) -> int:
    cuts = manifest.get("cuts")
    if cuts is not None:
        return int(cuts[1])
    if cfg.split.vm_surface is not None or cfg.split.vm_user_share < 1.0:
        raise ConfigError("artifacts without 'cuts' in manifest.json and a vertical slice "
                          "(split.vm_surface / vm_user_share): retrain them with "
                          "`solaris train` to record the period cuts")
    return int(manifest["periods"]["val"]["ts_min"])  # no slice: the cut's own row


def served_rows_of(ds: Dataset, tables: Any, slots: Any, granularity_s: int, task: int
                   ) -> tuple[Any, np.ndarray]:
    """The simulated rows (``ServedSlots``, mapped ones only) as the replay's feature log
    (``ServedRows``, grouped by request, ``task``'s labels; scores not yet) and their
    interaction rows."""
    from solaris.data.requests import request_times
    from solaris.replay.evaluate import ServedRows

    keep = np.flatnonzero(slots.mapped)
    row = slots.rows[keep]
    gran = 0 if ds.requests is not None else max(1, int(granularity_s))
    req_ts = request_times(tables.user, tables.ts, gran)[row]
    user, surface = tables.user[row], tables.surface[row]
    order = np.lexsort((row, surface, user, req_ts))
    keep, row, req_ts, user, surface = (a[order] for a in (keep, row, req_ts, user, surface))
    new = np.r_[True, (np.diff(req_ts) != 0) | (np.diff(user) != 0) | (np.diff(surface) != 0)]
    rows = ServedRows(req=np.cumsum(new) - 1, ts=req_ts.astype(np.float64), user=user,
                      item=tables.item[row], surface=surface,
                      y=tables.labels[row, task].astype(np.float64),
                      score=np.zeros(len(row)), tier=slots.pair_tier[keep],
                      age_s=slots.pair_age_s[keep], pair_emb=slots.pair_emb[keep],
                      agg_emb=slots.agg_emb[keep], agg_present=slots.agg_present[keep])
    return rows, row


def predict(art_dir: str | Path, ds: Dataset, *, start_ts: int | None = None,
            num_candidates: int = 100, seed: int | None = None,
            cfg: SolarisConfig | None = None, task: str | None = None, resamples: int = 1000,
            backtest: str | Path | None = None,
            say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Online TR, coverage and FM evaluations per 1,000 requests of a replay window starting
    at ``start_ts`` (default: the artifacts' own), predicted from the data before it.

    ``num_candidates`` and ``seed`` as the replay builds its request log (``seed``: the
    artifacts' training seed by default); ``cfg`` the artifacts' config by default.

    By default the shipped artifacts serve the validation period. The VM alone was selected
    there (learning rate, early stopping, calibration), which flatters it against the FM;
    ``backtest`` (a directory) instead trains artifacts with the same config and seed on the
    data before the validation period (the split's fractions rescaled so that their test
    period is exactly the validation period) and serves the validation period with those,
    as a replay of it would: nothing they chose was chosen on it.
    """
    from solaris.replay.prepare import check_no_request_features, check_trained_before
    from solaris.online.scoring import Artifacts

    check_no_request_features(ds, "the prediction")

    say = say or (lambda _m: None)
    art_dir = Path(art_dir)
    art = Artifacts.open(art_dir)
    manifest = art.manifest
    cfg = cfg or config_from_dict(manifest["config"], stored=True)
    start = window_start(manifest) if start_ts is None else int(start_ts)
    check_trained_before(manifest, start)
    seed = int(manifest.get("seed", 0)) if seed is None else int(seed)
    task = task or art.tasks[0]
    if task not in art.tasks:
        raise ConfigError(f"task={task!r}: the artifacts serve {list(art.tasks)}")
    past = before(ds, start)  # the window is gone from here on
    if (past.num_users, past.num_items) != (art.num_users, art.num_items):
        raise DataError(f"{ds.name}: {past.num_users} users / {past.num_items} items, the "
                        f"artifacts were trained on {art.num_users} / {art.num_items}")
    val_start = _val_start(manifest, cfg)
    if val_start >= start:
        raise ConfigError(f"validation start ts={val_start} is not before the window start "
                          f"ts={start}")
    method = "shipped"
    if backtest is not None:
        art_dir, manifest, cfg = backtest_artifacts(Path(backtest), past, cfg, val_start,
                                                    seed, say)
        check_trained_before(manifest, val_start)
        method = "backtest"
    out = served_period(art_dir, manifest, past, cfg, val_start, start,
                        num_candidates=num_candidates, seed=seed, task=task,
                        resamples=resamples, say=say)
    out.update({"window_start": start, "method": method})
    return out


def backtest_artifacts(out: Path, past: Dataset, cfg: SolarisConfig, val_start: int,
                       seed: int, say: Callable[[str], None]
                       ) -> tuple[Path, dict, SolarisConfig]:
    """Artifacts trained like the shipped ones on ``past`` with the split rescaled so that
    their test period starts at ``val_start`` (reused when ``out`` already holds them)."""
    from solaris.train.artifacts import train_artifacts

    ts = past.interactions.column(TS).to_numpy()
    n = len(ts)
    n_before = int(np.searchsorted(ts, val_start, side="left"))
    sp = cfg.split
    total = sp.fm_frac + sp.vm_frac + sp.val_frac
    # time_split cuts at ts[round(cumsum(fractions) * n)]: the last cut lands on row n_before
    scale = (n_before / n) / total
    split = dataclasses.replace(sp, fm_frac=sp.fm_frac * scale, vm_frac=sp.vm_frac * scale,
                                val_frac=n_before / n - (sp.fm_frac + sp.vm_frac) * scale)
    bcfg = dataclasses.replace(cfg, split=split)
    path = out / "manifest.json"
    if path.exists():
        manifest = json.loads(path.read_text())
        if manifest.get("cuts", [None] * 3)[2] != val_start or manifest.get("seed") != seed:
            raise ConfigError(f"{out}: holds other backtest artifacts (test cut "
                              f"{manifest.get('cuts')}, seed {manifest.get('seed')}); "
                              "give an empty directory")
    else:
        say("training backtest artifacts on the data before the validation period")
        manifest = train_artifacts(bcfg, past, out, seed=seed)
    if manifest["cuts"][2] != val_start:
        raise DataError(f"backtest split: test cut at ts={manifest['cuts'][2]}, wanted "
                        f"ts={val_start} (too many equal timestamps around the cut)")
    return out, manifest, bcfg


def served_period(art_dir: Path, manifest: dict, past: Dataset, cfg: SolarisConfig,
                  period_start: int, period_end: int, *, num_candidates: int, seed: int,
                  task: str, resamples: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Serve ``past``'s period [period_start, period_end) with ``art_dir`` in simulation and
    measure it as the replay measures its window."""
    from solaris.data.split import Periods, vertical_mask
    from solaris.eval import metrics as M
    from solaris.simulate.served import simulate_period
    from solaris.features import FeatureTables
    from solaris.replay.coverage import coverage_by_tier
    from solaris.replay.evaluate import (base_calibrated_tr, calibrated_tr_ci, crossfit_tr,
                                         gain_per_row, halves, score, transfer)
    from solaris.simulate.log import build_request_log
    from solaris.online.scales import ScaleTable
    from solaris.online.scoring import Artifacts, VMScorer
    from solaris.train.teacher import Teacher, teacher_outputs
    from solaris.tiers import Tier

    art = Artifacts.open(art_dir)
    say("building the period's requests")
    tables = FeatureTables(past, cfg.features)
    gran = cfg.features.request_granularity_s
    lg = build_request_log(past, period_start, num_candidates=num_candidates,
                           granularity_s=max(1, gran), seed=seed, end_ts=period_end)
    ts = tables.ts
    val_rows = np.flatnonzero((ts >= period_start) & (ts < period_end)
                              & vertical_mask(past, cfg.split))
    empty = np.zeros(0, np.int64)
    periods = Periods(fm=empty, vm=empty, val=val_rows, test=empty, fm_vertical=empty,
                      cuts=(period_start, period_start, period_end),
                      ranges={"val": (period_start, period_end - 1)})
    fm, encoder, version = art.models()
    base, _, _ = art.vm_alone(task)
    # the router's lookups: a tier at scale 0 in every VM of the version is not looked up
    cfg = dataclasses.replace(cfg, enrich=ScaleTable({version: manifest}).enrich_for(
        version, cfg.enrich))
    say(f"simulating serving on the period ({lg.num_requests} requests)")
    slots = simulate_period(cfg, past, tables, periods, base, fm, encoder, version, "val",
                            seed, lg=lg)
    t_idx = list(past.tasks).index(task)
    rows, row = served_rows_of(past, tables, slots, gran, t_idx)
    say(f"scoring {len(row)} labelled rows")
    side = art.side_tables()
    ttl = float(cfg.cache.read_ttl_s)
    vm = VMScorer(art, task, side, ttl)
    alone = VMScorer(art, task, side, ttl, alone=True)
    p_served = score(vm, rows)
    rows.score = p_served
    p_alone = score(alone, rows, slots=False)
    probs, _ = teacher_outputs(Teacher(fm, encoder, None, version), tables, row)
    p_fm = np.clip(probs[:, t_idx].astype(np.float64), 1e-7, 1 - 1e-7)
    y = rows.y
    first, second = halves(rows)  # as the replay splits its window
    tr = transfer(y, p_alone, p_served, p_fm, first, second)
    la, lx, lf = (M.bce_rows(y, p) for p in (p_alone, p_served, p_fm))
    ci = M.tr_bootstrap(la, lx, lf, resamples, 0.05, seed)
    # the calibrated figure as the replay measures its window (Platt on the first half, TR
    # on the second), and beside it both halves measured (``crossfit_tr``), each with its
    # spread over whole requests
    n_cal = max(2, resamples // 5)
    one_ci = calibrated_tr_ci(y, p_alone, p_served, p_fm, first, rows.req, n_cal, seed)
    both_ci = calibrated_tr_ci(y, p_alone, p_served, p_fm, first, rows.req, n_cal, seed,
                               crossfit=True)
    cov = coverage_by_tier(rows.tier, rows.agg_present)
    info = slots.info
    return {
        "tr_predicted": tr["tr_cal"],
        "tr_predicted_ci": None if one_ci is None else one_ci["ci"],
        "tr_predicted_sd": None if one_ci is None else one_ci["sd"],
        "tr_predicted_crossfit": crossfit_tr(y, p_alone, p_served, p_fm, first),
        "tr_predicted_crossfit_ci": None if both_ci is None else both_ci["ci"],
        "tr_predicted_crossfit_sd": None if both_ci is None else both_ci["sd"],
        "tr_predicted_raw": tr["tr_raw"],
        "tr_predicted_raw_ci": [ci["ci_low"], ci["ci_high"]],
        "tr_predicted_base_calibrated": base_calibrated_tr(y, p_alone, p_served, p_fm, first,
                                                           second),
        "coverage_predicted": cov,
        # what a covered row is worth here, as the replay reports it for its window
        "gain_per_row": gain_per_row(y, p_alone, p_served, p_fm,
                                     (rows.tier != Tier.NONE) | rows.agg_present),
        "fm_evals_predicted": int(info["fm_evals"]),
        "fm_evals_per_1k_requests_predicted": 1000.0 * info["fm_evals"] / max(1, lg.num_requests),
        "bce": {"raw": tr["bce_raw"], "calibrated_second_half": tr["bce_cal"]},
        "from": {"period": "validation", "ts_min": period_start, "ts_end": period_end,
                 "requests": int(lg.num_requests), "rows": int(len(row)),
                 "rows_in_period": int(len(val_rows)),
                 "pair_simulated_keys": info["pair_simulated"],
                 "own_pair_agrees_with_key_simulation":
                     info["own_pair_agrees_with_key_simulation"]},
        "task": task, "version": version, "seed": seed,
        "num_candidates": int(num_candidates),
    }


def compare(pred: dict[str, Any], rep: dict[str, Any]) -> dict[str, Any]:
    """Prediction against a finished replay (``replay.json``): each figure's error and the
    issue's bars: |TR online - predicted| <= max(0.03, 0.3 |TR online|) (calibrated and raw),
    |coverage - predicted| <= 0.05 (pair and effective); for the calibrated TR, where both
    sides measured their noise, the error in units of it (``error_z``)."""
    from solaris.replay.evaluate import tr_tolerance

    out: dict[str, Any] = {}
    for name, p_key, o_key in (("tr", "tr_predicted", "tr_online"),
                               ("tr_raw", "tr_predicted_raw", "tr_online_raw")):
        o, p = rep.get(o_key), pred.get(p_key)
        if o is None or p is None:
            out[name] = None
            continue
        tol = tr_tolerance(o)
        out[name] = {"online": o, "predicted": p, "error": p - o, "tolerance": tol,
                     "within": bool(abs(p - o) <= tol)}
    if out["tr"] is not None:  # each side's own sampling noise, where measured
        c = out["tr"]
        c["online_sd"], c["predicted_sd"] = rep.get("tr_online_sd"), pred.get("tr_predicted_sd")
        c["online_within_bar_share"] = rep.get("tr_online_within_bar_share")
        if c["online_sd"] is not None and c["predicted_sd"] is not None:
            # the error in units of both sides' noise together (requests resampled on each
            # side): beyond 1.96 the periods differ by more than sampling explains
            sd = float(np.hypot(c["online_sd"], c["predicted_sd"]))
            c["error_sd"] = sd
            c["error_z"] = c["error"] / sd if sd > 0 else None
    for k in ("pair", "effective"):
        o, p = rep["coverage"][k], pred["coverage_predicted"][k]
        out[f"coverage_{k}"] = {"online": o, "predicted": p, "error": p - o, "tolerance": 0.05,
                                "within": bool(abs(p - o) <= 0.05)}
    o, p = rep.get("fm_evals_per_1k_requests"), pred["fm_evals_per_1k_requests_predicted"]
    out["fm_evals_per_1k_requests"] = {"online": o, "predicted": p,
                                       "ratio": p / o if o else None}
    return out


def tr_missing_reason(bce: dict[str, float] | None, where: str) -> str | None:
    """Why a TR measured on the BCEs ``bce`` (``vm``: the VM alone, ``fm``: the FM) is
    missing, in words (None: it is not). TR is the share of the FM-VM gap the served VM
    closes, so it is undefined where the FM is no better than the VM alone."""
    vm, fm = (bce or {}).get("vm"), (bce or {}).get("fm")
    if vm is None or fm is None or not (np.isfinite(vm) and np.isfinite(fm)):
        return f"no BCE was measured {where} (no labelled rows)"
    if vm - fm <= 0:
        return (f"the FM's BCE {fm:.4f} is not below the VM alone's {vm:.4f} {where}: there "
                "is no FM-VM gap for the served VM to close (TR is a share of that gap)")
    return None


def prediction_table(pred: dict[str, Any], check: dict[str, Any] | None = None) -> str:
    """The prediction as a text table (with the online figures and errors where given)."""
    from solaris.replay.report import fmt

    def ci(v: list | None) -> str:
        return "" if not v else f" [{fmt(v[0])}, {fmt(v[1])}]"

    src = pred["from"]
    lines = [f"predicted from the validation period ({src['requests']} requests, "
             f"{src['rows']} labelled rows) for the window from ts={pred['window_start']}",
             f"{'':<30}{'predicted':>10}{'online':>10}"]

    def row(name: str, p: Any, o_key: str | None, extra: str = "") -> None:
        o = (check or {}).get(o_key) if o_key else None
        lines.append(f"  {name:<28}{fmt(p):>10}{fmt(o['online']) if o else '':>10}{extra}")

    row("TR (calibrated)", pred["tr_predicted"], "tr", ci(pred.get("tr_predicted_ci")))
    if "tr_predicted_crossfit" in pred:
        lines.append(f"  {'TR (calibrated, cross-fit)':<28}"
                     f"{fmt(pred['tr_predicted_crossfit']):>10}"
                     f"{'':>10}{ci(pred.get('tr_predicted_crossfit_ci'))}")
    row("TR (raw)", pred["tr_predicted_raw"], "tr_raw", ci(pred.get("tr_predicted_raw_ci")))
    lines.append(f"  {'TR (base-calibrated)':<28}{fmt(pred['tr_predicted_base_calibrated']):>10}")
    for k in ("pair", "effective"):
        row(f"coverage, {k}", pred["coverage_predicted"][k], f"coverage_{k}")
    o = (check or {}).get("fm_evals_per_1k_requests")
    lines.append(f"  {'FM evals / 1k requests':<28}"
                 f"{pred['fm_evals_per_1k_requests_predicted']:>10.0f}"
                 f"{'' if not o or o['online'] is None else format(o['online'], '>10.0f')}")
    bce = pred.get("bce") or {}
    for name, key, measured, where in (
            ("TR (calibrated)", "tr_predicted", "calibrated_second_half",
             "on the period's second half after calibration"),
            ("TR (raw)", "tr_predicted_raw", "raw", "on the period's labelled rows")):
        v = pred.get(key)
        if v is None or not np.isfinite(v):
            why = tr_missing_reason(bce.get(measured), where)
            lines.append(f"{name} is n/a: {why or 'not measured'}")
    return "\n".join(lines)
