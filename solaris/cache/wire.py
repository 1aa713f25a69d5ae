"""ShardQuery / ShardAnswer <-> one SOLARIS frame each (``solaris.wire``), for the trip
through Ray.

Why not let Ray pickle the dataclasses: every numpy array in a Ray argument or return is
serialised as its own out-of-band buffer with its own metadata, ~50 us apiece on a 2-core
machine, and a query or answer holds up to 14 of them. One frame costs one copy. The frame
is lossless (each field in its fixed dtype, same bits), so an answer that crossed the wire
assembles into exactly the slots the in-process answer gives.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from solaris import wire
from solaris.cache.query import ShardAnswer, ShardQuery
from solaris.errors import RequestError

_I64, _F64, _F32, _B = np.int64, np.float64, np.float32, np.bool_
# each answer field in ShardAnswer's order with the dtype it crosses in (None: an int)
_ANSWER_DTYPES = (_I64, _B, _F32, _F64, _F64, None, _I64, _I64, _F32, _F64, _I64, _F32, _F64)
_ANSWER_FIELDS = tuple(f.name for f in fields(ShardAnswer))
assert len(_ANSWER_FIELDS) == len(_ANSWER_DTYPES)


def _as(a: object, dtype: type) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == dtype else a.astype(dtype)


def encode_query(q: ShardQuery) -> bytes:
    """One frame holding every field of ``q``."""
    inb = _as(q.item_nbrs, _I64)
    if inb.ndim != 2:
        raise RequestError(f"item_nbrs: shape {inb.shape}, expected (U, ki)")
    return wire.encode("shard_query", (str(q.version), float(q.now), _as(q.items, _I64),
                                       int(q.user), inb, bool(q.aggregate),
                                       _as(q.nbr_users, _I64), bool(q.nbr_all)))


def decode_query(buf: bytes) -> ShardQuery:
    """The ShardQuery ``encode_query`` packed (arrays are read-only views of ``buf``)."""
    version, now, items, user, inb, agg, nbr, nbr_all = wire.decode(buf, "shard_query", 8)
    return ShardQuery(version=version, now=now, items=items, user=user, item_nbrs=inb,
                      aggregate=agg, nbr_users=nbr, nbr_all=nbr_all)


def encode_answer(a: ShardAnswer) -> bytes:
    """One frame holding every field of ``a``."""
    return wire.encode("shard_answer", [
        int(getattr(a, f)) if dt is None else _as(getattr(a, f), dt)
        for f, dt in zip(_ANSWER_FIELDS, _ANSWER_DTYPES)])


def decode_answer(buf: bytes) -> ShardAnswer:
    """The ShardAnswer ``encode_answer`` packed (arrays are read-only views of ``buf``)."""
    return ShardAnswer(*wire.decode(buf, "shard_answer", len(_ANSWER_FIELDS)))
