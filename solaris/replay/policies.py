"""The speculation policies and bounds the replay compares with the verifier at equal FM cost
(``solaris.replay.coverage.compare_policies``, ``bench/policies.py``,
``bench/policy_bounds.py``); the live system runs only the verifier
(``solaris/precompute/speculation.py``, which defines ``Candidates``, ``Policy`` and
``admit``).

* ``recurrence``: the top ``fraction`` by how often the pair was a candidate of the same user
  within the read TTL before (then how recently, then the VM's score): a pair the retrieval
  keeps returning is likely asked for again before its entry expires.
* ``learned``: a logistic model of "this pair is labelled at a later request of the user,
  after the lag and within the TTL", refitted on the outcomes that have matured (requests
  older than TTL + lag, labels as fed back), on what is known when a request is served: the
  VM's score and rank, the candidate's position, its recurrence and recency as a candidate,
  the user's request rate and the time since the previous one, how often the item was
  labelled in the last day and whether this pair ever was -- in the spirit of learned cache
  admission (LRB, NSDI 2020). Until its first fit it bets as the verifier does.
* ``allocated``: the learned model's bets allocated across requests -- every candidate whose
  predicted probability reaches the threshold that admitted the top ``fraction`` of all
  candidates over the last day -- so the FM cost goes to the users likely to come back.
* ``returns``: a bound -- the verifier's bet, made only at requests whose user comes back
  after the lag and within the TTL (it knows future arrivals, not future rankings): what
  predicting returns perfectly would save. Built from a whole request log.
* ``hindsight``: a bound -- the learned policy's features and model fitted on the whole
  log's own outcomes (in sample), its bets allocated over the log: how well those features
  could rank the candidates at all. Built from a whole request log and its scores.
* ``oracle``: knows the future -- every candidate whose pair is labelled (shown) at a later
  request of the user, after the lag and within the TTL; the bound of any policy that only
  computes pairs it has seen as candidates. Built from a whole request log.

numpy and the standard library only; no Ray.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from solaris.errors import ConfigError, RequestError
from solaris.precompute.speculation import (Candidates, Policy, RandomPolicy, VerifierPolicy,
                                            by_score, top_count)


def labelled_later(times: list[float] | None, ts: float, lag_s: float, ttl_s: float) -> bool:
    """Whether a pair labelled at ``times`` (ascending) is labelled at a later request than
    ``ts``, at least ``lag_s`` and at most ``ttl_s`` after it: what an entry written at ``ts``
    would be read for (the oracle's bet, the learned policy's outcome)."""
    if not times:
        return False
    k = max(bisect.bisect_right(times, ts), bisect.bisect_left(times, ts + lag_s))
    return k < len(times) and times[k] - ts <= ttl_s


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
            hit[j] = labelled_later(self.labelled.get((req.user, it)), req.ts, self.lag,
                                    self.ttl)
        top = np.flatnonzero(hit)
        return top, np.ones(len(top))

    def observe(self, req: Candidates) -> None:
        pass


class ReturnsOraclePolicy(VerifierPolicy):
    """The verifier's bet, made only at requests whose user comes back: a later request at
    least ``lag_s`` and at most ``read_ttl_s`` after this one (any request, labelled or not);
    nothing elsewhere. It knows the future of arrivals but not of rankings, so its cost
    curve against the verifier's says how much of the verifier's FM cost goes to users who
    do not return while an entry could be read -- the most any policy that predicts returns
    could save. A bound, not a policy to run; ``from_log`` builds it from a
    ``RequestLog``."""

    name = "returns"

    def __init__(self, request_times: dict[int, list[float]], read_ttl_s: float,
                 lag_s: float) -> None:
        self.times = {u: sorted(v) for u, v in request_times.items()}
        self.ttl, self.lag = float(read_ttl_s), float(lag_s)

    @classmethod
    def from_log(cls, request_log, read_ttl_s: float, lag_s: float) -> "ReturnsOraclePolicy":
        times: dict[int, list[float]] = {}
        for u, t in zip(request_log.user.tolist(), request_log.ts.tolist()):
            times.setdefault(int(u), []).append(float(t))
        return cls(times, read_ttl_s, lag_s)

    def returns(self, user: int, ts: float) -> bool:
        """Whether ``user`` sends a request at least the lag and at most the TTL after
        ``ts``."""
        return labelled_later(self.times.get(int(user)), float(ts), self.lag, self.ttl)

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        if not self.returns(req.user, req.ts):
            return np.zeros(0, np.int64), np.zeros(0)
        return super().rank(req, fraction)


def fit_logistic(X: np.ndarray, y: np.ndarray, iters: int = 25
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(w, mu, sd): a logistic model of ``y`` (N,) in {0, 1} on ``X`` (N, F) standardised
    by ``mu``, ``sd``, by Newton's method on the loss with an L2 penalty of 1 on every weight
    but the intercept (``w[-1]``); a constant feature gets sd 1 and stays 0."""
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd > 1e-6, sd, 1.0)  # a constant feature stays 0, never blows up
    Z = np.column_stack([(X - mu) / sd, np.ones(len(X))])
    w = np.zeros(Z.shape[1])
    ridge = np.eye(len(w))
    ridge[-1, -1] = 0.0  # the intercept is not shrunk
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(Z @ w, -30, 30)))
        g = Z.T @ (p - y) + ridge @ w
        h = (Z * (p * (1 - p))[:, None]).T @ Z + ridge
        step = np.linalg.solve(h, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w, mu, sd


def predict_logistic(X: np.ndarray, w: np.ndarray, mu: np.ndarray, sd: np.ndarray
                     ) -> np.ndarray:
    """``fit_logistic``'s probabilities for ``X`` (standardised features clipped to ±10)."""
    z = np.column_stack([np.clip((X - mu) / sd, -10, 10), np.ones(len(X))]) @ w
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


FEATURES = ("vm_logit", "vm_rank", "position", "recurrence", "since_candidate",
            "user_requests", "since_user_request", "item_labels_day", "pair_labelled")


class LearnedPolicy:
    """Bets on the candidates a logistic model, refitted every ``refit_s`` of event time on
    matured outcomes, rates most likely to be labelled at a later request of the user within
    (lag, TTL]; the top ``fraction`` of them, priority = the predicted probability."""

    name = "learned"

    def __init__(self, read_ttl_s: float, lag_s: float, refit_s: float = 6 * 3600.0,
                 max_rows: int = 100_000, min_positives: int = 20) -> None:
        for name, v in (("read_ttl_s", read_ttl_s), ("refit_s", refit_s)):
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{name}={v!r}: must be a finite number > 0")
        if not (math.isfinite(lag_s) and lag_s >= 0):
            raise ConfigError(f"lag_s={lag_s!r}: must be a finite number >= 0")
        self.ttl, self.lag, self.refit_s = float(read_ttl_s), float(lag_s), float(refit_s)
        self.max_rows, self.min_positives = int(max_rows), int(min_positives)
        self.recur = RecurrencePolicy(read_ttl_s)
        self.user_ts: dict[int, list[float]] = {}
        self.item_labels: dict[int, list[float]] = {}  # item -> labelled request times
        self.pair_labels: dict[tuple[int, int], list[float]] = {}
        self.rows: list[tuple[float, int, np.ndarray, np.ndarray]] = []  # (ts, user, items, X)
        self.w: np.ndarray | None = None  # (F + 1,) on standardised features
        self.mu = self.sd = None
        self.next_fit: float | None = None
        self.fits = 0
        self._pending: np.ndarray | None = None  # features of the request just ranked

    def features(self, req: Candidates) -> np.ndarray:
        """(C, len(FEATURES)) what is known of each candidate when ``req`` is served."""
        c = len(req.items)
        s = np.clip(req.scores.astype(np.float64), 1e-6, 1 - 1e-6)
        n, since = self.recur.counts(req)
        past = [x for x in self.user_ts.get(req.user, []) if x < req.ts]
        recent = sum(1 for x in past if req.ts - x <= self.ttl)
        last = req.ts - past[-1] if past else 1e7
        seen_by = req.ts - self.lag  # feedback reaches the policy lag_s after its request
        day = np.zeros(c)
        pair = np.zeros(c)
        for j, it in enumerate(req.items.tolist()):
            t = self.item_labels.get(it)
            if t:
                day[j] = bisect.bisect_right(t, seen_by) - bisect.bisect_left(t, req.ts - 86400)
            p = self.pair_labels.get((req.user, it))
            pair[j] = bool(p) and p[0] <= seen_by
        rank = np.argsort(np.argsort(-s, kind="stable"), kind="stable") / c
        return np.column_stack([np.log(s / (1 - s)), rank, np.arange(c) / c, np.log1p(n),
                                np.log1p(np.minimum(since, self.ttl)),
                                np.full(c, np.log1p(recent)), np.full(c, np.log1p(min(last, 1e7))),
                                np.log1p(np.maximum(day, 0)), pair])

    def _outcome(self, ts: float, user: int, items: np.ndarray) -> np.ndarray:
        y = np.zeros(len(items))
        for j, it in enumerate(items.tolist()):
            y[j] = labelled_later(self.pair_labels.get((user, it)), ts, self.lag, self.ttl)
        return y

    def _fit(self, now: float) -> None:
        ripe = [r for r in self.rows if r[0] <= now - self.ttl - self.lag]
        if not ripe:
            return
        X = np.concatenate([r[3] for r in ripe])[-self.max_rows:]
        y = np.concatenate([self._outcome(r[0], r[1], r[2]) for r in ripe])[-self.max_rows:]
        if y.sum() < self.min_positives or y.sum() == len(y):
            return
        self.w, self.mu, self.sd = fit_logistic(X, y)
        self.fits += 1

    def predict(self, X: np.ndarray) -> np.ndarray | None:
        if self.w is None:
            return None
        return predict_logistic(X, self.w, self.mu, self.sd)

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        if self.next_fit is None:
            self.next_fit = req.ts + self.refit_s
        elif req.ts >= self.next_fit:
            self._fit(req.ts)
            self.next_fit = req.ts + self.refit_s
        X = self.features(req)
        self._pending = X
        p = self.predict(X)
        if p is None:  # no model yet: the verifier's bet
            top = by_score(req, top_count(len(req.items), fraction))
            return top, req.scores[top]
        return self._select(req, p, fraction)

    def _select(self, req: Candidates, p: np.ndarray, fraction: float
                ) -> tuple[np.ndarray, np.ndarray]:
        """The bets among the candidates given their predicted probabilities ``p``: the top
        ``fraction`` of this request (ties: smaller item id)."""
        top = np.lexsort((req.items, -p))[:top_count(len(req.items), fraction)]
        return top, p[top]

    def observe(self, req: Candidates, features: np.ndarray | None = None) -> None:
        """Learn from ``req`` once served; ``features``: its rows of ``features(req)`` where
        the caller already has them (default: those ``rank`` computed, else computed now)."""
        X = self._pending if features is None else features
        if X is None or len(X) != len(req.items):
            X = self.features(req)
        self._pending = None
        self.rows.append((req.ts, req.user, req.items.copy(), X))
        keep = 2 * self.max_rows // max(1, len(req.items)) + 1
        if len(self.rows) > 4 * keep:  # bounded memory: the latest requests only
            del self.rows[:len(self.rows) - keep]
        self.recur.observe(req)
        # bounded by time (requests come in event order): a user's request times within the
        # TTL plus the latest one before it (all ``features`` reads), an item's label times
        # of the last day
        ts = self.user_ts.setdefault(req.user, [])
        ts.append(req.ts)
        cut = bisect.bisect_left(ts, req.ts - self.ttl)
        if cut > 1:
            del ts[:cut - 1]
        if req.labelled is not None:
            for it in req.items[np.asarray(req.labelled, bool)].tolist():
                t = self.item_labels.setdefault(it, [])
                t.append(req.ts)
                old = bisect.bisect_left(t, req.ts - 86400)
                if old:
                    del t[:old]
                self.pair_labels.setdefault((req.user, it), []).append(req.ts)


class AllocatedPolicy(LearnedPolicy):
    """The learned model's bets allocated across requests, not per request: every candidate
    whose predicted probability reaches a threshold -- the one that, on the requests of the
    last ``window_s`` before the latest refit, admits the top ``fraction`` of all candidates
    -- so a request whose user is unlikely to come back within the TTL spends little or
    nothing, and one whose user is in the middle of a busy day spends more. The same FM cost
    as the per-request policies on average over that window; until the first fit, the
    verifier's bet."""

    name = "allocated"

    def __init__(self, read_ttl_s: float, lag_s: float, refit_s: float = 6 * 3600.0,
                 window_s: float = 86400.0, **kw) -> None:
        super().__init__(read_ttl_s, lag_s, refit_s, **kw)
        if not (math.isfinite(window_s) and window_s > 0):
            raise ConfigError(f"window_s={window_s!r}: must be a finite number > 0")
        self.window_s = float(window_s)
        self._preds: np.ndarray | None = None  # sorted predictions over the last window

    def _fit(self, now: float) -> None:
        super()._fit(now)
        if self.w is None:
            return
        recent = [r[3] for r in self.rows if r[0] >= now - self.window_s]
        self._preds = np.sort(self.predict(np.concatenate(recent))) if recent else None

    def _select(self, req: Candidates, p: np.ndarray, fraction: float
                ) -> tuple[np.ndarray, np.ndarray]:
        if self._preds is None or not len(self._preds):  # nothing recent to set it on
            return super()._select(req, p, fraction)
        n = len(self._preds)
        k = min(n, top_count(n, fraction))
        thr = self._preds[n - k] if k > 0 else np.inf
        keep = np.flatnonzero(p >= thr)
        order = keep[np.lexsort((req.items[keep], -p[keep]))]
        return order, p[order]


class HindsightPolicy:
    """A bound: the learned policy's features (``LearnedPolicy.features``, every request of
    the log seen in order) and model, fitted once on the whole log's own outcomes -- in
    sample, so it foresees them -- and its bets allocated over the whole log: every
    candidate whose predicted probability is among the top ``fraction`` of all the log's
    candidates, best first. No policy that reads only those features through a model of
    that form ranks the log's candidates better, so its cost curve against the learned and
    allocated policies splits their shortfall from the oracle into what the features cannot
    tell and what learning them from the past loses. ``from_log`` builds it from a
    ``RequestLog`` and the scores served; it must then see the log's requests in order."""

    name = "hindsight"

    def __init__(self, prob: np.ndarray, users: np.ndarray, ts: np.ndarray) -> None:
        self.prob = np.asarray(prob, np.float64)
        self.users, self.ts = np.asarray(users), np.asarray(ts, np.float64)
        self._sorted = np.sort(self.prob, axis=None)
        self._next = 0

    @classmethod
    def from_log(cls, request_log, scores: np.ndarray, read_ttl_s: float,
                 lag_s: float) -> "HindsightPolicy":
        r, c = request_log.candidates.shape
        s = np.asarray(scores, np.float64)
        if s.shape != (r, c):
            raise RequestError(f"scores: shape {s.shape}, expected {(r, c)}")
        learner = LearnedPolicy(read_ttl_s, lag_s)
        labelled = OraclePolicy.from_log(request_log, read_ttl_s, lag_s).labelled
        X = np.zeros((r, c, len(FEATURES)))
        y = np.zeros((r, c))
        for i in range(r):
            req = Candidates(int(request_log.user[i]), float(request_log.ts[i]),
                             request_log.candidates[i].astype(np.int64), s[i],
                             request_log.labelled[i])
            X[i] = learner.features(req)
            learner.observe(req, features=X[i])
            for j, it in enumerate(req.items.tolist()):
                y[i, j] = labelled_later(labelled.get((req.user, it)), req.ts, lag_s,
                                         read_ttl_s)
        flat = X.reshape(r * c, -1)
        if 0 < y.sum() < y.size:
            prob = predict_logistic(flat, *fit_logistic(flat, y.reshape(-1))).reshape(r, c)
        else:  # nothing (or everything) is read later: every candidate is as good a bet
            prob = np.full((r, c), y.mean() if y.size else 0.0)
        return cls(prob, request_log.user, request_log.ts)

    def rank(self, req: Candidates, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        i = self._next
        if i >= len(self.prob) or int(self.users[i]) != req.user or self.ts[i] != req.ts \
                or len(req.items) != self.prob.shape[1]:
            raise RequestError(f"hindsight bound: request {i} (user {req.user}, ts {req.ts})"
                               " is not the next request of the log it was fitted on")
        self._next += 1
        n = self._sorted.size
        k = top_count(n, fraction)
        thr = self._sorted[n - k] if k > 0 else np.inf
        p = self.prob[i]
        keep = np.flatnonzero(p >= thr)
        order = keep[np.lexsort((req.items[keep], -p[keep]))]
        return order, p[order]

    def observe(self, req: Candidates) -> None:
        pass


POLICIES = ("verifier", "random", "recurrence", "learned", "allocated", "returns", "oracle")
# the bounds that foresee the log: reported beside the policies, never as one of them
BOUNDS = ("returns", "oracle")
# ``HindsightPolicy`` is a bound too, built from the log and the scores served; fitting it
# costs a pass over the log, so only ``bench/policy_bounds.py`` runs it


def make_policy(name: str, *, seed: int = 0, read_ttl_s: float = 4 * 3600.0, lag_s: float = 0.0,
                request_log=None) -> Policy:
    """A policy by name (``POLICIES``); the bounds (``BOUNDS``) need the ``request_log`` they
    foresee."""
    if name == "verifier":
        return VerifierPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "recurrence":
        return RecurrencePolicy(read_ttl_s)
    if name == "learned":
        return LearnedPolicy(read_ttl_s, lag_s)
    if name == "allocated":
        return AllocatedPolicy(read_ttl_s, lag_s)
    if name in BOUNDS:
        if request_log is None:
            raise ConfigError(f"policy {name!r}: needs the request log it foresees")
        cls = OraclePolicy if name == "oracle" else ReturnsOraclePolicy
        return cls.from_log(request_log, read_ttl_s, lag_s)
    raise ConfigError(f"policy={name!r}: one of {', '.join(POLICIES)}")
