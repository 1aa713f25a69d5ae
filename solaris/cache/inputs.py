"""Boundary checks shared by the store, the ring and enrichment: each names the bad value."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from solaris.errors import RequestError

if TYPE_CHECKING:
    from solaris.cache.query import ShardQuery


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


def check_user(user: int) -> int:
    """One user id: a non-negative integer (not a bool), or RequestError naming the value."""
    if not isinstance(user, (int, np.integer)) or isinstance(user, bool) or user < 0:
        raise RequestError(f"user={user!r}: must be a non-negative integer id")
    return int(user)


def check_time(now: float) -> float:
    """A finite event time in seconds (never wall time: DESIGN.md, two clocks)."""
    if not isinstance(now, (int, float, np.integer, np.floating)) or not math.isfinite(now):
        raise RequestError(f"now={now!r}: must be a finite event time in seconds")
    return float(now)


def check_times(now: float | np.ndarray, n: int) -> np.ndarray:
    """(n,) float64 finite event times: one ``now`` for every row, or one per row."""
    if np.ndim(now) == 0:
        return np.full(n, check_time(now))
    t = np.asarray(now, np.float64)
    if t.shape != (n,) or not np.isfinite(t).all():
        raise RequestError(f"now: expected one finite event time or {n}, got shape "
                           f"{t.shape}")
    return t


def check_version(version: str) -> str:
    """A non-empty FM+encoder version string."""
    if not isinstance(version, str) or not version:
        raise RequestError(f"version={version!r}: must be a non-empty string")
    return version


def check_query(q: "ShardQuery") -> tuple[float, np.ndarray, int, np.ndarray, np.ndarray]:
    """(now, items, user, item_nbrs, nbr_users) of a ShardQuery, checked by name."""
    now = check_time(q.now)
    items = check_ids(q.items, "items")
    nbr_users = check_ids(q.nbr_users, "nbr_users")
    user = q.user
    if not isinstance(user, (int, np.integer)) or isinstance(user, bool) or user < -1:
        raise RequestError(f"user={user!r}: must be a user id, or -1 for none")
    inb = q.item_nbrs
    if type(inb) is not np.ndarray or inb.dtype != np.int64:
        inb = np.asarray(inb)
        if inb.size and inb.dtype.kind not in "iu":
            raise RequestError(f"item_nbrs: expected integers, got dtype {inb.dtype}")
        inb = inb.astype(np.int64)
    if inb.ndim != 2 or (user >= 0 and inb.shape[1] and inb.shape[0] != len(items)):
        raise RequestError(f"item_nbrs: shape {inb.shape}, expected ({len(items)}, ki)")
    if inb.size and inb.min() < -1:
        raise RequestError(f"item_nbrs: id {int(inb.min())} (-1 is the only pad)")
    return now, items, int(user), inb, nbr_users
