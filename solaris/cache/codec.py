"""Vector codecs of the pair store: (n, d) float32 <-> (n, row_bytes) uint8 rows.

Rows are raw bytes so one slab of one dtype holds any codec, a gather reads a vector (and
its int8 scale) in one pass, and a snapshot copies rows byte for byte (restore is exact).

Error bounds (per component, x the input, m = max |x| over the vector):

- ``fp32``: exact.
- ``fp16``: round to nearest, ``|dec - x| <= max(2**-11 * |x|, 2**-25)`` for
  ``|x| <= 65504``; larger magnitudes are rejected (they would become inf).
- ``int8``: per-vector scale ``s = m / 127`` stored as float32 with the codes, codes
  ``round(x / s)`` in [-127, 127], ``|dec - x| <= m * (1/254 + 2**-22)`` (half a step, plus
  float32 rounding of the scale and of the product), i.e. 0.39% of the vector's largest
  component. A zero vector decodes to zeros. (For m < 1e-36 the scale is not a normal
  float32 and the bound is only ``|dec - x| <= m``.)
"""

from __future__ import annotations

import numpy as np

from solaris.errors import RequestError

CODECS = ("fp32", "fp16", "int8")
FP16_MAX = 65504.0


def error_bound(codec: str, x: np.ndarray) -> np.ndarray:
    """The documented per-component bound on |decode(encode(x)) - x| for (n, d) x."""
    x = np.asarray(x, dtype=np.float64)
    if codec == "fp32":
        return np.zeros_like(x)
    if codec == "fp16":
        return np.maximum(np.abs(x) * 2.0**-11, 2.0**-25)
    if codec == "int8":
        m = np.abs(x).max(axis=1, keepdims=True) if x.size else np.zeros((len(x), 1))
        return np.broadcast_to(np.where(m < 1e-36, m, m * (1 / 254 + 2.0**-22)), x.shape)
    raise RequestError(f"codec={codec!r}: must be one of {', '.join(CODECS)}")


class Codec:
    """Encode / decode (n, d) float32 vectors as fixed-width byte rows."""

    def __init__(self, name: str, dim: int) -> None:
        if name not in CODECS:
            raise RequestError(f"codec={name!r}: must be one of {', '.join(CODECS)}")
        if dim < 1:
            raise RequestError(f"dim={dim!r}: must be >= 1")
        self.name = name
        self.dim = dim
        self.row_bytes = {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim + 4}[name]

    def encode(self, x: np.ndarray) -> np.ndarray:
        """(n, d) finite floats -> (n, row_bytes) uint8."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise RequestError(f"vectors shape={x.shape}: expected (n, {self.dim})")
        if not np.isfinite(x).all():
            raise RequestError("vectors: contain NaN or inf")
        n, d = x.shape
        if self.name == "fp32":
            return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).reshape(n, 4 * d)
        if self.name == "fp16":
            if n and np.abs(x).max() > FP16_MAX:
                raise RequestError(f"vectors max |x|={np.abs(x).max()!r}: beyond fp16 range "
                                   f"{FP16_MAX}")
            return np.ascontiguousarray(x, dtype=np.float16).view(np.uint8).reshape(n, 2 * d)
        x64 = x.astype(np.float64)
        m = np.abs(x64).max(axis=1) if n else np.zeros(0)
        scale = (m / 127.0).astype(np.float32)  # (n,)
        s64 = scale.astype(np.float64)
        safe = np.where(s64 > 0, s64, 1.0)
        q = np.clip(np.rint(x64 / safe[:, None]), -127, 127).astype(np.int8)  # (n, d)
        out = np.empty((n, d + 4), dtype=np.uint8)
        out[:, :d] = q.view(np.uint8)
        out[:, d:] = scale.view(np.uint8).reshape(n, 4)
        return out

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """(n, row_bytes) uint8 -> (n, d) float32 (fp32: a view of ``rows`` when contiguous)."""
        n, d = len(rows), self.dim
        if self.name == "fp32":
            return np.ascontiguousarray(rows).view(np.float32).reshape(n, d)
        if self.name == "fp16":
            return np.ascontiguousarray(rows).view(np.float16).reshape(n, d).astype(np.float32)
        q = np.ascontiguousarray(rows[:, :d]).view(np.int8)
        scale = np.ascontiguousarray(rows[:, d:]).view(np.float32).reshape(n)
        return q.astype(np.float32) * scale[:, None]
