"""What speculation costs and what it buys (DESIGN.md, "Precompute cost", "Speculation precision").

Each figure has one source, the one that sees it happen:

- ``CostLedger`` (one per FM+encoder version, in the ledger actor) counts the FM's work: the
  pair evaluations the FM workers report and their FM-seconds.
- The cache shards (``solaris.cache.store.PairStore`` counters) see every entry end -- it
  expires, is evicted, or is replaced by a re-evaluation -- with the entry's read flag (set
  when it was served as its user's own pair), and count a re-evaluation of a pair whose entry
  was still fresh for reads as a **duplicate**.

``speculation_report`` is the one place that turns the two into the reported figures:
evaluations, duplicates and FM-seconds per 1,000 served requests, speculation precision (the
share of ended entries read at least once) and the share that expired unread. numpy in,
plain numbers out.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from solaris.cache.inputs import check_ids
from solaris.errors import RequestError

# the shard counters speculation_report sums (every PairStore counts them)
SHARD_COUNTERS = ("expired", "expired_unread", "replaced", "replaced_read", "evicted_live",
                  "evicted_read", "duplicates",
                  "clock_refused")  # calls refused for an event time too far ahead


class CostLedger:
    """Counts the FM's pair evaluations and FM-seconds of one FM+encoder version."""

    def __init__(self) -> None:
        self.evaluations = 0
        self.fm_seconds = 0.0

    def evaluated(self, users: np.ndarray, items: np.ndarray, seconds: float) -> int:
        """The FM evaluated these pairs in ``seconds``; returns how many."""
        u, i = check_ids(users, "users"), check_ids(items, "items")
        if len(u) != len(i):
            raise RequestError(f"items: length {len(i)} != users length {len(u)}")
        if not np.isfinite(seconds) or seconds < 0:
            raise RequestError(f"seconds={seconds!r}: must be a finite value >= 0")
        self.evaluations += len(u)
        self.fm_seconds += float(seconds)
        return len(u)

    def report(self) -> dict[str, Any]:
        """``evaluations`` and ``fm_seconds`` so far."""
        return {"evaluations": self.evaluations, "fm_seconds": self.fm_seconds}


def speculation_report(ledger: dict[str, Any] | None, shards: Iterable[dict[str, Any]],
                       served: int) -> dict[str, Any]:
    """The FM's costs per 1,000 of ``served`` requests and speculation precision, from a
    ``CostLedger.report`` (None: no ledger, costs unknown) and the shards' metrics (the
    shards that answered). A figure whose denominator is 0 is None."""
    if served < 0:
        raise RequestError(f"served={served!r}: must be >= 0")
    c = dict.fromkeys(SHARD_COUNTERS, 0)
    for s in shards:
        for k in SHARD_COUNTERS:
            c[k] += int(s.get(k, 0))
    ended = c["expired"] + c["replaced"] + c["evicted_live"]
    ended_read = (c["expired"] - c["expired_unread"]) + c["replaced_read"] + c["evicted_read"]

    def share(a: float, b: float) -> float | None:
        return a / b if b else None
    evals = None if ledger is None else int(ledger["evaluations"])
    fm_s = None if ledger is None else float(ledger["fm_seconds"])
    return {
        "served": int(served), "evaluations": evals, "fm_seconds": fm_s,
        "duplicates": c["duplicates"],
        "unique_evaluations": None if evals is None else evals - c["duplicates"],
        "evaluations_per_1k": None if evals is None else share(1000.0 * evals, served),
        "duplicates_per_1k": share(1000.0 * c["duplicates"], served),
        "fm_seconds_per_1k": None if fm_s is None else share(1000.0 * fm_s, served),
        "duplicate_share": None if evals is None else share(c["duplicates"], evals),
        "ended": ended, "ended_read": ended_read, **{f"shard_{k}": v for k, v in c.items()},
        "speculation_precision": share(ended_read, ended),
        "expired_unread_share": share(c["expired_unread"], c["expired"]),
    }
