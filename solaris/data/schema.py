"""Arrow schemas and the in-memory dataset container every loader returns.

Conventions shared by all loaders (synthetic, MovieLens, generic):

* ``user_id`` and ``item_id`` are dense ``int64`` codes ``0..n-1``; the loader keeps the
  original ids in the ``raw_id`` column of the user/item tables.
* ``ts`` is event time in integer seconds.
* Task labels are ``float32`` columns (0.0 / 1.0) named after the task; the main task is
  ``tasks[0]``.
* The interaction table is sorted by ``(ts, seq)``; ``seq`` is a unique, deterministic
  tie-breaker so equal timestamps always order the same way.
* Categorical feature columns hold dense ``int64`` codes ``0..card-1``; multi-hot columns hold
  ``list<int64>`` codes ``0..vocab-1``; continuous columns are standardised ``float32``.
* Request-time features (``FeatureSpec.request_continuous``) are standardised ``float32``
  columns of the interaction table (and of the request table, where there is one), named as
  declared; every row of one request holds the same values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from solaris.errors import DataError

USER = "user_id"
ITEM = "item_id"
TS = "ts"
SEQ = "seq"
SURFACE = "surface"
RAW_ID = "raw_id"


def interaction_schema(tasks: tuple[str, ...]) -> pa.Schema:
    """Schema of the labelled interaction log (one row per impressed, labelled pair)."""
    fields = [
        pa.field(SEQ, pa.int64(), nullable=False),
        pa.field(USER, pa.int64(), nullable=False),
        pa.field(ITEM, pa.int64(), nullable=False),
        pa.field(TS, pa.int64(), nullable=False),
        pa.field(SURFACE, pa.int32(), nullable=False),
    ]
    fields += [pa.field(t, pa.float32(), nullable=False) for t in tasks]
    return pa.schema(fields)


def request_schema(tasks: tuple[str, ...]) -> pa.Schema:
    """Schema of the request log: one row per request with its candidate list.

    ``impressed`` is aligned with ``candidates``; ``label_<task>`` lists are aligned with
    ``candidates`` too and hold NaN for candidates that were not impressed.
    """
    fields = [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field(USER, pa.int64(), nullable=False),
        pa.field(TS, pa.int64(), nullable=False),
        pa.field(SURFACE, pa.int32(), nullable=False),
        pa.field("candidates", pa.list_(pa.int64()), nullable=False),
        pa.field("impressed", pa.list_(pa.bool_()), nullable=False),
    ]
    fields += [pa.field(f"label_{t}", pa.list_(pa.float32()), nullable=False) for t in tasks]
    return pa.schema(fields)


@dataclass(frozen=True)
class FeatureSpec:
    """Which side-feature columns exist and their sizes (what models size their tables by)."""

    # the user table's categorical columns, in order: column -> cardinality (codes
    # 0..cardinality-1)
    user_categorical: dict[str, int] = field(default_factory=dict)
    user_continuous: tuple[str, ...] = ()  # the user table's continuous columns, in order
    # the item table's categorical columns, in order: column -> cardinality (codes
    # 0..cardinality-1)
    item_categorical: dict[str, int] = field(default_factory=dict)
    # the item table's multi-hot (list) columns, in order: column -> vocabulary size (codes
    # 0..size-1)
    item_multihot: dict[str, int] = field(default_factory=dict)
    item_continuous: tuple[str, ...] = ()  # the item table's continuous columns, in order
    num_surfaces: int = 1  # surfaces a request comes from (codes 0..num_surfaces-1)
    # request-time features: numeric columns of the log, one value per request, standardised
    # float32 columns of the interaction (and request) table; the raw value's training mean
    # and std, per column, standardise a served request's value the same way
    request_continuous: tuple[str, ...] = ()
    request_mean: tuple[float, ...] = ()  # each request feature's training mean, raw
    request_std: tuple[float, ...] = ()  # each request feature's training std, raw (> 0)

    def __post_init__(self) -> None:
        for name in ("user_continuous", "item_continuous", "request_continuous",
                     "request_mean", "request_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        n = len(self.request_continuous)
        if len(self.request_mean) != n or len(self.request_std) != n:
            raise ValueError(f"request_mean={self.request_mean!r}, request_std="
                             f"{self.request_std!r}: need one value per request feature "
                             f"({list(self.request_continuous)!r})")
        if any(not s > 0 for s in self.request_std):
            raise ValueError(f"request_std={self.request_std!r}: must be > 0")

    def to_dict(self) -> dict:
        return {
            "user_categorical": dict(self.user_categorical),
            "user_continuous": list(self.user_continuous),
            "item_categorical": dict(self.item_categorical),
            "item_multihot": dict(self.item_multihot),
            "item_continuous": list(self.item_continuous),
            "num_surfaces": self.num_surfaces,
            "request_continuous": list(self.request_continuous),
            "request_mean": list(self.request_mean),
            "request_std": list(self.request_std),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpec":
        """The spec ``to_dict`` wrote; one written before request-time features existed
        has none."""
        return cls(
            user_categorical=dict(d["user_categorical"]),
            user_continuous=tuple(d["user_continuous"]),
            item_categorical=dict(d["item_categorical"]),
            item_multihot=dict(d["item_multihot"]),
            item_continuous=tuple(d["item_continuous"]),
            num_surfaces=int(d["num_surfaces"]),
            request_continuous=tuple(d.get("request_continuous", ())),
            request_mean=tuple(float(v) for v in d.get("request_mean", ())),
            request_std=tuple(float(v) for v in d.get("request_std", ())),
        )


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset: interactions plus side features, ready for splitting."""

    name: str
    interactions: pa.Table  # interaction_schema(tasks), sorted by (ts, seq)
    users: pa.Table  # user_id, raw_id, spec.user_categorical..., spec.user_continuous...
    items: pa.Table  # item_id, raw_id, item categorical / multi-hot / continuous columns
    tasks: tuple[str, ...]
    spec: FeatureSpec
    requests: pa.Table | None = None  # request_schema(tasks), where the source has one

    @property
    def num_users(self) -> int:
        return self.users.num_rows

    @property
    def num_items(self) -> int:
        return self.items.num_rows

    def validate(self) -> None:
        """Check the conventions above; raise DataError naming the offending column."""
        inter = self.interactions
        for col in (SEQ, USER, ITEM, TS, SURFACE, *self.tasks):
            if col not in inter.column_names:
                raise DataError(f"{self.name}: interactions lack column {col!r}")
        users = inter.column(USER).to_numpy()
        items = inter.column(ITEM).to_numpy()
        if len(users) and (users.min() < 0 or users.max() >= self.num_users):
            raise DataError(f"{self.name}: column {USER!r} holds codes outside 0..{self.num_users - 1}")
        if len(items) and (items.min() < 0 or items.max() >= self.num_items):
            raise DataError(f"{self.name}: column {ITEM!r} holds codes outside 0..{self.num_items - 1}")
        ts = inter.column(TS).to_numpy()
        seq = inter.column(SEQ).to_numpy()
        if len(ts) > 1:
            order_ok = (np.diff(ts) > 0) | ((np.diff(ts) == 0) & (np.diff(seq) > 0))
            if not bool(order_ok.all()):
                raise DataError(f"{self.name}: interactions are not sorted by ({TS!r}, {SEQ!r})")
        for t in self.tasks:
            y = inter.column(t).to_numpy(zero_copy_only=False)
            if not np.isin(y, (0.0, 1.0)).all():
                raise DataError(f"{self.name}: label column {t!r} holds values other than 0/1")
        surf = inter.column(SURFACE).to_numpy()
        if len(surf) and (surf.min() < 0 or surf.max() >= self.spec.num_surfaces):
            raise DataError(f"{self.name}: column {SURFACE!r} outside 0..{self.spec.num_surfaces - 1}")
