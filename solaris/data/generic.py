"""Generic loader: any interaction log (Parquet or CSV) mapped onto the SOLARIS schema.

A ``ColumnMapping`` names the user, item, timestamp and label columns of the log and which
columns of the optional user / item tables become features. The column encoders at the top
(dense codes, numeric parsing, standardising, multi-hot) are shared with the MovieLens loader
so every loader codes values the same way.

Conventions (besides those of ``solaris.data.schema``):

* Dense codes follow the sorted raw values (numeric order for integer ids, byte order for
  strings), so codes do not depend on row order.
* A null in a categorical feature gets its own code, the last one; a null in a continuous
  feature becomes 0 after standardising (the mean); a null multi-hot value is an empty list.
* Rows with equal timestamps are ordered by (user, item, surface, labels), i.e. by the sorted
  raw ids; ``seq`` numbers that order. Rows equal in all of those keep file order.
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

from solaris.data.schema import ITEM, RAW_ID, USER, Dataset, FeatureSpec, interaction_schema
from solaris.errors import ConfigError, DataError

log = logging.getLogger(__name__)

_FLOAT_RE = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_INT_RE = r"^[+-]?\d+$"


# ----------------------------------------------------------------------------- shared encoders


@dataclass(frozen=True)
class Source:
    """A file being decoded, to name it (and the bad line or row) in error messages."""

    path: Path
    first_line: int | None = None  # text files: line number of data row 0; None for Parquet

    def at(self, row: int) -> str:
        return f"row {row}" if self.first_line is None else f"line {row + self.first_line}"

    def error(self, column: str, row: int | None, why: str) -> DataError:
        where = "" if row is None else f", {self.at(row)}"
        return DataError(f"{self.path}: column {column!r}{where}: {why}")


def read_text_table(src: Source, names: list[str], *, delimiter: str, encoding: str = "utf8") -> pa.Table:
    """Read a delimited text file as all-string columns named ``names``.

    Quoting is off (MovieLens titles hold quotes); ``src.first_line - 1`` leading lines are
    skipped. A row with the wrong number of fields raises DataError naming the line and the
    first missing (or an unexpected extra) column.
    """
    assert src.first_line is not None
    bad: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad.append(row)
        return "error"

    try:
        return pacsv.read_csv(
            src.path,
            read_options=pacsv.ReadOptions(skip_rows=src.first_line - 1, column_names=names,
                                           encoding=encoding, use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        if bad:
            row = bad[0]
            line = f"line {row.number}" if row.number is not None else "a row"
            if row.actual_columns < row.expected_columns:
                col = names[row.actual_columns]
                why = f"missing (row has {row.actual_columns} of {row.expected_columns} fields)"
            else:
                col = "<extra>"
                why = f"row has {row.actual_columns} fields, expected {row.expected_columns}"
            raise DataError(f"{src.path}: column {col!r}, {line}: {why}: {row.text[:80]!r}") from exc
        raise DataError(f"{src.path}: cannot read ({exc})") from exc


def parse_numeric(arr: pa.ChunkedArray | pa.Array, src: Source, column: str, *, integer: bool) -> np.ndarray:
    """Decimal strings to ``int64`` (integer) or finite ``float64``; DataError on the first bad one."""
    ok = pc.match_substring_regex(arr, _INT_RE if integer else _FLOAT_RE)
    ok = pc.fill_null(ok, False)
    if not pc.all(ok).as_py():
        row = first_true(np.logical_not(ok.to_numpy(zero_copy_only=False)))
        kind = "an integer" if integer else "a number"
        raise src.error(column, row, f"{arr[row].as_py()!r} is not {kind}")
    out = pc.cast(arr, pa.int64() if integer else pa.float64())
    return out.to_numpy()


def first_true(mask: np.ndarray) -> int:
    """Index of the first True in a boolean mask (which must hold one)."""
    return int(np.flatnonzero(mask)[0])


def sorted_vocab(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Distinct non-null values, sorted: code k means ``vocab[k]``."""
    uniq = pc.unique(values)
    if isinstance(uniq, pa.ChunkedArray):
        uniq = uniq.combine_chunks()
    uniq = pc.drop_null(uniq)
    return uniq.take(pc.sort_indices(uniq))


def encode(values: pa.ChunkedArray | pa.Array, vocab: pa.Array, src: Source, column: str,
           vocab_from: str) -> np.ndarray:
    """``int64`` codes of ``values`` in ``vocab``; DataError naming the first value not in it."""
    codes = pc.index_in(values, value_set=vocab)
    if codes.null_count:
        row = first_true(codes.is_null().to_numpy(zero_copy_only=False))
        raise src.error(column, row, f"{values[row].as_py()!r} is not in {vocab_from}")
    return codes.to_numpy().astype(np.int64)


def categorical_codes(values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, int]:
    """Dense codes of a categorical column and its cardinality; nulls get the last code."""
    vocab = sorted_vocab(values)
    codes = pc.index_in(values, value_set=vocab)
    card = len(vocab)
    if codes.null_count:
        codes = pc.fill_null(codes, card)
        card += 1
    return codes.to_numpy().astype(np.int64), max(card, 1)


def standardise(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the non-NaN values, as ``float32``; NaN becomes 0 (the mean)."""
    x = np.asarray(x, dtype=np.float64)
    known = ~np.isnan(x)
    if not known.any():
        return np.zeros(len(x), dtype=np.float32)
    mean = x[known].mean()
    std = x[known].std()
    z = (x - mean) / (std if std > 0 else 1.0)
    z[~known] = 0.0
    return z.astype(np.float32)


def multihot_array(lists: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, int]:
    """A list column to ``list<int64>`` codes of its sorted vocabulary, and the vocabulary size.

    Within a row codes are sorted and unique; strings are trimmed; null and empty elements drop out.
    """
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    n = len(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    flat = pc.list_flatten(lists)
    if pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type):
        flat = pc.utf8_trim_whitespace(flat)
        keep = pc.fill_null(pc.not_equal(flat, ""), False).to_numpy(zero_copy_only=False)
    else:
        keep = flat.is_valid().to_numpy(zero_copy_only=False)
    flat = flat.filter(pa.array(keep))
    parents = parents[keep]
    vocab = sorted_vocab(flat)
    codes = pc.index_in(flat, value_set=vocab).to_numpy().astype(np.int64)
    order = np.lexsort((codes, parents))  # codes within a row sorted, repeats dropped
    parents, codes = parents[order], codes[order]
    first = np.ones(len(codes), dtype=bool)
    first[1:] = (parents[1:] != parents[:-1]) | (codes[1:] != codes[:-1])
    parents, codes = parents[first], codes[first]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents, minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(codes, pa.int64())), max(len(vocab), 1)


def raw_ids(arr: pa.Array, src: Source, column: str) -> pa.Array:
    """An id column as ``int64`` (integer-valued numbers) or ``string``; DataError on nulls."""
    check_no_nulls(arr, src, column)
    t = arr.type
    if pa.types.is_integer(t):
        return pc.cast(arr, pa.int64())
    if pa.types.is_floating(t):
        v = arr.to_numpy()
        bad = np.isnan(v) | (v != np.floor(v))
        if bad.any():
            row = first_true(bad)
            raise src.error(column, row, f"id {v[row]!r} is not an integer or a string")
        return pa.array(v.astype(np.int64))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.cast(arr, pa.string())
    raise src.error(column, None, f"ids must be integers or strings, not {t}")


def align_id_types(a: pa.Array, b: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Make two id arrays comparable: if one holds strings, both become strings."""
    if a.type == b.type:
        return a, b
    return pc.cast(a, pa.string()), pc.cast(b, pa.string())


def check_no_nulls(arr: pa.Array | pa.ChunkedArray, src: Source, column: str) -> None:
    """DataError naming the first null (or float NaN) in a required column."""
    bad = arr.is_null(nan_is_null=True) if pa.types.is_floating(arr.type) else arr.is_null()
    if pc.any(bad).as_py():
        row = first_true(bad.to_numpy(zero_copy_only=False))
        raise src.error(column, row, "null / NaN in a required column")


# ----------------------------------------------------------------------------- the mapping


@dataclass(frozen=True)
class FeatureColumns:
    """Which columns of a user or item table become features."""

    categorical: tuple[str, ...] = ()  # values -> dense codes
    continuous: tuple[str, ...] = ()  # numbers -> standardised float32
    # column -> separator of a delimited string column; None = a list column
    multihot: Mapping[str, str | None] = field(default_factory=dict)
    key: str | None = None  # id column of the table; None = same name as in the interactions

    def __post_init__(self) -> None:
        object.__setattr__(self, "categorical", tuple(self.categorical))
        object.__setattr__(self, "continuous", tuple(self.continuous))
        object.__setattr__(self, "multihot", dict(self.multihot))
        cols = [*self.categorical, *self.continuous, *self.multihot]
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            raise ConfigError(f"feature columns={dup!r}: listed under more than one kind")
        if self.key is not None and self.key in cols:
            raise ConfigError(f"key={self.key!r}: the id column cannot also be a feature")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "FeatureColumns":
        d = dict(d or {})
        unknown = set(d) - {"categorical", "continuous", "multihot", "key"}
        if unknown:
            raise ConfigError(f"features fields={sorted(unknown)!r}: unknown "
                              "(known: categorical, continuous, multihot, key)")
        return cls(categorical=tuple(d.get("categorical") or ()),
                   continuous=tuple(d.get("continuous") or ()),
                   multihot=dict(d.get("multihot") or {}), key=d.get("key"))


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

    def __post_init__(self) -> None:
        for name in ("user", "item", "timestamp"):
            val = getattr(self, name)
            if not isinstance(val, str) or not val:
                raise ConfigError(f"mapping.{name}={val!r}: must be a column name")
        if isinstance(self.labels, (list, tuple)):
            object.__setattr__(self, "labels", tuple(self.labels))
        elif isinstance(self.labels, Mapping):
            object.__setattr__(self, "labels", dict(self.labels))
        else:
            raise ConfigError(f"mapping.labels={self.labels!r}: must be a mapping or a list")
        rules = self.label_rules()  # checks each entry
        if not rules:
            raise ConfigError(f"mapping.labels={self.labels!r}: need at least one task")
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
        known = {"user", "item", "timestamp", "labels", "surface", "user_features", "item_features"}
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
                   surface=d.get("surface"),
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


def _labels(table: pa.Table, src: Source, mapping: ColumnMapping) -> dict[str, np.ndarray]:
    out = {}
    for task, column, threshold in mapping.label_rules():
        v = _numbers(_column(table, src, column), src, column, required=True)
        if threshold is None:
            bad = (v != 0.0) & (v != 1.0)
            if bad.any():
                row = first_true(bad)
                raise src.error(column, row, f"label {v[row]!r} is not 0/1 (give a threshold to binarise)")
            out[task] = v.astype(np.float32)
        else:
            out[task] = (v >= threshold).astype(np.float32)
    return out


def _side_table(path: str | Path | None, ids: pa.Array, inter_src: Source, id_column: str,
                feats: FeatureColumns) -> tuple[pa.Table, np.ndarray, dict, tuple, dict]:
    """Codes for ``ids`` plus the coded side table (or a bare id table when ``path`` is None)."""
    if path is None:
        if feats.categorical or feats.continuous or feats.multihot:
            raise DataError(f"{inter_src.path}: features for {id_column!r} are mapped "
                            "but no table was given")
        vocab = sorted_vocab(ids)
        codes = encode(ids, vocab, inter_src, id_column, "its own vocabulary")
        table = pa.table({RAW_ID: vocab})
        return table, codes, {}, (), {}
    table, src = _read_table(Path(path))
    key = feats.key or id_column
    keys = raw_ids(_column(table, src, key), src, key)
    keys, ids = align_id_types(keys, ids)
    vocab = sorted_vocab(keys)
    if len(vocab) != len(keys):
        counts = pc.value_counts(keys)
        dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise src.error(key, None, f"id {dup!r} appears more than once")
    codes = encode(ids, vocab, inter_src, id_column, f"{src.path.name} (column {key!r})")
    order = pc.index_in(vocab, value_set=keys).to_numpy()  # side-table row of each code
    cols: dict[str, pa.Array] = {RAW_ID: vocab}
    cat: dict[str, int] = {}
    for c in feats.categorical:
        values, card = categorical_codes(_column(table, src, c).take(order))
        cols[c] = pa.array(values, pa.int64())
        cat[c] = card
    for c in feats.continuous:
        cols[c] = pa.array(standardise(_numbers(_column(table, src, c), src, c, required=False)[order]))
    multi: dict[str, int] = {}
    for c, sep in feats.multihot.items():
        arr = _column(table, src, c).take(order)
        if sep is not None:
            if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                raise src.error(c, None, f"a separator {sep!r} was given but the column holds {arr.type}")
            arr = pc.split_pattern(arr, sep)
        elif not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise src.error(c, None, f"expected a list column (or give a separator), found {arr.type}")
        cols[c], multi[c] = multihot_array(arr)
    return pa.table(cols), codes, cat, tuple(feats.continuous), multi


def load_generic(interactions: str | Path, mapping: ColumnMapping, users: str | Path | None = None,
                 items: str | Path | None = None) -> Dataset:
    """Load an interaction log (``.parquet``/``.csv``/``.tsv``) and optional side tables."""
    path = Path(interactions)
    table, src = _read_table(path)
    user_raw = raw_ids(_column(table, src, mapping.user), src, mapping.user)
    item_raw = raw_ids(_column(table, src, mapping.item), src, mapping.item)
    ts = _timestamps(_column(table, src, mapping.timestamp), src, mapping.timestamp)
    labels = _labels(table, src, mapping)
    if mapping.surface is None:
        surface, num_surfaces = np.zeros(table.num_rows, dtype=np.int64), 1
    else:
        surf = _column(table, src, mapping.surface)
        check_no_nulls(surf, src, mapping.surface)
        surface, num_surfaces = categorical_codes(surf)

    user_tab, ucodes, ucat, ucont, _ = _side_table(users, user_raw, src, mapping.user, mapping.user_features)
    item_tab, icodes, icat, icont, imulti = _side_table(items, item_raw, src, mapping.item,
                                                         mapping.item_features)
    tasks = tuple(labels)
    n = table.num_rows
    # last key sorts first: ts, user, item, surface, labels, then file order
    order = np.lexsort([np.arange(n), *(labels[t] for t in reversed(tasks)), surface, icodes, ucodes, ts])
    inter = pa.table({
        "seq": np.arange(n, dtype=np.int64), USER: ucodes[order], ITEM: icodes[order], "ts": ts[order],
        "surface": surface[order].astype(np.int32), **{t: labels[t][order] for t in tasks},
    }, schema=interaction_schema(tasks))
    user_tab = pa.table({USER: np.arange(user_tab.num_rows, dtype=np.int64),
                         **{c: user_tab.column(c) for c in user_tab.column_names}})
    item_tab = pa.table({ITEM: np.arange(item_tab.num_rows, dtype=np.int64),
                         **{c: item_tab.column(c) for c in item_tab.column_names}})
    spec = FeatureSpec(user_categorical=ucat, user_continuous=ucont, item_categorical=icat,
                       item_multihot=imulti, item_continuous=icont, num_surfaces=num_surfaces)
    ds = Dataset(name=path.stem, interactions=inter, users=user_tab, items=item_tab, tasks=tasks, spec=spec)
    ds.validate()
    log.info("loaded %s: %d interactions, %d users, %d items, tasks %s",
             path, n, ds.num_users, ds.num_items, tasks)
    return ds


def load_generic_yaml(path: str | Path) -> Dataset:
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
                        users=resolve("users"), items=resolve("items"))
