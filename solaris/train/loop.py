"""A minimal, deterministic minibatch loop with early stopping on a validation loss."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass
class FitResult:
    best_val_loss: float  # validation loss of the kept (best) weights
    best_epoch: int  # epoch (1-based) whose weights were kept
    epochs_run: int  # epochs actually run before stopping


def seed_everything(seed: int) -> None:
    """Seed torch and numpy's legacy global state (our own code uses explicit Generators)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def fit(model: torch.nn.Module,
        train_step_loss: Callable[[np.ndarray, np.random.Generator], torch.Tensor],
        val_loss: Callable[[], float],
        num_train: int,
        *,
        lr: float,
        epochs: int,
        patience: int,
        batch_size: int,
        seed: int,
        weight_decay: float = 0.0,
        progress: Callable[[str, float], None] | None = None,
        name: str = "model") -> FitResult:
    """Train ``model`` with Adam; keep the weights with the best ``val_loss()``.

    ``train_step_loss(idx, rng)`` returns the loss of the training rows at positions ``idx``
    (positions into the caller's training set, shuffled per epoch by a seeded generator).
    """
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state, best_epoch, bad = float("inf"), None, 0, 0
    epoch = 0
    for epoch in range(1, epochs + 1):
        model.train()
        perm = rng.permutation(num_train)
        for start in range(0, num_train, batch_size):
            idx = perm[start:start + batch_size]
            loss = train_step_loss(idx, rng)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            v = float(val_loss())
        if progress is not None:
            progress(name, v)
        log.debug("%s epoch %d val %.5f", name, epoch, v)
        if v < best - 1e-6:
            best, best_state, best_epoch, bad = v, copy.deepcopy(model.state_dict()), epoch, 0
        else:
            bad += 1
            if bad >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return FitResult(best_val_loss=best, best_epoch=best_epoch, epochs_run=epoch)


@torch.no_grad()
def predict_in_batches(fn: Callable[[np.ndarray], torch.Tensor], n: int,
                       batch_size: int = 4096) -> np.ndarray:
    """Concatenate ``fn(positions)`` over ``0..n-1`` in chunks (eval mode is the caller's)."""
    outs = [fn(np.arange(s, min(s + batch_size, n))).detach().cpu().numpy()
            for s in range(0, n, batch_size)]
    return np.concatenate(outs, axis=0) if outs else np.zeros((0,))
