"""Train the residual SOLARIS VM: cross-fitted base logits, the slot corrections, the scales.

The base is the VM alone, trained first with the ``vm`` arm's code and grid and then frozen.
The corrections learn from base logits that are *out of sample*: on the base's own training
rows its logits are overconfident (it has seen their labels), and a correction trained on them
learns to trust the base and transfers nothing. So the training rows' base logits come from
``folds`` VM-alone models, each trained on the other folds (same code, lr and seed family)
and scoring its own; validation and test rows are out of sample for the base itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from solaris.config import ResidualConfig, TrainConfig, VMConfig
from solaris.eval.metrics import clustered_se, sigmoid
from solaris.models.residual import AGG_TIER, SLOTS, ResidualVM
from solaris.models.vm import VerticalModel
from solaris.tiers import Tier
from solaris.train.loop import fit, seed_everything
from solaris.train.vertical import VMInputs, VMSpec, best_vm, train_vm, vm_logits


@dataclass
class CrossFit:
    """Cross-fitted VMs alone: ``models[k]`` trained on every row of ``rows`` outside fold
    ``k`` (``fold``, len(rows),); ``logits`` (len(rows),) each row's logit from the model that
    did not train on it."""

    rows: np.ndarray
    fold: np.ndarray
    models: list[VerticalModel]
    logits: np.ndarray

    def verifier(self, tables) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        """Out-of-sample candidate scores (users, items, surfaces) -> probabilities: a
        candidate whose (user, item) pair has a row in ``rows`` is scored by the model that did
        not train on that row (the first such row, where a pair repeats); any other by model
        ``key % folds`` of its pair key. So a training-period schedule simulation ranks as the
        base ranks unseen pairs when it serves."""
        from solaris.simulate.schedule import candidate_scores

        n_items = int(tables.num_items)
        keys = tables.user[self.rows].astype(np.int64) * n_items + tables.item[self.rows]
        order = np.argsort(keys, kind="stable")
        k_sorted, f_sorted = keys[order], self.fold[order]

        def scores(users: np.ndarray, items: np.ndarray, surfaces: np.ndarray) -> np.ndarray:
            q = np.asarray(users, np.int64) * n_items + np.asarray(items, np.int64)
            at = np.minimum(np.searchsorted(k_sorted, q), max(len(k_sorted) - 1, 0))
            hit = (k_sorted[at] == q) if len(k_sorted) else np.zeros(len(q), bool)
            f = np.where(hit, f_sorted[at], q % len(self.models))
            out = np.empty(len(q), np.float64)
            for k, model in enumerate(self.models):
                m = np.flatnonzero(f == k)
                if len(m):
                    out[m] = candidate_scores(model, tables, users[m], items[m], surfaces[m])
            return out

        return scores


def training_verifier(cf: CrossFit, tables, period: str
                      ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None:
    """The verifier a period's schedule simulation ranks by: on the training (``vm``) period
    the cross-fitted models' out-of-sample scores (the VM alone trained on those rows: its
    top-ranked, precomputed pairs would be enriched in positives it has memorised); None on
    every later period (the VM alone, out of sample there as when it serves)."""
    return cf.verifier(tables) if period == "vm" else None


def crossfit_base(inputs: VMInputs, cfg: VMConfig, train: TrainConfig, res: ResidualConfig,
                  *, task: int, rows: np.ndarray, absent_rows: np.ndarray, val_rows: np.ndarray,
                  lr: float, seed: int, num_users: int, num_items: int) -> CrossFit:
    """``res.folds`` VMs alone on ``rows``: fold k's model trains on the other folds (plus
    ``absent_rows``, as the base) with the base's code, lr and seed family, and gives fold k's
    out-of-sample logits."""
    rows = np.asarray(rows)
    fold = np.random.default_rng(seed + 7919).permutation(len(rows)) % res.folds
    out = np.empty(len(rows), np.float32)
    models = []
    for k in range(res.folds):
        model, _ = train_vm(inputs, VMSpec(f"vm_fold{k}"), cfg, train, task=task,
                            teacher_rows=rows[fold != k], absent_rows=absent_rows,
                            val_rows=val_rows, lr=lr, seed=seed + 1000 * (k + 1),
                            num_users=num_users, num_items=num_items)
        out[fold == k] = vm_logits(model, inputs, rows[fold == k])
        models.append(model)
    return CrossFit(rows, fold, models, out)


@dataclass
class ResidualFit:
    model: ResidualVM
    val_bce: float  # validation BCE on rows with the slot on, at the chosen scales
    scale_curves: dict[str, dict[str, float]]  # slot -> {scale: validation BCE on its rows}


def _bce(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.binary_cross_entropy_with_logits(logits, y))


def _bce_rows(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-row BCE as float64 numpy (what the validation guards compare)."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="none").double().numpy()


def train_residual(base: VerticalModel, inputs: VMInputs, res: ResidualConfig,
                   train: TrainConfig, *, task: int, rows: np.ndarray, base_logits: np.ndarray,
                   val_rows: np.ndarray, slot: str, use_z: bool, seed: int) -> ResidualFit:
    """Fit one slot's correction on every row of ``rows`` where the slot is present, on the
    out-of-sample ``base_logits`` (len(rows),); choose its scale on ``val_rows``.

    Offline every VM-period row has its own pair embedding (tier pair, age 0) and an
    aggregate where the user had earlier pairs in the window."""
    if slot not in SLOTS:
        raise ValueError(f"slot={slot!r}: one of {SLOTS}")
    seed_everything(seed)
    torch.set_num_threads(train.threads)
    model = ResidualVM(base, inputs.dim, res.hidden, use_pair=slot == "pair",
                       use_agg=slot == "agg", use_z=use_z)
    rows = np.asarray(rows)
    agg_ok = inputs.agg_present.numpy() > 0
    keep = agg_ok[rows] if slot == "agg" else np.ones(len(rows), bool)
    tr_rows, tr_b = rows[keep], torch.from_numpy(np.asarray(base_logits, np.float32)[keep])
    val_rows = np.asarray(val_rows)
    val_rows = val_rows[agg_ok[val_rows]] if slot == "agg" else val_rows
    val_b = torch.from_numpy(vm_logits(base, inputs, val_rows))
    y_all = inputs.labels[:, task]

    def batch(r: np.ndarray) -> dict[str, torch.Tensor]:
        on = np.ones(len(r), bool)
        return inputs.batch(r, on if slot == "pair" else ~on, on if slot == "agg" else ~on)

    def step(idx: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        r = tr_rows[idx]
        logits = model(batch(r), base_logit=tr_b[idx])
        return F.binary_cross_entropy_with_logits(logits, y_all[torch.from_numpy(r)])

    vb = batch(val_rows)
    yv = y_all[torch.from_numpy(val_rows)]

    def val() -> float:
        return _bce(model(vb, base_logit=val_b), yv)

    params = [p for p in model.parameters() if p.requires_grad]
    assert params and all(not p.requires_grad for p in model.base.parameters())
    fit(model, step, val, len(tr_rows), lr=res.lr, epochs=res.epochs, patience=train.patience,
        batch_size=max(train.batch_size, 2048), seed=seed, weight_decay=train.weight_decay,
        name=f"residual_{slot}{'' if use_z else '_control'}")
    model.eval()
    best, curve = _choose_scale(model, slot, res.scales, vb, val_b, yv)
    return ResidualFit(model, curve[f"{best:g}"], {slot: curve})


@torch.no_grad()
def _choose_scale(model: ResidualVM, slot: str, scales: tuple[float, ...],
                  vb: dict[str, torch.Tensor], val_b: torch.Tensor, yv: torch.Tensor
                  ) -> tuple[float, dict[str, float]]:
    """Set the slot's scale to the best of ``scales`` on the validation batch ``vb`` (ties:
    the larger scale); (scale, {scale: validation BCE})."""
    tier = Tier.PAIR if slot == "pair" else AGG_TIER
    curve: dict[str, float] = {}
    for s in scales:
        model.set_scale(slot, tier, s)
        curve[f"{s:g}"] = _bce(model(vb, base_logit=val_b), yv)
    best = min(scales, key=lambda s: (curve[f"{s:g}"], -s))
    model.set_scale(slot, tier, best)
    return best, curve


def draw_ages(found_age_s: np.ndarray, n: int, seed: int,
              history_age_s: np.ndarray | None = None
              ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``n`` ages (s) drawn with replacement from the ages the schedule simulation read its
    entries at (``simulated_presence(...)["age_s"]`` where found): the age distribution
    serving gives the pair slot. With ``history_age_s`` (the same entries' history ages,
    ``simulated_presence(...)["history_age_s"]``): (ages, history ages), each draw one
    entry's pair of them."""
    a = np.asarray(found_age_s, np.float64)
    keep = np.isfinite(a)
    if not keep.any():
        raise ValueError("found_age_s: no finite ages (the simulation covered nothing)")
    pick = np.random.default_rng(seed + 4241).choice(int(keep.sum()), size=n)
    ages = np.round(a[keep][pick])
    if history_age_s is None:
        return ages
    h = np.asarray(history_age_s, np.float64)
    if h.shape != a.shape or not np.isfinite(h[keep]).all():
        raise ValueError(f"history_age_s: shape {h.shape} with NaNs where an age is found; "
                         f"expected {a.shape}, finite wherever found_age_s is")
    return ages, np.round(h[keep][pick])


ZAsOf = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (rows, age_s) -> z (len(rows), D)


@dataclass
class ServedPairFit:
    """The pair correction to serve: the one trained on fresh z or the one trained on z as
    the cache serves it, whichever is better on validation served the same way."""

    fit: ResidualFit  # the chosen correction, its scale chosen on served validation
    fresh: ResidualFit  # the fresh-z correction as trained (its scale on fresh validation)
    served_inputs: VMInputs  # training and validation rows as served (z, age)
    info: dict


def fit_pair_as_served(base: VerticalModel, inputs: VMInputs, res: ResidualConfig,
                       train: TrainConfig, *, task: int, rows: np.ndarray,
                       base_logits: np.ndarray, val_rows: np.ndarray, seed: int,
                       z_as_of: ZAsOf, found_age_s: np.ndarray,
                       read_ttl_s: float,
                       found_history_age_s: np.ndarray | None = None) -> ServedPairFit:
    """Train the pair correction on fresh z (``train_residual``) and on z as served: every
    training and validation row's own pair written ``a`` seconds before its request, ``a``
    drawn from the schedule's read ages (``draw_ages``), z as of the history the entry read
    (``z_as_of`` at the drawn entry's history age, ``found_history_age_s``; the write, ``a``,
    where not given) and ``a`` fed to the gate. Both are scored on the served validation
    rows, each at its best scale there; the better one is served (a cache never holds a
    fresher z than the lag)."""
    rows, val_rows = np.asarray(rows), np.asarray(val_rows)
    fresh = train_residual(base, inputs, res, train, task=task, rows=rows,
                           base_logits=base_logits, val_rows=val_rows, slot="pair",
                           use_z=True, seed=seed)
    n_found = int(np.isfinite(np.asarray(found_age_s, np.float64)).sum())
    if n_found == 0:  # the schedule covered no validation row: nothing to learn ages from
        return ServedPairFit(fresh, fresh, inputs, {"chosen": "fresh", "ages_drawn_from": 0,
                                                    "val_bce_fresh_trained": fresh.val_bce})
    both = np.concatenate([rows, val_rows])
    ages, hist = draw_ages(found_age_s, len(both), seed,
                           found_age_s if found_history_age_s is None else found_history_age_s)
    served = inputs.served_as(both, z_as_of(both, hist), ages, read_ttl_s)
    aged = train_residual(base, served, res, train, task=task, rows=rows,
                          base_logits=base_logits, val_rows=val_rows, slot="pair",
                          use_z=True, seed=seed)
    # the fresh-z correction on the served validation rows, its scale chosen there
    reread = ResidualFit(copy.deepcopy(fresh.model), 0.0, {})
    on = np.ones(len(val_rows), bool)
    vb = served.batch(val_rows, on, ~on)
    val_b = torch.from_numpy(vm_logits(base, served, val_rows))
    yv = served.labels[torch.from_numpy(val_rows), task]
    best, curve = _choose_scale(reread.model, "pair", res.scales, vb, val_b, yv)
    reread.val_bce, reread.scale_curves = curve[f"{best:g}"], {"pair": curve}
    chosen = aged if aged.val_bce < reread.val_bce else reread
    info = {"chosen": "served" if chosen is aged else "fresh",
            "val_bce_served_trained": aged.val_bce, "val_bce_fresh_trained": reread.val_bce,
            "val_bce_fresh_trained_fresh_val": fresh.val_bce,
            "age_s_median": float(np.median(ages)), "ages_drawn_from": n_found}
    return ServedPairFit(chosen, fresh, served, info)


def train_base(inputs: VMInputs, cfg: VMConfig, train: TrainConfig, lrs: tuple[float, ...], *,
               task: int, rows: np.ndarray, absent_rows: np.ndarray, val_rows: np.ndarray,
               seed: int, num_users: int, num_items: int, name: str = "vm"
               ) -> tuple[VerticalModel, float, float]:
    """The VM alone with the ``vm`` arm's code and lr grid, best on validation:
    (model, lr, validation BCE)."""
    _, lr, model, v = best_vm(inputs, [VMSpec(name)], cfg, train, lrs, task=task,
                              teacher_rows=rows, absent_rows=absent_rows, val_rows=val_rows,
                              seed=seed, num_users=num_users, num_items=num_items)
    return model, lr, v


def residual_meta(fit: ResidualFit) -> dict:
    """What a residual VM checkpoint records beside its weights: the scales by slot and tier
    name and the validation curves behind them."""
    m = fit.model
    scales = {"pair": {t.label: float(m.scale[0, t]) for t in Tier if t > Tier.NONE},
              "aggregate": float(m.scale[1, AGG_TIER]) if m.agg is not None else 0.0}
    return {"residual": True, "use_pair": m.pair is not None, "use_agg": m.agg is not None,
            "use_z": m.use_z, "imputed": m.imputed is not None,
            "hidden": m.pair.delta[0].out_features if m.pair is not None
            else m.agg.delta[0].out_features, "scales": scales,
            # (num_items, K) of the aggregate's item table where it meets the candidate
            "agg_items": [int(m.agg.item_vec.shape[0]) - 1, int(m.agg.item_vec.shape[1])]
            if m.agg is not None and m.agg.crossed else None,
            "scale_curves": fit.scale_curves, "val_bce": fit.val_bce,
            # the logit map where a pair tier is served, for the tiers where it is not identity
            "present_affine": {t.label: m.present_affine[t].tolist() for t in Tier
                               if t > Tier.NONE and m.present_affine[t].tolist() != [0.0, 1.0]}}


# ---- tiers and the aggregate, trained on simulated serving ------------------------------------
IMPUTED = (Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR)
# the inputs ``fit_served_tiers`` judges together with the guard: the imputed tiers and the
# aggregate
GUARDED_INPUTS = len(IMPUTED) + 1


def family_z(z: float, k: int) -> float:
    """The z each of ``k`` one-sided tests needs so that the chance any of them passes on
    noise is at most that of one test at ``z`` (Bonferroni): Phi^-1(1 - (1 - Phi(z)) / k).
    family_z(2, 1) = 2; family_z(2, 3) = 2.428."""
    if k < 1:
        raise ValueError(f"k={k!r}: must be >= 1")
    if z <= 0:
        return float(z)
    n = NormalDist()
    return float(n.inv_cdf(1.0 - (1.0 - n.cdf(z)) / k))


def guard_z(res: ResidualConfig) -> float:
    """The z each guarded input must reach: ``res.min_gain_z`` as the level of the family of
    ``GUARDED_INPUTS`` inputs (``family_z``)."""
    return family_z(res.min_gain_z, GUARDED_INPUTS)


@dataclass
class TierFit(ResidualFit):
    """The serving VM with every input the router serves (``fit_served_tiers``)."""

    info: dict = field(default_factory=dict)


def _served_fit(model: ResidualVM, params: list[torch.nn.Parameter], step, val, n: int,
                res: ResidualConfig, train: TrainConfig, seed: int, name: str) -> None:
    """Train ``params`` only (everything else of ``model`` frozen), early-stopped on ``val``."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    fit(model, step, val, n, lr=res.lr, epochs=res.epochs, patience=train.patience,
        batch_size=max(train.batch_size, 2048), seed=seed, weight_decay=train.weight_decay,
        name=name)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()


@torch.no_grad()
def choose_scale_guarded(model: ResidualVM, slot: str, tier: int, scales: tuple[float, ...],
                         batch: dict[str, torch.Tensor], base_logit: torch.Tensor,
                         y: torch.Tensor, min_gain_z: float,
                         groups: np.ndarray | None = None) -> dict:
    """Set one slot-tier's scale on a validation batch: the scale of lowest BCE, kept only if
    its BCE gain over scale 0 is at least ``min_gain_z`` standard errors of the mean per-row
    gain (paired over the rows; clustered by ``groups``, the rows' users, when given), else
    0 -- an input whose gain validation cannot tell from noise is not served. Returns
    {"curve": {scale: BCE}, "gain", "se", "scale"}."""
    rows = {}
    for s in sorted(set(scales) | {0.0}):
        model.set_scale(slot, tier, s)
        rows[s] = _bce_rows(model(batch, base_logit=base_logit), y)
    curve = {f"{s:g}": float(v.mean()) for s, v in rows.items()}
    best = min(rows, key=lambda s: (rows[s].mean(), -s))
    ok, g = passes_guard(rows[0.0] - rows[best], groups, min_gain_z)
    chosen = best if best > 0 and ok else 0.0
    model.set_scale(slot, tier, chosen)
    return {"curve": curve, "gain": g["val_gain"], "se": g["val_se"], "scale": chosen}


@torch.no_grad()
def fit_present_affine(model: ResidualVM, tables, *, task: int, train_slots,
                       base_logits: torch.Tensor, val_slots, val_base: torch.Tensor,
                       read_ttl_s: float, min_gain_z: float, min_rows: int = 50) -> dict:
    """Per pair tier served (scale > 0): fit ``alpha + beta * logit`` (Platt, on logits) on the
    training rows ``train_slots`` serves with that tier, ``base_logits`` their out-of-sample
    base logits; set it on ``model`` only if its BCE gain over the identity on the validation
    rows served that tier is at least ``min_gain_z`` standard errors (clustered by user) and
    positive. Fewer than ``min_rows`` rows on either side: not fitted. {tier label: record}."""
    from solaris.eval.metrics import fit_platt_logits

    y_all = tables.labels[:, task].astype(np.float64)
    out: dict[str, dict] = {}
    for t in (Tier.PAIR, *IMPUTED):
        if float(model.scale[0, t]) <= 0:
            continue
        tr = np.flatnonzero(train_slots.pair_tier == int(t))
        va = np.flatnonzero(val_slots.pair_tier == int(t))
        rec: dict = {"train_rows": int(len(tr)), "val_rows": int(len(va)), "kept": False}
        out[t.label] = rec
        if len(tr) < min_rows or len(va) < min_rows:
            continue
        x = model(train_slots.batch(tables, tr, read_ttl_s), base_logit=base_logits[tr])
        # fit_platt_logits gives (a, b) of sigmoid(a * x + b): beta, alpha
        beta, alpha = fit_platt_logits(y_all[train_slots.rows[tr]], x.double().numpy())
        rec.update(alpha=float(alpha), beta=float(beta))
        if not (np.isfinite(alpha) and np.isfinite(beta) and beta > 0):
            continue
        xv = model(val_slots.batch(tables, va, read_ttl_s), base_logit=val_base[va]).double()
        yv = torch.from_numpy(y_all[val_slots.rows[va]])
        before, after = _bce_rows(xv, yv), _bce_rows(alpha + beta * xv, yv)
        ok, g = passes_guard(before - after, tables.user[val_slots.rows[va]], min_gain_z)
        rec.update(gain=g["val_gain"], se=g["val_se"])
        if ok:
            model.set_present_affine(int(t), alpha, beta)
            rec["kept"] = True
    return out


def passes_guard(gain_rows: np.ndarray, users: np.ndarray | None, z: float
                 ) -> tuple[bool, dict]:
    """Whether a change whose per-row validation BCE gain is ``gain_rows`` may be served: its
    mean gain positive and at least ``z`` standard errors, clustered by ``users`` (None: per
    row)."""
    gain, se = float(np.mean(gain_rows)), clustered_se(gain_rows, users)
    return bool(gain > 0 and gain >= z * se), {"val_gain": gain, "val_se": se}


def presence_rates(tier: np.ndarray, y: np.ndarray, base_logit: np.ndarray) -> dict:
    """Per served pair tier: rows, positive rate and the VM alone's mean probability on them
    (``base_logit``: out of sample); their ratio far from 1 on the own pair's rows means the
    verifier's choice carries label signal the base does not (in-sample ranking inflates it)."""
    p = sigmoid(base_logit)
    out = {}
    for t in Tier:
        m = np.asarray(tier) == int(t)
        if m.any():
            out[t.label] = {"rows": int(m.sum()), "positive_rate": float(y[m].mean()),
                            "base_p": float(p[m].mean())}
    return out


def candidate_table(kind: str, fm, side, max_width: int = 256) -> torch.Tensor | None:
    """(num_items, K) float32: what the aggregate's correction knows of each candidate
    (``ResidualConfig.agg_items``). "features": the item's side features as the VM gets them
    (``side``: ``FeatureTables`` or ``SideTables``), each categorical column one-hot and
    each multi-hot column as its codes' indicator (columns of more than ``max_width`` values
    left out), the continuous ones as they are; "fm": the FM's ``item_vectors()``; "both":
    the two side by side; "off": None. On the synthetic world the side features hold 0.74 of
    the hidden item vectors (held-out R^2) and the built-in FM's item-id vectors none
    (``bench/aggregate_interest.py``'s note)."""
    if kind == "off":
        return None
    parts = []
    if kind in ("features", "both"):
        cat, mh = np.asarray(side.item_cat), np.asarray(side.item_mh)
        n = len(cat)
        for j in range(cat.shape[1]):
            width = int(cat[:, j].max(initial=-1)) + 1
            if 0 < width <= max_width:
                parts.append(np.eye(width, dtype=np.float32)[cat[:, j]])
        for j in range(mh.shape[1]):
            width = int(mh[:, j].max(initial=0))  # codes + 1, 0 = pad
            if 0 < width <= max_width:
                m = np.zeros((n, width + 1), np.float32)
                np.put_along_axis(m, mh[:, j], 1.0, axis=1)
                parts.append(m[:, 1:])
        parts.append(np.asarray(side.item_cont, np.float32).reshape(n, -1))
    if kind in ("fm", "both"):
        with torch.no_grad():
            parts.append(fm.item_vectors().detach().float().cpu().numpy())
    table = np.concatenate(parts, axis=1)
    if table.shape[1] == 0:
        return None
    return torch.from_numpy(np.ascontiguousarray(table, np.float32))


def fit_served_tiers(pair_model: ResidualVM, tables, res: ResidualConfig, train: TrainConfig,
                     *, task: int, train_slots, base_logits: np.ndarray, val_slots,
                     read_ttl_s: float, seed: int,
                     pair_curves: dict[str, dict[str, float]] | None = None,
                     item_table: torch.Tensor | None = None) -> TierFit:
    """Extend the chosen pair correction to every input the router serves.

    ``train_slots`` / ``val_slots`` (``solaris.simulate.served.ServedSlots``): the VM and the
    validation period's rows as simulated serving gives them; ``base_logits``: the training
    rows' out-of-sample base logits (len(train_slots.rows),). The own pair is read exactly as
    ``pair_model`` reads it (its correction and scale). The imputed tiers get their own
    correction, a copy of the own pair's whose tier-and-age gate trains on every training row
    served with an imputed tier (``res.imputed_fit``: "own", the whole correction, pulled
    toward the own pair's weights by ``res.imputed_prox``; "gate", the gate alone); then the
    aggregate's correction trains on every row with a served aggregate, the pair slot as
    served (``item_table``, ``candidate_table``'s (num_items, K): crossed with the
    candidate's row); both stop early on the training period's last ``res.holdout_share``
    (by request time), never on validation. Scales are chosen on validation in lookup order
    (user neighbour, item neighbour, aggregate), each with the ones before fixed, by
    ``choose_scale_guarded`` at ``guard_z(res)`` (``res.min_gain_z``, Bonferroni over the three
    inputs), standard errors clustered by user.
    ``pair_curves``: the own pair's scale
    curve, kept beside the new ones (the validation curves behind every scale)."""
    if pair_model.pair is None:
        raise ValueError("pair_model: needs the pair correction")
    seed_everything(seed)
    torch.set_num_threads(train.threads)
    base = pair_model.base
    model = ResidualVM(base, pair_model.slot_dim, res.hidden, use_pair=True, use_agg=True,
                       use_z=True, imputed=True,
                       agg_items=None if item_table is None else tuple(item_table.shape))
    if item_table is not None:
        model.agg.set_item_vectors(item_table)
    model.pair.load_state_dict(pair_model.pair.state_dict())
    model.imputed.load_state_dict(pair_model.pair.state_dict())
    model.set_scale("pair", int(Tier.PAIR), float(pair_model.scale[0, Tier.PAIR]))
    model.set_scale("agg", AGG_TIER, 0.0)
    y_all = torch.from_numpy(tables.labels[:, task])
    tr_y = y_all[torch.from_numpy(train_slots.rows)]
    tr_b = torch.from_numpy(np.asarray(base_logits, np.float32))
    va_y = y_all[torch.from_numpy(val_slots.rows)]
    every = np.arange(len(val_slots.rows))
    users = tables.user[val_slots.rows]  # the guard's clusters
    vb_all = val_slots.batch(tables, every, read_ttl_s)
    with torch.no_grad():
        va_b = base(vb_all)
    z_in = guard_z(res)
    info: dict = {"train_rows": int(len(train_slots.rows)), "val_rows": int(len(every)),
                  "guard_z": z_in,
                  "presence": {"train": presence_rates(train_slots.pair_tier, tr_y.numpy(),
                                                       tr_b.numpy()),
                               "val": presence_rates(val_slots.pair_tier, va_y.numpy(),
                                                     va_b.numpy())}}
    curves: dict[str, dict[str, float]] = dict(pair_curves or {})
    guard: dict[str, dict] = {}

    def loss_on(idx: np.ndarray, agg: bool) -> torch.Tensor:
        out = model(train_slots.batch(tables, idx, read_ttl_s, None, agg), base_logit=tr_b[idx])
        return F.binary_cross_entropy_with_logits(out, tr_y[idx])

    # early stopping reads the last ``holdout_share`` of the training rows by request time,
    # so the validation period is read only to choose the scales (an unbiased guard)
    late = tables.req_ts[train_slots.rows] >= np.quantile(tables.req_ts[train_slots.rows],
                                                           1.0 - res.holdout_share)

    def split(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.flatnonzero(mask & ~late), np.flatnonzero(mask & late)

    def holdout_loss(idx: np.ndarray, agg: bool) -> Callable[[], float]:
        b = train_slots.batch(tables, idx, read_ttl_s, None, agg)
        return lambda: _bce(model(b, base_logit=tr_b[idx]), tr_y[idx])

    # 1. the imputed tiers' correction (or gate alone), both at scale 1 while it learns (the
    # aggregate off); "own" pulls every weight toward where it started, the own pair's
    for t in IMPUTED:
        model.set_scale("pair", int(t), 1.0)
    tr_i, ho_i = split(np.isin(train_slots.pair_tier, [int(t) for t in IMPUTED]))
    info["imputed_rows"] = {"train": int(len(tr_i)), "holdout": int(len(ho_i))}
    info["imputed_fit"] = res.imputed_fit
    if len(tr_i) and len(ho_i):
        own = res.imputed_fit == "own"
        params = list((model.imputed if own else model.imputed.gate).parameters())
        start = [p.detach().clone() for p in params]

        def imputed_loss(i: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
            loss = loss_on(tr_i[i], False)
            if own and res.imputed_prox > 0:
                loss = loss + res.imputed_prox * sum(((p - p0) ** 2).sum()
                                                     for p, p0 in zip(params, start))
            return loss

        _served_fit(model, params, imputed_loss, holdout_loss(ho_i, False), len(tr_i), res,
                    train, seed, "residual_imputed" if own else "residual_imputed_gate")
    vb_noagg = val_slots.batch(tables, every, read_ttl_s, None, False)
    for t in IMPUTED:
        model.set_scale("pair", int(t), 0.0)
    for t in IMPUTED:
        g = choose_scale_guarded(model, "pair", int(t), res.scales, vb_noagg, va_b, va_y,
                                 z_in, users)
        curves[t.label], guard[t.label] = g["curve"], g
    # 2. the aggregate's correction, the pair slot as served at the chosen scales
    model.set_scale("agg", AGG_TIER, 1.0)
    tr_a, ho_a = split(train_slots.agg_present)
    info["agg_rows"] = {"train": int(len(tr_a)), "holdout": int(len(ho_a))}
    if len(tr_a) and len(ho_a):
        _served_fit(model, list(model.agg.parameters()), lambda i, rng: loss_on(tr_a[i], True),
                    holdout_loss(ho_a, True), len(tr_a), res, train, seed,
                    "residual_agg_served")
    g = choose_scale_guarded(model, "agg", AGG_TIER, res.scales, vb_all, va_b, va_y,
                             z_in, users)
    curves["aggregate"], guard["aggregate"] = g["curve"], g
    # 3. ``res.present_affine == "served"``: per pair tier served, the logit's map
    # alpha + beta * logit fitted on the training rows simulated serving gives that tier (every
    # input as served, out-of-sample base logits) and judged on validation by the guard
    if res.present_affine == "served":
        info["present_affine"] = fit_present_affine(
            model, tables, task=task, train_slots=train_slots, base_logits=tr_b,
            val_slots=val_slots, val_base=va_b, read_ttl_s=read_ttl_s, min_gain_z=z_in)
    info["guard"] = {k: {"gain": v["gain"], "se": v["se"], "scale": v["scale"]}
                     for k, v in guard.items()}
    with torch.no_grad():
        val_bce = _bce(model(vb_all, base_logit=va_b), va_y)
    return TierFit(model, val_bce, curves, info)
