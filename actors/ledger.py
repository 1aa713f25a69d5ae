"""The cost-ledger actor: one ``CostLedger`` that outlives the workers reporting to it.
Duplicates and speculation precision are the cache shards' counts
(``solaris.precompute.ledger.speculation_report``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from solaris import wire
from solaris.precompute.ledger import CostLedger

LEDGER_NUM_CPUS = 0.05


@ray.remote(num_cpus=LEDGER_NUM_CPUS, max_restarts=0)
class LedgerActor:
    """One CostLedger (per FM+encoder version) that outlives the workers reporting to it."""

    def __init__(self) -> None:
        self._ledger = CostLedger()

    def evaluated(self, users: np.ndarray, items: np.ndarray, seconds: float) -> int:
        """Record FM evaluations; returns how many."""
        return self._ledger.evaluated(users, items, seconds)

    def evaluated_frame(self, payload: bytes) -> int:
        """``evaluated`` with its arguments in one ``evaluated`` frame (``solaris.wire``)."""
        return self._ledger.evaluated(*wire.decode(payload, "evaluated", 3))

    def report(self) -> dict:
        """``CostLedger.report``: evaluations and FM-seconds."""
        return self._ledger.report()


class LedgerClient:
    """The project's one way to call the cost-ledger actor: evaluations go as one
    ``evaluated`` frame (``solaris.wire``), not waited on; ``report`` is waited on."""

    def __init__(self, handle: Any, timeout_s: float = 30.0) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    @classmethod
    def create(cls, name: str | None = None, detached: bool = False) -> "LedgerClient":
        """Start (or attach to, by ``name``) a ledger actor."""
        opts: dict[str, Any] = {}
        if name is not None:
            opts.update(name=name, get_if_exists=True)
        if detached:
            opts["lifetime"] = "detached"
        return cls(LedgerActor.options(**opts).remote())

    @classmethod
    def of(cls, ledger: Any) -> "LedgerClient | None":
        """``ledger`` if it is a client or None, else a client of the actor handle."""
        return ledger if ledger is None or isinstance(ledger, cls) else cls(ledger)

    def evaluated(self, users: np.ndarray, items: np.ndarray, seconds: float) -> Any:
        """Record FM evaluations; the ref gives how many."""
        return self.handle.evaluated_frame.remote(wire.encode("evaluated", (
            np.asarray(users, np.int64), np.asarray(items, np.int64), float(seconds))))

    def report(self) -> dict[str, Any]:
        """``CostLedger.report``, waited on."""
        return ray.get(self.handle.report.remote(), timeout=self.timeout_s)
