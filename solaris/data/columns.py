"""Column encoders shared by every loader, so each codes values the same way.

Feature values' dense codes follow the sorted raw values (numeric order for integers, byte
order for strings); ids are coded in order of appearance (``appearance_vocab``,
``extend_vocab``: what a deployment's id map appends); numeric parsing, standardising and multi-hot building raise DataError naming the
file, the column and the first bad line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from solaris.errors import DataError

_FLOAT_RE = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_INT_RE = r"^[+-]?\d+$"


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


def appearance_vocab(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Distinct non-null values in order of first appearance: code k means ``vocab[k]``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = pc.drop_null(values)
    if not len(values):
        return values
    codes = pc.index_in(values, value_set=pc.unique(values)).to_numpy()
    _, first = np.unique(codes, return_index=True)
    return values.take(pa.array(np.sort(first)))


def extend_vocab(known: pa.Array | None, values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``known`` (kept as it is) followed by the values of ``values`` it lacks, in order of
    first appearance: an append-only vocabulary."""
    new = appearance_vocab(values)
    if known is None or not len(known):
        return new
    if not len(new):
        return known
    fresh = pc.invert(pc.is_in(new, value_set=known))
    return pa.concat_arrays([known, new.filter(fresh)])


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
