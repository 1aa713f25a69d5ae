"""Generic loader: any interaction log (Parquet or CSV) mapped onto the SOLARIS schema.

A ``ColumnMapping`` names the user, item, timestamp and label columns of the log and which
columns of the optional user / item tables become features. The column encoders live in
``solaris.data.columns``, shared with the MovieLens loader.

Conventions (besides those of ``solaris.data.schema``):

* Ids are coded in order of appearance, never by their values, so a re-keyed log (other
  raw ids, the same rows) codes the same: the side table's row order where one is given, else
  the log's first appearance in event order (ties by the ``order`` column, then file order).
  Given a deployment's id map (``solaris.ids``), every id it holds keeps its code and the new
  ones are appended in that order. Feature values' codes follow their sorted values.
* A null in a categorical feature gets its own code, the last one; a null in a continuous
  feature becomes 0 after standardising (the mean); a null multi-hot value is an empty list.
* Rows with equal timestamps are ordered by (user, item, surface, labels), i.e. by the
  codes; ``seq`` numbers that order. Rows equal in all of those keep file order.
* A label given as ``(column, threshold)`` is ``value >= threshold``; a label given as a bare
  column must already hold 0/1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from solaris.data.columns import (Source, align_id_types, appearance_vocab, categorical_codes,
                                  check_no_nulls, encode, extend_vocab, first_true,
                                  multihot_array, parse_numeric, raw_ids, sorted_vocab,
                                  standardise)
from solaris.data.schema import (ITEM, RAW_ID, USER, Dataset, FeatureSpec, interaction_schema,
                                 request_schema)
from solaris.data import request_features
from solaris.errors import ConfigError, DataError
from solaris.ids import IdMap

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- the mapping


@dataclass(frozen=True)
class FeatureColumns:
    """Which columns of a user or item table become features."""

    categorical: tuple[str, ...] = ()  # values -> dense codes
    continuous: tuple[str, ...] = ()  # numbers -> standardised float32
    # column -> separator of a delimited string column; None = a list column
    multihot: Mapping[str, str | None] = field(default_factory=dict)
    key: str | None = None  # id column of the table; None = same name as in the interactions
    scaled: tuple[str, ...] = ()  # numbers taken as they are (already scaled) -> float32
    # categorical or multi-hot (list) columns that already hold dense codes 0..n-1: column -> n
    codes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "categorical", tuple(self.categorical))
        object.__setattr__(self, "continuous", tuple(self.continuous))
        object.__setattr__(self, "multihot", dict(self.multihot))
        object.__setattr__(self, "scaled", tuple(self.scaled))
        object.__setattr__(self, "codes", dict(self.codes))
        cols = [*self.categorical, *self.continuous, *self.scaled, *self.multihot]
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            raise ConfigError(f"feature columns={dup!r}: listed under more than one kind")
        if self.key is not None and self.key in cols:
            raise ConfigError(f"key={self.key!r}: the id column cannot also be a feature")
        for c, n in self.codes.items():
            if c not in self.categorical and c not in self.multihot:
                raise ConfigError(f"codes[{c!r}]: only categorical or multi-hot columns "
                                  "can hold codes")
            if self.multihot.get(c) is not None:
                raise ConfigError(f"codes[{c!r}]: a coded multi-hot column must be a list "
                                  "column (no separator)")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"codes[{c!r}]={n!r}: the number of codes must be an "
                                  "integer >= 1")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "FeatureColumns":
        d = dict(d or {})
        known = ("categorical", "codes", "continuous", "key", "multihot", "scaled")
        unknown = set(d) - set(known)
        if unknown:
            raise ConfigError(f"features fields={sorted(unknown)!r}: unknown "
                              f"(known: {', '.join(known)})")
        return cls(categorical=tuple(d.get("categorical") or ()),
                   continuous=tuple(d.get("continuous") or ()),
                   multihot=dict(d.get("multihot") or {}), key=d.get("key"),
                   scaled=tuple(d.get("scaled") or ()), codes=dict(d.get("codes") or {}))


LabelSpec = Mapping[str, "str | tuple[str, float]"] | tuple[str, ...]


@dataclass(frozen=True)
class ColumnMapping:
    """How an interaction log (and its user / item tables) maps onto the SOLARIS schema."""

    user: str  # user id column (strings or integers)
    item: str  # item id column (strings or integers)
    timestamp: str  # event time: numbers (seconds) or an Arrow timestamp / date column
    labels: LabelSpec  # task -> column or (column, threshold); or a list of 0/1 columns (task = column)
    surface: str | None = None  # surface column (categorical); None = one surface
    user_features: FeatureColumns = field(default_factory=FeatureColumns)
    item_features: FeatureColumns = field(default_factory=FeatureColumns)
    # an impression log: one row per (request, candidate); the rows of a request share its
    # user, timestamp and surface and list its candidates in order
    request: str | None = None  # request id column; None = an interaction log
    shown: str | None = None  # 0/1: the candidate was shown (labelled); None = every row
    order: str | None = None  # numbers ordering rows of equal timestamps (e.g. a sequence)
    # numeric columns known when the request is served, one value per request (rows of one
    # request, or of one user and timestamp in an interaction log, share them):
    # standardised, read by the VM (solaris.data.request_features)
    request_features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("user", "item", "timestamp"):
            val = getattr(self, name)
            if not isinstance(val, str) or not val:
                raise ConfigError(f"mapping.{name}={val!r}: must be a column name")
        for name in ("surface", "request", "shown", "order"):
            val = getattr(self, name)
            if val is not None and (not isinstance(val, str) or not val):
                raise ConfigError(f"mapping.{name}={val!r}: must be a column name")
        if self.shown is not None and self.request is None:
            raise ConfigError(f"mapping.shown={self.shown!r}: needs mapping.request (an "
                              "impression log groups its rows into requests)")
        if isinstance(self.labels, (list, tuple)):
            object.__setattr__(self, "labels", tuple(self.labels))
        elif isinstance(self.labels, Mapping):
            object.__setattr__(self, "labels", dict(self.labels))
        else:
            raise ConfigError(f"mapping.labels={self.labels!r}: must be a mapping or a list")
        rules = self.label_rules()  # checks each entry
        if not rules:
            raise ConfigError(f"mapping.labels={self.labels!r}: need at least one task")
        object.__setattr__(self, "request_features", request_features.check_names(
            self.request_features, [task for task, _, _ in rules]))
        if self.user_features.multihot:
            raise ConfigError(f"mapping.user_features.multihot={self.user_features.multihot!r}: "
                              "multi-hot features are supported on items only")

    def label_rules(self) -> tuple[tuple[str, str, float | None], ...]:
        """``(task, column, threshold or None)`` per task, in task order."""
        if isinstance(self.labels, tuple):
            items = [(c, c) for c in self.labels]
        else:
            items = list(self.labels.items())
        rules = []
        for task, rule in items:
            if isinstance(rule, str):
                rules.append((task, rule, None))
            elif isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str) \
                    and isinstance(rule[1], (int, float)) and not isinstance(rule[1], bool):
                rules.append((task, rule[0], float(rule[1])))
            else:
                raise ConfigError(f"mapping.labels[{task!r}]={rule!r}: "
                                  "expected a column or [column, threshold]")
            if not isinstance(task, str) or not task:
                raise ConfigError(f"mapping.labels task={task!r}: must be a non-empty string")
        return tuple(rules)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ColumnMapping":
        """Build from plain YAML-style data, e.g.
        ``{user: uid, item: iid, timestamp: t, labels: {click: clicked, like: [rating, 4]},
        item_features: {categorical: [brand], multihot: {tags: "|"}}}``.
        """
        d = dict(d)
        known = {"user", "item", "timestamp", "labels", "surface", "user_features", "item_features",
                 "request", "shown", "order", "request_features"}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"mapping fields={sorted(unknown)!r}: unknown "
                              f"(known: {', '.join(sorted(known))})")
        missing = {"user", "item", "timestamp", "labels"} - set(d)
        if missing:
            raise ConfigError(f"mapping fields={sorted(missing)!r}: required")
        labels = d["labels"]
        if isinstance(labels, Mapping):
            labels = {k: tuple(v) if isinstance(v, list) else v for k, v in labels.items()}
        return cls(user=d["user"], item=d["item"], timestamp=d["timestamp"], labels=labels,
                   surface=d.get("surface"), request=d.get("request"), shown=d.get("shown"),
                   order=d.get("order"), request_features=d.get("request_features") or (),
                   user_features=FeatureColumns.from_dict(d.get("user_features")),
                   item_features=FeatureColumns.from_dict(d.get("item_features")))


# ----------------------------------------------------------------------------- the loader


def _read_table(path: Path) -> tuple[pa.Table, Source]:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        if suffix in (".parquet", ".pq"):
            return pq.read_table(path), Source(path)
        if suffix in (".csv", ".tsv"):
            opts = pacsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
            return pacsv.read_csv(path, parse_options=opts), Source(path, first_line=2)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from exc
    raise DataError(f"{path}: unsupported file type {suffix!r} (expected .parquet, .csv or .tsv)")


def _column(table: pa.Table, src: Source, name: str) -> pa.Array:
    """One column as a single plain (not dictionary-encoded) array."""
    if name not in table.column_names:
        raise DataError(f"{src.path}: column {name!r} not found (columns: {', '.join(table.column_names)})")
    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.combine_chunks()


def _timestamps(arr: pa.Array, src: Source, column: str) -> np.ndarray:
    """Event time as int64 seconds: numbers are floored, Arrow timestamps / dates converted."""
    check_no_nulls(arr, src, column)
    t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        seconds = pa.timestamp("s", tz=getattr(t, "tz", None))
        return pc.cast(pc.cast(arr, seconds, safe=False), pa.int64()).to_numpy()
    if pa.types.is_integer(t):
        return pc.cast(arr, pa.int64()).to_numpy()
    if pa.types.is_floating(t):
        return np.floor(arr.to_numpy()).astype(np.int64)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return np.floor(parse_numeric(arr, src, column, integer=False)).astype(np.int64)
    raise src.error(column, None, f"timestamps must be numeric or timestamps, not {t}")


def _numbers(arr: pa.Array, src: Source, column: str, *, required: bool) -> np.ndarray:
    """A numeric (or bool) column as float64 with NaN for nulls."""
    if required:
        check_no_nulls(arr, src, column)
    t = arr.type
    if any(is_type(t) for is_type in (pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating,
                                      pa.types.is_null)):
        return pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    raise src.error(column, None, f"expected numbers, found {t}")


def _labels(table: pa.Table, src: Source, mapping: ColumnMapping,
            shown: np.ndarray) -> dict[str, np.ndarray]:
    """Each task's labels (NaN where not ``shown``: there they may be null)."""
    out = {}
    for task, column, threshold in mapping.label_rules():
        v = _numbers(_column(table, src, column), src, column, required=False)
        missing = np.isnan(v) & shown
        if missing.any():
            row = first_true(missing)
            raise src.error(column, row, "label is null" + (" on a shown row" if mapping.shown
                                                            else ""))
        if threshold is None:
            bad = (v != 0.0) & (v != 1.0) & shown
            if bad.any():
                row = first_true(bad)
                raise src.error(column, row, f"label {float(v[row])!r} is not 0/1 (give a threshold to binarise)")
            y = v.astype(np.float32)
        else:
            y = (v >= threshold).astype(np.float32)
        out[task] = np.where(shown, y, np.nan).astype(np.float32)
    return out


def _shown(table: pa.Table, src: Source, mapping: ColumnMapping) -> np.ndarray:
    if mapping.shown is None:
        return np.ones(table.num_rows, bool)
    v = _numbers(_column(table, src, mapping.shown), src, mapping.shown, required=True)
    bad = (v != 0.0) & (v != 1.0)
    if bad.any():
        row = first_true(bad)
        raise src.error(mapping.shown, row, f"shown {float(v[row])!r} is not 0/1")
    return v == 1.0


def _coded(arr: pa.Array, src: Source, column: str, n: int, multihot: bool
           ) -> tuple[pa.Array, int]:
    """A column that already holds dense codes 0..n-1 (a list column when ``multihot``)."""
    if multihot:
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise src.error(column, None, f"coded multi-hot values must be a list column, "
                                          f"found {arr.type}")
        flat = pc.list_flatten(arr)
    else:
        flat = arr
    if not pa.types.is_integer(flat.type):
        raise src.error(column, None, f"codes must be integers, found {flat.type}")
    check_no_nulls(flat, src, column)
    v = flat.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = (v < 0) | (v >= n)
    if bad.any():
        raise src.error(column, None, f"code {int(v[first_true(bad)])} outside 0..{n - 1}")
    if multihot:
        if arr.null_count:
            arr = pc.fill_null(arr, pa.scalar([], arr.type))
        return pc.cast(arr, pa.list_(pa.int64())), n
    return pa.array(v, pa.int64()), n


def _known_ids(known: pa.Array | None, ids: pa.Array, src: Source, column: str
               ) -> pa.Array | None:
    """The id map's side, checked to hold the log's kind of ids."""
    if known is None:
        return None
    if known.type != ids.type:
        raise src.error(column, None, f"the id map holds {known.type} ids, the log {ids.type}: "
                                      "a deployment keeps one kind of id")
    return known


def _side_table(path: str | Path | None, ids: pa.Array, inter_src: Source, id_column: str,
                feats: FeatureColumns, appear: np.ndarray, known: pa.Array | None
                ) -> tuple[pa.Table, np.ndarray, dict, tuple, dict]:
    """Codes for ``ids`` plus the coded side table (or a bare id table when ``path`` is
    None). ``known``: the id map's raw ids of this side (kept, new ids appended); ``appear``:
    the log's rows in event order (the order new ids are met in without a side table)."""
    if path is None:
        if feats.categorical or feats.continuous or feats.scaled or feats.multihot:
            raise DataError(f"{inter_src.path}: features for {id_column!r} are mapped "
                            "but no table was given")
        known = _known_ids(known, ids, inter_src, id_column)
        vocab = extend_vocab(known, ids.take(pa.array(appear)))
        codes = encode(ids, vocab, inter_src, id_column, "its own vocabulary")
        table = pa.table({RAW_ID: vocab})
        return table, codes, {}, (), {}
    table, src = _read_table(Path(path))
    key = feats.key or id_column
    keys = raw_ids(_column(table, src, key), src, key)
    keys, ids = align_id_types(keys, ids)
    if len(sorted_vocab(keys)) != len(keys):
        counts = pc.value_counts(keys)
        dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise src.error(key, None, f"id {dup!r} appears more than once")
    known = _known_ids(known, keys, src, key)
    vocab = extend_vocab(known, keys)  # the table's rows in order after the known ids
    codes = encode(ids, vocab, inter_src, id_column, f"{src.path.name} (column {key!r})")
    # side-table row of each code; a known id the table no longer lists has null features
    order = pc.index_in(vocab, value_set=keys)
    gone = order.is_null().to_numpy(zero_copy_only=False)
    if gone.any():
        log.warning("%s: %d ids of the id map are not in the table; their features are null",
                    src.path, int(gone.sum()))
    rows = pc.fill_null(order, 0).to_numpy()

    def numbers(c: str) -> np.ndarray:
        v = _numbers(_column(table, src, c), src, c, required=False)[rows]
        v[gone] = np.nan
        return v

    cols: dict[str, pa.Array] = {RAW_ID: vocab}
    cat: dict[str, int] = {}
    for c in feats.categorical:
        if c in feats.codes:
            cols[c], cat[c] = _coded(_column(table, src, c).take(order), src, c,
                                     feats.codes[c], multihot=False)
            continue
        values, card = categorical_codes(_column(table, src, c).take(order))
        cols[c] = pa.array(values, pa.int64())
        cat[c] = card
    multi: dict[str, int] = {}
    for c, sep in feats.multihot.items():
        arr = _column(table, src, c).take(order)
        if c in feats.codes:
            cols[c], multi[c] = _coded(arr, src, c, feats.codes[c], multihot=True)
            continue
        if sep is not None:
            if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                raise src.error(c, None, f"a separator {sep!r} was given but the column holds {arr.type}")
            arr = pc.split_pattern(arr, sep)
        elif not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise src.error(c, None, f"expected a list column (or give a separator), found {arr.type}")
        cols[c], multi[c] = multihot_array(arr)
    for c in feats.continuous:
        cols[c] = pa.array(standardise(numbers(c)))
    for c in feats.scaled:
        v = numbers(c)
        cols[c] = pa.array(np.nan_to_num(v, nan=0.0).astype(np.float32))
    return pa.table(cols), codes, cat, (*feats.continuous, *feats.scaled), multi


def load_generic(interactions: str | Path, mapping: ColumnMapping, users: str | Path | None = None,
                 items: str | Path | None = None, ids: IdMap | None = None) -> Dataset:
    """Load an interaction or impression log (``.parquet``/``.csv``/``.tsv``) and optional
    side tables; ``ids``: the deployment's id map, extended (never renumbered) by the new ids.

    An impression log (``mapping.request`` set) has one row per (request, candidate): the
    shown rows become the interactions, and every request its candidate list (in file
    order) with the shown flags and labels (``Dataset.requests``), as the synthetic
    generator's requests are."""
    path = Path(interactions)
    table, src = _read_table(path)
    user_raw = raw_ids(_column(table, src, mapping.user), src, mapping.user)
    item_raw = raw_ids(_column(table, src, mapping.item), src, mapping.item)
    ts = _timestamps(_column(table, src, mapping.timestamp), src, mapping.timestamp)
    shown = _shown(table, src, mapping)
    labels = _labels(table, src, mapping, shown)
    if mapping.surface is None:
        surface, num_surfaces = np.zeros(table.num_rows, dtype=np.int64), 1
    else:
        surf = _column(table, src, mapping.surface)
        check_no_nulls(surf, src, mapping.surface)
        surface, num_surfaces = categorical_codes(surf)
    tie = None
    if mapping.order is not None:
        tie = _numbers(_column(table, src, mapping.order), src, mapping.order, required=True)

    # the rows in event order: ts, then the order column if given, then file order
    appear = np.lexsort([np.arange(table.num_rows),
                         *([] if tie is None else [tie]), ts])
    user_tab, ucodes, ucat, ucont, _ = _side_table(
        users, user_raw, src, mapping.user, mapping.user_features, appear,
        None if ids is None else ids.users.raw)
    item_tab, icodes, icat, icont, imulti = _side_table(
        items, item_raw, src, mapping.item, mapping.item_features, appear,
        None if ids is None else ids.items.raw)
    tasks = tuple(labels)
    rows = np.flatnonzero(shown)  # the interactions: shown rows
    n = len(rows)
    # last key sorts first: ts, then the order column if given, else user, item, surface,
    # labels; then file order
    if tie is not None:
        keys = [tie[rows]]
    else:
        keys = [*(labels[t][rows] for t in reversed(tasks)), surface[rows], icodes[rows],
                ucodes[rows]]
    order = rows[np.lexsort([np.arange(n), *keys, ts[rows]])]
    inter = pa.table({
        "seq": np.arange(n, dtype=np.int64), USER: ucodes[order], ITEM: icodes[order], "ts": ts[order],
        "surface": surface[order].astype(np.int32), **{t: labels[t][order] for t in tasks},
    }, schema=interaction_schema(tasks))
    rq, rq_mean, rq_std = _request_features(table, src, mapping, ucodes, ts)
    inter = request_features.with_columns(inter, {c: v[order] for c, v in rq.items()})
    requests = None
    if mapping.request is not None:
        requests = _requests(table, src, mapping, ucodes, icodes, ts, surface, shown, labels,
                             appear, rq)
    user_tab = pa.table({USER: np.arange(user_tab.num_rows, dtype=np.int64),
                         **{c: user_tab.column(c) for c in user_tab.column_names}})
    item_tab = pa.table({ITEM: np.arange(item_tab.num_rows, dtype=np.int64),
                         **{c: item_tab.column(c) for c in item_tab.column_names}})
    spec = FeatureSpec(user_categorical=ucat, user_continuous=ucont, item_categorical=icat,
                       item_multihot=imulti, item_continuous=icont, num_surfaces=num_surfaces,
                       request_continuous=tuple(rq), request_mean=rq_mean, request_std=rq_std)
    ds = Dataset(name=path.stem, interactions=inter, users=user_tab, items=item_tab, tasks=tasks,
                 spec=spec, requests=requests)
    ds.validate()
    log.info("loaded %s: %d interactions, %d users, %d items, tasks %s%s",
             path, n, ds.num_users, ds.num_items, tasks,
             "" if requests is None else f", {requests.num_rows} requests")
    return ds


def _requests(table: pa.Table, src: Source, mapping: ColumnMapping, ucodes: np.ndarray,
              icodes: np.ndarray, ts: np.ndarray, surface: np.ndarray, shown: np.ndarray,
              labels: dict[str, np.ndarray], appear: np.ndarray,
              features: dict[str, np.ndarray]) -> pa.Table:
    """The impression log's requests (``request_schema``): ids coded in order of first
    appearance in event order (``appear``), requests in (ts, id) order; candidates in file
    order; then a column per request feature (``features``: name -> (N,) by log row)."""
    col = mapping.request
    rid = raw_ids(_column(table, src, col), src, col)
    codes = encode(rid, appearance_vocab(rid.take(pa.array(appear))), src, col,
                   "its own vocabulary")
    by = np.lexsort((np.arange(len(codes)), codes))  # by request, then file order
    c = codes[by]
    starts = np.r_[0, np.flatnonzero(np.diff(c)) + 1]
    ends = np.r_[starts[1:], len(c)]
    for name, v in ((mapping.user, ucodes), (mapping.timestamp, ts),
                    (mapping.surface or "surface", surface)):
        first = np.repeat(v[by][starts], ends - starts)
        bad = v[by] != first
        if bad.any():
            row = int(by[first_true(bad)])
            raise src.error(name, row, f"request {rid[row].as_py()!r} holds more than one "
                                       f"{name} value")
    item = icodes[by]
    key = np.stack([c, item], 1)
    dup = np.zeros(len(c), bool)
    srt = np.lexsort((item, c))
    dup[srt[1:]] = (key[srt][1:] == key[srt][:-1]).all(1)
    if dup.any():
        row = int(by[first_true(dup)])
        raise src.error(mapping.item, row, f"request {rid[row].as_py()!r} lists the item twice")
    req_ts = ts[by][starts]
    order = np.lexsort((c[starts], req_ts))  # requests in (ts, id) order
    lens = (ends - starts)[order]
    take = np.concatenate([np.arange(starts[j], ends[j]) for j in order]) if len(order) \
        else np.zeros(0, np.int64)
    offsets = pa.array(np.r_[0, np.cumsum(lens)].astype(np.int32))

    def lists(values: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values, typ))

    cols = {"request_id": c[starts][order].astype(np.int64),
            USER: ucodes[by][starts][order].astype(np.int64),
            "ts": req_ts[order].astype(np.int64),
            "surface": surface[by][starts][order].astype(np.int32),
            "candidates": lists(item[take].astype(np.int64), pa.int64()),
            "impressed": lists(shown[by][take], pa.bool_()),
            **{f"label_{t}": lists(labels[t][by][take], pa.float32()) for t in labels}}
    return request_features.with_columns(
        pa.table(cols, schema=request_schema(tuple(labels))),
        {name: v[by][starts][order] for name, v in features.items()})


def _request_features(table: pa.Table, src: Source, mapping: ColumnMapping,
                      ucodes: np.ndarray, ts: np.ndarray
                      ) -> tuple[dict[str, np.ndarray], tuple[float, ...], tuple[float, ...]]:
    """The mapping's request features, each (N,) float32 by log row, standardised over the
    requests, with their raw means and stds (``request_features.standardised``). A request
    is a request id of an impression log, else one user at one timestamp."""
    if not mapping.request_features:
        return {}, (), ()
    if mapping.request is not None:
        rid = raw_ids(_column(table, src, mapping.request), src, mapping.request)
        groups = pc.dictionary_encode(rid).indices.to_numpy(zero_copy_only=False)
    else:
        groups = np.unique(np.stack([ucodes, ts], 1), axis=0, return_inverse=True)[1]
    values = {c: _numbers(_column(table, src, c), src, c, required=False)
              for c in mapping.request_features}
    return request_features.standardised(values, np.ravel(groups), src, mapping.request)


def load_generic_yaml(path: str | Path, ids: IdMap | None = None) -> Dataset:
    """Load a generic log described by a YAML file (or a directory holding ``mapping.yaml``)::

        interactions: log.parquet   # paths relative to the YAML file
        users: users.csv            # optional
        items: items.parquet        # optional
        mapping: {user: uid, item: iid, timestamp: t, labels: {click: clicked}}
    """
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / "mapping.yaml"
    if not path.is_file():
        raise DataError(f"{path}: no such mapping file")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(doc, dict) or "interactions" not in doc or "mapping" not in doc:
        raise DataError(f"{path}: expected a mapping with keys 'interactions' and 'mapping' "
                        "(and optional 'users', 'items')")
    unknown = set(doc) - {"interactions", "users", "items", "mapping"}
    if unknown:
        raise DataError(f"{path}: unknown keys {sorted(unknown)!r}")

    def resolve(key: str) -> Path | None:
        value = doc.get(key)
        return None if value is None else path.parent / Path(value).expanduser()

    return load_generic(resolve("interactions"), ColumnMapping.from_dict(doc["mapping"]),
                        users=resolve("users"), items=resolve("items"), ids=ids)
