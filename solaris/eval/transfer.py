"""The offline transfer report: FM -> encoder -> VM variants, temporal teacher protocol.

Per seed: train the FM on the FM period; fit the encoder; run the frozen snapshot over every
row (soft labels and pair embeddings z, out-of-sample on the VM, validation and test periods);
build the causal aggregate; train each VM variant on the same validation grid; score the test
rows. Numbers follow DESIGN.md: TR from seed-mean BCEs, calibration fitted on validation only,
FM-vs-VM gap by a paired bootstrap over test rows, warm and cold users apart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from solaris.config import SolarisConfig
from solaris.data.schema import Dataset
from solaris.data.split import Periods, time_split, warm_mask
from solaris.eval import metrics as M
from solaris.features import FeatureTables
from solaris.models.vm import VerticalModel
from solaris.simulate.schedule import simulated_presence, window_log
from solaris.simulate.served import ServedSlots, simulate_period
from solaris.tiers import STEPS
from solaris.train.loop import predict_in_batches
from solaris.train.residual import (CrossFit, candidate_table, crossfit_base, fit_pair_as_served,
                                    fit_served_tiers, residual_meta, train_base, train_residual,
                                    training_verifier)
from solaris.train.teacher import Teacher, build_teacher, vm_inputs, z_at_age
from solaris.train.vertical import VMInputs, VMSpec, best_vm, coverage_mask, predict_vm

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def variant_specs(coverages: tuple[float, ...], kd_alphas: tuple[float, ...]) -> list[list[VMSpec]]:
    """Grids of jointly trained VM variants (the ablations' arms; the report's own SOLARIS
    arms are residual, ``TransferExperiment.residual_arms``)."""
    out = [[VMSpec("vm")], [VMSpec("vm_kd", kd_alpha=a) for a in kd_alphas],
           [VMSpec("vm_agg", use_agg=True)]]
    for c in coverages:
        out.append([VMSpec(f"vm_pair_{int(round(c * 100))}", use_pair=True, coverage=c)])
    return out


@dataclass
class SeedRun:
    """One seed's test predictions per model (probabilities), raw and calibrated."""

    raw: dict[str, np.ndarray] = field(default_factory=dict)
    cal: dict[str, np.ndarray] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # test rows with the slot on
    chosen: dict[str, dict] = field(default_factory=dict)  # grid point chosen per variant


class TransferExperiment:
    """Holds the data, periods and feature tables shared by every seed and variant."""

    def __init__(self, cfg: SolarisConfig, ds: Dataset, progress: Progress | None = None):
        self.cfg = cfg
        self.ds = ds
        self.progress = progress or (lambda _msg: None)
        self.periods: Periods = time_split(ds, cfg.split)
        self.tables = FeatureTables(ds, cfg.features)
        self.warm = warm_mask(ds, self.periods)
        self.absent_rows = self.periods.fm_vertical if cfg.split.vm_trains_on_fm_period else \
            np.zeros(0, dtype=np.int64)
        self._logs: dict = {}  # period -> its request log, built once (schedule simulation)

    # ---- teacher -------------------------------------------------------------------------
    def teacher(self, seed: int, fm_rows: np.ndarray | None = None,
                task_mask: tuple[bool, ...] | None = None) -> Teacher:
        rows = self.periods.fm if fm_rows is None else fm_rows
        return build_teacher(self.tables, rows, self.cfg.fm, self.cfg.encoder, self.cfg.train,
                             seed, task_mask=task_mask)

    def inputs(self, teacher: Teacher) -> tuple[np.ndarray, VMInputs]:
        """Teacher probabilities for every row and the VM inputs built from its z."""
        return vm_inputs(teacher, self.tables, self.cfg.features)

    # ---- VMs -----------------------------------------------------------------------------
    def best_of_grid(self, grid: list[VMSpec], inputs: VMInputs, probs: np.ndarray, task: int,
                     seed: int, teacher_rows: np.ndarray | None = None
                     ) -> tuple[VMSpec, float, VerticalModel]:
        """Best-on-validation model of ``grid`` x lr grid: (spec, lr, model)."""
        p = self.periods
        spec, lr, model, _ = best_vm(
            inputs, grid, self.cfg.vm, self.cfg.train, self.cfg.report.vm_lrs, task=task,
            teacher_rows=p.vm if teacher_rows is None else teacher_rows,
            absent_rows=self.absent_rows, val_rows=p.val, seed=seed,
            soft_labels=probs[:, task], num_users=self.ds.num_users,
            num_items=self.ds.num_items)
        return spec, lr, model

    def predict(self, model: torch.nn.Module, inputs: VMInputs, task: int, seed: int,
                coverage: float, use_agg: bool) -> tuple[np.ndarray, np.ndarray]:
        """(test probs, calibrated) of ``model``: the pair slot present on the seeded
        ``coverage`` masks (nested across coverages, shared by every arm of a seed), the user
        slot on where ``use_agg``; Platt fitted on validation with the same gates."""
        p = self.periods
        val_mask = coverage_mask(len(p.val), coverage, seed + 1)
        test_mask = coverage_mask(len(p.test), coverage, seed + 2)
        pv = predict_vm(model, inputs, p.val, val_mask, np.full(len(p.val), use_agg))
        pt = predict_vm(model, inputs, p.test, test_mask, np.full(len(p.test), use_agg))
        ab = M.fit_platt(self.tables.labels[p.val, task], pv)
        return pt, M.apply_platt(pt, ab)

    def run_variant(self, grid: list[VMSpec], inputs: VMInputs, probs: np.ndarray, task: int,
                    seed: int, teacher_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
        """Best-on-validation model of ``grid`` x lr grid: (test probs, calibrated, chosen)."""
        spec, lr, model = self.best_of_grid(grid, inputs, probs, task, seed, teacher_rows)
        cov = spec.coverage if spec.use_pair else 0.0
        pt, pc = self.predict(model, inputs, task, seed, cov, spec.use_agg)
        chosen = {"lr": lr, "kd_alpha": spec.kd_alpha, "coverage": cov}
        return pt, pc, chosen

    def schedule(self, base: VerticalModel, period: str, seed: int) -> dict:
        """The schedule simulation over a period's request log (built once per period), the
        verifier ranking by ``base``: ``simulated_presence`` on that period's rows."""
        if period not in self._logs:
            self._logs[period] = window_log(self.cfg, self.ds, self.periods, period)
        rows = self.periods.test if period == "test" else self.periods.val
        return simulated_presence(self.cfg, self.ds, self.tables, self.periods, base,
                                  self._logs[period], seed, rows=rows)

    def served(self, base: VerticalModel, teacher: Teacher, period: str, seed: int,
               cf: CrossFit) -> ServedSlots:
        """A period's rows as simulated serving gives them (``simulate_serving``): the
        verifier ranking by ``base`` (on the training period by ``training_verifier``), KNN
        tables as of the period's start."""
        if period not in self._logs:
            self._logs[period] = window_log(self.cfg, self.ds, self.periods, period)
        return simulate_period(self.cfg, self.ds, self.tables, self.periods, base, teacher.fm,
                               teacher.encoder, teacher.version, period, seed,
                               self._logs[period],
                               verifier=training_verifier(cf, self.tables, period))

    def served_arms(self, run: "SeedRun", base: VerticalModel, pair_model: torch.nn.Module,
                    cf: CrossFit, task: int, seed: int, teacher: Teacher,
                    pair_curves: dict | None = None) -> None:
        """Every input the router serves, trained and judged on simulated serving
        (``fit_served_tiers``): the arms ``served_<step>`` switch them on cumulatively in
        lookup order (pair, user neighbour, item neighbour, aggregate); Platt on validation
        served the same way."""
        cfg, p = self.cfg, self.periods
        ttl = float(cfg.cache.read_ttl_s)
        self.progress(f"seed {seed}: {self.ds.tasks[task]} simulated serving")
        sv = {per: self.served(base, teacher, per, seed, cf) for per in ("vm", "val", "test")}
        self.progress(f"seed {seed}: {self.ds.tasks[task]} tiers and aggregate as served")
        tf = fit_served_tiers(pair_model, self.tables, cfg.residual, cfg.train, task=task,
                              train_slots=sv["vm"], base_logits=cf.logits, val_slots=sv["val"],
                              read_ttl_s=ttl, seed=seed, pair_curves=pair_curves,
                              item_table=candidate_table(cfg.residual.agg_items, teacher.fm,
                                                         self.tables))
        m = tf.model
        run.chosen["served"] = {**tf.info, "scale_curves": tf.scale_curves,
                                "scales": residual_meta(tf)["scales"],
                                "simulation": {per: s.info for per, s in sv.items()}}
        m.eval()

        @torch.no_grad()
        def probs(slots: ServedSlots, tiers, agg: bool) -> np.ndarray:
            idx = np.arange(len(slots.rows))
            return np.clip(predict_in_batches(
                lambda q: torch.sigmoid(m(slots.batch(self.tables, idx[q], ttl, tiers, agg))),
                len(idx)).astype(np.float64), 1e-7, 1 - 1e-7)

        yv = self.tables.labels[p.val, task]
        te = sv["test"]
        for name, tiers, agg in STEPS:
            pt, pv = probs(te, tiers, agg), probs(sv["val"], tiers, agg)
            arm = f"vm_served_{name}"
            run.raw[arm], run.cal[arm] = pt, M.apply_platt(pt, M.fit_platt(yv, pv))
            run.masks[arm] = np.isin(te.pair_tier, sorted(tiers)) | (te.agg_present & agg)

    def residual_arms(self, run: "SeedRun", base: VerticalModel, lr: float, inputs: VMInputs,
                      task: int, seed: int, teacher: Teacher) -> None:
        """The residual arms on the frozen base: the pair correction at every coverage, its
        no-z control, and the user-slot correction; each trained once on every VM-period row
        where its slot is present, on cross-fitted base logits. The pair correction is also
        trained on z as the cache serves it (``fit_pair_as_served``); the one better on
        validation served the same way scores ``pair_sim``, the schedule's presence with z
        and ages as served."""
        p, cfg = self.periods, self.cfg
        self.progress(f"seed {seed}: {self.ds.tasks[task]} cross-fitted base logits")
        cf = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, task=task, rows=p.vm,
                           absent_rows=self.absent_rows, val_rows=p.val, lr=lr, seed=seed,
                           num_users=self.ds.num_users, num_items=self.ds.num_items)
        b_oos = cf.logits
        self.progress(f"seed {seed}: {self.ds.tasks[task]} schedule simulation")
        sim_val = self.schedule(base, "val", seed)
        sim = self.schedule(base, "test", seed)
        z_as_of = z_at_age(teacher, self.tables, cfg.features)
        self.progress(f"seed {seed}: {self.ds.tasks[task]} residual pair (fresh and as served)")
        ttl = float(cfg.cache.read_ttl_s)
        served_fit = fit_pair_as_served(base, inputs, cfg.residual, cfg.train, task=task,
                                        rows=p.vm, base_logits=b_oos, val_rows=p.val,
                                        seed=seed, z_as_of=z_as_of,
                                        found_age_s=sim_val["age_s"], read_ttl_s=ttl,
                                        found_history_age_s=sim_val["history_age_s"])
        run.chosen["residual_pair_as_served"] = served_fit.info
        fits = {"pair": served_fit.fresh}
        run.chosen["residual_pair"] = {"val_bce": served_fit.fresh.val_bce,
                                       "scale_curve": served_fit.fresh.scale_curves["pair"]}
        for name, slot, use_z in (("control", "pair", False), ("agg", "agg", True)):
            self.progress(f"seed {seed}: {self.ds.tasks[task]} residual {name}")
            fits[name] = train_residual(base, inputs, cfg.residual, cfg.train, task=task,
                                        rows=p.vm, base_logits=b_oos, val_rows=p.val, slot=slot,
                                        use_z=use_z, seed=seed)
            run.chosen[f"residual_{name}"] = {"val_bce": fits[name].val_bce,
                                              "scale_curve": fits[name].scale_curves[slot]}
        for c in cfg.report.coverages:
            name = f"vm_pair_{int(round(c * 100))}"
            run.raw[name], run.cal[name] = self.predict(fits["pair"].model, inputs, task, seed,
                                                        c, False)
            run.masks[name] = coverage_mask(len(p.test), c, seed + 2)
        run.raw["vm_control_100"], run.cal["vm_control_100"] = self.predict(
            fits["control"].model, inputs, task, seed, 1.0, False)
        run.raw["vm_agg"], run.cal["vm_agg"] = self.predict(fits["agg"].model, inputs, task,
                                                            seed, 0.0, True)
        # the presence pattern the speculation schedule gives on the test period (c_sim):
        # pair_sim_fresh with each covered row's own fresh z (the fresh-z correction),
        # pair_sim as served -- z as of the history the entry read (its write, or its release
        # under schedule.history_at: visible), its age, the correction chosen as served;
        # Platt on validation rows covered the same way
        off = np.zeros(len(p.test), bool)
        pt = predict_vm(fits["pair"].model, inputs, p.test, sim["mask"], off)
        val_mask = coverage_mask(len(p.val), sim["c_sim"], seed + 1)
        pv = predict_vm(fits["pair"].model, inputs, p.val, val_mask,
                        np.zeros(len(p.val), bool))
        ab = M.fit_platt(self.tables.labels[p.val, task], pv)
        run.raw["vm_pair_sim_fresh"], run.cal["vm_pair_sim_fresh"] = pt, M.apply_platt(pt, ab)
        run.masks["vm_pair_sim_fresh"] = sim["mask"]
        cov_t, cov_v = p.test[sim["mask"]], p.val[sim_val["mask"]]
        both = np.concatenate([cov_t, cov_v])
        age = np.concatenate([sim["age_s"][sim["mask"]], sim_val["age_s"][sim_val["mask"]]])
        hist = np.concatenate([sim["history_age_s"][sim["mask"]],
                               sim_val["history_age_s"][sim_val["mask"]]])
        as_served = inputs.served_as(both, z_as_of(both, hist), age, ttl)
        chosen = served_fit.fit.model
        pt = predict_vm(chosen, as_served, p.test, sim["mask"], off)
        pv = predict_vm(chosen, as_served, p.val, sim_val["mask"], np.zeros(len(p.val), bool))
        ab = M.fit_platt(self.tables.labels[p.val, task], pv)
        run.raw["vm_pair_sim"], run.cal["vm_pair_sim"] = pt, M.apply_platt(pt, ab)
        run.masks["vm_pair_sim"] = sim["mask"]
        run.chosen["schedule"] = {k: v for k, v in sim.items()
                                  if k not in ("mask", "age_s", "history_age_s")}
        run.chosen["schedule"]["age_s_median"] = float(np.nanmedian(sim["age_s"])) \
            if sim["mask"].any() else None
        run.chosen["schedule"]["c_sim_val"] = sim_val["c_sim"]
        # what the covered rows can give at most: the FM's own edge there (``fm_on_sim``:
        # the FM's probability on the covered rows, the VM alone's elsewhere), and where the
        # pair correction's and the FM's gains fall, covered rows against the rest
        m = sim["mask"]
        run.raw["fm_on_sim"] = np.where(m, run.raw["fm"], run.raw["vm"])
        run.cal["fm_on_sim"] = np.where(m, run.cal["fm"], run.cal["vm"])
        run.chosen["schedule"]["gain_per_row"] = edge_by_mask(
            self.tables.labels[p.test, task], m, run.raw["vm"],
            {"fm": run.raw["fm"], "pair_100": run.raw["vm_pair_100"],
             "pair_sim": run.raw["vm_pair_sim"]})
        run.masks["vm_agg"] = inputs.agg_present.numpy()[p.test] > 0
        self.served_arms(run, base, served_fit.fit.model, cf, task, seed, teacher,
                         served_fit.fit.scale_curves)

    def fm_predictions(self, probs: np.ndarray, task: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.periods
        ab = M.fit_platt(self.tables.labels[p.val, task], probs[p.val, task])
        return probs[p.test, task], M.apply_platt(probs[p.test, task], ab)

    def run_seed(self, seed: int, tasks: list[int]) -> dict[int, SeedRun]:
        """All variants of one seed, for each task index in ``tasks`` (one shared teacher)."""
        self.progress(f"seed {seed}: FM + encoder")
        teacher = self.teacher(seed)
        probs, inputs = self.inputs(teacher)
        runs: dict[int, SeedRun] = {}
        for task in tasks:
            run = SeedRun()
            run.chosen["fm"] = {"best_epoch": teacher.fm_fit.best_epoch,
                                "epochs_run": teacher.fm_fit.epochs_run}
            run.raw["fm"], run.cal["fm"] = self.fm_predictions(probs, task)
            self.progress(f"seed {seed}: {self.ds.tasks[task]} vm")
            # the base of every residual arm: the very code that trains a serving VM's base
            base, lr, _ = train_base(inputs, self.cfg.vm, self.cfg.train, self.cfg.report.vm_lrs,
                                     task=task, rows=self.periods.vm,
                                     absent_rows=self.absent_rows, val_rows=self.periods.val,
                                     seed=seed, num_users=self.ds.num_users,
                                     num_items=self.ds.num_items)
            run.raw["vm"], run.cal["vm"] = self.predict(base, inputs, task, seed, 0.0, False)
            run.chosen["vm"] = {"lr": lr, "kd_alpha": 0.0, "coverage": 0.0}
            self.progress(f"seed {seed}: {self.ds.tasks[task]} vm_kd")
            kd = [VMSpec("vm_kd", kd_alpha=a) for a in self.cfg.report.kd_alphas]
            run.raw["vm_kd"], run.cal["vm_kd"], run.chosen["vm_kd"] = self.run_variant(
                kd, inputs, probs, task, seed)
            self.residual_arms(run, base, lr, inputs, task, seed, teacher)
            runs[task] = run
        return runs


def edge_by_mask(y: np.ndarray, mask: np.ndarray, base: np.ndarray,
                 arms: dict[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
    """Mean BCE gain per row over ``base`` of each arm, on the rows of ``mask`` and on the
    rest: {arm: {"covered": g, "uncovered": g}} (None where a side has no rows)."""
    lb = M.bce_rows(y, base)
    out: dict[str, dict[str, float | None]] = {}
    for name, p in arms.items():
        g = lb - M.bce_rows(y, p)
        out[name] = {side: float(g[m].mean()) if m.any() else None
                     for side, m in (("covered", mask), ("uncovered", ~mask))}
    return out


# ---- aggregation over seeds ------------------------------------------------------------------
def _tr_block(bce: dict[str, float], names: list[str]) -> dict[str, float]:
    out = {}
    for n in names:
        key = n.removeprefix("vm_")
        out[key] = M.transfer_ratio(bce["vm"], bce[n], bce["fm"])
    return out


def _gated(tr: dict[str, float], significant: bool) -> dict[str, float]:
    """DESIGN.md: report TR only where the FM-VM gap is significant (else NaN -> null)."""
    return tr if significant else {k: float("nan") for k in tr}


def _nanstd(values: list[float]) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.std()) if len(v) else float("nan")


def _paired_block(runs: list[SeedRun], y: np.ndarray, tr_names: list[str], cfg: SolarisConfig,
                  seed: int) -> dict:
    """Paired figures over seeds and rows: TR intervals (raw, against the VM alone), TR of
    the pair embedding against its no-z control, and the rows where a slot is missing."""
    def losses(arm: str, preds: str = "raw") -> np.ndarray:  # (S, N)
        return np.stack([M.bce_rows(y, getattr(r, preds)[arm]) for r in runs])

    vm, fm = losses("vm"), losses("fm")
    b = cfg.report.bootstrap
    intervals = {n.removeprefix("vm_"): M.tr_bootstrap(vm, losses(n), fm, b, cfg.report.alpha,
                                                       seed) for n in tr_names}
    out: dict = {"tr_paired": intervals}
    if "vm_control_100" in runs[0].raw and "vm_pair_100" in runs[0].raw:
        # TR against the control: what z adds beyond recalibrating the base on covered rows,
        # as a share of the FM-VM gap: (BCE(control) - BCE(pair 100%)) / (BCE(VM) - BCE(FM))
        vs = {}
        for preds in ("raw", "cal"):
            c, x = losses("vm_control_100", preds), losses("vm_pair_100", preds)
            v, f = losses("vm", preds), losses("fm", preds)
            gap = v.mean() - f.mean()
            vs[preds] = float((c.mean() - x.mean()) / gap) if gap > 0 else float("nan")
        out["tr_vs_control"] = vs
    miss = {}
    for n in tr_names:
        if n not in runs[0].masks:
            continue
        off = [~r.masks[n] for r in runs]
        if not any(o.any() for o in off):
            continue
        a = [M.bce(y[o], r.raw[n][o]) for r, o in zip(runs, off) if o.any()]
        v = [M.bce(y[o], r.raw["vm"][o]) for r, o in zip(runs, off) if o.any()]
        exact = all(np.array_equal(r.raw[n][o], r.raw["vm"][o]) for r, o in zip(runs, off))
        miss[n.removeprefix("vm_")] = {"rows": int(np.mean([o.sum() for o in off])),
                                       "bce": float(np.mean(a)), "bce_vm": float(np.mean(v)),
                                       "max_abs_diff": float(abs(np.mean(a) - np.mean(v))),
                                       "scores_equal_vm": bool(exact)}
    out["miss_rows"] = miss
    # rows where the slot is present: the arm's BCE beside the VM alone's and the FM's; and
    # the calibration slope (Platt's slope of the label on the logit) on present and missing
    # rows, seed means
    present, slopes = {}, {}
    for n in tr_names:
        if n not in runs[0].masks:
            continue
        ons = [r.masks[n] for r in runs]
        key = n.removeprefix("vm_")
        if all(o.sum() >= 50 for o in ons):
            present[key] = {
                "rows": int(np.mean([o.sum() for o in ons])),
                **{k: float(np.mean([M.bce(y[o], getattr(r, "raw")[a][o])
                                     for r, o in zip(runs, ons)]))
                   for k, a in (("bce", n), ("bce_vm", "vm"), ("bce_fm", "fm"))}}
        slopes[key] = {
            side: float(np.mean([M.fit_platt(y[m], r.raw[n][m])[0] for r, m in pairs]))
            if all(m.sum() >= 50 and len(np.unique(y[m])) == 2 for _, m in pairs) else None
            for side, pairs in (("present", [(r, o) for r, o in zip(runs, ons)]),
                                ("missing", [(r, ~o) for r, o in zip(runs, ons)]))}
    out["present_rows"] = present
    out["calibration_slope"] = slopes
    return out


def _tier_worth(runs: list[SeedRun], y: np.ndarray, cfg: SolarisConfig, seed: int
                ) -> dict | None:
    """What each served input adds, from simulated serving: the cumulative steps' TR
    increments (``tr_step_bootstrap``, paired over seeds and rows), the scale each seed
    serves it at, and the share of test rows it reaches."""
    if f"vm_served_{STEPS[0][0]}" not in runs[0].raw:
        return None

    def losses(arm: str) -> np.ndarray:
        return np.stack([M.bce_rows(y, r.raw[arm]) for r in runs])

    vm, fm = losses("vm"), losses("fm")
    prev, prev_mask = vm, [np.zeros(len(y), bool) for _ in runs]
    out = {}
    for name, _, _ in STEPS:
        arm = f"vm_served_{name}"
        cur = losses(arm)
        st = M.tr_step_bootstrap(vm, prev, cur, fm, cfg.report.bootstrap, cfg.report.alpha, seed)
        scales = [r.chosen["served"]["scales"] for r in runs]
        out[name] = {**st, "scale_per_seed": [sc["aggregate"] if name == "aggregate"
                                              else sc["pair"][name] for sc in scales],
                     "rows_share": float(np.mean([(r.masks[arm] & ~pm).mean()
                                                  for r, pm in zip(runs, prev_mask)]))}
        prev, prev_mask = cur, [r.masks[arm] for r in runs]
    return out


def _served_summary(chosen: list[dict]) -> dict | None:
    """Seed means of simulated serving's test-period shares, and each seed's guard."""
    per = [c["served"] for c in chosen if "served" in c]
    if not per:
        return None
    sims = [p["simulation"]["test"] for p in per]
    return {"tier_share": {k: float(np.mean([s["tier_share"][k] for s in sims]))
                           for k in sims[0]["tier_share"]},
            "aggregate_share": float(np.mean([s["aggregate_share"] for s in sims])),
            "own_pair_agrees_with_key_simulation": [s["own_pair_agrees_with_key_simulation"]
                                                    for s in sims],
            "guard_per_seed": [p["guard"] for p in per],
            "scale_curves_per_seed": [p["scale_curves"] for p in per]}


def _schedule_summary(chosen: list[dict]) -> dict | None:
    """Seed means of the schedule simulation behind ``pair_sim`` (and each seed's)."""
    per = [c["schedule"] for c in chosen if "schedule" in c]
    if not per:
        return None
    out = {k: float(np.mean([p[k] for p in per])) for k in ("c_sim", "pair_simulated",
                                                           "fm_evals", "precision")}
    out["c_sim_per_seed"] = [p["c_sim"] for p in per]
    if all("gain_per_row" in p for p in per):
        g = [p["gain_per_row"] for p in per]
        out["gain_per_row"] = {a: {side: float(np.mean([x[a][side] for x in g]))
                                   for side in ("covered", "uncovered")} for a in g[0]}
    return out


def summarize(runs: list[SeedRun], y: np.ndarray, warm: np.ndarray, cfg: SolarisConfig,
              seed: int = 0) -> dict:
    """Seed-mean metrics, TRs, their spread, the bootstrap gap test, warm and cold splits."""
    models = list(runs[0].raw)
    tr_names = [m for m in models if m not in ("fm", "vm")]

    def mean_metric(fn, preds: str, mask: np.ndarray | None = None) -> dict[str, float]:
        res = {}
        for m in models:
            vals = []
            for r in runs:
                p = getattr(r, preds)[m]
                vals.append(fn(y[mask], p[mask]) if mask is not None else fn(y, p))
            res[m] = float(np.nanmean(vals))
        return res

    bce, auc = mean_metric(M.bce, "raw"), mean_metric(M.auc, "raw")
    bce_cal, auc_cal = mean_metric(M.bce, "cal"), mean_metric(M.auc, "cal")
    per_seed_tr = []
    for r in runs:
        b = {m: M.bce(y, r.raw[m]) for m in models}
        per_seed_tr.append(_tr_block(b, tr_names))
    tr_std = {k: _nanstd([t[k] for t in per_seed_tr]) for k in per_seed_tr[0]}
    fm_loss = np.mean([M.bce_rows(y, r.raw["fm"]) for r in runs], axis=0)
    vm_loss = np.mean([M.bce_rows(y, r.raw["vm"]) for r in runs], axis=0)
    gap = M.paired_bootstrap(vm_loss, fm_loss, cfg.report.bootstrap, cfg.report.alpha, seed)
    fm_cal = np.mean([M.bce_rows(y, r.cal["fm"]) for r in runs], axis=0)
    vm_cal = np.mean([M.bce_rows(y, r.cal["vm"]) for r in runs], axis=0)
    gap_cal = M.paired_bootstrap(vm_cal, fm_cal, cfg.report.bootstrap, cfg.report.alpha, seed)
    split = {}
    for label, mask in (("warm", warm), ("cold", ~warm)):
        if mask.sum() < 50 or len(np.unique(y[mask])) < 2:
            split[label] = {"rows": int(mask.sum()), "tr": None}
            continue
        b = mean_metric(M.bce, "raw", mask)
        g = M.paired_bootstrap(vm_loss[mask], fm_loss[mask], cfg.report.bootstrap,
                               cfg.report.alpha, seed)
        split[label] = {"rows": int(mask.sum()), "bce": b, "gap_significant": g["significant"],
                        "tr": _gated(_tr_block(b, tr_names), g["significant"])}
    tr = _tr_block(bce, tr_names)
    paired = _paired_block(runs, y, tr_names, cfg, seed)
    return {
        **paired,
        "tier_worth": _tier_worth(runs, y, cfg, seed),
        "bce": bce, "auc": auc, "bce_cal": bce_cal, "auc_cal": auc_cal,
        "tr": _gated(tr, gap["significant"]), "tr_cal": _gated(_tr_block(bce_cal, tr_names),
                                                             gap_cal["significant"]),
        "gap_cal": gap_cal,
        "tr_std": tr_std, "tr_ungated": tr,
        "tr_per_seed": per_seed_tr, "gap": gap, "gap_significant": gap["significant"],
        "warm": split["warm"], "cold": split["cold"],
        "chosen": [r.chosen for r in runs],
    }


# the stages ``run_transfer`` reports per seed and task: vm, vm_kd, cross-fitted base logits,
# schedule simulation, residual pair, control, aggregate, simulated serving, tiers as served
STAGES_PER_TASK = 9


def transfer_tasks(ds: Dataset) -> list[int]:
    """The tasks the report covers: the main task and, where the data has one, the second."""
    return [0, 1] if len(ds.tasks) > 1 else [0]


def transfer_steps(cfg: SolarisConfig, ds: Dataset) -> int:
    """How many stages ``run_transfer`` reports to its ``progress`` (one per call)."""
    return cfg.report.seeds * (1 + len(transfer_tasks(ds)) * STAGES_PER_TASK)


def run_transfer(cfg: SolarisConfig, ds: Dataset, progress: Progress | None = None,
                 runs: dict[int, list[SeedRun]] | None = None) -> dict:
    """The headline report (temporal protocol) for the main task and the second task;
    ``runs``, where given, receives each task's seed runs (``compare_fms`` reads them)."""
    t0 = time.perf_counter()
    exp = TransferExperiment(cfg, ds, progress)
    tasks = transfer_tasks(ds)
    per_task: dict[int, list[SeedRun]] = {t: [] for t in tasks} if runs is None else runs
    per_task.update({t: [] for t in tasks})
    for seed in range(cfg.report.seeds):
        for t, run in exp.run_seed(seed, tasks).items():
            per_task[t].append(run)
    p = exp.periods
    main = summarize(per_task[0], exp.tables.labels[p.test, 0], exp.warm, cfg)
    report = {
        "dataset": ds.name,
        "teacher_protocol": "temporal",
        "task": ds.tasks[0],
        **{k: main[k] for k in ("bce", "auc", "bce_cal", "auc_cal", "tr", "tr_cal", "tr_std",
                                "tr_ungated", "gap_significant", "gap", "gap_cal", "warm",
                                "cold", "tr_paired", "tr_vs_control", "miss_rows",
                                "present_rows", "calibration_slope", "tier_worth")},
        "served": _served_summary(main["chosen"]),
        "tr_per_seed": main["tr_per_seed"],
        "chosen": main["chosen"],
        "request_granularity_s": cfg.features.request_granularity_s,
        "schedule": _schedule_summary(main["chosen"]),
        "pair_as_served": [c["residual_pair_as_served"] for c in main["chosen"]
                           if "residual_pair_as_served" in c],
        "periods": p.as_dict(),
        "test_rows": int(len(p.test)),
        "warm_share": float(exp.warm.mean()),
        "fm_version": cfg.fm.version,
        "embedding_width": cfg.encoder.width,
        "seeds": cfg.report.seeds,
    }
    if len(tasks) > 1:
        second = summarize(per_task[1], exp.tables.labels[p.test, 1], exp.warm, cfg)
        report["tasks"] = {ds.tasks[1]: {k: second[k] for k in
                                         ("tr", "tr_cal", "tr_std", "tr_ungated", "bce", "auc",
                                          "bce_cal", "auc_cal", "gap", "gap_cal", "gap_significant")}}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def compare_fms(cfgs: dict[str, SolarisConfig], ds: Dataset,
                progress: Progress | None = None) -> dict:
    """The transfer report of each FM (``cfgs``: label -> config, the same but for ``fm``)
    on the same seeds, periods and rows, and each pair of FMs' paired BCE difference on the
    main task's test rows (seed-mean per-row losses, bootstrap over rows; no FM is expected
    to win). Every arm but the FM's own is the same run for every FM: a seed's VM alone
    reads no FM output."""
    reports, losses = {}, {}
    for label, cfg in cfgs.items():
        runs: dict[int, list[SeedRun]] = {}
        reports[label] = run_transfer(cfg, ds, progress, runs)
        test = time_split(ds, cfg.split).test
        y = ds.interactions.column(ds.tasks[0]).to_numpy(zero_copy_only=False)[test]
        losses[label] = np.mean([M.bce_rows(y, r.raw["fm"]) for r in runs[0]], axis=0)
    first = next(iter(cfgs.values()))
    labels = list(cfgs)
    pairs = {f"{a} - {b}": M.paired_bootstrap(losses[a], losses[b], first.report.bootstrap,
                                              first.report.alpha)
             for i, a in enumerate(labels) for b in labels[i + 1:]}
    return {"fms": reports, "fm_bce_difference": pairs, "seeds": first.report.seeds,
            "dataset": ds.name}
