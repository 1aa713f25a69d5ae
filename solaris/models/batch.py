"""The VM's input batch, built in one place for every path that runs a vertical model.

Training (``VMInputs.batch``), the serving path (``VMScorer``), the replay's fine-tuning
(through ``VMScorer.batch_rows``) and the schedule's candidate scores all call ``vm_batch``,
so the key names, the dtypes, what an absent slot holds and how the age is scaled are defined
once (``solaris/models/vm.py`` and ``solaris/models/residual.py`` read these keys).

Numpy in, torch out, batch-first; no Ray.
"""

from __future__ import annotations

import numpy as np
import torch

from solaris.cache.query import Slots
from solaris.tiers import Tier

Tensor = torch.Tensor

# key -> dtype of every batch ``vm_batch`` returns, in this order
KEYS: dict[str, type] = {
    "user": np.int64,  # (B,) user id (the out-of-vocabulary row included)
    "item": np.int64,  # (B,) item id
    "surface": np.int64,  # (B,) surface code
    "user_cat": np.int64,  # (B, n_uc) the user's categorical codes
    "user_cont": np.float32,  # (B, n_ud) the user's continuous features (standardised)
    "item_cat": np.int64,  # (B, n_ic) the item's categorical codes
    "item_mh": np.int64,  # (B, n_mh, M) the item's multi-hot codes + 1, 0 = pad
    "item_cont": np.float32,  # (B, n_id) the item's continuous features
    "request_cont": np.float32,  # (B, n_rq) the request-time features (standardised)
    "pair_emb": np.float32,  # (B, d) the pair slot (anything where absent)
    "pair_present": np.float32,  # (B,) 1.0 where the pair slot is present
    "pair_tier": np.int64,  # (B,) ``Tier`` code of the pair slot (NONE where absent)
    "pair_age": np.float32,  # (B,) the pair embedding's age as a share of the read TTL
    "agg_emb": np.float32,  # (B, d) the user slot (anything where absent)
    "agg_present": np.float32,  # (B,) 1.0 where the user slot is present
}
# the keys of the two SOLARIS slots (``slot_batch``)
SLOT_KEYS: dict[str, type] = {k: KEYS[k] for k in ("pair_emb", "pair_present", "pair_tier",
                                                   "pair_age", "agg_emb", "agg_present")}
# the keys a VM alone reads: every key but the slots' (``base_batch``)
BASE_KEYS: dict[str, type] = {k: t for k, t in KEYS.items() if k not in SLOT_KEYS}


def vm_batch(user: np.ndarray, item: np.ndarray, surface: np.ndarray, user_cat: np.ndarray,
             item_cat: np.ndarray, item_cont: np.ndarray, slots: Slots | None = None, *,
             user_cont: np.ndarray, item_mh: np.ndarray, request_cont: np.ndarray,
             dim: int | None = None, read_ttl_s: float | None = None) -> dict[str, Tensor]:
    """The VM's input batch (``KEYS``) for B rows whose ids the model knows.

    ``user_cont``, ``item_mh`` (the side tables' padded multi-hot codes, ``SideTables``) and
    ``request_cont`` are required by name: every path hands the VM every declared feature
    (a table without such columns has width 0).

    ``slots``: the rows' two SOLARIS inputs as looked up, passed as given (an absent slot
    may hold anything, NaN included: the models mask with ``where``); None: both absent --
    zeros of width ``dim`` (required then), presence 0, tier NONE, age 0.
    ``read_ttl_s``: the pair slot's tier as looked up and its age as a share of this TTL
    (what a tier-aware VM reads); None: what a VM trained offline saw, tier PAIR wherever
    the pair slot is present and age 0.
    A tensor may share memory with the array it came from.
    """
    cols = {"user": user, "item": item, "surface": surface, "user_cat": user_cat,
            "user_cont": user_cont, "item_cat": item_cat, "item_mh": item_mh,
            "item_cont": item_cont, "request_cont": request_cont}
    cols.update(_slot_cols(len(user), slots, dim, read_ttl_s))
    return _tensors(cols, KEYS, len(user))


def base_batch(user: np.ndarray, item: np.ndarray, surface: np.ndarray, user_cat: np.ndarray,
               item_cat: np.ndarray, item_cont: np.ndarray, *, user_cont: np.ndarray,
               item_mh: np.ndarray, request_cont: np.ndarray) -> dict[str, Tensor]:
    """The keys of ``vm_batch`` a VM alone reads (``BASE_KEYS``), built the same way, without
    the slots' columns: what a residual VM's base runs on (``VMScorer.base_logits``)."""
    cols = {"user": user, "item": item, "surface": surface, "user_cat": user_cat,
            "user_cont": user_cont, "item_cat": item_cat, "item_mh": item_mh,
            "item_cont": item_cont, "request_cont": request_cont}
    return _tensors(cols, BASE_KEYS, len(user))


def slot_batch(n: int, slots: Slots | None = None, *, dim: int | None = None,
               read_ttl_s: float | None = None) -> dict[str, Tensor]:
    """The slot keys of ``vm_batch`` alone (``SLOT_KEYS``), built the same way: what the
    residual VM's corrections read (``ResidualVM.forward`` given the base's logits)."""
    return _tensors(_slot_cols(n, slots, dim, read_ttl_s), SLOT_KEYS, n)


def _slot_cols(n: int, slots: Slots | None, dim: int | None, read_ttl_s: float | None
               ) -> dict[str, np.ndarray]:
    if slots is None:
        if dim is None:
            raise ValueError("dim=None: the width of the absent slots is needed without slots")
        return dict(pair_emb=np.zeros((n, dim), np.float32), pair_present=np.zeros(n, np.float32),
                    pair_tier=np.full(n, Tier.NONE, np.int64), pair_age=np.zeros(n, np.float32),
                    agg_emb=np.zeros((n, dim), np.float32), agg_present=np.zeros(n, np.float32))
    if read_ttl_s is None:
        tier = np.where(slots.pair_present, Tier.PAIR, Tier.NONE)
        age = np.zeros(len(tier), np.float32)
    else:
        tier = slots.pair_tier
        age = np.asarray(slots.pair_age_s) / float(read_ttl_s)
    return dict(pair_emb=slots.pair_emb, pair_present=slots.pair_present, pair_tier=tier,
                pair_age=age, agg_emb=slots.agg_emb, agg_present=slots.agg_present)


def _tensors(cols: dict[str, np.ndarray], keys: dict[str, type], n: int) -> dict[str, Tensor]:
    out = {}
    for key, dtype in keys.items():
        a = np.ascontiguousarray(cols[key], dtype=dtype)
        if len(a) != n:
            raise ValueError(f"{key}: {len(a)} rows, expected {n} (as user)")
        out[key] = torch.from_numpy(a)
    return out
