"""The FM's input contract as data: every key an FM reads, its dtype, shape, value range,
coding, padding and unit.

The codes are made in three places that must agree: ``solaris/features.py``
(``FeatureTables.batch``, training), ``solaris/history.py`` (``request_inputs``, the FM workers
and the KNN job) and the side tables (``solaris/artifacts.py``). ``INPUTS`` describes them once;
the reference page ``docs/reference/fm-inputs.md`` is rendered from it
(``solaris/reference.py``), a test checks it against real batches of both paths, and the FM
checker (``solaris/models/check.py``) draws its extreme and random inputs from ``Sizes``.

numpy only: no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# the shape symbols the fields use, in words
DIMS: dict[str, str] = {
    "R": "requests in the batch (in training, every pair carries its own request side: R = B)",
    "B": "(request, candidate) pairs in the batch",
    "L": "the FM's `history_len` (every batch holds exactly L events per row, padded)",
    "n_uc": "`len(spec.user_categorical)`",
    "n_ud": "`len(spec.user_continuous)`",
    "n_ic": "`len(spec.item_categorical)`",
    "n_mh": "`len(spec.item_multihot)`",
    "M": "the longest multi-hot list of any item in the item table (at least 1)",
    "n_id": "`len(spec.item_continuous)`",
}

# the largest valid value of a field, by name (what ``Sizes.high`` computes); "-" is a float
# field with no upper bound
HIGHS = ("num_users - 1", "num_surfaces - 1", "user card - 1", "-", "num_items",
         "2^T", "num_surfaces", "item card", "num_items - 1", "item card - 1", "vocab")


@dataclass(frozen=True)
class InputField:
    """One key of the FM's inputs."""

    name: str  # the key in ``req`` or ``cand``
    side: str  # "request" (``REQUEST_KEYS``, R rows) or "candidate" (``CANDIDATE_KEYS``, B rows)
    dtype: str  # numpy / torch dtype name: "int64" or "float32"
    shape: tuple[str, ...]  # symbols of ``DIMS``
    high: str  # the largest valid value, one of ``HIGHS`` (the smallest is 0, or any float)
    coding: str  # what a value means
    padding: str  # what a row or slot without a value holds
    unit: str  # the unit of a number, "code" for an id or a category


INPUTS: tuple[InputField, ...] = (
    InputField("user", "request", "int64", ("R",), "num_users - 1",
               "the user's dense id, `0..num_users-1`, not shifted. Read it only through a "
               "table the FM owns; `user_vectors` must not read it at all",
               "none; a user the FM never saw (an appended or provisional code, "
               "`>= num_users`) reaches the FM only if it declares `reads_unseen_users` "
               "(below)", "code"),
    InputField("surface", "request", "int64", ("R",), "num_surfaces - 1",
               "the request's surface (feed, search, ...), `0..num_surfaces-1`, not shifted: "
               "add 1 to share a table with `hist_surface`", "none", "code"),
    InputField("user_cat", "request", "int64", ("R", "n_uc"), "user card - 1",
               "column j: the user's code of `spec.user_categorical`'s j-th column, "
               "`0..cardinality-1`, not shifted",
               "none; all 0 for a user the FM never saw", "code"),
    InputField("user_cont", "request", "float32", ("R", "n_ud"), "-",
               "column j: `spec.user_continuous`'s j-th column, standardised over the user "
               "table (mean 0, std 1); a missing value is 0, the mean",
               "none; all 0 for a user the FM never saw", "standard deviations"),
    InputField("hist_item", "request", "int64", ("R", "L"), "num_items",
               "the user's past events as of the request, most recent first (ties: the later "
               "arrival first): item id **+ 1**, so `1..num_items` are items `0..num_items-1`. "
               "An event strictly before the request's time only; an item the FM has no row "
               "for is left out and the rest moved up",
               "0 after the last event (`hist_item == 0` marks every padded slot of every "
               "`hist_*` key); a user with no history is all 0", "code"),
    InputField("hist_action", "request", "int64", ("R", "L"), "2^T",
               "**1 + sum_k y_k 2^k** over the FM's `tasks` in order (`y_k` the event's label "
               "of task k, 0 or 1): 1 is an impression with no positive label (or whose "
               "labels have not arrived), `2^T` every task positive (T tasks, at most 15)",
               "0", "code"),
    InputField("hist_surface", "request", "int64", ("R", "L"), "num_surfaces",
               "the event's surface **+ 1**", "0 (also an event whose surface is unknown)",
               "code"),
    InputField("hist_age", "request", "float32", ("R", "L"), "-",
               "**log1p(hours)** from the event to the time the history is read as of (the "
               "request's time), so never negative: 0 is the same instant, 1 about 1.7 "
               "hours, 3.2 a day", "0.0", "log1p of hours"),
    InputField("hist_item_cat", "request", "int64", ("R", "L", "n_ic"), "item card",
               "column j: the event's item's code of `spec.item_categorical`'s j-th column "
               "**+ 1**", "0", "code"),
    InputField("item", "candidate", "int64", ("B",), "num_items - 1",
               "the candidate's item id, `0..num_items-1`, **not shifted**: add 1 to share "
               "a table with `hist_item`", "none (an item the FM has no row for is never "
               "given to it)", "code"),
    InputField("item_cat", "candidate", "int64", ("B", "n_ic"), "item card - 1",
               "column j: the candidate's code of `spec.item_categorical`'s j-th column, "
               "`0..cardinality-1`, **not shifted**: add 1 to share a table with "
               "`hist_item_cat`", "none", "code"),
    InputField("item_mh", "candidate", "int64", ("B", "n_mh", "M"), "vocab",
               "`[b, j, :]`: the candidate's list of `spec.item_multihot`'s j-th column, "
               "each code **+ 1** (`1..vocab`), in the table's order",
               "0 after the list's end; an item with an empty list is all 0", "code"),
    InputField("item_cont", "candidate", "float32", ("B", "n_id"), "-",
               "column j: `spec.item_continuous`'s j-th column, standardised over the item "
               "table (mean 0, std 1); a missing value is 0, the mean", "none",
               "standard deviations"),
)

BY_NAME: dict[str, InputField] = {f.name: f for f in INPUTS}


@dataclass(frozen=True)
class Sizes:
    """The sizes an FM is built with (``api.build_fm``'s arguments): what the shape symbols
    and the value ranges of ``INPUTS`` resolve to."""

    spec: Any  # solaris.data.schema.FeatureSpec
    num_users: int
    num_items: int
    tasks: tuple[str, ...]
    history_len: int
    multihot_width: int = 1  # M: the item table's longest multi-hot list

    def dims(self, rows: int, requests: int | None = None) -> dict[str, int]:
        """Each shape symbol's value for a batch of ``rows`` pairs and ``requests`` requests
        (None: as many as pairs, the training form)."""
        s = self.spec
        return {"R": rows if requests is None else requests, "B": rows, "L": self.history_len,
                "n_uc": len(s.user_categorical), "n_ud": len(s.user_continuous),
                "n_ic": len(s.item_categorical), "n_mh": len(s.item_multihot),
                "M": self.multihot_width, "n_id": len(s.item_continuous)}

    def shape(self, name: str, rows: int, requests: int | None = None) -> tuple[int, ...]:
        dims = self.dims(rows, requests)
        return tuple(dims[d] for d in BY_NAME[name].shape)

    def high(self, name: str) -> np.ndarray | None:
        """The largest valid value of key ``name``, broadcastable to its shape (a column per
        feature), or None for a float key with no upper bound."""
        s, f = self.spec, BY_NAME[name]
        ucard = np.array(list(s.user_categorical.values()), np.int64)
        icard = np.array(list(s.item_categorical.values()), np.int64)
        vocab = np.array(list(s.item_multihot.values()), np.int64)[:, None]  # (n_mh, 1)
        return {"num_users - 1": np.int64(self.num_users - 1),
                "num_surfaces - 1": np.int64(s.num_surfaces - 1),
                "user card - 1": ucard - 1, "-": None,
                "num_items": np.int64(self.num_items), "2^T": np.int64(2 ** len(self.tasks)),
                "num_surfaces": np.int64(s.num_surfaces), "item card": icard,
                "num_items - 1": np.int64(self.num_items - 1), "item card - 1": icard - 1,
                "vocab": vocab}[f.high]


def mismatches(batch: dict[str, Any], sizes: Sizes, rows: int,
               requests: int | None = None) -> list[str]:
    """What in ``batch`` (numpy arrays or tensors, any subset of ``INPUTS``' keys) breaks the
    contract: a dtype, a shape, a value out of range, a padded slot that is not 0. Empty when
    it holds (the contract test and the FM checker call it)."""
    out = []
    for name, value in batch.items():
        f = BY_NAME.get(name)
        if f is None:
            continue
        a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if str(a.dtype) != f.dtype:
            out.append(f"{name}: dtype {a.dtype}, the contract says {f.dtype}")
        want = sizes.shape(name, rows, requests)
        if a.shape != want:
            out.append(f"{name}: shape {a.shape}, the contract says {want} "
                       f"({', '.join(f.shape)})")
            continue
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                out.append(f"{name}: a value is not finite")
            if name == "hist_age" and a.size and a.min() < 0:
                out.append(f"{name}: a negative age")
        elif a.size:
            hi = sizes.high(name)
            if a.min() < 0 or (hi is not None and (a > hi).any()):
                out.append(f"{name}: values {int(a.min())}..{int(a.max())} outside "
                           f"0..{f.high}")
    if "hist_item" in batch:
        pad = np.asarray(batch["hist_item"]) == 0  # (R, L)
        for name in ("hist_action", "hist_surface", "hist_age", "hist_item_cat"):
            if name in batch:
                a = np.asarray(batch[name])
                held = a[pad] if a.ndim == 2 else a[pad].reshape(-1)
                if a.shape[:2] == pad.shape and held.size and (held != 0).any():
                    out.append(f"{name}: a padded slot (hist_item == 0) is not 0")
                real = a[~pad] if a.ndim == 2 else None
                if name == "hist_action" and real is not None and real.size and real.min() < 1:
                    out.append(f"{name}: an event's action is 0 (the padding's code)")
    return out
