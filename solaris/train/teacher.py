"""Train the teacher: the FM on its own period, then the pair encoder on the FM's shared layer.

``teacher_outputs`` then runs the frozen snapshot over any rows: its probabilities (soft labels,
BCE(FM)) and the compressed pair embeddings z that feed the VMs. Under the temporal protocol
the snapshot never trained on the rows whose outputs a VM trains on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from solaris.config import EncoderConfig, FeatureConfig, FMConfig, TrainConfig
from solaris.features import FeatureTables, aggregate_embeddings
from solaris.models.api import FMModel, build_fm, shared_layer as fm_shared_layer
from solaris.models.encoder import PairEncoder, encoder_loss
from solaris.precompute.worker import describe_device
from solaris.train.loop import FitResult, fit, predict_in_batches, seed_everything
from solaris.train.vertical import SlotArrays, VMInputs

log = logging.getLogger(__name__)


@dataclass
class Teacher:
    fm: FMModel
    encoder: PairEncoder
    fm_fit: FitResult
    version: str  # FM + encoder version carried by every embedding they make
    device: str = "cpu"  # where the FM trained (``describe_device``; imported: "cpu")


def train_fm(tables: FeatureTables, rows: np.ndarray, cfg: FMConfig, train: TrainConfig,
             seed: int, task_mask: tuple[bool, ...] | None = None,
             progress: Callable[[str, float], None] | None = None) -> tuple[FMModel, FitResult]:
    """Train the FM on ``rows`` (event order); the last 10% of them is its early-stopping tail.

    ``task_mask`` switches tasks off the loss (the ablation "FM without the VM's task").
    """
    seed_everything(seed)
    torch.set_num_threads(train.threads)
    dev = training_device(train.device)
    rows = np.asarray(rows)
    cut = int(len(rows) * 0.9)
    tr, ho = rows[:cut], rows[cut:]
    model = build_fm(cfg, tables.spec, tables.num_users, tables.num_items, tables.tasks,
                     tables.history_len)
    model.to(dev)
    mask = torch.tensor(task_mask if task_mask is not None else [True] * len(tables.tasks))
    mask = mask.to(dev)
    y_all = torch.from_numpy(tables.labels)

    def loss_on(r: np.ndarray) -> torch.Tensor:
        batch = {k: v.to(dev) for k, v in tables.batch(r).items()}
        logits = model.heads(fm_shared_layer(model, batch))  # (B, T)
        per = F.binary_cross_entropy_with_logits(logits, y_all[r].to(dev),
                                                 reduction="none")  # (B, T)
        return per[:, mask].mean()

    def step(idx: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        return loss_on(tr[idx])

    def val() -> float:
        losses = [loss_on(ho[s:s + 4096]).item() * len(ho[s:s + 4096]) for s in range(0, len(ho), 4096)]
        return sum(losses) / len(ho)

    res = fit(model, step, val, len(tr), lr=train.fm_lr, epochs=train.fm_epochs,
              patience=train.patience, batch_size=train.batch_size, seed=seed,
              weight_decay=train.weight_decay, progress=progress, name="fm")
    return model.cpu(), res


def training_device(device: str) -> torch.device:
    """``train.device`` resolved: "auto" is a GPU where torch sees one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from solaris.errors import ConfigError
        raise ConfigError("train.device='cuda': torch sees no GPU here")
    return torch.device(device)


def import_fm(cfg: FMConfig, tables: FeatureTables) -> FMModel:
    """The FM of class ``cfg.cls`` with the weights of ``cfg.weights``: a state dict saved
    with ``torch.save`` or an ``fm.pt`` of ``solaris train`` (read without running pickled
    code); ``CheckpointError`` naming the file if it is missing or does not fit."""
    from pathlib import Path

    from solaris.errors import CheckpointError
    from solaris.models.api import load_weights

    path = Path(cfg.weights)
    if not path.is_file():
        raise CheckpointError(f"fm.weights={cfg.weights!r}: no such file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file
        raise CheckpointError(f"fm.weights={cfg.weights!r}: cannot read it "
                              f"({type(e).__name__}: {e})") from e
    state = obj["state_dict"] if isinstance(obj, dict) and obj.get("kind") == "fm" else obj
    if not isinstance(state, dict):
        raise CheckpointError(f"fm.weights={cfg.weights!r}: holds no state dict")
    fm = build_fm(cfg, tables.spec, tables.num_users, tables.num_items, tables.tasks,
                  tables.history_len)
    load_weights(fm, state, f"fm.weights={cfg.weights!r}")
    return fm


@torch.no_grad()
def shared_layer(fm: FMModel, tables: FeatureTables, rows: np.ndarray) -> np.ndarray:
    fm.eval()
    rows = np.asarray(rows)
    return predict_in_batches(lambda p: fm_shared_layer(fm, tables.batch(rows[p])), len(rows),
                              2048)


def train_encoder(fm: FMModel, tables: FeatureTables, rows: np.ndarray,
                  cfg: EncoderConfig, seed: int, version: str) -> PairEncoder:
    """Fit the autoencoder on the FM's last shared layer over ``rows`` (the FM's period)."""
    seed_everything(seed)
    x = torch.from_numpy(shared_layer(fm, tables, rows)).float()  # (N, H)
    enc = PairEncoder(x.shape[1], cfg)
    enc.version = version
    if cfg.width == 0:
        return enc.eval()
    with torch.no_grad():
        logits = fm.heads(x)  # (N, T)
    for p in fm.parameters():
        p.requires_grad_(False)
    cut = int(len(x) * 0.9)
    perm = np.random.default_rng(seed).permutation(len(x))
    tr, ho = perm[:cut], perm[cut:]

    def loss_on(idx: np.ndarray) -> torch.Tensor:
        xb = x[idx]
        z, x_hat = enc(xb)
        return encoder_loss(xb, x_hat, logits[idx], fm.heads(x_hat), cfg.logit_weight)

    fit(enc, lambda i, rng: loss_on(tr[i]), lambda: loss_on(ho).item(), len(tr), lr=cfg.lr,
        epochs=cfg.epochs, patience=3, batch_size=1024, seed=seed, name="encoder")
    for p in fm.parameters():
        p.requires_grad_(True)
    return enc.eval()


@torch.no_grad()
def teacher_outputs(teacher: Teacher, tables: FeatureTables, rows: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (N, T), pair embeddings z (N, D)) of the frozen snapshot over ``rows``."""
    fm, enc = teacher.fm.eval(), teacher.encoder.eval()
    rows = np.asarray(rows)

    def run(p: np.ndarray) -> torch.Tensor:
        h = fm_shared_layer(fm, tables.batch(rows[p]))  # (B, H)
        prob = torch.sigmoid(fm.heads(h))  # (B, T)
        return torch.cat([prob, enc.encode(h)], dim=1)

    out = predict_in_batches(run, len(rows), 2048)
    t = len(tables.tasks)
    return out[:, :t].astype(np.float64), out[:, t:].astype(np.float32)


@torch.no_grad()
def pair_embeddings_as_of(teacher: Teacher, tables: FeatureTables, features: FeatureConfig,
                          rows: np.ndarray, as_of: np.ndarray) -> np.ndarray:
    """z (len(rows), D) of each row's (user, item, surface) as the snapshot computes it at
    time ``as_of`` (per row): the user's history strictly before ``as_of``, its ages counted
    from ``as_of`` -- what a cache entry written at ``as_of`` holds (the FM worker reads the
    history as of the speculating request). ``as_of`` = the row's request time gives the
    row's own z."""
    import copy

    from solaris.features import history_index

    rows = np.asarray(rows, np.int64)
    as_of = np.asarray(as_of, np.int64)
    if as_of.shape != rows.shape:
        raise ValueError(f"as_of: shape {as_of.shape}, expected {rows.shape} (one per row)")
    view = copy.copy(tables)  # shares every array but the two replaced below
    view.req_ts = tables.req_ts.copy()
    # before the first event the history is empty (and the search keys stay in their group)
    view.req_ts[rows] = np.maximum(as_of, tables.ts.min()) if len(tables.ts) else as_of
    view.hist = history_index(tables.user, tables.ts, tables.history_len,
                              features.history_ties, view.req_ts)
    return teacher_outputs(teacher, view, rows)[1]


def z_at_age(teacher: Teacher, tables: FeatureTables, features: FeatureConfig
             ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``(rows, age_s) -> z``: each row's own pair as a cache entry written ``age_s`` seconds
    before the row's request holds it (``pair_embeddings_as_of``)."""
    def z(rows: np.ndarray, age_s: np.ndarray) -> np.ndarray:
        return pair_embeddings_as_of(teacher, tables, features, rows,
                                     tables.req_ts[rows] - np.asarray(age_s).astype(np.int64))
    return z


def vm_inputs(teacher: Teacher, tables: FeatureTables, features: FeatureConfig
              ) -> tuple[np.ndarray, VMInputs]:
    """The snapshot's probabilities for every row (N, T) and the VM inputs built from its z:
    each row's own pair embedding and its causal aggregate (``aggregate_embeddings``)."""
    probs, z = teacher_outputs(teacher, tables, np.arange(tables.num_rows))
    agg, present = aggregate_embeddings(tables.user, tables.item, tables.ts, z,
                                        features.agg_window_s, features.history_ties,
                                        tables.req_ts)
    return probs, VMInputs(tables, SlotArrays(z, agg, present))


def build_teacher(tables: FeatureTables, fm_rows: np.ndarray, fm_cfg: FMConfig,
                  enc_cfg: EncoderConfig, train: TrainConfig, seed: int,
                  task_mask: tuple[bool, ...] | None = None,
                  progress: Callable[[str, float], None] | None = None) -> Teacher:
    if fm_cfg.weights:  # an already-trained FM: only the encoder (and the VMs) are fitted
        torch.set_num_threads(train.threads)
        fm, res = import_fm(fm_cfg, tables), FitResult(float("nan"), 0, 0)
        device = "cpu"
    else:
        fm, res = train_fm(tables, fm_rows, fm_cfg, train, seed, task_mask, progress)
        device = describe_device(training_device(train.device))
    version = f"{fm_cfg.version}+enc{enc_cfg.width}"
    enc = train_encoder(fm, tables, fm_rows, enc_cfg, seed, version)
    return Teacher(fm=fm, encoder=enc, fm_fit=res, version=version, device=device)
