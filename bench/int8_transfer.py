"""bench/cache.py's int8 check: the same trained VM on the same MovieLens-100K test rows, fed
int8-decoded instead of fp32 pair embeddings; the change of the calibrated transfer ratio.

Run by ``bench/cache.py`` in its own spawned process (torch threads and memory go with it).
"""

from __future__ import annotations

import logging
import time

import numpy as np


def int8_transfer(data_dir: str | None, threads: int) -> dict:
    """The same trained vm_pair_100 on the same MovieLens test rows, fed fp32 vs int8 z."""
    import copy

    import torch

    from solaris.cache.codec import Codec
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.eval import metrics as M
    from solaris.eval.transfer import TransferExperiment
    from solaris.train.vertical import VMSpec, coverage_mask, predict_vm, train_vm

    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    ov: dict = {"data.dataset": "movielens", "train.threads": threads}
    if data_dir:
        ov["data.data_dir"] = data_dir
    cfg = load_config(None, ov)
    ds = load_dataset(cfg.data, fetch=True)
    exp = TransferExperiment(cfg, ds)
    seed, task = 0, 0
    teacher = exp.teacher(seed)
    probs, inputs = exp.inputs(teacher)
    p = exp.periods
    y_val, y_test = exp.tables.labels[p.val, task], exp.tables.labels[p.test, task]
    fm_raw, fm_cal = exp.fm_predictions(probs, task)
    vm_raw, vm_cal, _ = exp.run_variant([VMSpec("vm")], inputs, probs, task, seed)

    spec = VMSpec("vm_pair_100", use_pair=True, coverage=1.0)
    best = None
    for lr in cfg.report.vm_lrs:  # the report's grid, best on validation (as run_variant)
        model, v = train_vm(inputs, spec, cfg.vm, cfg.train, task=task, teacher_rows=p.vm,
                            absent_rows=exp.absent_rows, val_rows=p.val, lr=lr, seed=seed,
                            soft_labels=probs[:, task], num_users=ds.num_users,
                            num_items=ds.num_items)
        if best is None or v < best[0]:
            best = (v, model)
    assert best is not None
    model = best[1]
    z = inputs.pair.numpy()
    codec = Codec("int8", z.shape[1])
    z8 = codec.decode(codec.encode(z))
    inputs8 = copy.copy(inputs)
    inputs8.pair = torch.from_numpy(np.ascontiguousarray(z8, dtype=np.float32))
    val_mask = coverage_mask(len(p.val), 1.0, seed + 1)
    test_mask = coverage_mask(len(p.test), 1.0, seed + 2)
    off_v, off_t = np.zeros(len(p.val), bool), np.zeros(len(p.test), bool)
    preds = {}
    for name, inp in (("fp32", inputs), ("int8", inputs8)):
        preds[name] = (predict_vm(model, inp, p.val, val_mask, off_v),
                       predict_vm(model, inp, p.test, test_mask, off_t))
    ab32 = M.fit_platt(y_val, preds["fp32"][0])
    ab8 = M.fit_platt(y_val, preds["int8"][0])
    b_fm, b_vm = M.bce(y_test, fm_cal), M.bce(y_test, vm_cal)
    cal32 = M.apply_platt(preds["fp32"][1], ab32)
    cal8 = M.apply_platt(preds["int8"][1], ab8)  # Platt refitted on int8-fed validation
    cal8_fixed = M.apply_platt(preds["int8"][1], ab32)  # the fp32 calibration kept
    tr = {k: M.transfer_ratio(b_vm, M.bce(y_test, v), b_fm)
          for k, v in (("fp32", cal32), ("int8", cal8), ("int8_fixed_platt", cal8_fixed))}
    tr_raw = {k: M.transfer_ratio(M.bce(y_test, vm_raw), M.bce(y_test, preds[k][1]),
                                  M.bce(y_test, fm_raw)) for k in ("fp32", "int8")}
    gap = M.paired_bootstrap(M.bce_rows(y_test, vm_cal), M.bce_rows(y_test, fm_cal),
                             cfg.report.bootstrap, cfg.report.alpha, seed)
    return {
        "int8_tr_delta": tr["int8"] - tr["fp32"],
        "int8_tr_delta_fixed_platt": tr["int8_fixed_platt"] - tr["fp32"],
        "int8_tr_delta_raw": tr_raw["int8"] - tr_raw["fp32"],
        "tr_cal": tr, "tr_raw": tr_raw,
        "bce_cal": {"fm": b_fm, "vm": b_vm, "vm_pair_100_fp32": M.bce(y_test, cal32),
                    "vm_pair_100_int8": M.bce(y_test, cal8)},
        "max_abs_pred_diff": float(np.abs(preds["int8"][1] - preds["fp32"][1]).max()),
        "z_max_abs_err": float(np.abs(z8 - z).max()), "gap_cal": gap,
        "test_rows": int(len(p.test)), "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
    }
