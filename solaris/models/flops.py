"""Compute per pair, counted with ``torch.utils.flop_counter`` (what "FM >= 20x VM" means).

The counter sees matmul-like ops only: linear layers and attention (torch's table knows the
GPU attention kernels; the CPU kernel is added below). Embedding and EmbeddingBag lookups,
elementwise ops, softmax and layer norms count as 0: the numbers are lower bounds dominated
by the dense layers.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

Tensor = torch.Tensor


def _sdpa_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """Scores (q @ k^T) and weighted sum (att @ v), 2 FLOPs per multiply-add."""
    b, h, s_q, d_qk = q_shape
    s_k, d_v = k_shape[2], v_shape[3]
    return 2 * b * h * s_q * s_k * (d_qk + d_v)


# torch's registry lacks the CPU fused attention kernel that F.scaled_dot_product_attention uses
_EXTRA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}


def count_flops(fn: Callable[[], object]) -> int:
    """Total FLOPs of one call of ``fn`` (no autograd graph is built)."""
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_EXTRA) as counter:
        fn()
    return int(counter.get_total_flops())


def _rows(batch: dict[str, Tensor]) -> int:
    B = int(batch["item"].shape[0])
    if B < 1:
        raise ValueError(f"batch has {B} rows; need at least one to count FLOPs per pair")
    return B


def flops_per_pair(model: torch.nn.Module, batch: dict[str, Tensor]) -> float:
    """FLOPs of one ``model(batch)`` divided by its rows (each row its own request)."""
    return count_flops(lambda: model(batch)) / _rows(batch)


def fm_request_flops(fm: torch.nn.Module, batch: dict[str, Tensor]) -> float:
    """FM FLOPs per request of ``request_part`` (user features + history encoder)."""
    return count_flops(lambda: fm.request_part(batch)) / _rows(batch)


def fm_candidate_flops(fm: torch.nn.Module, batch: dict[str, Tensor]) -> float:
    """FM FLOPs per candidate of ``candidate_part`` plus the task heads, request part excluded."""
    B = _rows(batch)
    with torch.no_grad():
        state = fm.request_part(batch)
    req_index = torch.arange(B, device=batch["item"].device)
    return count_flops(lambda: fm.heads(fm.candidate_part(state, batch, req_index))) / B


def fm_amortised_flops(fm: torch.nn.Module, batch: dict[str, Tensor],
                       candidates_per_request: int) -> float:
    """FM FLOPs per pair when one request part serves ``candidates_per_request`` candidates."""
    if candidates_per_request < 1:
        raise ValueError(f"candidates_per_request={candidates_per_request!r}: must be >= 1")
    return fm_request_flops(fm, batch) / candidates_per_request + fm_candidate_flops(fm, batch)
