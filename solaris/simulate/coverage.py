"""The precompute schedule simulated on (user, item) keys alone: the verifier -> queue ->
budgeted FM -> store loop in event-time ticks, so budgets, TTLs and lags can be swept in
seconds without embeddings. Training reads its presence masks (``schedule.py``); the replay
checks the live system against it (``solaris/replay/coverage.py``)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from solaris.errors import ConfigError, DataError
from solaris.precompute.speculation import Candidates, Policy, RandomPolicy, VerifierPolicy, admit, top_count
from solaris.simulate.log import RequestLog


class _Pending:
    __slots__ = ("prio", "req_ts", "token", "group", "item")

    def __init__(self, prio: float, req_ts: float, token: int, group: tuple, item: int) -> None:
        self.prio, self.req_ts, self.token = prio, req_ts, token
        self.group, self.item = group, item


def simulate_pair_coverage(request_log: RequestLog, scores: np.ndarray, *, fraction: float = 0.2,
                           horizon_s: float, read_ttl_s: float, lag_s: float, tick_s: float,
                           budget_per_hour: float, seed: int = 0, random_picks: bool = False,
                           skip_pending: bool = False, record_writes: bool = False,
                           policy: Policy | None = None) -> dict:
    """Pair coverage of the precompute schedule, simulated on (user, item) keys.

    Event time advances in ticks of ``tick_s`` from ``floor(ts[0] / tick_s) * tick_s``; the
    requests of tick T (``T <= ts < T + tick_s``) are served in log order, then the tick ends:

    * serving at ts: a candidate's pair is *found* when the store holds it written at w with
      ``ts - w <= read_ttl_s`` (its age ``ts - w``);
    * the verifier (``solaris.online.verifier.choose``): the top ``ceil(fraction * C)`` candidates by
      ``scores[r]`` (ties: smaller item id; ``random_picks``: a seeded uniform sample of as
      many; ``policy``: any ``solaris.precompute.speculation.Policy``'s bets, the verifier's by
      default), those not found or with age > ``read_ttl_s - horizon_s``. They are queued with
      the policy's priority (the verifier's: the score; random picks': uniform random) and
      the request's ts. A pair already pending is merged as the live queue does (the router
      sends no in-flight mask): the higher priority is kept and the pair keeps its place,
      with the earlier request. ``skip_pending=True`` drops pending pairs at the verifier
      instead;
    * at the tick's end ``T_end = T + tick_s``: pending pairs whose request ts <=
      ``T_end - lag_s`` are eligible; ``budget_per_hour * tick_s / 3600`` evaluations are
      added to an allowance, its whole part is spent and lost if unused, its fraction
      carried. As the live queue leases (``solaris.precompute.pqueue``), pairs go by request group
      (user, request ts, surface): groups in order of their best pending priority (ties: the
      group created first), each whole, the last one the allowance ends inside cut to its
      best pairs (ties: smaller item id). Each taken pair is one FM evaluation and is
      written with ``written_at`` = its request's ts. ``budget_per_hour = 0``: every
      eligible pair is taken.

    ``scores`` (R, C): the VM's scores as served. Returns ``pair`` (coverage of labelled
    candidates), ``fm_evals``, ``precision`` (share of writes found by a later request before
    a newer write of the pair or expiry), ``found`` (R, C) bool, ``age_s`` (R, C) (NaN where
    not found), ``visible_age_s`` (R, C) how long before the read its entry was released (the
    read's ts minus the end of the tick that released it; NaN where not found),
    ``per_request_enqueued`` (R,) pairs sent to the queue, ``merged`` and ``pending_left``
    (still queued after the last tick). ``record_writes``: also ``writes``, the FM
    evaluations in the order made, as arrays ``user``, ``item``, ``surface``,
    ``written_at`` (the request ts its age counts from) and ``visible_at`` (the end of the
    tick that released it: requests from then on read it).
    """
    r, c = request_log.candidates.shape
    s = np.asarray(scores, np.float64)
    if s.shape != (r, c):
        raise DataError(f"scores: shape {s.shape}, expected {(r, c)}")
    pol: Policy = policy if policy is not None else \
        RandomPolicy(seed) if random_picks else VerifierPolicy()
    if not isinstance(pol, RandomPolicy) and not np.isfinite(s).all():
        raise DataError(f"scores: {int((~np.isfinite(s)).sum())} non-finite values")
    for name, v in (("horizon_s", horizon_s), ("lag_s", lag_s),
                    ("budget_per_hour", budget_per_hour)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{name}={v!r}: must be a finite number >= 0")
    for name, v in (("read_ttl_s", read_ttl_s), ("tick_s", tick_s)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{name}={v!r}: must be a finite number > 0")
    top_count(c, fraction)  # checks the fraction
    found = np.zeros((r, c), bool)
    age_s = np.full((r, c), np.nan)
    visible_age_s = np.full((r, c), np.nan)
    sent = np.zeros(r, np.int64)
    if r == 0:
        return {"pair": float("nan"), "fm_evals": 0, "precision": float("nan"), "found": found,
                "age_s": age_s, "visible_age_s": visible_age_s, "per_request_enqueued": sent,
                "merged": 0, "pending_left": 0,
                **({"writes": _write_arrays([])} if record_writes else {})}

    ts = request_log.ts.astype(np.float64)
    t0 = math.floor(ts[0] / tick_s) * tick_s
    tick_of = np.floor((ts - t0) / tick_s).astype(np.int64)
    cand = request_log.candidates
    width = int(cand.max()) + 1
    if (int(request_log.user.max()) + 1) * width < 2**62:
        keys = request_log.user.astype(np.int64)[:, None] * width + cand  # (R, C) pair keys
    else:  # Python ints never overflow
        keys = request_log.user.astype(object)[:, None] * width + cand.astype(object)

    store: dict[int, tuple[float, int, float]] = {}  # key -> (written_at, write index,
    #                                                    visible_at)
    read: list[bool] = []  # per write: found by a later request
    pending: dict[int, _Pending] = {}
    waiting: list[tuple[float, int, int]] = []  # (request ts, token, key), lazy
    state = {"token": 0, "allow": 0.0, "evals": 0, "merged": 0}
    group_order: dict[tuple, int] = {}  # request group -> creation order (the live gid)
    per_tick = budget_per_hour * tick_s / 3600.0
    log: list[tuple] | None = [] if record_writes else None

    def enqueue(key: int, prio: float, req_ts: float, group: tuple, item: int) -> None:
        state["token"] += 1
        group_order.setdefault(group, len(group_order))
        p = pending.get(key)
        if p is None:
            p = pending[key] = _Pending(prio, req_ts, state["token"], group, item)
        else:
            state["merged"] += 1
            p.prio = max(p.prio, prio)
            p.token = state["token"]
        heapq.heappush(waiting, (p.req_ts, p.token, key))

    def spend(ticks: int) -> int:
        """Add ``ticks`` ticks of allowance; its whole part (spent or lost), fraction kept."""
        allow = state["allow"] + ticks * per_tick
        n = math.floor(allow + 1e-9)
        state["allow"] = max(allow - n, 0.0)
        return n

    def live(token: int, key: int) -> bool:
        p = pending.get(key)
        return p is not None and p.token == token

    def release(j: int) -> None:
        """End of tick j: eligible pairs in, the allowance spent."""
        end = t0 + (j + 1) * tick_s
        cutoff = end - lag_s
        n = spend(1) if budget_per_hour > 0 else len(pending)
        groups: dict[tuple, list] = {}
        for key, p in pending.items():
            if p.req_ts <= cutoff:
                groups.setdefault(p.group, []).append((-p.prio, p.item, key))
        ranked = sorted(groups.items(), key=lambda g: (min(m[0] for m in g[1]),
                                                       group_order[g[0]]))
        for _, members in ranked:
            if n <= 0:
                break
            for _, _, key in sorted(members)[:n]:
                p = pending.pop(key)
                if log is not None:
                    log.append((p.group[0], p.item, p.group[2], p.req_ts, end))
                old = store.get(key)
                if old is None or p.req_ts >= old[0]:
                    store[key] = (p.req_ts, len(read), end)
                read.append(False)
                state["evals"] += 1
                n -= 1

    def idle_until(j: int, stop: int) -> int:
        """Skip ticks j..stop-1 in which nothing can be released; the first that can."""
        while waiting and not live(waiting[0][1], waiting[0][2]):
            heapq.heappop(waiting)
        if waiting and waiting[0][0] <= t0 + (j + 1) * tick_s - lag_s:
            nxt = j
        elif waiting:  # first tick whose end makes the earliest waiting pair eligible
            w = waiting[0][0]
            nxt = max(j, math.ceil((w + lag_s - t0) / tick_s) - 1)
            # the same test as release(), so float rounding cannot skip a tick
            while nxt > j and t0 + nxt * tick_s - lag_s >= w:
                nxt -= 1
            while t0 + (nxt + 1) * tick_s - lag_s < w:
                nxt += 1
        else:
            nxt = stop
        nxt = min(nxt, stop)
        if budget_per_hour > 0 and nxt > j:
            spend(nxt - j)
        return nxt

    i = 0
    while i < r:
        tick = int(tick_of[i])
        while i < r and tick_of[i] == tick:
            t = ts[i]
            row_keys = keys[i].tolist()
            fnd = found[i]
            age = age_s[i]
            vage = visible_age_s[i]
            for j in range(c):
                hit = store.get(row_keys[j])
                if hit is not None and t - hit[0] <= read_ttl_s:
                    fnd[j] = True
                    age[j] = t - hit[0]
                    vage[j] = t - hit[2]
                    read[hit[1]] = True
            req = Candidates(int(request_log.user[i]), float(t), cand[i], s[i],
                             request_log.labelled[i])
            top, prio = pol.rank(req, fraction)
            pol.observe(req)
            keep = admit(top, fnd, age, read_ttl_s, horizon_s)
            group = (int(request_log.user[i]), float(t), int(request_log.surface[i]))
            rank = 0
            for j, pr in zip(top[keep].tolist(), prio[keep].tolist()):
                key = row_keys[j]
                if skip_pending and key in pending:
                    continue
                enqueue(key, pr, t, group, int(cand[i, j]))
                rank += 1
            sent[i] = rank
            i += 1
        release(tick)
        if i < r:
            j = tick + 1
            stop = int(tick_of[i])
            while j < stop:
                j = idle_until(j, stop)
                if j < stop:
                    release(j)
                    j += 1

    lab = request_log.labelled
    writes = len(read)
    return {"pair": float(found[lab].mean()) if lab.any() else float("nan"),
            "fm_evals": state["evals"],
            "precision": float(sum(read)) / writes if writes else float("nan"),
            "found": found, "age_s": age_s, "visible_age_s": visible_age_s,
            "per_request_enqueued": sent,
            "merged": state["merged"], "pending_left": len(pending),
            **({"writes": _write_arrays(log)} if log is not None else {})}


def _write_arrays(log: list[tuple]) -> dict[str, np.ndarray]:
    a = np.asarray(log, np.float64).reshape(-1, 5)
    return {"user": a[:, 0].astype(np.int64), "item": a[:, 1].astype(np.int64),
            "surface": a[:, 2].astype(np.int64), "written_at": a[:, 3],
            "visible_at": a[:, 4]}
