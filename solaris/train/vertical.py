"""Train and score vertical models (VMs) with the two SOLARIS input slots.

Feature dropout: during training each row's pair slot is present with probability equal to
the target coverage (and the user slot whenever an aggregate exists), so zeros at serving time
are in-distribution. Rows whose teacher outputs would be in-sample (the FM's own period) train
the VM with both slots marked absent and no soft label.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from solaris.cache.query import Slots
from solaris.config import TrainConfig, VMConfig
from solaris.features import FeatureTables
from solaris.eval.metrics import fit_platt_logits
from solaris.models.api import build_vm
from solaris.models.batch import vm_batch
from solaris.models.vm import VerticalModel
from solaris.tiers import Tier
from solaris.train.loop import fit, predict_in_batches, seed_everything


@dataclass
class SlotArrays:
    """Per-row SOLARIS features as a cache would serve them (offline: fresh at row time)."""

    pair_emb: np.ndarray  # (N, D) z of the row's own (user, item) pair
    agg_emb: np.ndarray  # (N, D) causal aggregate of the user's other recent pairs
    agg_present: np.ndarray  # (N,) bool: an aggregate exists

    @property
    def dim(self) -> int:
        return self.pair_emb.shape[1]


class VMInputs:
    """All rows' VM inputs (no history: a VM never reads it) plus slot arrays; the slot
    arrays and labels are tensors (sharing memory with the arrays ``batch`` reads)."""

    def __init__(self, tables: FeatureTables, slots: SlotArrays):
        t = torch.from_numpy
        self.tables = tables
        self.pair = t(slots.pair_emb.astype(np.float32))
        self.agg = t(slots.agg_emb.astype(np.float32))
        self.agg_present = t(slots.agg_present.astype(np.float32))
        # the pair slot as a cache serves it (``served_as``): its age per row, read against
        # this TTL; None: the own pair, fresh (age 0), as an offline VM reads it
        self.pair_age_s = np.zeros(tables.num_rows)
        self.read_ttl_s: float | None = None
        self.dim = slots.dim
        self.labels = t(tables.labels)

    def served_as(self, rows: np.ndarray, pair_emb: np.ndarray, age_s: np.ndarray,
                  read_ttl_s: float) -> "VMInputs":
        """A copy whose pair slot at ``rows`` holds ``pair_emb`` (len(rows), D), written
        ``age_s`` seconds before the row's request -- the own pair as the cache serves it
        (z as of the write: ``pair_embeddings_as_of``) -- read as a tier-aware VM reads it:
        tier PAIR, age ``age_s / read_ttl_s``. Other rows keep their fresh z, age 0."""
        rows = np.asarray(rows, np.int64)
        age_s = np.asarray(age_s, np.float64)
        if pair_emb.shape != (len(rows), self.dim) or age_s.shape != rows.shape:
            raise ValueError(f"pair_emb {pair_emb.shape} / age_s {age_s.shape}: expected "
                             f"({len(rows)}, {self.dim}) / ({len(rows)},)")
        if not (np.isfinite(age_s).all() and (age_s >= 0).all()):
            raise ValueError("age_s: must be finite and >= 0")
        if not read_ttl_s > 0:
            raise ValueError(f"read_ttl_s={read_ttl_s!r}: must be > 0")
        out = copy.copy(self)
        out.pair = self.pair.clone()
        out.pair[torch.from_numpy(rows)] = torch.from_numpy(np.asarray(pair_emb, np.float32))
        out.pair_age_s = self.pair_age_s.copy()
        out.pair_age_s[rows] = age_s
        out.read_ttl_s = float(read_ttl_s)
        return out

    def batch(self, rows: np.ndarray, pair_present: np.ndarray, agg_on: np.ndarray
              ) -> dict[str, torch.Tensor]:
        """Batch for ``rows``; ``pair_present`` / ``agg_on`` (bool per row) gate the slots.
        Offline every present pair slot is the row's own pair: the VM reads tier PAIR there,
        age 0 (fresh) unless ``served_as`` set the rows' ages."""
        r = np.asarray(rows, dtype=np.int64)
        pp = np.asarray(pair_present, dtype=np.float32)
        ap = self.agg_present.numpy()[r] * np.asarray(agg_on, dtype=np.float32)
        present = pp > 0
        # the gates multiply the embeddings (the models mask absent slots again, with where)
        slots = Slots(pair_emb=self.pair.numpy()[r] * pp[:, None], pair_present=present,
                      pair_tier=np.where(present, Tier.PAIR, Tier.NONE),
                      pair_age_s=np.where(present, self.pair_age_s[r], 0.0),
                      agg_emb=self.agg.numpy()[r] * ap[:, None], agg_present=ap > 0,
                      missing=~present)
        tb = self.tables
        u, i = tb.user[r], tb.item[r]
        return vm_batch(u, i, tb.surface[r], tb.user_cat[u], tb.item_cat[i], tb.item_cont[i],
                        slots, user_cont=tb.user_cont[u], item_mh=tb.item_mh[i],
                        request_cont=tb.request_cont[r], read_ttl_s=self.read_ttl_s)


@dataclass
class VMSpec:
    """One VM variant: which slots, at which coverage, with or without distillation."""

    name: str
    use_pair: bool = False
    use_agg: bool = False
    coverage: float = 1.0  # share of rows whose pair slot is present (train and eval)
    kd_alpha: float = 0.0  # weight of the teacher's soft label in the loss (0 = no KD)


def _loss(model: VerticalModel, inputs: VMInputs, rows: np.ndarray, present: np.ndarray,
          agg_on: np.ndarray, task: int, soft: np.ndarray | None, kd_w: np.ndarray | None
          ) -> torch.Tensor:
    logits = model(inputs.batch(rows, present, agg_on))  # (B,)
    y = inputs.labels[torch.from_numpy(np.asarray(rows, dtype=np.int64)), task]
    loss = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    if soft is not None and kd_w is not None:
        s = torch.from_numpy(soft.astype(np.float32))
        w = torch.from_numpy(kd_w.astype(np.float32))
        kd = F.binary_cross_entropy_with_logits(logits, s, reduction="none")
        loss = (1 - w) * loss + w * kd
    return loss.mean()


def train_vm(inputs: VMInputs, spec: VMSpec, cfg: VMConfig, train: TrainConfig, *, task: int,
             teacher_rows: np.ndarray, absent_rows: np.ndarray, val_rows: np.ndarray,
             lr: float, seed: int, soft_labels: np.ndarray | None = None,
             num_users: int, num_items: int) -> tuple[VerticalModel, float]:
    """Train one VM variant; return it and its validation BCE (for the shared grid).

    ``teacher_rows`` carry out-of-sample teacher outputs (slots and soft labels available);
    ``absent_rows`` train with both slots absent; ``soft_labels`` (N,) are the teacher's
    probabilities for every row (used only on ``teacher_rows`` when ``spec.kd_alpha > 0``).
    With ``cfg.calibrate`` the trained model gets a Platt fit on ``val_rows`` folded in
    (``calibrate_on``), and the validation BCE returned is the calibrated one.
    """
    seed_everything(seed)
    torch.set_num_threads(train.threads)
    vm_cfg = dataclasses.replace(cfg, use_pair=spec.use_pair, use_agg=spec.use_agg)
    model = build_vm(vm_cfg, inputs.tables.spec, num_users, num_items, inputs.dim)
    rows = np.concatenate([np.asarray(absent_rows), np.asarray(teacher_rows)])
    has_teacher = np.concatenate([np.zeros(len(absent_rows), bool), np.ones(len(teacher_rows), bool)])
    kd_w = has_teacher * spec.kd_alpha if spec.kd_alpha > 0 else None
    soft = soft_labels if spec.kd_alpha > 0 else None
    val_present = coverage_mask(len(val_rows), spec.coverage if spec.use_pair else 0.0, seed + 1)
    val_agg = np.full(len(val_rows), spec.use_agg)

    def step(idx: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        r = rows[idx]
        ht = has_teacher[idx]
        present = ht & (rng.random(len(idx)) < spec.coverage) if spec.use_pair else np.zeros(len(idx), bool)
        agg_on = ht & spec.use_agg
        return _loss(model, inputs, r, present, agg_on, task,
                     None if soft is None else soft[r], None if kd_w is None else kd_w[idx])

    def val() -> float:
        return _loss(model, inputs, val_rows, val_present, val_agg, task, None, None).item()

    res = fit(model, step, val, len(rows), lr=lr, epochs=train.vm_epochs, patience=train.patience,
              batch_size=max(train.batch_size, 2048), seed=seed, weight_decay=train.weight_decay,
              name=spec.name)
    if not cfg.calibrate or len(val_rows) == 0:
        return model, res.best_val_loss
    calibrate_on(model, inputs, val_rows, val_present, val_agg, task)
    with torch.no_grad():
        return model, val()


@torch.no_grad()
def vm_logits(model: torch.nn.Module, inputs: VMInputs, rows: np.ndarray,
              present: np.ndarray | None = None, agg_on: np.ndarray | None = None
              ) -> np.ndarray:
    """Logits (float32) of ``model`` on ``rows`` with the given slot gates (default: none)."""
    model.eval()
    rows = np.asarray(rows)
    off = np.zeros(len(rows), bool)
    present = off if present is None else present
    agg_on = off if agg_on is None else agg_on
    return predict_in_batches(lambda p: model(inputs.batch(rows[p], present[p], agg_on[p])),
                              len(rows))


@torch.no_grad()
def calibrate_on(model: VerticalModel, inputs: VMInputs, rows: np.ndarray, present: np.ndarray,
                 agg_on: np.ndarray, task: int) -> tuple[float, float]:
    """Fold a Platt fit of ``model`` on ``rows`` (its slots gated as given) into the model:
    (a, b) with logit -> a * logit + b. Keeps the identity if the labels are one class, and
    leaves a VM without ``set_calibration`` (an optional part of ``VMModel``) as trained."""
    if not callable(getattr(model, "set_calibration", None)):
        return 1.0, 0.0
    model.set_calibration(1.0, 0.0)
    rows = np.asarray(rows)
    x = vm_logits(model, inputs, rows, present, agg_on)
    y = inputs.labels[torch.from_numpy(rows), task].numpy()
    if len(np.unique(y)) < 2:
        return 1.0, 0.0
    a, b = fit_platt_logits(y, x)
    if a <= 0:  # a model whose validation ranking is inverted: leave it as trained
        return 1.0, 0.0
    model.set_calibration(a, b)
    return a, b


def coverage_mask(n: int, coverage: float, seed: int) -> np.ndarray:
    """Exactly round(coverage * n) rows present, chosen by a seeded permutation."""
    mask = np.zeros(n, dtype=bool)
    k = int(round(coverage * n))
    mask[np.random.default_rng(seed).permutation(n)[:k]] = True
    return mask


def best_vm(inputs: VMInputs, specs: list[VMSpec], cfg: VMConfig, train: TrainConfig,
            lrs: tuple[float, ...], *, task: int, teacher_rows: np.ndarray,
            absent_rows: np.ndarray, val_rows: np.ndarray, seed: int, num_users: int,
            num_items: int, soft_labels: np.ndarray | None = None
            ) -> tuple[VMSpec, float, VerticalModel, float]:
    """The best on validation of ``specs`` x ``lrs`` (``train_vm`` each; ties: the first):
    (spec, lr, model, validation BCE)."""
    best = None
    for spec in specs:
        for lr in lrs:
            model, v = train_vm(inputs, spec, cfg, train, task=task, teacher_rows=teacher_rows,
                                absent_rows=absent_rows, val_rows=val_rows, lr=lr, seed=seed,
                                soft_labels=soft_labels, num_users=num_users,
                                num_items=num_items)
            if best is None or v < best[3]:
                best = (spec, lr, model, v)
    if best is None:
        raise ValueError(f"specs={specs!r}, lrs={lrs!r}: nothing to train")
    return best


@torch.no_grad()
def predict_vm(model: VerticalModel, inputs: VMInputs, rows: np.ndarray, present: np.ndarray,
               agg_on: np.ndarray) -> np.ndarray:
    """Probabilities of ``model`` on ``rows`` with the given slot gates."""
    model.eval()
    rows = np.asarray(rows)
    out = predict_in_batches(
        lambda p: torch.sigmoid(model(inputs.batch(rows[p], present[p], agg_on[p]))), len(rows))
    return out.astype(np.float64)
