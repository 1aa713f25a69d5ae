"""MovieLens (100K-shaped) from RecBole atomic files or from GroupLens' original files.

``load_movielens(dir)`` detects the format: ``<name>.inter/.user/.item`` (RecBole: tab
separated, typed headers such as ``rating:float``) or ``u.data/u.user/u.item`` (GroupLens).
Both decode to the same intermediate columns, so both formats give identical Datasets.

Mapping onto the schema (see ``solaris.data.schema``):

* tasks ``("like", "love")``: like = rating >= 4, love = rating == 5; one surface (0).
* ``user_id`` / ``item_id`` codes follow the sorted raw ids of the ``.user`` / ``.item``
  tables (numeric order when every id is an integer); ``raw_id`` keeps the original id. Users
  and items only present in the side tables still get codes; an interaction whose id is
  absent from its side table is a DataError.
* Row order: by (timestamp, user raw id, item raw id, rating); ``seq`` numbers that order.
  Many of a user's ratings share one timestamp, so the tie-break is what makes order (and
  every time split built on it) independent of file row order.
* Users: categorical ``age_bucket`` (AGE_BUCKETS), ``gender``, ``occupation`` (sorted values
  of the file), ``zip_region`` (first digit of an all-digit zip, else "other"); continuous
  ``age`` (standardised).
* Items: categorical ``release_decade`` (code 0 = unknown, then sorted decades present),
  multi-hot ``genres`` (sorted genre names present; codes within a row sorted), continuous
  ``release_year`` (standardised; unknown -> 0, the mean). The year comes from the release
  year (RecBole) or date (GroupLens); when that is not a year it falls back to a trailing
  "(YYYY)" in the title, else unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from solaris.data.columns import (
    Source,
    categorical_codes,
    encode,
    first_true,
    multihot_array,
    parse_numeric,
    read_text_table,
    sorted_vocab,
    standardise,
)
from solaris.data.schema import ITEM, RAW_ID, USER, Dataset, FeatureSpec, interaction_schema
from solaris.errors import DataError

log = logging.getLogger(__name__)

TASKS = ("like", "love")
# GroupLens u.item genre flag columns, in file order.
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
          "War", "Western")
AGE_BUCKETS = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")
_AGE_EDGES = np.array([18, 25, 35, 45, 50, 56])  # lower bounds of buckets 1..6
ZIP_REGIONS = tuple("0123456789") + ("other",)
UNKNOWN_DECADE = "unknown"

_INTER_COLS = ("user_id", "item_id", "rating", "timestamp")
_USER_COLS = ("user_id", "age", "gender", "occupation", "zip_code")
_GL_ITEM_COLS = ("item_id", "movie_title", "release_date", "video_release_date", "imdb_url", *GENRES)


@dataclass(frozen=True)
class _Raw:
    """Format-independent decoded columns (strings as read, numbers parsed)."""

    name: str
    inter: Source
    users: Source
    items: Source
    inter_user: pa.Array  # string
    inter_item: pa.Array  # string
    rating: np.ndarray  # float64
    ts: np.ndarray  # int64 seconds
    user_id: pa.Array  # string
    age: np.ndarray  # int64
    gender: pa.Array
    occupation: pa.Array
    zip_code: pa.Array
    item_id: pa.Array  # string
    year: np.ndarray  # float64, NaN = unknown
    genres: pa.Array  # list<string>


def load_movielens(path: str | Path) -> Dataset:
    """Load the MovieLens directory ``path`` (RecBole atomic or GroupLens format)."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory")
    inters = sorted(root.glob("*.inter"))
    if len(inters) > 1:
        raise DataError(f"{root}: several .inter files ({', '.join(p.name for p in inters)}); keep one")
    if inters:
        raw = _read_recbole(root, inters[0].stem)
    elif (root / "u.data").is_file():
        raw = _read_grouplens(root)
    else:
        raise DataError(f"{root}: no MovieLens files: expected <name>.inter/.user/.item (RecBole) "
                        "or u.data/u.user/u.item (GroupLens)")
    ds = _assemble(raw)
    ds.validate()
    log.info("loaded %s from %s: %d ratings, %d users, %d items", ds.name, root,
             ds.interactions.num_rows, ds.num_users, ds.num_items)
    return ds


# ----------------------------------------------------------------------------- readers


def _recbole_table(path: Path, required: tuple[str, ...]) -> tuple[pa.Table, Source]:
    """Read a RecBole atomic file; columns are named by the part of the header before ':'."""
    if not path.is_file():
        raise DataError(f"{path}: file missing (RecBole format needs .inter, .user and .item)")
    with open(path, encoding="utf-8-sig") as f:
        header = f.readline().rstrip("\r\n")
    if not header:
        raise DataError(f"{path}: empty file, expected a typed header line")
    names = [h.split(":", 1)[0].strip() for h in header.split("\t")]
    if len(set(names)) != len(names):
        raise DataError(f"{path}: header repeats a column: {header!r}")
    for col in required:
        if col not in names:
            raise DataError(f"{path}: column {col!r} missing from the header (found: {', '.join(names)})")
    src = Source(path, first_line=2)
    return read_text_table(src, names, delimiter="\t"), src


def _read_recbole(root: Path, prefix: str) -> _Raw:
    inter, isrc = _recbole_table(root / f"{prefix}.inter", _INTER_COLS)
    users, usrc = _recbole_table(root / f"{prefix}.user", _USER_COLS)
    items, tsrc = _recbole_table(root / f"{prefix}.item", ("item_id", "release_year"))
    genre_col = next((c for c in ("class", "genre") if c in items.column_names), None)
    if genre_col is None:
        raise DataError(f"{tsrc.path}: column 'class' (or 'genre') missing from the header "
                        f"(found: {', '.join(items.column_names)})")
    year = _years(items.column("release_year"), r"^(?P<y>\d{4})$")
    if "movie_title" in items.column_names:
        year = _year_from_title(year, items.column("movie_title"))
    genres = pc.split_pattern(items.column(genre_col).combine_chunks(), " ")
    return _decode(prefix, (inter, isrc), (users, usrc), (items, tsrc), year, genres)


def _read_grouplens(root: Path) -> _Raw:
    srcs = {}
    tables = {}
    files = (("u.data", _INTER_COLS, "\t", "utf8"), ("u.user", _USER_COLS, "|", "utf8"),
             ("u.item", _GL_ITEM_COLS, "|", "latin-1"))
    for fname, cols, delim, enc in files:
        path = root / fname
        if not path.is_file():
            raise DataError(f"{path}: file missing (GroupLens format needs u.data, u.user and u.item)")
        srcs[fname] = Source(path, first_line=1)
        tables[fname] = read_text_table(srcs[fname], list(cols), delimiter=delim, encoding=enc)
    inter, users, items = tables["u.data"], tables["u.user"], tables["u.item"]
    isrc, usrc, tsrc = srcs["u.data"], srcs["u.user"], srcs["u.item"]

    year = _years(items.column("release_date"), r"(?P<y>\d{4})$")  # e.g. 01-Jan-1995
    year = _year_from_title(year, items.column("movie_title"))
    flags = np.zeros((items.num_rows, len(GENRES)), dtype=bool)
    for j, g in enumerate(GENRES):
        col = items.column(g)
        ok = pc.fill_null(pc.match_substring_regex(col, r"^\s*[01]\s*$"), False).to_numpy(zero_copy_only=False)
        if not ok.all():
            row = first_true(~ok)
            raise tsrc.error(g, row, f"genre flag {col[row].as_py()!r} is not 0 or 1")
        flags[:, j] = pc.equal(pc.utf8_trim_whitespace(col), "1").to_numpy(zero_copy_only=False)
    rows, cols = np.nonzero(flags)  # row-major: grouped by item
    offsets = np.zeros(items.num_rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=items.num_rows), out=offsets[1:])
    names = pa.array(np.array(GENRES, dtype=object)[cols], pa.string())
    genres = pa.ListArray.from_arrays(pa.array(offsets), names)
    return _decode(root.name, (inter, isrc), (users, usrc), (items, tsrc), year, genres)


def _decode(name: str, inter: tuple[pa.Table, Source], users: tuple[pa.Table, Source],
            items: tuple[pa.Table, Source], year: np.ndarray, genres: pa.Array) -> _Raw:
    """The columns both formats share (same names once read), parsed."""
    (itab, isrc), (utab, usrc), (ttab, tsrc) = inter, users, items
    return _Raw(
        name=name, inter=isrc, users=usrc, items=tsrc,
        inter_user=_strings(itab, "user_id"), inter_item=_strings(itab, "item_id"),
        rating=parse_numeric(itab.column("rating"), isrc, "rating", integer=False),
        ts=np.floor(parse_numeric(itab.column("timestamp"), isrc, "timestamp", integer=False)).astype(np.int64),
        user_id=_strings(utab, "user_id"), age=parse_numeric(utab.column("age"), usrc, "age", integer=True),
        gender=_strings(utab, "gender"), occupation=_strings(utab, "occupation"),
        zip_code=_strings(utab, "zip_code"),
        item_id=_strings(ttab, "item_id"), year=year, genres=genres,
    )


def _strings(table: pa.Table, column: str) -> pa.Array:
    return pc.utf8_trim_whitespace(table.column(column).combine_chunks())


def _years(tokens: pa.ChunkedArray, pattern: str) -> np.ndarray:
    """The year captured as group ``y`` of ``pattern`` as float64; NaN where it does not match."""
    found = pc.extract_regex(pc.utf8_trim_whitespace(tokens.combine_chunks()), pattern)
    return pc.cast(pc.struct_field(found, "y"), pa.float64()).to_numpy(zero_copy_only=False)


def _year_from_title(year: np.ndarray, title: pa.ChunkedArray) -> np.ndarray:
    """Fill unknown years from a trailing "(YYYY)" in the title."""
    return np.where(np.isnan(year), _years(title, r"\((?P<y>\d{4})\)$"), year)


# ----------------------------------------------------------------------------- assembly


def _ids(side: pa.Array, inter: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Integer ids when both columns are all integers (numeric order), else strings."""
    def is_int(a: pa.Array) -> bool:
        return bool(pc.all(pc.match_substring_regex(a, r"^[+-]?\d+$"), min_count=0).as_py())

    if is_int(side) and is_int(inter):
        return pc.cast(side, pa.int64()), pc.cast(inter, pa.int64())
    return side, inter


def _codes(side: pa.Array, inter: pa.Array, side_src: Source, inter_src: Source,
           column: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """(sorted raw ids, side-table row of each code, interaction codes)."""
    side, inter = _ids(side, inter)
    vocab = sorted_vocab(side)
    if len(vocab) != len(side):
        seen: set = set()
        for row, v in enumerate(side.to_pylist()):
            if v in seen:
                raise side_src.error(column, row, f"id {v!r} appears more than once")
            seen.add(v)
    rows = pc.index_in(vocab, value_set=side).to_numpy()
    codes = encode(inter, vocab, inter_src, column, f"{side_src.path.name} (column {column!r})")
    return vocab, rows, codes


def _assemble(raw: _Raw) -> Dataset:
    user_vocab, urows, ucodes = _codes(raw.user_id, raw.inter_user, raw.users, raw.inter, "user_id")
    item_vocab, irows, icodes = _codes(raw.item_id, raw.inter_item, raw.items, raw.inter, "item_id")

    order = np.lexsort((raw.rating, icodes, ucodes, raw.ts))
    rating = raw.rating[order]
    n = len(order)
    inter = pa.table({
        "seq": np.arange(n, dtype=np.int64), USER: ucodes[order], ITEM: icodes[order], "ts": raw.ts[order],
        "surface": np.zeros(n, dtype=np.int32),
        "like": (rating >= 4).astype(np.float32), "love": (rating == 5).astype(np.float32),
    }, schema=interaction_schema(TASKS))

    age = raw.age[urows]
    gender, n_gender = categorical_codes(raw.gender.take(urows))
    occupation, n_occ = categorical_codes(raw.occupation.take(urows))
    zips = raw.zip_code.take(urows)
    # region code k = first digit k of an all-digit zip; else "other" (the last code)
    digits = pc.match_substring_regex(zips, r"^[0-9]+$")
    first = pc.utf8_slice_codeunits(zips, 0, 1)
    region = pc.cast(pc.if_else(digits, first, str(ZIP_REGIONS.index("other"))), pa.int64())
    users = pa.table({
        USER: np.arange(len(user_vocab), dtype=np.int64), RAW_ID: user_vocab,
        "age_bucket": np.searchsorted(_AGE_EDGES, age, side="right").astype(np.int64),
        "gender": gender, "occupation": occupation,
        "zip_region": region,
        "age": standardise(age.astype(np.float64)),
    })

    year = raw.year[irows]
    known = ~np.isnan(year)
    decade = np.full(len(year), UNKNOWN_DECADE, dtype=object)
    decade[known] = [f"{int(y) // 10 * 10}s" for y in year[known]]
    decades = sorted({d for d in decade if d != UNKNOWN_DECADE})
    decade_vocab = {d: k for k, d in enumerate([UNKNOWN_DECADE, *decades])}
    genres, n_genres = multihot_array(raw.genres.take(irows))
    items = pa.table({
        ITEM: np.arange(len(item_vocab), dtype=np.int64), RAW_ID: item_vocab,
        "release_decade": np.array([decade_vocab[d] for d in decade], dtype=np.int64),
        "genres": genres,
        "release_year": standardise(year),
    })
    spec = FeatureSpec(
        user_categorical={"age_bucket": len(AGE_BUCKETS), "gender": n_gender, "occupation": n_occ,
                          "zip_region": len(ZIP_REGIONS)},
        user_continuous=("age",),
        item_categorical={"release_decade": len(decade_vocab)},
        item_multihot={"genres": n_genres},
        item_continuous=("release_year",),
        num_surfaces=1,
    )
    return Dataset(name=raw.name, interactions=inter, users=users, items=items, tasks=TASKS, spec=spec)
