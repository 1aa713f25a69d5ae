"""After-answer speculation policies: which of a served request's candidates are offered to
the FM, and at what queue priority (DESIGN.md step 5).

One implementation per policy, each a pure object over one request at a time
(``Candidates``); a stateful policy also ``observe``s every request after it ranks it, so it
only ever knows the past. The router runs the default (``VerifierPolicy``, through
``solaris.verifier.choose``) live; the key-level schedule simulation
(``solaris.replay.coverage.simulate_pair_coverage``) runs any of them, so policies can be
compared at equal FM cost in seconds.

A policy's ``rank`` returns the candidates it bets on and their priorities; ``admit`` then
keeps those whose pair is missing from the cache or expires within the horizon -- the same
for every policy, so they differ only in the bet.

* ``verifier``: the paper's rule, the top ``fraction`` of all candidates by the VM's own
  score (the VM alone inside the served VM).
* ``random``: as many candidates, drawn uniformly (the baseline at equal cost).
* ``recurrence``: the top ``fraction`` by how often the pair was a candidate of the same user
  within the read TTL before (then how recently, then the VM's score): a pair the retrieval
  keeps returning is likely asked for again before its entry expires.
* ``oracle``: knows the future -- every candidate whose pair is labelled (shown) at a later
  request of the user, after the lag and within the TTL; the bound of any policy that only
  computes pairs it has seen as candidates. Built from a whole request log.

numpy and the standard library only; no Ray.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from solaris.errors import ConfigError, RequestError


def top_count(num_candidates: int, fraction: float) -> int:
    """How many candidates the top ``fraction`` holds: ceil(fraction * C), robust to float
    noise (0.1 * 30 is 3.0000000000000004, still 3)."""
    if not 0.0 <= fraction <= 1.0:
        raise RequestError(f"fraction={fraction!r}: must be in [0, 1]")
    return min(num_candidates, math.ceil(fraction * num_candidates - 1e-9))


@dataclass(frozen=True)
class Candidates:
    """One served request as a policy sees it: ``items`` (C,) int64 ids, ``scores`` (C,)
    the VM's scores (finite), ``ts`` its event time, ``user`` its user."""

    user: int
    ts: float
    items: np.ndarray
    scores: np.ndarray


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


def _by_score(req: Candidates, k: int) -> np.ndarray:
    return np.lexsort((req.items, -req.scores))[:k]  # best score first, then smaller id


class VerifierPolicy:
    """The top ``fraction`` of all candidates by the VM's score (ties: smaller item id)."""

    name = "verifier"

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        top = _by_score(req, top_count(len(req.items), fraction))
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


class RecurrencePolicy:
    """The top ``fraction`` by candidate recurrence: how many earlier requests of the user
    within ``read_ttl_s`` had the pair as a candidate, then how recent the last one was, then
    the VM's score. Remembers (user, item) -> its candidate times, pruned to the TTL."""

    name = "recurrence"

    def __init__(self, read_ttl_s: float) -> None:
        if not (math.isfinite(read_ttl_s) and read_ttl_s > 0):
            raise ConfigError(f"read_ttl_s={read_ttl_s!r}: must be a finite number > 0")
        self.ttl = float(read_ttl_s)
        self.seen: dict[tuple[int, int], list[float]] = {}

    def counts(self, req: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """(C,) earlier appearances within the TTL, (C,) seconds since the last (inf: none)."""
        n = np.zeros(len(req.items), np.int64)
        since = np.full(len(req.items), np.inf)
        for j, it in enumerate(req.items.tolist()):
            past = self.seen.get((req.user, it))
            if past:
                lo = bisect.bisect_left(past, req.ts - self.ttl)
                hi = bisect.bisect_left(past, req.ts)  # strictly earlier requests
                n[j] = hi - lo
                if hi > lo:
                    since[j] = req.ts - past[hi - 1]
        return n, since

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        n, since = self.counts(req)
        k = top_count(len(req.items), fraction)
        top = np.lexsort((req.items, -req.scores, since, -n))[:k]
        # priority: the count first, the VM's probability in [0, 1] as a tie-break
        return top, n[top] + np.clip(req.scores[top], 0.0, 1.0) * 0.999

    def observe(self, req: Candidates) -> None:
        cut = req.ts - self.ttl
        for it in req.items.tolist():
            past = self.seen.setdefault((req.user, it), [])
            if past and past[0] < cut:
                del past[:bisect.bisect_left(past, cut)]
            past.append(req.ts)


class OraclePolicy:
    """Every candidate whose pair is labelled at a later request of the same user at least
    ``lag_s`` and at most ``read_ttl_s`` after this one (``fraction`` is ignored: it computes
    exactly what will be read). ``labelled`` maps (user, item) to its labelled request times;
    ``from_log`` builds it from a ``RequestLog``."""

    name = "oracle"

    def __init__(self, labelled: dict[tuple[int, int], list[float]], read_ttl_s: float,
                 lag_s: float) -> None:
        self.labelled = {k: sorted(v) for k, v in labelled.items()}
        self.ttl, self.lag = float(read_ttl_s), float(lag_s)

    @classmethod
    def from_log(cls, request_log, read_ttl_s: float, lag_s: float) -> "OraclePolicy":
        lab: dict[tuple[int, int], list[float]] = {}
        r, c = np.nonzero(request_log.labelled)
        for u, it, t in zip(request_log.user[r].tolist(), request_log.candidates[r, c].tolist(),
                            request_log.ts[r].tolist()):
            lab.setdefault((int(u), int(it)), []).append(float(t))
        return cls(lab, read_ttl_s, lag_s)

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        hit = np.zeros(len(req.items), bool)
        for j, it in enumerate(req.items.tolist()):
            times = self.labelled.get((req.user, it))
            if times:
                # the first labelled time strictly later and at least the lag later
                k = max(bisect.bisect_right(times, req.ts),
                        bisect.bisect_left(times, req.ts + self.lag))
                hit[j] = k < len(times) and times[k] - req.ts <= self.ttl
        top = np.flatnonzero(hit)
        return top, np.ones(len(top))

    def observe(self, req: Candidates) -> None:
        pass


POLICIES = ("verifier", "random", "recurrence", "oracle")


def make_policy(name: str, *, seed: int = 0, read_ttl_s: float = 4 * 3600.0, lag_s: float = 0.0,
                request_log=None) -> Policy:
    """A policy by name (``POLICIES``); the oracle needs the ``request_log`` it foresees."""
    if name == "verifier":
        return VerifierPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "recurrence":
        return RecurrencePolicy(read_ttl_s)
    if name == "oracle":
        if request_log is None:
            raise ConfigError("policy 'oracle': needs the request log it foresees")
        return OraclePolicy.from_log(request_log, read_ttl_s, lag_s)
    raise ConfigError(f"policy={name!r}: one of {', '.join(POLICIES)}")
