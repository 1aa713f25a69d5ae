"""Global-time periods for the temporal teacher protocol (DESIGN.md, honest teacher outputs).

FM period (earliest) -> VM period -> validation -> test (latest). Cuts fall on timestamp
boundaries, so every row of an earlier period is strictly older than every row of a later one:
no timestamp straddles two periods, whatever the tie order.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from solaris.config import SplitConfig
from solaris.data.schema import SURFACE, TS, USER, Dataset
from solaris.errors import DataError

PERIODS = ("fm", "vm", "val", "test")


@dataclass(frozen=True)
class Periods:
    """Row indices (into ``Dataset.interactions``) of each period, and the VM's slice."""

    fm: np.ndarray  # FM training rows (all users and surfaces)
    vm: np.ndarray  # VM training rows with out-of-sample teacher outputs (vertical slice)
    val: np.ndarray  # validation rows (vertical slice)
    test: np.ndarray  # test rows (vertical slice)
    fm_vertical: np.ndarray  # FM-period rows inside the vertical slice (VM rows, slots absent)
    cuts: tuple[int, int, int]  # first timestamp of vm, val, test periods
    ranges: dict[str, tuple[int, int]]  # period -> (first ts, last ts) over its rows

    def as_dict(self) -> dict[str, dict[str, int]]:
        out = {}
        for name in PERIODS:
            rows = getattr(self, name)
            lo, hi = self.ranges[name]
            out[name] = {"rows": int(len(rows)), "ts_min": int(lo), "ts_max": int(hi)}
        return out


def vertical_mask(ds: Dataset, cfg: SplitConfig) -> np.ndarray:
    """Rows inside the VM's vertical slice: one surface and/or a hashed share of users."""
    n = ds.interactions.num_rows
    mask = np.ones(n, dtype=bool)
    if cfg.vm_surface is not None:
        if cfg.vm_surface >= ds.spec.num_surfaces:
            raise DataError(f"split.vm_surface={cfg.vm_surface}: dataset {ds.name!r} has only "
                            f"{ds.spec.num_surfaces} surface(s)")
        mask &= ds.interactions.column(SURFACE).to_numpy() == cfg.vm_surface
    if cfg.vm_user_share < 1.0:
        users = ds.interactions.column(USER).to_numpy()
        uniq = np.unique(users)
        # a stable hash (not Python's salted hash) so the slice is the same in every process
        h = np.array([zlib.crc32(int(u).to_bytes(8, "little")) for u in uniq], dtype=np.uint64)
        keep = uniq[(h % 10_000) < int(cfg.vm_user_share * 10_000)]
        mask &= np.isin(users, keep)
    return mask


def time_split(ds: Dataset, cfg: SplitConfig) -> Periods:
    """Split ``ds`` by global time into the four periods of SplitConfig."""
    ts = ds.interactions.column(TS).to_numpy()
    n = len(ts)
    if n < 20:
        raise DataError(f"{ds.name}: {n} interactions are too few to split into four periods")
    fr = np.cumsum([cfg.fm_frac, cfg.vm_frac, cfg.val_frac])
    # cut at the timestamp found at each row quantile; rows with that timestamp go later
    cuts = [int(ts[min(int(round(f * n)), n - 1)]) for f in fr]
    for i in range(1, 3):
        if cuts[i] <= cuts[i - 1]:
            raise DataError(f"{ds.name}: periods collapse at ts={cuts[i]} (too many equal "
                            f"timestamps); adjust split fractions")
    period = np.searchsorted(np.asarray(cuts), ts, side="right")  # 0 fm, 1 vm, 2 val, 3 test
    vert = vertical_mask(ds, cfg)
    rows = np.arange(n)
    fm = rows[period == 0]
    out = {
        "fm": fm,
        "vm": rows[(period == 1) & vert],
        "val": rows[(period == 2) & vert],
        "test": rows[(period == 3) & vert],
    }
    for name, r in out.items():
        if len(r) == 0:
            raise DataError(f"{ds.name}: period {name!r} is empty after the vertical slice")
    ranges = {k: (int(ts[v].min()), int(ts[v].max())) for k, v in out.items()}
    return Periods(fm=fm, vm=out["vm"], val=out["val"], test=out["test"],
                   fm_vertical=fm[vert[fm]], cuts=(cuts[0], cuts[1], cuts[2]), ranges=ranges)


def warm_mask(ds: Dataset, periods: Periods) -> np.ndarray:
    """For each test row: did its user have any row (any surface) before the test period?"""
    users = ds.interactions.column(USER).to_numpy()
    ts = ds.interactions.column(TS).to_numpy()
    seen = np.unique(users[ts < periods.cuts[2]])
    return np.isin(users[periods.test], seen)
