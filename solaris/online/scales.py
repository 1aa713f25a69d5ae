"""The residual VMs' scales per slot and tier: what the router looks up and the VMs apply.

Each residual VM ships the scale of each of its corrections (pair slot by tier, user slot)
chosen on validation (``vm_<task>.pt``, the manifest). The router holds the live table: an
operator changes a tier's scale at runtime (``POST /scales``) without a redeploy; every
score request carries its VM's row of the table, and a tier whose scale is 0 in every VM of
a version is not looked up at all (``enrich_for``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from solaris.config import EnrichConfig
from solaris.errors import RequestError
from solaris.tiers import LABELS, NUM_TIERS, Tier

PAIR, AGG = 0, 1  # rows of a scale array (2, 4): pair slot by tier; user slot at column 1
AGG_COL = 1
PAIR_TIERS = LABELS[Tier.PAIR:]  # the tiers with a scale: pair, user_neighbour, item_neighbour


def scale_array(scales: dict[str, Any] | None) -> np.ndarray:
    """(2, 4) float32 from a manifest's ``scales`` ({"pair": {tier: s}, "aggregate": s});
    None (a jointly trained VM of older artifacts): every tier on, as it was served."""
    out = np.zeros((2, NUM_TIERS), np.float32)
    if scales is None:
        out[PAIR, Tier.PAIR:] = 1.0
        out[AGG, AGG_COL] = 1.0
        return out
    for name, s in scales.get("pair", {}).items():
        out[PAIR, Tier.from_label(name)] = float(s)
    out[AGG, AGG_COL] = float(scales.get("aggregate", 0.0))
    return out


def scale_dict(a: np.ndarray) -> dict[str, Any]:
    return {"pair": {t: float(a[PAIR, Tier.from_label(t)]) for t in PAIR_TIERS},
            "aggregate": float(a[AGG, AGG_COL])}


class ScaleError(RequestError):
    """A bad scale change; ``field`` names the request field it is about."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class ScaleTable:
    """Live scales per (version, task); ``residual`` says whether a VM applies them."""

    def __init__(self, manifests: dict[str, dict]):
        self._a: dict[tuple[str, str], np.ndarray] = {}
        self.residual: dict[tuple[str, str], bool] = {}
        self.curves: dict[tuple[str, str], dict] = {}
        self.affine: dict[tuple[str, str], dict] = {}  # tier -> [alpha, beta] (not identity)
        # enrich_for's answers per version, for the base config they were built from;
        # dropped on every change of a scale
        self._enrich: dict[str, tuple[EnrichConfig, EnrichConfig]] = {}
        for version, m in manifests.items():
            for task, vm in m.get("vms", {}).items():
                self._a[(version, task)] = scale_array(vm.get("scales"))
                self.residual[(version, task)] = "scales" in vm
                self.curves[(version, task)] = vm.get("scale_curves", {})
                self.affine[(version, task)] = vm.get("present_affine", {})

    def array(self, version: str, task: str) -> np.ndarray:
        return self._a[(version, task)].copy()

    def set(self, version: str, task: str, slot: str, tier: str | None, value: float
            ) -> dict[str, Any]:
        """Set one scale; ``ScaleError`` naming the field on a bad value. Returns the VM's
        row."""
        if (version, task) not in self._a:
            raise ScaleError("version", f"task={task!r}, version={version!r}: no such VM")
        if not self.residual[(version, task)]:
            raise ScaleError("version", f"task={task!r}, version={version!r}: not a residual "
                             "VM (its artifacts predate scales); retrain it to use them")
        if not (isinstance(value, (int, float)) and np.isfinite(value) and 0.0 <= value <= 1.0):
            raise ScaleError("scale", f"scale={value!r}: must be in [0, 1]")
        a = self._a[(version, task)]
        self._enrich.clear()
        if slot == "aggregate":
            a[AGG, AGG_COL] = value
        elif slot == "pair":
            if tier not in PAIR_TIERS:
                raise ScaleError("tier", f"tier={tier!r}: one of {', '.join(PAIR_TIERS)}")
            a[PAIR, Tier.from_label(tier)] = value
        else:
            raise ScaleError("slot", f"slot={slot!r}: one of pair, aggregate")
        return scale_dict(a)

    def enrich_for(self, version: str, base: EnrichConfig) -> EnrichConfig:
        """``base`` with the tiers switched off that no VM of ``version`` uses (scale 0);
        kept until a scale changes (the request path asks it once per request)."""
        hit = self._enrich.get(version)
        if hit is not None and hit[0] is base:
            return hit[1]
        rows = [a for (v, _), a in self._a.items() if v == version]
        out = base
        if rows:
            top = np.max(np.stack(rows), axis=0)  # (2, 4)
            out = dataclasses.replace(
                base,
                user_knn_probe=base.user_knn_probe if top[PAIR, Tier.USER_NEIGHBOUR] > 0 else 0,
                item_tier=base.item_tier and bool(top[PAIR, Tier.ITEM_NEIGHBOUR] > 0),
                aggregate=base.aggregate and bool(top[AGG, AGG_COL] > 0))
        self._enrich[version] = (base, out)
        return out

    def state(self) -> dict[str, Any]:
        return {f"{v}/{t}": {"scales": scale_dict(a), "residual": self.residual[(v, t)],
                             "validation": self.curves[(v, t)],
                             "present_affine": self.affine[(v, t)]}
                for (v, t), a in self._a.items()}
