"""A PairStore's parts <-> one Arrow table (``to_table`` / ``from_table``), so a restarted
shard answers exactly as before.

One row per live entry: key, version, written_at, score, read flag and the codec's bytes
verbatim (no re-encoding, so int8 / fp16 entries come back bit-identical). The float64
running sum of each (user, version) rides on the first row of its group (null elsewhere), so
the aggregate after a restore is bit-identical too, not re-added in another order. Counters,
the codec and the latest event time seen live in the schema metadata.

The table goes to Parquet through ``pyarrow.fs`` (``write_snapshot`` / ``read_snapshot``), so
a shard restarted on another node finds it; a write lands whole or not at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from solaris.atomic import filesystem, remove_stale, write_atomic
from solaris.cache.codec import Codec
from solaris.cache.slab import SlotTable
from solaris.cache.sums import UserSums
from solaris.errors import DataError

FORMAT = 1
NAME = re.compile(r"shard-(\d+)-of-(\d+)\.parquet")  # a pair snapshot's file name: shard, count


def to_table(slots: SlotTable, sums: UserSums, version_names: list[str], max_now: float,
             counters: dict[str, int]) -> pa.Table:
    """Every live entry of a store -- its slot table, running sums, version names (by id),
    latest event time and counters -- as an Arrow table (see the module docstring)."""
    codec = slots.codec
    live = slots.live_slots()
    m = slots.meta
    live = live[np.lexsort((m["item"][live], m["user"][live], m["vid"][live]))]
    m = slots.records(live)
    n, d, rb = len(live), codec.dim, codec.row_bytes
    rows = slots.rows.take(live, axis=0)  # (n, row_bytes)
    first = np.ones(n, dtype=bool)  # opens a (user, version) group
    first[1:] = (m["user"][1:] != m["user"][:-1]) | (m["vid"][1:] != m["vid"][:-1])
    g = np.flatnonzero(first)
    r = sums.find(m["user"][g], m["vid"][g])
    assert (r >= 0).all(), "a live entry without a running sum"
    # a list column: d values on each group's first row, null elsewhere (no n x d copy)
    offsets = np.r_[0, np.cumsum(first * d)].astype(np.int64)
    sum_col = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(sums.sums[r].ravel()),
                                            mask=pa.array(~first))
    names = pa.array(version_names, type=pa.string())
    version = pa.DictionaryArray.from_arrays(pa.array(m["vid"].astype(np.int32)), names)
    meta = {"format": FORMAT, "codec": codec.name, "dim": d,
            "max_now": max_now if np.isfinite(max_now) else None, "counters": counters}
    return pa.table({
        "user": pa.array(m["user"]), "item": pa.array(m["item"]), "version": version,
        "written_at": pa.array(m["written"]), "score": pa.array(m["score"]),
        "read": pa.array(m["read"].astype(bool)),
        "row": pa.FixedSizeBinaryArray.from_buffers(pa.binary(rb), n,
                                                    [None, pa.py_buffer(rows)]),
        "user_sum": sum_col,
    }).replace_schema_metadata({"solaris_pair_store": json.dumps(meta)})


@dataclass
class Entries:
    """What ``from_table`` reads back: one row per entry, plus the running sums on each
    (user, version) group's first row, the latest event time and the counters."""

    users: np.ndarray  # (n,) int64
    items: np.ndarray  # (n,) int64
    versions: np.ndarray  # (n,) object: version names
    written: np.ndarray  # (n,) float64
    score: np.ndarray  # (n,) float32
    read: np.ndarray  # (n,) uint8
    rows: np.ndarray  # (n, row_bytes) uint8 codec bytes
    sum_rows: np.ndarray  # (g,) positions opening a group
    sums: np.ndarray  # (g, d) float64 their running sums
    max_now: float | None
    counters: dict[str, int]


def from_table(table: pa.Table, codec: Codec) -> Entries:
    """The entries of ``to_table``'s output, for a store of ``codec``; raises DataError on
    a mismatch."""
    raw = (table.schema.metadata or {}).get(b"solaris_pair_store")
    if raw is None:
        raise DataError("snapshot table: missing 'solaris_pair_store' schema metadata")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise DataError(f"snapshot format={meta.get('format')!r}: expected {FORMAT}")
    for key, want in (("codec", codec.name), ("dim", codec.dim)):
        if meta.get(key) != want:
            raise DataError(f"snapshot {key}={meta.get(key)!r}: this store has {want!r}")
    n, d, rb = table.num_rows, codec.dim, codec.row_bytes

    def col(name: str) -> pa.Array:
        if name not in table.column_names:
            raise DataError(f"snapshot table: missing column {name!r}")
        return table.column(name).combine_chunks()

    version = col("version")
    if pa.types.is_dictionary(version.type):
        version = version.dictionary_decode()
    row_arr = col("row")
    if row_arr.type != pa.binary(rb):
        raise DataError(f"snapshot column 'row' type={row_arr.type}: expected {pa.binary(rb)}")
    rows = np.zeros((n, rb), np.uint8)
    if n:
        rows[:] = np.frombuffer(row_arr.buffers()[1], dtype=np.uint8, count=n * rb,
                                offset=row_arr.offset * rb).reshape(n, rb)
    sums = col("user_sum")
    valid = sums.is_valid().to_numpy(zero_copy_only=False).astype(bool)
    g = np.flatnonzero(valid)
    flat = (sums.filter(pa.array(valid)).flatten().to_numpy().reshape(len(g), d) if len(g)
            else np.zeros((0, d)))
    return Entries(
        users=col("user").to_numpy().astype(np.int64),
        items=col("item").to_numpy().astype(np.int64),
        versions=np.asarray(version.to_pylist(), dtype=object),
        written=col("written_at").to_numpy().astype(np.float64),
        score=col("score").to_numpy().astype(np.float32),
        read=col("read").to_numpy(zero_copy_only=False).astype(np.uint8), rows=rows,
        sum_rows=g, sums=flat,
        max_now=None if meta.get("max_now") is None else float(meta["max_now"]),
        counters={k: int(v) for k, v in meta.get("counters", {}).items()})


# ---- files ---------------------------------------------------------------------------------------
def snapshot_location(uri: str, group_id: str, shard: int, num_shards: int
                      ) -> tuple[pafs.FileSystem, str]:
    """Filesystem and path of one shard's snapshot under ``uri`` (a pyarrow.fs URI or a dir).

    The shard count is part of the name: with another count, users live on other shards
    (a shard of a new count re-splits the old count's set: ``solaris.cache.reshard``).
    """
    fs, root = filesystem(uri)
    name = f"shard-{shard:03d}-of-{num_shards:03d}.parquet"  # NAME matches it
    return fs, f"{root.rstrip('/')}/{group_id}/{name}"


def history_location(pair_path: str) -> str:
    """The history snapshot's path beside a shard's pair snapshot ``pair_path``."""
    stem = pair_path[:-len(".parquet")] if pair_path.endswith(".parquet") else pair_path
    return f"{stem}.history.parquet"


def write_snapshot(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write ``table`` to a temporary file beside ``path``, then move it over ``path``.

    A crash mid-write leaves a stray temporary file, never a half-written snapshot.
    """
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    write_atomic(fs, path, lambda tmp: pq.write_table(table, tmp, filesystem=fs))


def read_snapshot(fs: pafs.FileSystem, path: str) -> pa.Table | None:
    """The snapshot at ``path``, or None when there is none; stray temporaries are removed."""
    remove_stale(fs, path)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    return pq.read_table(path, filesystem=fs)
