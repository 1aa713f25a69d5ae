"""Row-wise models evaluated in fixed-size blocks, so a row's output does not depend on which
other rows share its batch.

A CPU matrix product picks its kernels and blocking by the number of rows, so the same row
can come out a few ulps apart in a batch of 37 and in one of 512. Where batches are made by
timing -- the FM worker's leases, a VM replica's ``@serve.batch`` -- that makes two runs of
the same replay differ in the last bits of some embeddings and scores. ``blockwise`` runs a
function of row-wise models (no operation across rows) on blocks of exactly ``block`` rows,
the last one padded with copies of its first row, and keeps the real rows: every call the
model sees has the same shape, and a row's result is the same wherever it sits.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
from torch import Tensor

Out = TypeVar("Out", Tensor, tuple, dict)


def _rows(out: Out, n: int) -> Out:
    if isinstance(out, Tensor):
        return out[:n]
    if isinstance(out, tuple):
        return tuple(o[:n] for o in out)
    return {k: v[:n] for k, v in out.items()}


def _cat(parts: list) -> Out:
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, tuple):
        return tuple(torch.cat([p[j] for p in parts]) for j in range(len(first)))
    return {k: torch.cat([p[k] for p in parts]) for k in first}


def blockwise(fn: Callable[[dict[str, Tensor]], Out], batch: dict[str, Tensor], block: int
              ) -> Out:
    """``fn(batch)`` computed on blocks of ``block`` rows (every tensor of ``batch`` has the
    rows first; ``fn`` returns a tensor, a tuple or a dict of tensors with the rows first).
    ``block`` <= 0: one call on the whole batch, as given."""
    first = next(iter(batch.values()))
    n = first.shape[0]
    if block <= 0 or n == 0:
        return fn(batch)
    parts = []
    for start in range(0, n, block):
        real = min(block, n - start)
        if real == block:  # a full block: views, no copy
            parts.append(fn({k: v[start:start + block] for k, v in batch.items()}))
            continue
        # the last block, padded with its first row (any valid row would do)
        idx = torch.arange(start, n, device=first.device)
        idx = torch.cat([idx, idx[:1].expand(block - real)])
        parts.append(_rows(fn({k: v.index_select(0, idx) for k, v in batch.items()}), real))
    return _cat(parts)
