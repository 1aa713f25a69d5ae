"""The record layout of a store's slots, shared by the store, its reads and its snapshots.

One 32-byte record per slot (user, item, written_at, verifier score, version id, read flag;
version id 0 marks a free slot), so checking a key's fields costs one cache line, and a batch
of records is gathered as 4 x uint64 rows: ~30x faster than numpy's structured fancy indexing.
"""

from __future__ import annotations

import numpy as np

META = np.dtype([("user", "<i8"), ("item", "<i8"), ("written", "<f8"), ("score", "<f4"),
                 ("vid", "<u2"), ("read", "u1"), ("pad", "u1")])
assert META.itemsize == 32


def gather(meta: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """meta[idx] for an index array, whole records at once."""
    return meta.view(np.uint64).reshape(-1, 4).take(idx, axis=0).view(META).reshape(-1)
