"""One id map per deployment: a team's raw ids (integers or strings) and the dense codes every
model table, history store, cache key and KNN table is keyed by.

Code ``k`` of a side (users or items) is ``raw[k]``. The map only grows: a newer log loaded
against it keeps every known id's code and appends the new ids after them
(``solaris.data.generic``), so an FM version rollover never hands one user's history, cached
pairs or neighbours to another. The map is saved beside the artifacts (``ids/users.parquet``,
``ids/items.parquet``: one ``raw_id`` column in code order) and the router translates the
wire's raw ids with it.

An id the map has never seen is served through the fallbacks as any unknown id is: it gets
a *provisional* code, ``PROVISIONAL_BASE`` plus a 60-bit hash of the raw id, far past every
table (the VM reads its out-of-vocabulary row), stable across processes and versions while
the id stays unknown, so its serving-time history stays its own.

A map whose user (item) raw ids are the integers ``0..n-1`` is the identity on that side
(the synthetic default, a log already coded): integers pass through unchanged, known or not.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from solaris import atomic
from solaris.errors import CheckpointError, DataError, RequestError

IDS_DIR = "ids"
RAW_ID = "raw_id"
SIDES = ("users", "items")
MAX_CODE = 2**62  # every code fits int64 with room: the wire's old integer bound
PROVISIONAL_BASE = 2**61  # unknown raw ids: this plus a 60-bit hash (< MAX_CODE)
MAX_RAW_LEN = 256  # characters of a string id


def _as_raw_array(values: Any) -> pa.Array:
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.int64())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    raise DataError(f"raw ids must be integers or strings, not {arr.type}")


def provisional_code(raw: int | str) -> int:
    """The code of a raw id the map does not hold: stable, past every table."""
    key = (b"s" + raw.encode()) if isinstance(raw, str) else (b"i" + str(int(raw)).encode())
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return PROVISIONAL_BASE + (h >> 4)  # 60 bits


@dataclass
class SideIds:
    """One side's raw ids in code order (``raw[k]`` has code ``k``)."""

    side: str
    raw: pa.Array  # int64 or string, distinct
    _index: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.raw = _as_raw_array(self.raw)
        if self.raw.null_count:
            raise DataError(f"{self.side}: the id map holds a null id")
        n = len(self.raw)
        self.identity = self.is_int and n > 0 and bool(
            np.array_equal(self.raw.to_numpy(), np.arange(n))) or (self.is_int and n == 0)

    @property
    def is_int(self) -> bool:
        return pa.types.is_integer(self.raw.type)

    def __len__(self) -> int:
        return len(self.raw)

    def _lookup(self) -> dict:
        if self._index is None:
            keys = self.raw.to_pylist()
            self._index = dict(zip(keys, range(len(keys))))
            if len(self._index) != len(keys):
                raise DataError(f"{self.side}: the id map holds an id twice")
        return self._index

    def codes(self, values: Sequence[int | str], field_name: str) -> np.ndarray:
        """int64 codes of raw ids as they come off the wire; an unknown id gets its
        provisional code. A value of the wrong kind (a string where the map holds integers,
        or the reverse), an empty or overlong string, or an integer outside int64 is a
        RequestError naming ``field_name``."""
        vals = list(values)
        if self.identity or (self.is_int and not len(self.raw)):
            out = np.empty(len(vals), np.int64)
            for j, v in enumerate(vals):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise RequestError(f"{field_name}: {self.side} ids here are integers, "
                                       f"got {type(v).__name__}")
                if not 0 <= v <= MAX_CODE:
                    raise RequestError(f"{field_name}: ids must be in [0, 2**62]")
                out[j] = v
            return out
        index = self._lookup()
        want = int if self.is_int else str
        out = np.empty(len(vals), np.int64)
        for j, v in enumerate(vals):
            if type(v) is not want:
                raise RequestError(f"{field_name}: {self.side} ids here are "
                                   f"{'integers' if self.is_int else 'strings'}, got "
                                   f"{type(v).__name__}")
            if want is str and not 0 < len(v) <= MAX_RAW_LEN:
                raise RequestError(f"{field_name}: a string id must hold 1..{MAX_RAW_LEN} "
                                   "characters")
            if want is int and not -2**63 <= v < 2**63:
                raise RequestError(f"{field_name}: integer ids must fit int64")
            c = index.get(v)
            out[j] = provisional_code(v) if c is None else c
        return out

    def raw_of(self, codes: np.ndarray) -> list:
        """The raw ids of known codes (what a replay sends on the wire)."""
        codes = np.asarray(codes, np.int64)
        if self.identity:
            return codes.tolist()
        if len(codes) and (codes.min() < 0 or codes.max() >= len(self.raw)):
            raise DataError(f"{self.side}: codes outside the map (0..{len(self.raw) - 1})")
        return self.raw.take(pa.array(codes)).to_pylist()

    def check_extends(self, older: "SideIds", where: str) -> None:
        """Raise unless this map keeps every code of ``older`` (it may append)."""
        n = len(older.raw)
        if len(self.raw) < n or older.raw.type != self.raw.type or \
                not self.raw.slice(0, n).equals(older.raw):
            first = _first_difference(older.raw, self.raw)
            raise DataError(f"{where}: the {self.side} id map does not extend the earlier one "
                            f"({len(older.raw)} -> {len(self.raw)} ids; {first}): codes would "
                            "change hands")


def _first_difference(a: pa.Array, b: pa.Array) -> str:
    if a.type != b.type:
        return f"ids were {a.type}, now {b.type}"
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return f"code {k} was {a[k].as_py()!r}, now {b[k].as_py()!r}"
    return f"only {len(b)} ids now"


@dataclass
class IdMap:
    """The users' and items' raw ids in code order."""

    users: SideIds
    items: SideIds

    @classmethod
    def of(cls, users: Any, items: Any) -> "IdMap":
        return cls(SideIds("users", users), SideIds("items", items))

    @classmethod
    def from_dataset(cls, ds: Any) -> "IdMap":
        """The map a loaded ``Dataset`` codes by (its user / item tables' ``raw_id``)."""
        return cls.of(ds.users.column(RAW_ID), ds.items.column(RAW_ID))

    def side(self, name: str) -> SideIds:
        if name not in SIDES:
            raise ValueError(f"side={name!r}: one of {SIDES}")
        return getattr(self, name)

    def raw_user(self, code: int) -> int | str:
        """The raw id of a known user code (what a client sends)."""
        return self.users.raw_of(np.array([code]))[0]

    def raw_items(self, codes: np.ndarray) -> list:
        """The raw ids of known item codes."""
        return self.items.raw_of(codes)

    def check_extends(self, older: "IdMap", where: str) -> None:
        self.users.check_extends(older.users, where)
        self.items.check_extends(older.items, where)

    def digest(self) -> str:
        """sha256 (hex) of both sides' raw ids in code order and their kind: equal maps,
        saved or the identity of artifacts written without one, have equal digests (what a
        KNN table records of the map its ids are codes of)."""
        h = hashlib.sha256()
        for name in SIDES:
            side = self.side(name)
            h.update(f"{name}|{'int' if side.is_int else 'str'}|{len(side)}|".encode())
            if side.is_int:
                h.update(np.ascontiguousarray(side.raw.to_numpy(), "<i8").tobytes())
            else:  # length-prefixed, so no two lists of strings hash alike
                for v in side.raw.to_pylist():
                    b = v.encode()
                    h.update(len(b).to_bytes(4, "little") + b)
        return h.hexdigest()

    def save(self, root: str | Path) -> Path:
        """Write ``root/ids/{users,items}.parquet`` (each file atomically)."""
        out = Path(root) / IDS_DIR
        out.mkdir(parents=True, exist_ok=True)
        for name in SIDES:
            table = pa.table({RAW_ID: self.side(name).raw})
            atomic.save(out / f"{name}.parquet", lambda f, t=table: pq.write_table(t, f))
        return out

    @classmethod
    def load(cls, root: str | Path) -> "IdMap | None":
        """The map saved under ``root`` (an artifacts directory, or the ``ids`` directory
        itself); None where there is none (artifacts written before maps were saved)."""
        root = Path(root)
        d = root if (root / "users.parquet").is_file() and root.name == IDS_DIR \
            else root / IDS_DIR
        if not d.is_dir():
            return None
        sides = {}
        for name in SIDES:
            path = d / f"{name}.parquet"
            try:
                t = pq.read_table(path)
                sides[name] = SideIds(name, t.column(RAW_ID))
            except (OSError, KeyError, pa.ArrowException, DataError) as e:
                raise CheckpointError(f"{path}: not a readable id map ({e})") from e
        return cls(sides["users"], sides["items"])

    @classmethod
    def identity(cls, num_users: int, num_items: int) -> "IdMap":
        """The map of artifacts written without one: the wire's integers are the codes."""
        return cls.of(pa.array(np.arange(num_users, dtype=np.int64)),
                      pa.array(np.arange(num_items, dtype=np.int64)))


def deployment_ids(maps: Sequence[tuple[str, IdMap]]) -> IdMap:
    """The one map of a deployment serving several versions (oldest first): the newest,
    after checking it extends every earlier one (else a DataError: codes would change
    hands between versions)."""
    if not maps:
        raise ValueError("maps: need at least one (where, IdMap)")
    where, newest = maps[-1]
    for _, older in maps[:-1]:
        newest.check_extends(older, where)
    return newest
