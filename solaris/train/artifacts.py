"""``solaris train``: the teacher snapshot and one serving VM per task, written as artifacts.

The artifact directory's layout and schema are ``solaris.artifacts``'s (its one loader reads
them). With ``fm.weights`` set the FM is imported, not trained (``fm_imported`` in the
manifest); ``train_device`` says where training ran.

A serving VM is residual (``solaris/models/residual.py``): its VM alone (``vm_<task>_alone.pt``,
the very weights inside it) plus a pair-slot correction trained on every VM-period row on
cross-fitted base logits; the imputed tiers' correction and the aggregate's are trained on
simulated serving of the VM period (``solaris.simulate.served``), and every scale is chosen on the
validation period served the same way (0: not looked up). ``coverage`` is the
pair coverage its test figure in the manifest is measured at.

``ensure_artifacts`` builds the embedded default (synthetic data, ``solaris train``) once per
config under a file lock, so the first ``serve run serve_app:app`` on a fresh checkout works;
the app builder calls it, never a replica.
"""

from __future__ import annotations

import fcntl
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from solaris import atomic
from solaris.artifact_store import FILES, file_hashes
from solaris.artifacts import SCHEMA, SIDE_KEYS, Artifacts, SideTables
from solaris.config import SolarisConfig, config_to_dict
from solaris.data.schema import Dataset
from solaris.errors import ConfigError
from solaris.data.split import time_split
from solaris.eval import metrics as M
from solaris.features import FeatureTables
from solaris.ids import IDS_DIR, IdMap
from solaris.train.checkpoint import save_checkpoint
from solaris.train.teacher import build_teacher, vm_inputs, z_at_age
from solaris.simulate.schedule import simulated_presence, window_log
from solaris.simulate.served import simulate_period
from solaris.train.residual import (candidate_table, crossfit_base, fit_pair_as_served,
                                    fit_served_tiers, residual_meta, train_base,
                                    training_verifier)
from solaris.train.vertical import coverage_mask, predict_vm

log = logging.getLogger(__name__)

STAGES_PER_TASK = 6  # the stages ``train_artifacts`` reports for each task


def train_steps(ds: Dataset) -> int:
    """How many stages ``train_artifacts`` reports to its ``progress`` (one per call): the
    FM and encoder, then ``STAGES_PER_TASK`` per task."""
    return 1 + STAGES_PER_TASK * len(ds.tasks)


def fm_warnings(manifest: dict) -> list[str]:
    """A line per task whose FM is no better than its VM alone on the test period (the
    manifest's ``fm_test_bce`` against ``vm_alone_test_bce``): what it means, what to do."""
    out = []
    for task, v in manifest.get("vms", {}).items():
        fm, alone = v.get("fm_test_bce"), v.get("vm_alone_test_bce")
        if fm is None or alone is None or fm < alone:
            continue
        out.append(f"warning: {task}: the FM's test BCE {fm:.4f} is not below the VM "
                   f"alone's {alone:.4f}: on this log the FM predicts no better than the VM "
                   "alone, so its embeddings have nothing to transfer and serving them adds "
                   "cost, not accuracy (the corrections are scaled on validation and "
                   "switched off where they do not help). Train the FM longer or on more "
                   "history (train.fm_epochs, features.history_len), check a team's FM "
                   "with `solaris check-fm MODULE:CLASS`, or serve the VM alone "
                   "(serve.mode=vm).")
    return out


def train_artifacts(cfg: SolarisConfig, ds: Dataset, out_dir: str | Path, seed: int = 0,
                    coverage: float = 0.5, progress: Callable[[str], None] | None = None,
                    evaluation: bool = False, base_dir: str | Path | None = None) -> dict:
    """Train FM + encoder (FM period) and a two-slot VM per task; write them to ``out_dir``.

    ``evaluation`` (the replay) also writes the snapshot's outputs over every interaction row
    (``teacher.npz``: probabilities, pair embeddings, causal aggregates). ``base_dir``: the
    artifacts of an earlier FM version whose VMs alone (which read no FM output) are kept as
    they are -- a version rollover retrains the FM, the encoder and the corrections only.

    Training sets torch's thread count (``train.threads``); the caller's is restored after,
    so what the process computes next does not depend on whether it trained first."""
    threads = torch.get_num_threads()
    try:
        return _train_artifacts(cfg, ds, out_dir, seed, coverage, progress, evaluation,
                                base_dir)
    finally:
        torch.set_num_threads(threads)


def ensure_artifacts(cfg: SolarisConfig, out: Path,
                     progress: Callable[[str], None] | None = None) -> Path:
    """``out`` holding trained artifacts: built now (once, under a lock) if missing."""
    out = Path(out)
    if (out / "manifest.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds them built
        if (out / "manifest.json").exists():
            return out
        from solaris.data.load import load_dataset

        log.warning("no artifacts in %s: building the embedded default once (%s data, about "
                    "a minute on 2 CPUs)", out, cfg.data.dataset)
        t0 = time.perf_counter()
        ds = load_dataset(cfg.data)
        manifest = train_artifacts(cfg, ds, out, progress=progress)
        log.warning("built artifacts of version %s in %.0f s", manifest["version"],
                    time.perf_counter() - t0)
    return out


def _train_artifacts(cfg: SolarisConfig, ds: Dataset, out_dir: str | Path, seed: int,
                     coverage: float, progress: Callable[[str], None] | None,
                     evaluation: bool, base_dir: str | Path | None) -> dict:
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"{out}: a link to {out.readlink()}, which does not exist: create "
                          "that directory or remove the link")
    out.mkdir(parents=True, exist_ok=True)
    ids = IdMap.from_dataset(ds)
    if base_dir is not None:
        check_keeps(Artifacts.open(base_dir), ds, ids, out)
    periods = time_split(ds, cfg.split)
    tables = FeatureTables(ds, cfg.features)
    say("training FM + encoder")
    teacher = build_teacher(tables, periods.fm, cfg.fm, cfg.encoder, cfg.train, seed)
    probs, inputs = vm_inputs(teacher, tables, cfg.features)
    sizes = {"num_users": ds.num_users, "num_items": ds.num_items, "tasks": list(ds.tasks),
             "history_len": cfg.features.history_len, "spec": ds.spec.to_dict()}
    save_checkpoint(out / "fm.pt", teacher.fm, "fm", config_to_dict(cfg.fm), version=teacher.version,
                    **sizes)
    save_checkpoint(out / "encoder.pt", teacher.encoder, "encoder", config_to_dict(cfg.encoder),
                    version=teacher.version, in_dim=teacher.fm.shared_dim)
    vms, baselines = {}, {}
    val_log = window_log(cfg, ds, periods, "val")  # the schedule simulation's requests
    for t, task in enumerate(ds.tasks):
        common = dict(task=t, rows=periods.vm, absent_rows=periods.fm_vertical,
                      val_rows=periods.val, seed=seed, num_users=ds.num_users,
                      num_items=ds.num_items)
        if base_dir is not None:
            say(f"keeping the VM alone for {task} from {Path(base_dir).name}")
            base, lr, v_base = Artifacts.open(base_dir).vm_alone(task)
        else:
            say(f"training the VM alone for {task}")
            base, lr, v_base = train_base(inputs, cfg.vm, cfg.train, cfg.report.vm_lrs,
                                          name=f"vm_{task}_alone", **common)
        vm_cfg = {**config_to_dict(cfg.vm), "use_pair": False, "use_agg": False}
        save_checkpoint(out / f"vm_{task}_alone.pt", base, "vm", vm_cfg,
                        version=teacher.version, task=task, slot_dim=inputs.dim,
                        coverage=0.0, **sizes)
        baselines[task] = {"file": f"vm_{task}_alone.pt", "val_bce": v_base, "lr": lr}
        say(f"cross-fitting base logits for {task}")
        cf = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, lr=lr, **common)
        b_oos = cf.logits
        say(f"simulating the schedule on the validation period for {task}")
        sim_val = simulated_presence(cfg, ds, tables, periods, base, val_log, seed,
                                     rows=periods.val)

        say(f"training the residual VM for {task} (on fresh z and on z as served)")
        served = fit_pair_as_served(base, inputs, cfg.residual, cfg.train, task=t,
                                    rows=periods.vm, base_logits=b_oos, val_rows=periods.val,
                                    seed=seed, z_as_of=z_at_age(teacher, tables, cfg.features),
                                    found_age_s=sim_val["age_s"],
                                    read_ttl_s=float(cfg.cache.read_ttl_s),
                                    found_history_age_s=sim_val["history_age_s"])
        say(f"simulating serving on the VM and validation periods for {task}")
        sv = {per: simulate_period(cfg, ds, tables, periods, base, teacher.fm, teacher.encoder,
                                   teacher.version, per, seed,
                                   val_log if per == "val" else None,
                                   verifier=training_verifier(cf, tables, per))
              for per in ("vm", "val")}
        say(f"training the imputed tiers and the aggregate for {task} on simulated serving")
        fit = fit_served_tiers(served.fit.model, tables, cfg.residual, cfg.train, task=t,
                               train_slots=sv["vm"], base_logits=b_oos, val_slots=sv["val"],
                               read_ttl_s=float(cfg.cache.read_ttl_s), seed=seed,
                               pair_curves=served.fit.scale_curves,
                               item_table=candidate_table(cfg.residual.agg_items, teacher.fm,
                                                          tables))
        mask = coverage_mask(len(periods.test), coverage, seed)
        off = np.zeros(len(periods.test), bool)
        pt = predict_vm(fit.model, inputs, periods.test, mask, off)
        p_alone = predict_vm(fit.model, inputs, periods.test, off, off)  # no input: the base
        y = tables.labels[periods.test, t]
        meta = {**residual_meta(fit), "as_served": served.info, "served": fit.info}
        save_checkpoint(out / f"vm_{task}.pt", fit.model, "vm", vm_cfg, version=teacher.version,
                        task=task, slot_dim=inputs.dim, coverage=coverage, **meta, **sizes)
        vms[task] = {"file": f"vm_{task}.pt", "val_bce": fit.val_bce, "test_bce": M.bce(y, pt),
                     "test_auc": M.auc(y, pt), "test_coverage": coverage,
                     "fm_test_bce": M.bce(y, probs[periods.test, t]),
                     "vm_alone_test_bce": M.bce(y, p_alone),
                     "scales": meta["scales"], "scale_curves": meta["scale_curves"],
                     "present_affine": meta["present_affine"],
                     "as_served": served.info, "served": fit.info}
    if evaluation:
        atomic.save(out / "teacher.npz", lambda f: np.savez(
            f, probs=probs.astype(np.float32), z=inputs.pair.numpy(), agg=inputs.agg.numpy(),
            agg_present=inputs.agg_present.numpy().astype(bool)))
    save_side_tables(out / "side.npz", SideTables.from_features(tables))
    ids_dir = ids.save(out)
    written = ["fm.pt", "encoder.pt", "side.npz", *(v["file"] for v in vms.values()),
               *(v["file"] for v in baselines.values()),
               *(f"{IDS_DIR}/{p.name}" for p in ids_dir.iterdir()
                 if p.is_file() and atomic.TMP not in p.name)]
    if evaluation:
        written.append("teacher.npz")
    manifest = {
        "schema": SCHEMA, "dataset": ds.name, "version": teacher.version, "tasks": list(ds.tasks),
        "sizes": {"num_users": ds.num_users, "num_items": ds.num_items},
        "side_tables": "side.npz",
        "ids": {"dir": IDS_DIR, "users": len(ids.users), "items": len(ids.items),
                "kind": "integer" if ids.users.is_int else "string"},
        "fm": "fm.pt", "encoder": "encoder.pt", "vms": vms, "periods": periods.as_dict(),
        "cuts": [int(c) for c in periods.cuts],  # first ts of the vm, val and test periods
        "baselines": baselines,
        "config": config_to_dict(cfg), "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
        "fm_imported": bool(cfg.fm.weights), "train_device": teacher.device,
        # what a copy from shared storage is checked against (solaris.artifact_store)
        FILES: file_hashes(out, written),
    }
    atomic.save_json(out / "manifest.json", manifest)  # last: a manifest means a whole set
    return manifest


def check_keeps(base: Artifacts, ds: Dataset, ids: IdMap, out: Path) -> None:
    """A version keeping ``base``'s VMs alone codes every id as ``base`` did and holds no id
    they lack a row for (else a ``ConfigError`` saying so)."""
    ids.check_extends(base.ids(), str(out))
    if (ds.num_users, ds.num_items) != (base.num_users, base.num_items):
        raise ConfigError(f"base_dir={base.root}: its VMs alone have rows for {base.num_users} "
                          f"users and {base.num_items} items, the data {ds.num_users} and "
                          f"{ds.num_items} (ids arrived since): train new VMs alone (drop "
                          "--keep-vm-alone)")


def save_side_tables(path: str | Path, side: SideTables) -> Path:
    """Write the five side-feature arrays (numpy ``.npz``, no pickled objects); atomic."""
    path = Path(path)
    atomic.save(path, lambda f: np.savez(f, **{k: getattr(side, k) for k in SIDE_KEYS}))
    return path
