"""A shard count change: a shard of a new count restores its users from the snapshots a
group of another count wrote.

A shard's snapshots are named for its group's shard count (``snapshot_location``), because
with another count the ring (``solaris.cache.ring``) puts users on other shards. When a shard
of an N-shard group starts, ``plan`` picks what it restores:

- its own snapshots (pairs, history), unless a complete set written for another count M is
  newer than them -- complete: each of the M shards left a snapshot; newer: its newest file
  was written after this shard's own newest file (a group of M ran since, e.g. after a
  rollback from N to M and forward again);
- else the newest such complete set (by write time), re-split: ``split_pairs`` and
  ``split_history`` keep the rows of the M snapshots whose user the N-shard ring assigns to
  this shard. Every old row lands in exactly one new shard, unchanged (codec bytes, running
  sums, event rows, their arrival numbers).

The old files stay where they are: a group of M started again finds the N set newer than
its own files and re-splits that one, so nothing written under N is lost by a rollback.

Counters (the stores' own metrics) start at zero on a re-split; the latest event time seen
is the latest of the M snapshots. No Ray here: ``actors.shard`` calls ``plan`` and the two
splits, and a unit test checks them against a brute-force placement on seeded data.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from solaris.cache.ring import HashRing
from solaris.cache.snapshot import FORMAT
from solaris.errors import DataError

log = logging.getLogger(__name__)

# a shard's snapshot file names (snapshot_location, history_location): shard, count, history?
_FILE = re.compile(r"shard-(\d+)-of-(\d+)(\.history)?\.parquet")
_PAIR_META = b"solaris_pair_store"  # solaris.cache.snapshot.to_table's schema metadata
_HISTORY_META = b"solaris.history"  # solaris.history.HistoryStore.snapshot's


@dataclass(frozen=True)
class SnapshotSet:
    """The snapshots a group of ``num_shards`` shards left in one folder."""

    num_shards: int
    pairs: tuple[str | None, ...]  # (num_shards,) each shard's pair snapshot path, None: none
    history: tuple[str | None, ...]  # (num_shards,) each shard's history snapshot path
    # (num_shards,) each shard's newest file's modification time (ns since the epoch; 0:
    # unknown or no file)
    written: tuple[int, ...]

    @property
    def written_ns(self) -> int:
        """The set's newest file's modification time."""
        return max(self.written)

    @property
    def complete(self) -> bool:
        """Every shard of the set left a snapshot (pairs or history)."""
        return all(p is not None or h is not None for p, h in zip(self.pairs, self.history))


def snapshot_sets(folder: str, files: Iterable[tuple[str, int | None]]) -> list[SnapshotSet]:
    """The sets among ``files`` (base name, modification time in ns or None) of ``folder``,
    one per shard count, in order of count. Names other than a shard snapshot's are ignored
    (temporaries, other files)."""
    found: dict[int, dict] = {}
    for name, mtime_ns in files:
        m = _FILE.fullmatch(name)
        if m is None:
            continue
        shard, count = int(m.group(1)), int(m.group(2))
        if count < 1 or shard >= count:
            continue
        s = found.setdefault(count, {"pairs": [None] * count, "history": [None] * count,
                                     "written": [0] * count})
        s["history" if m.group(3) else "pairs"][shard] = f"{folder}/{name}"
        s["written"][shard] = max(s["written"][shard], mtime_ns or 0)
    return [SnapshotSet(c, tuple(s["pairs"]), tuple(s["history"]), tuple(s["written"]))
            for c, s in sorted(found.items())]


def choose(sets: list[SnapshotSet], shard: int, num_shards: int) -> SnapshotSet | None:
    """The set shard ``shard`` of ``num_shards`` restores from when it is not its own: the
    newest complete set of another count written after this shard's own newest snapshot
    (any, when it has none); None: restore its own snapshots (or start empty)."""
    own = next((s for s in sets if s.num_shards == num_shards), None)
    own_ns = None
    if own is not None and (own.pairs[shard] is not None or own.history[shard] is not None):
        own_ns = own.written[shard]
    others = [s for s in sets if s.num_shards != num_shards and s.complete
              and (own_ns is None or s.written_ns > own_ns)]
    return max(others, key=lambda s: (s.written_ns, s.num_shards), default=None)


def plan(fs: pafs.FileSystem, pair_path: str, shard: int, num_shards: int
         ) -> SnapshotSet | None:
    """``choose`` over the folder of ``pair_path`` (shard ``shard``'s own pair snapshot),
    logged: the set to re-split, or None to restore the shard's own snapshots."""
    folder = pair_path.rsplit("/", 1)[0]
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except OSError:
        log.exception("shard %d of %d: could not list %s; restoring its own snapshots",
                      shard, num_shards, folder)
        return None
    sets = snapshot_sets(folder, [(i.base_name, i.mtime_ns) for i in infos
                                  if i.type == pafs.FileType.File])
    chosen = choose(sets, shard, num_shards)
    if chosen is not None:
        log.warning("shard %d of %d: restoring from the snapshots of %d shards in %s (newest "
                    "written %s ns; sets found: %s)", shard, num_shards, chosen.num_shards,
                    folder, chosen.written_ns,
                    ", ".join(f"{s.num_shards} ({'complete' if s.complete else 'incomplete'})"
                              for s in sets))
    return chosen


def read_tables(fs: pafs.FileSystem, paths: Iterable[str | None]) -> Iterator[pa.Table]:
    """Each existing path's table, one at a time (a re-split holds one old snapshot in memory
    besides what it keeps). Temporaries beside them are left alone: they are their writers'."""
    for p in paths:
        if p is not None:
            yield pq.read_table(p, filesystem=fs)


def _owned(table: pa.Table, ring: HashRing, shard: int) -> pa.Table:
    """The rows of ``table`` whose user ``ring`` assigns to ``shard``, metadata dropped."""
    users = table.column("user").to_numpy().astype(np.int64)  # (n,)
    return table.filter(pa.array(ring.shard_of(users) == shard)).replace_schema_metadata(None)


def _meta(table: pa.Table, key: bytes, what: str) -> dict:
    raw = (table.schema.metadata or {}).get(key)
    if raw is None:
        raise DataError(f"{what}: missing {key.decode()!r} schema metadata")
    return json.loads(raw)


def _latest(values: list) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def split_pairs(tables: Iterable[pa.Table], ring: HashRing, shard: int) -> pa.Table | None:
    """One pair snapshot (``solaris.cache.snapshot.to_table``'s layout) of the entries of
    ``tables`` (the old shards' pair snapshots) whose user ``ring`` assigns to ``shard``;
    None when ``tables`` is empty. A (user, version) group moves whole, its running sum on its
    first row. DataError when the snapshots disagree on format, codec or width."""
    parts, metas = [], []
    for t in tables:
        meta = _meta(t, _PAIR_META, "pair snapshot")
        if meta.get("format") != FORMAT:
            raise DataError(f"pair snapshot format={meta.get('format')!r}: expected {FORMAT}")
        if metas and (meta.get("codec"), meta.get("dim")) != (metas[0]["codec"],
                                                              metas[0]["dim"]):
            raise DataError(f"pair snapshots of codec={metas[0]['codec']!r} "
                            f"dim={metas[0]['dim']!r} and codec={meta.get('codec')!r} "
                            f"dim={meta.get('dim')!r}: one group has one codec and width")
        metas.append(meta)
        part = _owned(t, ring, shard)
        version = part.column("version")
        if pa.types.is_dictionary(version.type):  # each snapshot has its own dictionary
            part = part.set_column(part.schema.get_field_index("version"), "version",
                                   version.cast(pa.string()))
        parts.append(part)
    if not parts:
        return None
    out = pa.concat_tables(parts).combine_chunks()
    i = out.schema.get_field_index("version")
    out = out.set_column(i, "version", pc.dictionary_encode(out.column(i)).combine_chunks()
                         .cast(pa.dictionary(pa.int32(), pa.string())))
    meta = {"format": FORMAT, "codec": metas[0]["codec"], "dim": metas[0]["dim"],
            "max_now": _latest([m.get("max_now") for m in metas]), "counters": {}}
    return out.replace_schema_metadata({_PAIR_META: json.dumps(meta)})


def split_history(tables: Iterable[pa.Table], ring: HashRing, shard: int) -> pa.Table | None:
    """One history snapshot (``HistoryStore.snapshot``'s layout) of the events of ``tables``
    (the old shards' history snapshots) whose user ``ring`` assigns to ``shard``; None when
    ``tables`` is empty. Arrival numbers are kept: a user's events all come from one old
    shard, so their order is its order; the next number is past every old shard's."""
    parts, metas = [], []
    for t in tables:
        metas.append(_meta(t, _HISTORY_META, "history snapshot"))
        parts.append(_owned(t, ring, shard))
    if not parts:
        return None
    tasks = {m["num_tasks"] for m in metas if m.get("num_tasks") is not None}
    if len(tasks) > 1:
        raise DataError(f"history snapshots with num_tasks {sorted(tasks)}: one group has one "
                        "label width")
    out = pa.concat_tables(parts).combine_chunks()
    seq = out.column("seq").to_numpy()
    seq_next = max([int(m.get("seq_next", 0)) for m in metas]
                   + [int(seq.max()) + 1 if len(seq) else 0])
    meta = {"counters": {}, "seq_next": seq_next, "num_tasks": next(iter(tasks), None),
            "latest": _latest([m.get("latest") for m in metas])}
    return out.replace_schema_metadata({_HISTORY_META: json.dumps(meta)})
