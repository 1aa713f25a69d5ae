"""Benchmark: the fallback inputs' corrections, variant by variant, on one training's inputs.

    python bench/served_tiers.py ARTIFACTS --seed S [--cache FILE] [--train-on vm|val-first-half]
        [--enrich KEY=VALUE ...] VARIANT [VARIANT ...]

``solaris train`` fits the imputed tiers and the aggregate on simulated serving
(``fit_served_tiers``) after the FM, the VM alone, the cross-fitted base logits, the own-pair
correction and the simulations of the VM and validation periods. This rebuilds those inputs
once from ``ARTIFACTS`` (trained with ``--seed S``; the FM, encoder and VM alone are read, the
rest recomputed as training computes it) for the click task, keeps them in ``--cache`` (a
pickle; default ``ARTIFACTS/served_tiers.pkl``), then fits every ``VARIANT`` on the same
inputs, paired: a variant is comma-separated ``residual`` settings, e.g.
``agg_items=off,imputed_fit=gate`` (what training did before either existed) or
``imputed_prox=0``; ``default`` is the config as it is.

Printed per variant: each guarded input's validation gain (BCE per validation row at its
best scale), its z (clustered by user) and the scale the guard serves; the aggregate's
validation curve; the aggregate correction's gain at scale 1 on the training period's early
rows and on its late rows (those that stop its training early); and each input's worth of
a real pair on the validation rows where it is what simulated serving gives (``worth``).

``--enrich KEY=VALUE`` (repeatable): simulated serving imputes with these ``enrich`` settings
instead of the artifacts' (``user_knn_mode=weighted``, ``user_knn_probe=50``: the paper's two
imputation strategies and the probe count), prepared into a cache of their own
(``ARTIFACTS/served_tiers-user_knn_mode-weighted.pkl``).

``--train-on val-first-half``: the tiers train on the validation period's first half by
request time (base logits from the VM alone, out of sample and older than the rows, as it
serves) and the guard judges the second half; with ``vm`` (the default) the guard judges the
whole validation period, as training does. Research only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np


def prepare(art_dir: Path, seed: int, enrich: dict[str, str] | None = None) -> dict:
    import torch

    from solaris.artifacts import Artifacts
    from solaris.data.load import load_dataset
    from solaris.data.split import time_split
    from solaris.features import FeatureTables
    from solaris.simulate.schedule import simulated_presence, window_log
    from solaris.simulate.served import simulate_period
    from solaris.train.residual import crossfit_base, fit_pair_as_served, training_verifier
    from solaris.train.teacher import FitResult, Teacher, vm_inputs, z_at_age

    art = Artifacts.open(art_dir)
    cfg = art.config
    if enrich:
        from solaris.config import parse_overrides, with_overrides

        cfg = with_overrides(cfg, parse_overrides([f"enrich.{k}={v}" for k, v in enrich.items()]))
    fm, enc, version = art.models()
    teacher = Teacher(fm, enc, FitResult(float("nan"), 0, 0), version)
    ds = load_dataset(cfg.data)
    periods = time_split(ds, cfg.split)
    tables = FeatureTables(ds, cfg.features)
    torch.set_num_threads(cfg.train.threads)
    _, inputs = vm_inputs(teacher, tables, cfg.features)
    val_log = window_log(cfg, ds, periods, "val")
    base, lr, _ = art.vm_alone(ds.tasks[0])
    common = dict(task=0, rows=periods.vm, absent_rows=periods.fm_vertical,
                  val_rows=periods.val, seed=seed, num_users=ds.num_users,
                  num_items=ds.num_items)
    cf = crossfit_base(inputs, cfg.vm, cfg.train, cfg.residual, lr=lr, **common)
    sim_val = simulated_presence(cfg, ds, tables, periods, base, val_log, seed,
                                 rows=periods.val)
    served = fit_pair_as_served(base, inputs, cfg.residual, cfg.train, task=0, rows=periods.vm,
                                base_logits=cf.logits, val_rows=periods.val, seed=seed,
                                z_as_of=z_at_age(teacher, tables, cfg.features),
                                found_age_s=sim_val["age_s"],
                                read_ttl_s=float(cfg.cache.read_ttl_s),
                                found_history_age_s=sim_val["history_age_s"])
    sv = {per: simulate_period(cfg, ds, tables, periods, base, fm, enc, version, per, seed,
                               val_log if per == "val" else None,
                               verifier=training_verifier(cf, tables, per))
          for per in ("vm", "val")}
    return {"cfg": cfg, "tables": tables, "b_oos": cf.logits, "pair": served.fit.model,
            "pair_curves": served.fit.scale_curves, "sv": sv, "fm": fm, "seed": seed,
            "z": inputs.pair.numpy()}  # every row's own pair embedding, fresh


def _take(slots, idx: np.ndarray):
    return dataclasses.replace(slots, **{f: getattr(slots, f)[idx] for f in (
        "rows", "mapped", "pair_emb", "pair_tier", "pair_age_s", "agg_emb", "agg_present")})


def fit_variant(d: dict, variant: str, train_on: str) -> dict:
    import torch
    import torch.nn.functional as F

    from solaris.config import ResidualConfig
    from solaris.models.residual import AGG_TIER
    from solaris.train.residual import candidate_table, fit_served_tiers

    cfg, tables, sv = d["cfg"], d["tables"], d["sv"]
    ttl = float(cfg.cache.read_ttl_s)
    kv = dict(x.split("=", 1) for x in variant.split(",")) if variant != "default" else {}
    types = {f.name: f.type for f in dataclasses.fields(ResidualConfig)}
    res = dataclasses.replace(cfg.residual, **{
        k: float(v) if types.get(k) == "float" else v for k, v in kv.items()})
    train, bl, val = sv["vm"], d["b_oos"], sv["val"]
    if train_on == "val-first-half":
        ts = tables.req_ts[val.rows]
        cut = np.median(ts)
        train, val = _take(val, np.flatnonzero(ts < cut)), _take(val, np.flatnonzero(ts >= cut))
        with torch.no_grad():
            bl = d["pair"].base(train.batch(tables, np.arange(len(train.rows)), ttl)).numpy()
    fit = fit_served_tiers(d["pair"], tables, res, cfg.train, task=0, train_slots=train,
                           base_logits=bl, val_slots=val, read_ttl_s=ttl, seed=d["seed"],
                           pair_curves=d["pair_curves"],
                           item_table=candidate_table(res.agg_items, d["fm"], tables))
    m = fit.model
    out = {"variant": variant, "train_on": train_on, "val_rows": int(len(val.rows)),
           "guard_z": fit.info["guard_z"],
           "guard": {k: {"gain": v["gain"], "z": v["gain"] / v["se"] if v["se"] else None,
                         "scale": v["scale"]} for k, v in fit.info["guard"].items()},
           "aggregate_curve": fit.scale_curves["aggregate"], "aggregate_gain_at_1": {}}
    late = tables.req_ts[train.rows] >= np.quantile(tables.req_ts[train.rows],
                                                    1 - res.holdout_share)
    y = torch.from_numpy(tables.labels[train.rows, 0])
    b = torch.from_numpy(np.asarray(bl, np.float32))
    keep = float(m.scale[1, AGG_TIER])
    for name, mask in (("train_early", ~late), ("train_late", late)):
        idx = np.flatnonzero(mask & train.agg_present)
        batch = train.batch(tables, idx, ttl)
        bce = {}
        for s in (0.0, 1.0):
            m.set_scale("agg", AGG_TIER, s)
            with torch.no_grad():
                bce[s] = float(F.binary_cross_entropy_with_logits(
                    m(batch, base_logit=b[idx]), y[idx]))
        out["aggregate_gain_at_1"][name] = {"rows": int(len(idx)), "gain": bce[0.0] - bce[1.0]}
    m.set_scale("agg", AGG_TIER, keep)
    out["worth"] = worth(m, d, val, res.scales)
    return out


def worth(m, d: dict, val, scales: tuple[float, ...], draws: int = 200) -> dict:
    """Per imputed tier, on the validation rows simulated serving gives it: (BCE with it off
    - BCE at its best scale) / (BCE with it off - BCE with the row's own fresh pair read by
    the own pair's correction), and a 95% interval over a bootstrap of users. The aggregate's
    rows are those with an aggregate and no pair tier, off = no aggregate. Hypothetical
    where the guard serves the input at 0: what it would be worth at the curve's best."""
    import torch
    import torch.nn.functional as F

    from solaris.models.residual import AGG_TIER
    from solaris.tiers import Tier

    tables, ttl = d["tables"], float(d["cfg"].cache.read_ttl_s)
    y = torch.from_numpy(tables.labels[val.rows, 0])
    users = tables.user[val.rows]
    every = np.arange(len(val.rows))
    real = dataclasses.replace(val, pair_emb=d["z"][val.rows], pair_tier=np.full(
        len(every), int(Tier.PAIR)), pair_age_s=np.zeros(len(every)))
    saved = m.scale.clone()

    def rows_bce(slots, slot: str, tier: int, s: float) -> np.ndarray:
        m.set_scale(slot, tier, s)
        with torch.no_grad():
            x = m(slots.batch(tables, every, ttl))
        return F.binary_cross_entropy_with_logits(x, y, reduction="none").double().numpy()

    out = {}
    for name, slot, tier, mask in (
            ("user_neighbour", "pair", int(Tier.USER_NEIGHBOUR),
             val.pair_tier == Tier.USER_NEIGHBOUR),
            ("item_neighbour", "pair", int(Tier.ITEM_NEIGHBOUR),
             val.pair_tier == Tier.ITEM_NEIGHBOUR),
            ("aggregate", "agg", AGG_TIER, val.agg_present & (val.pair_tier == Tier.NONE))):
        m.scale.copy_(saved)
        off = rows_bce(val, slot, tier, 0.0)
        best = min((rows_bce(val, slot, tier, s)[mask].mean(), s) for s in scales)[1]
        on = rows_bce(val, slot, tier, best)
        m.scale.copy_(saved)
        if slot == "agg":  # the real pair beside the aggregate as served
            m.set_scale("agg", AGG_TIER, best)
        ref = rows_bce(real, "pair", int(Tier.PAIR), float(saved[0, Tier.PAIR]))
        g, h = (off - on)[mask], (off - ref)[mask]
        u = users[mask]
        _, inv = np.unique(u, return_inverse=True)
        gs, hs = np.bincount(inv, g), np.bincount(inv, h)
        pick = np.random.default_rng(0).integers(0, len(gs), (draws, len(gs)))
        ratio = gs[pick].sum(1) / hs[pick].sum(1)
        out[name] = {"rows": int(mask.sum()), "share": float(mask.mean()), "best_scale": best,
                     "gain": float(g.mean()), "real_gain": float(h.mean()),
                     "worth": float(g.sum() / h.sum()) if h.sum() > 0 else None,
                     "worth_ci": [float(v) for v in np.quantile(ratio, [0.025, 0.975])],
                     "real_gain_ci": [float(v) for v in np.quantile(
                         hs[pick].sum(1) / np.bincount(inv)[pick].sum(1), [0.025, 0.975])]}
    m.scale.copy_(saved)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--seed", type=int, required=True, help="the seed ARTIFACTS trained with")
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--train-on", choices=("vm", "val-first-half"), default="vm")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--enrich", action="append", default=[], metavar="KEY=VALUE",
                    help="an enrich setting simulated serving imputes with")
    args = ap.parse_args()
    enrich = dict(x.split("=", 1) for x in args.enrich)
    tag = "".join(f"-{k}-{v}" for k, v in sorted(enrich.items()))
    cache = args.cache or args.artifacts / f"served_tiers{tag}.pkl"
    if cache.exists():
        d = pickle.loads(cache.read_bytes())
        if d["seed"] != args.seed:
            raise SystemExit(f"{cache}: prepared for seed {d['seed']}, not {args.seed}")
    else:
        t = time.perf_counter()
        d = prepare(args.artifacts, args.seed, enrich)
        cache.write_bytes(pickle.dumps(d))
        print(f"inputs prepared in {time.perf_counter() - t:.0f} s -> {cache}", flush=True)
    out = []
    for v in args.variants:
        r = fit_variant(d, v, args.train_on)
        out.append(r)
        g = ", ".join(f"{k} {x['gain']:+.6f} (z {x['z']:.2f}, scale {x['scale']:g})"
                      if x["z"] is not None else f"{k} 0 (best at scale 0)"
                      for k, x in r["guard"].items())
        curve = " / ".join(f"{x:.5f}" for x in r["aggregate_curve"].values())
        tr = r["aggregate_gain_at_1"]
        w = ", ".join(f"{k} {x['worth']:.3f} [{x['worth_ci'][0]:.3f}, {x['worth_ci'][1]:.3f}] "
                      f"at {x['best_scale']:g} ({x['rows']} rows, a real pair "
                      f"{x['real_gain']:+.4f})" for k, x in r["worth"].items()
                      if x["worth"] is not None)
        print(f"{v}{' ' + tag if tag else ''} [{args.train_on}; bar z {r['guard_z']:.2f}]: {g}\n"
              f"  aggregate curve {curve}; its gain at scale 1 on training rows early "
              f"{tr['train_early']['gain']:+.5f}, late {tr['train_late']['gain']:+.5f}\n"
              f"  worth of a real pair on validation (95% CI over users): {w}", flush=True)
    if args.json:
        import runpy

        machine = runpy.run_path(str(Path(__file__).with_name("machine.py")))
        args.json.write_text(json.dumps({"variants": out, "machine": machine["machine"](
            machine["IN_PROCESS"])}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
