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

from solaris.config import SolarisConfig
from solaris.data.schema import Dataset
from solaris.data.split import Periods, time_split, warm_mask
from solaris.eval import metrics as M
from solaris.features import FeatureTables
from solaris.train.teacher import Teacher, build_teacher, vm_inputs
from solaris.train.vertical import VMInputs, VMSpec, coverage_mask, predict_vm, train_vm

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def variant_specs(coverages: tuple[float, ...], kd_alphas: tuple[float, ...]) -> list[list[VMSpec]]:
    """Each entry is a grid of specs for one reported variant (best on validation wins)."""
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
    def run_variant(self, grid: list[VMSpec], inputs: VMInputs, probs: np.ndarray, task: int,
                    seed: int, teacher_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
        """Best-on-validation model of ``grid`` x lr grid: (test probs, calibrated, chosen)."""
        p = self.periods
        teacher_rows = p.vm if teacher_rows is None else teacher_rows
        best = None
        for spec in grid:
            for lr in self.cfg.report.vm_lrs:
                model, v = train_vm(inputs, spec, self.cfg.vm, self.cfg.train, task=task,
                                    teacher_rows=teacher_rows, absent_rows=self.absent_rows,
                                    val_rows=p.val, lr=lr, seed=seed,
                                    soft_labels=probs[:, task], num_users=self.ds.num_users,
                                    num_items=self.ds.num_items)
                if best is None or v < best[0]:
                    best = (v, spec, lr, model)
        assert best is not None
        _, spec, lr, model = best
        cov = spec.coverage if spec.use_pair else 0.0
        # coverage masks are seeded per (seed, variant) and identical across grid points
        val_mask = coverage_mask(len(p.val), cov, seed + 1)
        test_mask = coverage_mask(len(p.test), cov, seed + 2)
        agg_val = np.full(len(p.val), spec.use_agg)
        agg_test = np.full(len(p.test), spec.use_agg)
        pv = predict_vm(model, inputs, p.val, val_mask, agg_val)
        pt = predict_vm(model, inputs, p.test, test_mask, agg_test)
        ab = M.fit_platt(self.tables.labels[p.val, task], pv)
        chosen = {"lr": lr, "kd_alpha": spec.kd_alpha, "coverage": cov}
        return pt, M.apply_platt(pt, ab), chosen

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
            for grid in variant_specs(self.cfg.report.coverages, self.cfg.report.kd_alphas):
                name = grid[0].name
                self.progress(f"seed {seed}: {self.ds.tasks[task]} {name}")
                run.raw[name], run.cal[name], run.chosen[name] = self.run_variant(
                    grid, inputs, probs, task, seed)
            runs[task] = run
        return runs


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
    return {
        "bce": bce, "auc": auc, "bce_cal": bce_cal, "auc_cal": auc_cal,
        "tr": _gated(tr, gap["significant"]), "tr_cal": _gated(_tr_block(bce_cal, tr_names),
                                                             gap_cal["significant"]),
        "gap_cal": gap_cal,
        "tr_std": tr_std, "tr_ungated": tr,
        "tr_per_seed": per_seed_tr, "gap": gap, "gap_significant": gap["significant"],
        "warm": split["warm"], "cold": split["cold"],
        "chosen": [r.chosen for r in runs],
    }


def run_transfer(cfg: SolarisConfig, ds: Dataset, progress: Progress | None = None) -> dict:
    """The headline report (temporal protocol) for the main task and the second task."""
    t0 = time.perf_counter()
    exp = TransferExperiment(cfg, ds, progress)
    tasks = [0, 1] if len(ds.tasks) > 1 else [0]
    per_task: dict[int, list[SeedRun]] = {t: [] for t in tasks}
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
                                "cold")},
        "tr_per_seed": main["tr_per_seed"],
        "chosen": main["chosen"],
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
