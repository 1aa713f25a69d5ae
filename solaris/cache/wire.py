"""ShardQuery / ShardAnswer <-> one byte string each, for the trip through Ray.

Why not let Ray pickle the dataclasses: every numpy array in a Ray argument or return is
serialised as its own out-of-band buffer with its own metadata, ~50 us apiece on a 2-core
machine, and a query or answer holds up to 14 of them. One ``bytes`` object costs one copy.
The layout is lossless (same dtypes, same bits), so an answer that crossed the wire assembles
into exactly the slots the in-process answer gives.

Layout: an int64 header, then the 8-byte arrays, the 4-byte arrays and the 1-byte arrays,
so every array is read back aligned, as a read-only view of the bytes (no copy).
"""

from __future__ import annotations

import numpy as np

from solaris.cache.query import ShardAnswer, ShardQuery
from solaris.errors import RequestError

_QUERY = 0x51_0001  # format tags: a query / an answer, version 1
_ANSWER = 0x41_0001
_I64, _F64, _F32 = np.dtype("<i8"), np.dtype("<f8"), np.dtype("<f4")


def _bytes(a: np.ndarray, dtype: np.dtype) -> bytes:
    """The raw bytes of ``a`` as ``dtype``, C order (no conversion when it already is)."""
    if a.dtype != dtype:
        a = a.astype(dtype)
    return a.tobytes() if a.size else b""


def _view(buf: bytes, dtype: np.dtype, count: int, off: int) -> tuple[np.ndarray, int]:
    """(read-only view of ``count`` ``dtype`` values at ``off``, the offset after them)."""
    if count == 0:
        return _EMPTIES[dtype.char], off
    return np.frombuffer(buf, dtype=dtype, count=count, offset=off), off + count * dtype.itemsize


_EMPTIES = {dt.char: np.zeros(0, dt) for dt in (_I64, _F64, _F32, np.dtype(np.bool_))}
for _e in _EMPTIES.values():
    _e.setflags(write=False)


def _head(buf: bytes, tag: int, fields: int, what: str) -> np.ndarray:
    if not isinstance(buf, (bytes, bytearray, memoryview)) or len(buf) < 8 * fields:
        raise RequestError(f"{what}: expected the bytes of encode_{what}, got {type(buf)}")
    head = np.frombuffer(buf, dtype=_I64, count=fields)
    if head[0] != tag:
        raise RequestError(f"{what}: format tag {int(head[0]):#x}, expected {tag:#x}")
    return head


def encode_query(q: ShardQuery) -> bytes:
    """One byte string holding every field of ``q``."""
    items, inb, nbr = np.asarray(q.items), np.asarray(q.item_nbrs), np.asarray(q.nbr_users)
    if inb.ndim != 2:
        raise RequestError(f"item_nbrs: shape {inb.shape}, expected (U, ki)")
    version = q.version.encode()
    flags = int(bool(q.aggregate)) | int(bool(q.nbr_all)) << 1
    head = np.array([_QUERY, len(items), inb.shape[0], inb.shape[1], len(nbr), int(q.user),
                     flags, len(version)], dtype=_I64).tobytes()
    return b"".join((head, np.float64(q.now).tobytes(), _bytes(items, _I64), _bytes(inb, _I64),
                     _bytes(nbr, _I64), version))


def decode_query(buf: bytes) -> ShardQuery:
    """The ShardQuery ``encode_query`` packed (arrays are read-only views of ``buf``)."""
    _, n, r, ki, k, user, flags, lv = _head(buf, _QUERY, 8, "query").tolist()
    now = float(np.frombuffer(buf, dtype=_F64, count=1, offset=64)[0])
    items, off = _view(buf, _I64, n, 72)
    inb, off = _view(buf, _I64, r * ki, off)
    nbr, off = _view(buf, _I64, k, off)
    version = bytes(buf[off:off + lv]).decode()
    return ShardQuery(version=version, now=now, items=items, user=user,
                      item_nbrs=inb.reshape(r, ki), aggregate=bool(flags & 1), nbr_users=nbr,
                      nbr_all=bool(flags & 2))


def encode_answer(a: ShardAnswer) -> bytes:
    """One byte string holding every field of ``a``."""
    d = len(a.agg_sum)
    h, g, f = len(a.own_idx), len(a.nbr_idx), len(a.inbr_idx)
    head = np.array([_ANSWER, d, h, g, f, int(a.agg_count)], dtype=_I64).tobytes()
    parts = [head, _bytes(a.agg_sum, _F64)]
    if h:
        parts += [_bytes(a.own_idx, _I64), _bytes(a.own_age_s, _F64)]
    if g:
        parts += [_bytes(a.nbr_idx, _I64), _bytes(a.nbr_rank, _I64), _bytes(a.nbr_age_s, _F64)]
    if f:
        parts += [_bytes(a.inbr_idx, _I64), _bytes(a.inbr_age_s, _F64)]
    parts += [_bytes(a.own_vectors, _F32), _bytes(a.nbr_vectors, _F32),
              _bytes(a.inbr_vectors, _F32), _bytes(a.own_fresh, np.dtype(np.bool_))]
    return b"".join(parts)


def decode_answer(buf: bytes) -> ShardAnswer:
    """The ShardAnswer ``encode_answer`` packed (arrays are read-only views of ``buf``)."""
    _, d, h, g, f, agg_count = _head(buf, _ANSWER, 6, "answer").tolist()
    agg_sum, off = _view(buf, _F64, d, 48)
    own_idx, off = _view(buf, _I64, h, off)
    own_age, off = _view(buf, _F64, h, off)
    nbr_idx, off = _view(buf, _I64, g, off)
    nbr_rank, off = _view(buf, _I64, g, off)
    nbr_age, off = _view(buf, _F64, g, off)
    inbr_idx, off = _view(buf, _I64, f, off)
    inbr_age, off = _view(buf, _F64, f, off)
    own_vec, off = _view(buf, _F32, h * d, off)
    nbr_vec, off = _view(buf, _F32, g * d, off)
    inbr_vec, off = _view(buf, _F32, f * d, off)
    own_fresh, off = _view(buf, np.dtype(np.bool_), h, off)
    return ShardAnswer(own_idx=own_idx, own_fresh=own_fresh, own_vectors=own_vec.reshape(h, d),
                       own_age_s=own_age, agg_sum=agg_sum, agg_count=agg_count,
                       nbr_idx=nbr_idx, nbr_rank=nbr_rank, nbr_vectors=nbr_vec.reshape(g, d),
                       nbr_age_s=nbr_age, inbr_idx=inbr_idx,
                       inbr_vectors=inbr_vec.reshape(f, d), inbr_age_s=inbr_age)
