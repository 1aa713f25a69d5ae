"""Ablations of the transfer report (``solaris report transfer --ablations``).

* encoder width 8 / 32 / 128 and the raw last shared layer (width 0), on the same FM;
* the FM trained *without* the VM's task (why SOLARIS cuts at the task-agnostic shared layer);
  its TR uses the full FM's gap, since that FM has no head for the VM's task;
* the in-sample teacher protocol: the FM also trains on the VM's period, so the embeddings and
  soft labels the VM trains on are in-sample. Labelled as such; never a headline number.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from solaris.eval import metrics as M
from solaris.eval.transfer import TransferExperiment
from solaris.train.teacher import Teacher, train_encoder
from solaris.train.vertical import VMSpec

WIDTHS = (8, 32, 128, 0)


def ablation_steps(seeds: int) -> int:
    """How many stages ``run_ablations`` reports to the experiment's progress over ``seeds``
    seeds: the FM, each encoder width, the FM without the task, the in-sample teacher."""
    return seeds * (3 + len(WIDTHS))


def run_ablations(exp: TransferExperiment, seeds: int, task: int = 0) -> dict:
    """Seed-mean BCEs and TRs of each ablation for task index ``task``."""
    t0 = time.perf_counter()
    p = exp.periods
    y = exp.tables.labels[p.test, task]
    pair = [VMSpec("vm_pair_100", use_pair=True, coverage=1.0)]
    kd = [VMSpec("vm_kd", kd_alpha=a) for a in exp.cfg.report.kd_alphas]
    acc: dict[str, list[float]] = {}

    def add(key: str, preds: np.ndarray) -> None:
        acc.setdefault(key, []).append(M.bce(y, preds))

    for seed in range(seeds):
        exp.progress(f"ablations seed {seed}: FM")
        base = exp.teacher(seed)
        probs, inputs = exp.inputs(base)
        add("fm", probs[p.test, task])
        add("vm", exp.run_variant([VMSpec("vm")], inputs, probs, task, seed)[0])
        for w in WIDTHS:
            exp.progress(f"ablations seed {seed}: width {w or 'raw'}")
            enc = train_encoder(base.fm, exp.tables, p.fm, replace(exp.cfg.encoder, width=w), seed,
                                f"{exp.cfg.fm.version}+enc{w}")
            t = Teacher(fm=base.fm, encoder=enc, fm_fit=base.fm_fit, version=enc.version)
            pr, inp = exp.inputs(t)
            add(f"width_{w or 'raw'}", exp.run_variant(pair, inp, pr, task, seed)[0])
        exp.progress(f"ablations seed {seed}: FM without the VM's task")
        mask = tuple(i != task for i in range(len(exp.ds.tasks)))
        if any(mask):
            nt = exp.teacher(seed, task_mask=mask)
            pr, inp = exp.inputs(nt)
            add("fm_without_task_pair_100", exp.run_variant(pair, inp, pr, task, seed)[0])
        exp.progress(f"ablations seed {seed}: in-sample teacher")
        rows = np.concatenate([p.fm, p.vm])
        rows.sort()
        ins = exp.teacher(seed, fm_rows=rows)
        pr, inp = exp.inputs(ins)
        add("in_sample_fm", pr[p.test, task])
        add("in_sample_pair_100", exp.run_variant(pair, inp, pr, task, seed)[0])
        add("in_sample_kd", exp.run_variant(kd, inp, pr, task, seed)[0])

    bce = {k: float(np.mean(v)) for k, v in acc.items()}
    tr = {f"width_{w or 'raw'}": M.transfer_ratio(bce["vm"], bce[f"width_{w or 'raw'}"], bce["fm"])
          for w in WIDTHS}
    if "fm_without_task_pair_100" in bce:
        tr["fm_without_task_pair_100"] = M.transfer_ratio(bce["vm"], bce["fm_without_task_pair_100"],
                                                          bce["fm"])
    ins = {
        "teacher_protocol": "in_sample",
        "note": "FM trained on the FM and VM periods: VM training rows see in-sample teacher "
                "outputs. Not comparable with the temporal headline.",
        "tr": {
            "pair_100": M.transfer_ratio(bce["vm"], bce["in_sample_pair_100"], bce["in_sample_fm"]),
            "kd": M.transfer_ratio(bce["vm"], bce["in_sample_kd"], bce["in_sample_fm"]),
        },
    }
    return {"task": exp.ds.tasks[task], "seeds": seeds, "bce": bce, "tr": tr, "in_sample": ins,
            "tr_note": "width_*: temporal protocol, same FM; fm_without_task_pair_100: TR against "
                       "the full FM's gap",
            "seconds": round(time.perf_counter() - t0, 1)}

