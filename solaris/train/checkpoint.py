"""Checkpoints: a state dict plus the config that rebuilds the module, loaded with weights_only.

A checkpoint is one ``.pt`` file holding plain data only (tensors, strings, numbers, lists,
dicts), so ``torch.load(..., weights_only=True)`` can read it without running pickled code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from solaris import atomic
from solaris.errors import CheckpointError

FORMAT = 1


def save_checkpoint(path: str | Path, model: torch.nn.Module, kind: str, config: dict[str, Any],
                    **meta: Any) -> Path:
    """Write ``model``'s weights with ``config`` (enough to rebuild it) and plain ``meta``."""
    path = Path(path)
    obj = {"format": FORMAT, "kind": kind, "config": config, "meta": meta,
           "state_dict": model.state_dict()}
    atomic.save(path, lambda f: torch.save(obj, f))  # never half-written under `path`
    return path


def load_checkpoint(path: str | Path, kind: str, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint of ``kind``; raise CheckpointError naming the file on any problem.
    ``mmap``: the tensors are memory-mapped, not read (for a reader of the config only)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # corrupt or foreign file
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a SOLARIS checkpoint of format {FORMAT}")
    if ckpt.get("kind") != kind:
        raise CheckpointError(f"{path}: holds a {ckpt.get('kind')!r} checkpoint, expected {kind!r}")
    return ckpt
