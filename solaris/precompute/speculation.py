"""After-answer speculation policies: which of a served request's candidates are offered to
the FM, and at what queue priority (DESIGN.md step 5).

One implementation per policy, each a pure object over one request at a time
(``Candidates``); a stateful policy also ``observe``s every request after it ranks it, so it
only ever knows the past. The router runs the default (``VerifierPolicy``, through
``solaris.online.verifier.choose``) live; the key-level schedule simulation
(``solaris.simulate.coverage.simulate_pair_coverage``) runs any ``Policy``, so policies can be
compared at equal FM cost in seconds.

A policy's ``rank`` returns the candidates it bets on and their priorities; ``admit`` then
keeps those whose pair is missing from the cache or expires within the horizon -- the same
for every policy, so they differ only in the bet.

* ``verifier``: the paper's rule, the top ``fraction`` of all candidates by the VM's own
  score (the VM alone inside the served VM).
* ``random``: as many candidates, drawn uniformly (the baseline at equal cost).

The policies only the replay compares (recurrence, learned, allocated) and the bounds that
foresee a log (returns, hindsight, oracle) are research: ``solaris/replay/policies.py``.

numpy and the standard library only; no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from solaris.errors import RequestError


def top_count(num_candidates: int, fraction: float) -> int:
    """How many candidates the top ``fraction`` holds: ceil(fraction * C), robust to float
    noise (0.1 * 30 is 3.0000000000000004, still 3)."""
    if not 0.0 <= fraction <= 1.0:
        raise RequestError(f"fraction={fraction!r}: must be in [0, 1]")
    return min(num_candidates, math.ceil(fraction * num_candidates - 1e-9))


@dataclass(frozen=True)
class Candidates:
    """One served request as a policy sees it: ``items`` (C,) int64 ids, ``scores`` (C,)
    the VM's scores (finite), ``ts`` its event time, ``user`` its user; ``labelled`` (C,)
    bool, which candidates were shown and labelled (the feedback a policy learns from, which
    reaches it ``lag_s`` after ``ts``), None where not known."""

    user: int
    ts: float
    items: np.ndarray
    scores: np.ndarray
    labelled: np.ndarray | None = None


class Policy(Protocol):
    name: str

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """(indices into the candidates, their queue priorities), best bet first."""
        ...

    def observe(self, req: Candidates) -> None:
        """Called once per request after ``rank``: what a stateful policy may remember."""
        ...


def admit(top: np.ndarray, found_fresh: np.ndarray, age_s: np.ndarray, read_ttl_s: float,
          horizon_s: float) -> np.ndarray:
    """(len(top),) bool: the bets worth an FM pass -- the pair is not in the cache fresh, or
    its entry expires within ``horizon_s`` (age > read_ttl_s - horizon_s; a horizon at or
    past the TTL re-admits every found pair)."""
    return ~found_fresh[top] | (age_s[top] > read_ttl_s - horizon_s)


def by_score(req: Candidates, k: int) -> np.ndarray:
    """The ``k`` best candidates by the VM's score (ties: smaller item id): the verifier's
    bet."""
    return np.lexsort((req.items, -req.scores))[:k]  # best score first, then smaller id


class VerifierPolicy:
    """The top ``fraction`` of all candidates by the VM's score (ties: smaller item id)."""

    name = "verifier"

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        top = by_score(req, top_count(len(req.items), fraction))
        return top, req.scores[top]

    def observe(self, req: Candidates) -> None:
        pass


class RandomPolicy:
    """As many candidates as the verifier's, drawn uniformly; uniform random priorities."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        k = top_count(len(req.items), fraction)
        top = self.rng.choice(len(req.items), size=k, replace=False)
        return top, self.rng.random(k)

    def observe(self, req: Candidates) -> None:
        pass
