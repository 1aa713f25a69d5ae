"""The replay's report: coverage as served against the ceiling and the schedule's simulation,
and transfer re-scored from the feature log (``solaris.replay.evaluate``). Pure: the live
driver (``jobs/replay.py``) hands over what it served."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solaris import atomic
from solaris.config import SolarisConfig
from solaris.tiers import LABELS, Tier

PAIR_TIERS = LABELS[Tier.PAIR:]  # pair, user_neighbour, item_neighbour


def served_rows(lg: Any, live: dict, ds: Any, within_s: float):
    """The labelled rows as served (``ServedRows``) and their interaction rows (-1: none)."""
    from solaris.replay.evaluate import ServedRows
    from solaris.simulate.log import row_index

    r_idx, c_idx = np.nonzero(lg.labelled)
    ok = ~np.isnan(live["scores"][r_idx, c_idx]) & np.isin(r_idx, list(live["feats"]))
    r_idx, c_idx = r_idx[ok], c_idx[ok]
    d = None
    pair, user = [], []
    for r in np.unique(r_idx).tolist():
        fp, fu = live["feats"][r]
        pair.append(fp)
        user.append(fu)
        d = fp.shape[1] if fp.ndim == 2 and fp.shape[0] else d
    pair_emb = np.concatenate(pair) if pair else np.zeros((0, d or 1), np.float32)
    agg_emb = np.concatenate(user) if user else np.zeros((0, d or 1), np.float32)
    rows = ServedRows(req=r_idx.astype(np.int64), ts=lg.ts[r_idx].astype(np.float64),
                      user=lg.user[r_idx].astype(np.int64),
                      item=lg.candidates[r_idx, c_idx].astype(np.int64),
                      surface=lg.surface[r_idx].astype(np.int64),
                      y=lg.labels[r_idx, c_idx, 0].astype(np.float64),
                      score=live["scores"][r_idx, c_idx].astype(np.float64),
                      tier=live["tiers"][r_idx, c_idx].astype(np.int64),
                      age_s=live["ages"][r_idx, c_idx].astype(np.float64),
                      pair_emb=pair_emb, agg_emb=agg_emb,
                      agg_present=live["agg"][r_idx, c_idx].astype(bool))
    row = row_index(ds, rows.user, rows.item, rows.ts, within_s)
    return rows, row, c_idx


@dataclass
class Mapped:
    """A replay's labelled rows that map to interaction rows, with what every online TR
    reads: the served VM and the VM alone (scorers), the VM alone's, the served and the FM
    snapshot's probabilities (clipped) and the snapshot's own pair embeddings."""

    rows: Any  # ServedRows
    row: np.ndarray  # (N,) interaction row of each
    vm: Any  # VMScorer of the served VM
    alone: Any  # VMScorer of the VM alone
    p_alone: np.ndarray
    p_served: np.ndarray
    p_fm: np.ndarray
    z_real: np.ndarray


def mapped(art_dir: Path, task: str, rows: Any, row: np.ndarray, read_ttl_s: float) -> Mapped:
    """``Mapped`` for the rows with ``row >= 0`` of a feature log served by ``art_dir``."""
    from solaris.replay.evaluate import score
    from solaris.online.scoring import Artifacts, VMScorer

    keep = np.flatnonzero(row >= 0)
    rows = take_rows(rows, keep)
    row = row[keep]
    art = Artifacts.open(art_dir)
    side = art.side_tables()
    vm = VMScorer(art, task, side, read_ttl_s)
    alone = VMScorer(art, task, side, read_ttl_s, alone=True)
    with np.load(art_dir / "teacher.npz") as t:
        t_idx = list(art.tasks).index(task)
        p_fm = np.clip(t["probs"][row, t_idx].astype(np.float64), 1e-7, 1 - 1e-7)
        z_real = t["z"][row]
    return Mapped(rows, row, vm, alone, score(alone, rows, slots=False),
                  np.clip(rows.score, 1e-7, 1 - 1e-7), p_fm, z_real)


def transfer_report(art_dir: Path, task: str, rows: Any, row: np.ndarray, read_ttl_s: float,
                    resamples: int = 1000) -> dict[str, Any]:
    """Online TR, by tier, with every pair present, tier worth and train/serve consistency,
    on the labelled rows that map to interaction rows (and were served by ``art_dir``'s VM)."""
    from solaris.eval import metrics as M
    from solaris.replay.evaluate import (TIER_STEPS, base_calibrated_tr, calibrated_tr_ci,
                                         fine_tune, gain_per_row, halves, score, tier_worth,
                                         transfer, within_bar_share)

    m = mapped(art_dir, task, rows, row, read_ttl_s)
    rows, vm, p_fm, z_real = m.rows, m.vm, m.p_fm, m.z_real
    y = rows.y
    first, second = halves(rows)
    p_alone, p_served = m.p_alone, m.p_served
    p_again = score(vm, rows)
    gap = M.paired_bootstrap(M.bce_rows(y, p_alone), M.bce_rows(y, p_fm), resamples, 0.05)
    out: dict[str, Any] = {
        "rows": int(len(rows)), "positives": float(y.mean()),
        "rescored_max_abs_diff": float(np.abs(p_again - p_served).max()) if len(rows) else None,
        "fm_vm_gap": gap}
    # the served VM with every slot off must be the VM alone (a residual VM: exactly)
    p_off = score(vm, rows, tiers=set(), agg=False)
    out["all_slots_off"] = {"max_abs_diff_vs_alone": float(np.abs(p_off - p_alone).max())
                            if len(rows) else None,
                            "equal": bool(np.array_equal(p_off, p_alone))}
    # calibration of the served scores: slope of the label on logit(score), with its
    # interval, where a SOLARIS input was present and where none was (there the VM alone's
    # own slope); and on the second half after the VM alone's Platt fit on the first half is
    # applied to every score -- what a calibration layer refitted on feedback would serve
    present = (rows.tier != Tier.NONE) | rows.agg_present
    p_recal = M.apply_platt(p_served, M.fit_platt(y[first], p_alone[first]))

    def slope(m: np.ndarray, p: np.ndarray) -> dict:
        return M.platt_slope_ci(y[m], p[m]) if m.sum() >= 50 else {"slope": None}

    def band(m: np.ndarray) -> dict | None:  # the slope a calibrated model would show here
        return M.calibrated_slope_band(y[m], p_served[m]) if m.sum() >= 50 else None

    out["calibration_slope"] = {
        name: {"rows": int(m.sum()), **slope(m, p_served), "if_calibrated": band(m),
               "base_calibrated_second_half": slope(m & second, p_recal)}
        for name, m in (("present", present), ("missing", ~present))}
    online = transfer(y, p_alone, p_served, p_fm, first, second)
    out["tr_online"] = online["tr_cal"]
    # its own sampling noise: a bootstrap over whole requests, the Platt fits redone
    noise = calibrated_tr_ci(y, p_alone, p_served, p_fm, first, rows.req,
                             max(2, resamples // 5))
    out["tr_online_ci"] = None if noise is None else noise["ci"]
    out["tr_online_sd"] = None if noise is None else noise["sd"]
    # how often a replay of this system on a window like this one lands within the
    # prediction bar of this one's figure: the share of those draws
    out["tr_online_within_bar_share"] = (
        None if noise is None else within_bar_share(noise["values"], online["tr_cal"]))
    out["tr_online_raw"] = online["tr_raw"]
    # calibrated as the system would be: one Platt fit of the VM alone (first half) applied to
    # the VM alone and to the served scores alike, so rows without SOLARIS input stay equal to
    # the VM alone's after calibration too (a separate fit of the served VM moves them all)
    out["tr_online_base_calibrated"] = base_calibrated_tr(y, p_alone, p_served, p_fm, first,
                                                          second)
    # what the rows with a SOLARIS input could give at most: the FM's own probability there,
    # the VM alone's elsewhere; and each side's gain per row over the VM alone
    bound = transfer(y, p_alone, np.where(present, p_fm, p_alone), p_fm, first, second)
    out["tr_online_teacher_bound"] = {"tr": bound["tr_cal"], "tr_raw": bound["tr_raw"]}
    out["gain_per_row"] = gain_per_row(y, p_alone, p_served, p_fm, present)
    ci = M.tr_bootstrap(M.bce_rows(y, p_alone), M.bce_rows(y, p_served), M.bce_rows(y, p_fm),
                        resamples, 0.05)
    out["tr_online_raw_ci"] = [ci["ci_low"], ci["ci_high"]]  # paired bootstrap over rows
    out["bce"] = {"raw": online["bce_raw"], "calibrated_second_half": online["bce_cal"]}
    out["tr_online_by_tier"] = {}
    for name, tiers, agg in TIER_STEPS:
        r = transfer(y, p_alone, score(vm, rows, tiers=tiers, agg=agg), p_fm, first, second)
        out["tr_online_by_tier"][name] = {"tr": r["tr_cal"], "tr_raw": r["tr_raw"]}
    r = transfer(y, p_alone, score(vm, rows, pair=z_real), p_fm, first, second)
    out["tr_offline_pair_100"] = r["tr_cal"]
    out["tr_offline_pair_100_raw"] = r["tr_raw"]
    out["tier_worth"] = tier_worth(vm, rows, z_real, first)
    # train/serve consistency: fine-tuned on the first half's features as logged
    tuned, fit = fine_tune(vm, rows, np.flatnonzero(first))
    sec = np.flatnonzero(second)
    sub = take_rows(rows, sec)
    b_ship, b_tuned = M.bce(y[sec], score(vm, sub)), M.bce(y[sec], score(tuned, sub))
    b_alone, b_fm = M.bce(y[sec], p_alone[sec]), M.bce(y[sec], p_fm[sec])
    out["consistency"] = {
        "rows_train": int(first.sum()), "rows_eval": int(len(sec)), "fit": fit,
        "bce_dropout_vm": b_ship, "bce_logged_features_vm": b_tuned,
        "bce_vm_alone": b_alone, "bce_fm": b_fm,
        "tr_dropout_vm": M.transfer_ratio(b_alone, b_ship, b_fm),
        "tr_logged_features_vm": M.transfer_ratio(b_alone, b_tuned, b_fm),
        "gap_bce": b_ship - b_tuned}
    return out


def save_feature_log(path: Path, rows: Any, row: np.ndarray) -> Path:
    """The labelled rows' features as served (``ServedRows``) and their interaction rows."""
    import dataclasses

    atomic.save(path, lambda f: np.savez_compressed(
        f, row=row, **{fl.name: getattr(rows, fl.name) for fl in dataclasses.fields(rows)}))
    return path


def transfer_from_log(path: Path, art_dir: Path, task: str, read_ttl_s: float
                      ) -> dict[str, Any]:
    """``transfer_report`` over a saved feature log; the headline keys lifted to the top."""
    from solaris.replay.evaluate import ServedRows

    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    row = data.pop("row")
    out: dict[str, Any] = {"transfer": transfer_report(Path(art_dir), task, ServedRows(**data),
                                                       row, read_ttl_s)}
    for k in ("tr_online", "tr_online_ci", "tr_online_sd", "tr_online_within_bar_share",
              "tr_online_raw", "tr_online_raw_ci",
              "tr_online_base_calibrated",
              "tr_online_teacher_bound", "gain_per_row",
              "tr_online_by_tier", "tr_offline_pair_100",
              "consistency", "tier_worth", "all_slots_off", "calibration_slope"):
        out[k] = out["transfer"].pop(k)
    return out


def take_rows(rows: Any, idx: np.ndarray) -> Any:
    import dataclasses

    return dataclasses.replace(rows, **{f.name: getattr(rows, f.name)[idx]
                                        for f in dataclasses.fields(rows)})


def served_scores(live: dict) -> np.ndarray:
    """The scores the verifier ranked every candidate by (float64; NaN -- never served --
    as 0): the VM alone inside the served VM where the replay has them, else as served."""
    s = live["base_scores"] if live.get("base_scores") is not None else live["scores"]
    return np.nan_to_num(s.astype(np.float64), nan=0.0)


def coverage_report(lg: Any, live: dict, cfg: SolarisConfig, *, lag_s: float, tick_s: float,
                    budget_per_hour: float, seed: int = 0) -> dict[str, Any]:
    """Coverage by tier as served, the ceiling, and the key-level schedule with the served
    scores (a cross-check of the live queue) and with random picks (the baseline)."""
    from solaris.replay.coverage import coverage_by_tier, coverage_ceiling
    from solaris.simulate.coverage import simulate_pair_coverage

    lab = lg.labelled & (live["tiers"] >= 0)
    cov = coverage_by_tier(live["tiers"][lab].astype(np.int64), live["agg"][lab])
    ttl = float(cfg.cache.read_ttl_s)
    kw = dict(fraction=cfg.verifier.fraction, horizon_s=cfg.verifier.horizon_s, read_ttl_s=ttl,
              lag_s=lag_s, tick_s=tick_s, budget_per_hour=budget_per_hour, seed=seed)
    scores = served_scores(live)
    same = simulate_pair_coverage(lg, scores, **kw)
    rand = simulate_pair_coverage(lg, scores, random_picks=True, **kw)
    # random picks spend more evaluations when the budget does not bind (they re-pick what
    # is already fresh less often): also at about the verifier's number of evaluations, by
    # shrinking the random fraction (a few secant steps)
    frac, rand_eq = kw["fraction"], rand
    for _ in range(4):
        if not rand_eq["fm_evals"] or abs(rand_eq["fm_evals"] - same["fm_evals"]) \
                <= 0.02 * same["fm_evals"]:
            break
        frac = min(1.0, frac * same["fm_evals"] / rand_eq["fm_evals"])
        rand_eq = simulate_pair_coverage(lg, scores, random_picks=True,
                                         **{**kw, "fraction": frac})
    return {"coverage": cov,
            "coverage_ceiling": coverage_ceiling(lg, ttl, lag_s),
            "coverage_ceiling_no_lag": coverage_ceiling(lg, ttl, 0.0),
            "coverage_pair_random": rand["pair"],
            "random_fm_evals": rand["fm_evals"],
            "coverage_pair_random_equal_evals": rand_eq["pair"],
            "random_equal_evals": {"fraction": frac, "fm_evals": rand_eq["fm_evals"]},
            "schedule_check": {"pair_simulated_with_served_scores": same["pair"],
                               "fm_evals_simulated": same["fm_evals"],
                               "precision_simulated": same["precision"]}}


def bounds_report(lg: Any, live: dict, cfg: SolarisConfig, neighbours: Any, *,
                  lag_s: float) -> dict[str, Any]:
    """What the log allows whatever the speculation (``solaris.replay.bounds``): effective
    coverage of an oracle that precomputes every candidate, with the probed and with 100
    nearest user neighbours of ``neighbours`` (a ``NeighbourTable``), and how well the served
    scores pick the candidates that come back labelled."""
    from solaris.replay.bounds import effective_bounds, speculation_signal

    probe = int(cfg.enrich.user_knn_probe)
    wide = max(100, probe)
    nbrs = {int(u): neighbours.nearest(int(u), wide)[0] for u in np.unique(lg.user)}
    eff = effective_bounds(lg, nbrs, read_ttl_s=float(cfg.cache.read_ttl_s),
                           retention_s=float(cfg.cache.retention_s), lag_s=lag_s,
                           probes=tuple(sorted({probe, wide})))
    scores = served_scores(live)
    sig = speculation_signal(lg, scores, read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=lag_s,
                             fraction=float(cfg.verifier.fraction))
    return {"coverage_bounds": {**eff, "knn_version": neighbours.version,
                                "user_knn_probe": probe},
            "speculation_signal": sig}


def json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def headline(rep: dict[str, Any]) -> list[str]:
    """What a user reads first: coverage, TR online with its interval and the FM's cost, each
    beside its prediction from the data before the window (where it was made)."""
    pred = rep.get("prediction") or {}
    pc = pred.get("coverage_predicted") or {}

    def row(name: str, online: Any, predicted: Any = None, extra: str = "") -> str:
        return f"  {name:<26}{fmt(online):>8}{fmt(predicted) if pred else '':>11}{extra}"

    ci = rep.get("tr_online_ci")
    lines = [f"SOLARIS on {rep['dataset']}: {rep['requests']} requests, "
             f"{rep['labelled_pairs']} labelled pairs",
             f"  {'':<26}{'online':>8}{'predicted' if pred else '':>11}",
             row("pair coverage", rep["coverage"]["pair"], pc.get("pair")),
             row("effective coverage", rep["coverage"]["effective"], pc.get("effective")),
             row("TR online (calibrated)", rep.get("tr_online"), pred.get("tr_predicted"),
                 f"   95% CI [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
             row("TR online (raw)", rep.get("tr_online_raw"), pred.get("tr_predicted_raw"))]
    evals = rep.get("fm_evals_per_1k_requests")
    p_evals = pred.get("fm_evals_per_1k_requests_predicted")
    lines.append(f"  {'FM evals / 1k requests':<26}{evals:>8.0f}"
                 + (f"{p_evals:>11.0f}" if p_evals is not None else ""))
    if rep.get("candidate_recurrence_6h") is not None:
        lines.append(f"  {'candidate recurrence, 6 h':<26}{fmt(rep['candidate_recurrence_6h']):>8}"
                     f"   (within the read TTL {fmt(rep.get('candidate_recurrence'))})")
    return lines


def summary_table(rep: dict[str, Any]) -> str:
    """The replay's numbers as a text table, the headline first."""
    c = rep["coverage"]
    lines = [*headline(rep), "",
             f"details: {rep['seconds']} s replaying (+ {rep['artifacts_seconds']} s "
             "training)",
             f"{'coverage':<28}{'share':>8}"]
    for k in (*PAIR_TIERS, "aggregate", "effective"):  # cumulative, in the fixed tier order
        lines.append(f"  {k:<26}{c[k]:>8.3f}")
    lines += [f"  {'ceiling (TTL, lag)':<26}{rep['coverage_ceiling']:>8.3f}",
              f"  {'pair, random speculation':<26}{rep['coverage_pair_random']:>8.3f}",
              f"  {'  ... at equal FM evals':<26}"
              f"{fmt(rep.get('coverage_pair_random_equal_evals')):>8}",
              f"{'transfer ratio (calibrated)':<28}"]
    ci = rep.get("tr_online_ci")
    lines.append(f"  {'online, as served':<26}{fmt(rep['tr_online']):>8}"
                 + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""))
    for k, v in rep["tr_online_by_tier"].items():
        lines.append(f"  {'+ ' + k:<26}{fmt(v['tr']):>8}")
    lines.append(f"  {'every pair present':<26}{fmt(rep['tr_offline_pair_100']):>8}")
    if rep.get("tr_online_teacher_bound"):
        lines.append(f"  {'FM where input present':<26}"
                     f"{fmt(rep['tr_online_teacher_bound']['tr']):>8}")
    if rep.get("tr_online_raw") is not None:
        lines.append(f"  {'online, raw':<26}{fmt(rep['tr_online_raw']):>8}")
    worth = rep.get("tier_worth") or {}
    if worth:  # each fallback input's share of a real pair's gain, where it is served
        lines.append(f"{'worth of a real pair (raw)':<28}{'share':>8}{'worth':>8}")
    for k, w in worth.items():
        raw = w.get("raw") or {}
        ci = raw.get("worth_ci")
        lines.append(f"  {k:<26}{fmt(w.get('share')):>8}{fmt(raw.get('worth')):>8}"
                     + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""))
    sl = rep.get("calibration_slope") or {}
    if sl:
        lines.append(f"{'calibration slope (95% CI)':<28}")
    for k in ("present", "missing"):
        v = sl.get(k) or {}
        if v.get("slope") is not None:
            ci = f" [{fmt(v['ci_low'])}, {fmt(v['ci_high'])}]" if "ci_low" in v else ""
            lines.append(f"  {k + ' rows':<26}{fmt(v['slope']):>8}{ci}")
            band = v.get("if_calibrated")
            if band:
                lines.append(f"    {'if calibrated':<24}{'':>8} [{fmt(band['ci_low'])}, "
                             f"{fmt(band['ci_high'])}] p={fmt(band['p_value'])}")
    b, sig = rep.get("coverage_bounds"), rep.get("speculation_signal")
    if b:
        lines.append(f"{'bounds (oracle speculation)':<28}")
        lines.append(f"  {'own history (retention)':<26}{b['own_history_share']:>8.3f}")
        for k, v in b["effective_oracle"].items():
            name = "effective, any user" if k == "any_user" else f"effective, {k} nbrs"
            lines.append(f"  {name:<26}{v:>8.3f}")
    if sig:
        lines += [f"  {'verifier AUC, returning':<26}{fmt(sig['auc']):>8}",
                  f"  {'returning in top fraction':<26}{fmt(sig['top_fraction_share']):>8}"]
    chk = rep.get("prediction_check")
    if chk:
        lines.append(f"{'predicted before the replay':<28}{'pred.':>8}{'online':>8}")
        for name, key in (("TR calibrated", "tr"), ("TR raw", "tr_raw"),
                          ("pair coverage", "coverage_pair"),
                          ("effective coverage", "coverage_effective")):
            c = chk.get(key)
            if c:
                lines.append(f"  {name:<26}{fmt(c['predicted']):>8}{fmt(c['online']):>8}")
    lines += [f"{'speculation precision':<28}{fmt(rep['speculation_precision']):>8}",
              f"{'FM evals / 1k requests':<28}{rep['fm_evals_per_1k_requests']:>8.0f}",
              f"{'errors / retries':<28}{rep['errors']:>5} / {rep['retries']}"]
    return "\n".join(lines)


def fmt(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"
