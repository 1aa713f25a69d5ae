"""SOLARIS frames: the one wire format of every call between the project's processes.

Router -> cache shards (lookups, impressions, labels, history reads), router -> VM replicas
(score requests and their scores), router -> precompute queue (the verifier's picks), queue ->
FM workers (leases) and FM workers -> shards and ledger (pair embeddings, evaluations): each
call carries one frame, a ``bytes`` object, and nothing Ray would have to pickle. Why:

- Ray serialises every numpy array in an argument or a return as its own out-of-band buffer
  with its own metadata (~50-100 us apiece on a 2-core machine); one ``bytes`` costs one copy.
- A pickled Python object runs code when it is read and ties both ends to one class
  layout; a frame is data only, and a frame of the wrong kind is refused by name.

A frame is a list of fields, each a numpy array (at most 2-D, of the dtypes in ``DTYPES``), a
Python scalar (int, float, bool), a ``str`` or ``None``. Layout, all little-endian int64
unless said:

    MAGIC, kind, n, then per field: dtype code, ndim (-1: None, 0: scalar), dim 0, dim 1
    then each field's bytes, padded to a multiple of 8

so every array is read back aligned, as a read-only view of the frame (no copy). Lossless:
same dtypes, same bits. ``KINDS`` names every frame kind the project sends.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np

from solaris.errors import RequestError

MAGIC = 0x53_4F_4C_46_52_4D_31  # "SOLFRM1"
KINDS = {  # name -> code; a code is never reused for another meaning
    "shard_query": 1, "shard_answer": 2,  # router -> shard -> router (solaris.cache.wire)
    "score_request": 3, "scores": 4,  # router -> VM replica -> router (solaris.online.scoring)
    "impressions": 5, "labels": 6, "history_log": 7,  # writes to a shard's history
    "window_query": 8, "window": 9,  # a history read (FM workers, the router's cold start)
    "pairs": 10,  # FM worker -> shard: pair embeddings
    "evaluated": 11,  # FM worker -> ledger
    "picks": 12,  # router -> queue: the verifier's picks
    "lease": 13,  # queue -> FM worker
    # router's read replica <-> shard (solaris.cache.replica): a pull of the changes since a
    # sequence, the changes, and the reads the replica made, sent back
    "changes_query": 14, "changes": 15, "reads": 16,
}
_NAMES = {v: k for k, v in KINDS.items()}
# append only: a dtype's code is its position
DTYPES = tuple(np.dtype(t) for t in ("<i8", "<f8", "<f4", "<i4", "i1", "?", "u1", "<f2", "<i2"))
_CODE = {dt: i for i, dt in enumerate(DTYPES)}
_TEXT, _INT, _FLOAT, _BOOL = 100, 101, 102, 103  # scalar field codes
_HEAD = 3
_PER_FIELD = 4
_HEAD_S = struct.Struct("<3q")  # MAGIC, kind, n
_F64, _F2I = struct.Struct("<d"), struct.Struct("<q")  # a float field travels as its bits
_ZEROS = b"\0" * 8  # padding


def encode(kind: str, fields: Sequence[Any]) -> bytes:
    """One frame of ``kind`` holding ``fields`` (see the module docstring)."""
    code_of_kind = KINDS.get(kind)
    if code_of_kind is None:
        raise ValueError(f"frame kind {kind!r} is not one of {sorted(KINDS)}")
    head = [MAGIC, code_of_kind, len(fields)]
    parts: list[Any] = [None]  # the header goes first, once it is complete
    for i, f in enumerate(fields):
        if f is None:
            head += (0, -1, 0, 0)
            continue
        t = type(f)
        if t is np.ndarray:  # the common case first
            a = f
        elif isinstance(f, (bool, np.bool_)):
            head += (_BOOL, 0, int(bool(f)), 0)
            continue
        elif isinstance(f, (int, np.integer)):
            head += (_INT, 0, int(f), 0)
            continue
        elif isinstance(f, (float, np.floating)):
            head += (_FLOAT, 0, _F2I.unpack(_F64.pack(float(f)))[0], 0)
            continue
        elif isinstance(f, str):
            raw = f.encode()
            head += (_TEXT, 1, len(raw), 0)
            parts += (raw, _ZEROS[:-len(raw) % 8])
            continue
        elif isinstance(f, (list, tuple)):
            a = np.asarray(f)
        else:
            a = f
        dt = getattr(a, "dtype", None)
        code = None if dt is None else _CODE.get(dt)
        if code is None and dt is not None and dt.byteorder == ">":
            code = _CODE.get(dt.newbyteorder("<"))
        if code is None or a.ndim > 2 or not isinstance(a, np.ndarray):
            raise TypeError(f"{kind} field {i}: {type(f).__name__} "
                            f"{getattr(f, 'dtype', '')} cannot go in a frame (numpy arrays of "
                            f"{', '.join(str(d) for d in DTYPES)} up to 2-D, int, float, bool, "
                            "str, None)")
        shape = a.shape
        head += (code, a.ndim, shape[0] if a.ndim else 0, shape[1] if a.ndim == 2 else 0)
        if a.size:
            if dt is not DTYPES[code] and dt != DTYPES[code] or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a, DTYPES[code])
            parts.append(a.data.cast("B") if a.ndim else a.tobytes())
            pad = -a.nbytes % 8
            if pad:
                parts.append(_ZEROS[:pad])
    parts[0] = struct.pack(f"<{len(head)}q", *head)
    return b"".join(parts)


def decode(buf: Any, kind: str, count: int | None = None) -> list[Any]:
    """The fields of a ``kind`` frame (arrays: read-only views of ``buf``); ``count``: the
    number of fields expected. Anything else -- foreign bytes, another kind, a truncated
    frame -- is a ``RequestError`` naming what was wrong."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise RequestError(f"{kind}: expected a frame (bytes), got {type(buf).__name__}")
    size_b = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
    if size_b < 8 * _HEAD:
        raise RequestError(f"{kind}: {size_b} bytes is too short for a frame")
    magic, code, n = _HEAD_S.unpack_from(buf, 0)
    if magic != MAGIC:
        raise RequestError(f"{kind}: not a SOLARIS frame (magic {magic:#x})")
    if code != KINDS[kind]:
        raise RequestError(f"{kind}: got a {_NAMES.get(code, f'unknown ({code})')} frame")
    if count is not None and n != count:
        raise RequestError(f"{kind}: {n} fields, expected {count}")
    off = 8 * (_HEAD + _PER_FIELD * n)
    if n < 0 or size_b < off:
        raise RequestError(f"{kind}: truncated frame header ({size_b} bytes, {n} fields)")
    spec = struct.unpack_from(f"<{_PER_FIELD * n}q", buf, 8 * _HEAD)
    raw = np.frombuffer(buf, np.uint8)
    writable = raw.flags.writeable
    out: list[Any] = []
    for j in range(0, _PER_FIELD * n, _PER_FIELD):
        dcode, ndim, d0, d1 = spec[j:j + _PER_FIELD]
        if ndim == -1:
            out.append(None)
        elif dcode == _INT:
            out.append(d0)
        elif dcode == _BOOL:
            out.append(bool(d0))
        elif dcode == _FLOAT:
            out.append(_F64.unpack(_F2I.pack(d0))[0])
        elif dcode == _TEXT:
            if d0 < 0 or size_b < off + d0:
                raise RequestError(f"{kind}: truncated frame ({size_b} bytes)")
            out.append(bytes(buf[off:off + d0]).decode())
            off += d0 + (-d0 % 8)
        else:
            if not 0 <= dcode < len(DTYPES) or not 0 <= ndim <= 2 or d0 < 0 or d1 < 0:
                raise RequestError(f"{kind}: bad field spec ({dcode}, {ndim})")
            dt = DTYPES[dcode]
            shape = (d0, d1)[:ndim]
            size = d0 * d1 if ndim == 2 else (d0 if ndim == 1 else 1)
            nbytes = size * dt.itemsize
            if size_b < off + nbytes:
                raise RequestError(f"{kind}: truncated frame ({size_b} bytes)")
            a = raw[off:off + nbytes].view(dt).reshape(shape) if size else np.zeros(shape, dt)
            if writable or not size:
                a.flags.writeable = False
            out.append(a)
            off += nbytes + (-nbytes % 8)
    return out


# -- frames of a structure rather than a flat tuple of fields

def encode_impressions(records: Sequence[tuple[int, Any, Any, float]]) -> bytes:
    """Many requests' impressions ``(user, items, surfaces, now)`` (``surfaces`` one code or
    one per item) as one ``impressions`` frame."""
    counts = np.fromiter((len(r[1]) for r in records), np.int64, len(records))
    items = (np.concatenate([np.asarray(r[1], np.int64) for r in records]) if records
             else np.zeros(0, np.int64))
    surf = (np.concatenate([np.broadcast_to(np.asarray(r[2], np.int64), (len(r[1]),))
                            for r in records]) if records else np.zeros(0, np.int64))
    users = np.fromiter((int(r[0]) for r in records), np.int64, len(records))
    now = np.fromiter((float(r[3]) for r in records), np.float64, len(records))
    return encode("impressions", (users, counts, items, surf, now))


def decode_impressions(buf: Any) -> list[tuple[int, np.ndarray, np.ndarray, float]]:
    """The records ``encode_impressions`` framed (surfaces one per item)."""
    users, counts, items, surf, now = decode(buf, "impressions", 5)
    if int(counts.sum()) != len(items) or len(surf) != len(items):
        raise RequestError(f"impressions: counts sum to {int(counts.sum())}, "
                           f"{len(items)} items, {len(surf)} surfaces")
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends[:-1]]
    return [(u, items[a:b], surf[a:b], t)
            for u, a, b, t in zip(users.tolist(), starts, ends, now.tolist())]


def encode_window(window: dict[str, np.ndarray], keys: Sequence[str]) -> bytes:
    """A history window (``HistoryStore.window``: arrays under ``keys``) as one frame."""
    return encode("window", [window[k] for k in keys])


def decode_window(buf: Any, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The window ``encode_window`` framed."""
    return dict(zip(keys, decode(buf, "window", len(keys))))
