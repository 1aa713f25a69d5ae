"""Pair encoder: compresses the FM's last shared layer to the cached pair-embedding width.

The bottleneck is layer-normalised (no affine), so every pair embedding has zero mean and
unit variance across its width: VMs and the aggregated user embedding see one scale whatever
the FM's activations look like. ``width == 0`` is the raw-layer ablation: encode and decode
are the identity and the module has no parameters.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris.config import EncoderConfig

Tensor = torch.Tensor


class PairEncoder(nn.Module):
    """Autoencoder in_dim -> hidden -> width -> hidden -> in_dim."""

    def __init__(self, in_dim: int, cfg: EncoderConfig):
        super().__init__()
        if in_dim < 1:
            raise ValueError(f"in_dim={in_dim!r}: must be >= 1")
        self.cfg = cfg
        self.in_dim = in_dim
        self.version = ""  # FM+encoder version; set by the caller that trains or loads it
        self.width = cfg.width if cfg.width > 0 else in_dim  # width of what encode returns
        if cfg.width == 0:
            self.enc = None
            self.dec = None
            return
        self.enc = nn.Sequential(nn.Linear(in_dim, cfg.hidden), nn.GELU(),
                                 nn.Linear(cfg.hidden, cfg.width),
                                 nn.LayerNorm(cfg.width, elementwise_affine=False))
        self.dec = nn.Sequential(nn.Linear(cfg.width, cfg.hidden), nn.GELU(),
                                 nn.Linear(cfg.hidden, in_dim))

    def encode(self, x: Tensor) -> Tensor:
        if self.enc is None:
            return x  # (B, in_dim)
        return self.enc(x)  # (B, width)

    def decode(self, z: Tensor) -> Tensor:
        if self.dec is None:
            return z  # (B, in_dim)
        return self.dec(z)  # (B, in_dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encode(x)  # (B, width)
        return z, self.decode(z)  # (B, width), (B, in_dim)


def encoder_loss(x: Tensor, x_hat: Tensor, fm_logits: Tensor, fm_logits_hat: Tensor,
                 logit_weight: float) -> Tensor:
    """Reconstruction MSE (relative to the layer's variance) plus logit agreement.

    ``fm_logits`` are the FM heads on ``x``, ``fm_logits_hat`` the same heads on ``x_hat``;
    the second term makes the bottleneck keep what the heads read, not just what has variance.
    Targets are detached: only the encoder learns from this loss.
    """
    x = x.detach()
    var = x.var(unbiased=False).clamp(min=1e-8)  # scalar
    rec = F.mse_loss(x_hat, x) / var
    if logit_weight == 0:
        return rec
    return rec + logit_weight * F.mse_loss(fm_logits_hat, fm_logits.detach())
