"""What speculation costs and what it buys (DESIGN.md, "Precompute cost", "Speculation precision").

``CostLedger`` is fed events by whoever sees them -- the router (``served``), the FM workers
(``evaluated``), the cache (``read``, ``expired``) -- and reports:

- FM pair-evaluations and FM-seconds per 1,000 served requests, duplicates included and
  counted separately. A duplicate is an evaluation of a pair that already had a live entry
  (of the ledger's version): the caller may say so (``duplicate_mask``, e.g. from a cache
  lookup before the write), else the ledger infers it from the pairs it saw evaluated and
  not yet expired -- which covers a pair evaluated twice because its lease expired.
- Speculation precision: the share of precomputed entries read at least once before they
  ended (expired, or were replaced by a re-evaluation), and the share that expired unread.

One ledger per FM+encoder version. Pairs are tracked in a dict of int64 keys while live, so
its size follows the cache's; each batch goes through the dict with C-level calls (``map``
over ``dict.get`` / ``pop``, ``dict.update``), never a Python loop per pair, so an FM worker's
report costs ~0.1 us per pair. numpy in, plain numbers out.
"""

from __future__ import annotations

import logging
import operator
from itertools import compress, repeat

import numpy as np

from solaris.cache.inputs import check_ids
from solaris.errors import RequestError

log = logging.getLogger(__name__)

_COUNTERS = ("served", "evaluations", "duplicates", "reads", "reads_untracked",
             "first_reads", "expired", "expired_read", "expired_untracked", "replaced",
             "replaced_read")


def _keys(users: np.ndarray, items: np.ndarray) -> list[int]:
    u, i = check_ids(users, "users"), check_ids(items, "items")
    if len(u) != len(i):
        raise RequestError(f"items: length {len(i)} != users length {len(u)}")
    if len(u) and (u.max() >= 2 ** 31 or i.max() >= 2 ** 32):
        raise RequestError(f"ids too large for the ledger key: user {int(u.max())}, "
                           f"item {int(i.max())}")
    return ((u << 32) | i).tolist()


class CostLedger:
    """Counts FM work, served requests, reads and expiries; ``report`` turns them into rates."""

    def __init__(self) -> None:
        self._open: dict[int, bool] = {}  # live precomputed pair -> read at least once
        self.fm_seconds = 0.0
        self.counters = dict.fromkeys(_COUNTERS, 0)

    def served(self, n: int = 1) -> None:
        """``n`` requests were answered (the denominator of every per-1,000 rate)."""
        if n < 0:
            raise RequestError(f"n={n!r}: must be >= 0")
        self.counters["served"] += int(n)

    def evaluated(self, users: np.ndarray, items: np.ndarray, seconds: float,
                  duplicate_mask: np.ndarray | None = None) -> int:
        """The FM evaluated these pairs in ``seconds``; returns how many were duplicates.

        Without ``duplicate_mask`` a pair counts as a duplicate when the ledger still holds
        an earlier evaluation of it (live: not reported expired). Either way the earlier
        entry ends as "replaced" and the new one starts unread.
        """
        keys = _keys(users, items)
        if not np.isfinite(seconds) or seconds < 0:
            raise RequestError(f"seconds={seconds!r}: must be a finite value >= 0")
        if duplicate_mask is not None:
            dup = np.asarray(duplicate_mask, bool)
            if dup.shape != (len(keys),):
                raise RequestError(f"duplicate_mask: expected shape ({len(keys)},), got "
                                   f"{dup.shape}")
        # One pass per batch through C-level dict calls, no Python loop per pair. A key may
        # repeat in a batch: its first occurrence sees the ledger's entry (or none), every
        # later one the entry the first just opened -- a replaced, unread duplicate.
        batch = dict.fromkeys(keys, False)  # distinct keys, first-occurrence order
        prev = list(map(self._open.get, batch))
        repeats = len(keys) - len(batch)
        replaced = repeats + len(batch) - prev.count(None)
        self.counters["replaced"] += replaced
        self.counters["replaced_read"] += prev.count(True)
        n_dup = replaced if duplicate_mask is None else int(np.count_nonzero(dup))
        self._open.update(batch)
        self.counters["evaluations"] += len(keys)
        self.counters["duplicates"] += n_dup
        self.fm_seconds += float(seconds)
        return n_dup

    def read(self, users: np.ndarray, items: np.ndarray) -> None:
        """These pairs were served as pair embeddings (hits of precomputed entries)."""
        keys = _keys(users, items)
        self.counters["reads"] += len(keys)
        # every read of a pair the ledger does not hold is untracked; a held, unread pair
        # turns read once (its first read), whatever the repeats in the batch
        self.counters["reads_untracked"] += list(map(self._open.get, keys)).count(None)
        batch = dict.fromkeys(keys)
        unread = list(compress(batch, map(operator.is_, map(self._open.get, batch),
                                          repeat(False))))
        self._open.update(dict.fromkeys(unread, True))
        self.counters["first_reads"] += len(unread)

    def expired(self, users: np.ndarray, items: np.ndarray,
                was_read: np.ndarray | None = None) -> None:
        """These entries ended (left the cache). ``was_read`` (the cache's own read flags)
        overrides what the ledger saw; entries the ledger never saw evaluated count only
        when it is given."""
        keys = _keys(users, items)
        flags = None if was_read is None else np.asarray(was_read, bool)
        if flags is not None and flags.shape != (len(keys),):
            raise RequestError(f"was_read: expected shape ({len(keys)},), got {flags.shape}")
        batch = dict.fromkeys(keys)  # a repeated key ends once: later repeats find nothing
        prev = list(map(self._open.pop, batch, repeat(None)))
        if flags is not None:  # every row counts, read as the cache says
            self.counters["expired"] += len(keys)
            self.counters["expired_read"] += int(np.count_nonzero(flags))
            return
        untracked = len(keys) - len(batch) + prev.count(None)
        self.counters["expired_untracked"] += untracked
        self.counters["expired"] += len(keys) - untracked
        self.counters["expired_read"] += prev.count(True)

    def report(self) -> dict:
        """Costs per 1,000 served requests and speculation precision (None where undefined)."""
        c = self.counters

        def per_1k(x: float) -> float | None:
            return 1000.0 * x / c["served"] if c["served"] else None

        def share(a: int, b: int) -> float | None:
            return a / b if b else None
        ended = c["expired"] + c["replaced"]
        return {
            **c,
            "fm_seconds": self.fm_seconds,
            "unique_evaluations": c["evaluations"] - c["duplicates"],
            "evaluations_per_1k": per_1k(c["evaluations"]),
            "duplicates_per_1k": per_1k(c["duplicates"]),
            "fm_seconds_per_1k": per_1k(self.fm_seconds),
            "duplicate_share": share(c["duplicates"], c["evaluations"]),
            "live": len(self._open),
            "live_read": sum(self._open.values()),
            # entries that ended (expired or replaced) having been read at least once
            "speculation_precision": share(c["expired_read"] + c["replaced_read"], ended),
            "expired_unread": c["expired"] - c["expired_read"],
            "expired_unread_share": share(c["expired"] - c["expired_read"], c["expired"]),
        }
