"""Boundary checks shared by the store, the ring and enrichment: each names the bad value."""

from __future__ import annotations

import math

import numpy as np

from solaris.errors import RequestError


def check_ids(x: np.ndarray, name: str) -> np.ndarray:
    """A 1-D int64 array of non-negative ids, or RequestError naming ``name`` and the value."""
    if type(x) is np.ndarray and x.dtype == np.int64 and x.ndim == 1:  # the hot path
        if x.size and x.min() < 0:
            raise RequestError(f"{name}: negative id {int(x.min())}")
        return x
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise RequestError(f"{name}: expected a 1-D integer array, got shape {a.shape} "
                           f"dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and a.min() < 0:
        raise RequestError(f"{name}: negative id {int(a.min())}")
    return a


def check_time(now: float) -> float:
    """A finite event time in seconds (never wall time: DESIGN.md, two clocks)."""
    if not isinstance(now, (int, float, np.integer, np.floating)) or not math.isfinite(now):
        raise RequestError(f"now={now!r}: must be a finite event time in seconds")
    return float(now)


def check_version(version: str) -> str:
    """A non-empty FM+encoder version string."""
    if not isinstance(version, str) or not version:
        raise RequestError(f"version={version!r}: must be a non-empty string")
    return version
