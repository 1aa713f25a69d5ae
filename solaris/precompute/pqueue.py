"""The precompute queue (DESIGN.md steps 5-6): bounded, prioritised, grouped, leased.

What the queue actor wraps. Pairs arrive from the verifier in batches (``put``), each with
its priority (the VM score) and the request it came from (user, event time, surface);
identical (user, item, version) pairs are merged: the higher priority is kept, and the pair
stays with the earlier request by event time, whatever order the puts came in (it is computed
as soon as it is due: in a session, requests a minute or two apart would otherwise push it
back again and again). A worker ``lease``s whole request groups, highest priority first, so
it runs the FM's request part once per group; it ``ack``s after its cache write. A lease not
acked within ``cfg.lease_timeout_s`` wall seconds returns its pairs to the queue on the next
call (pairs may then be evaluated twice; the cost ledger counts such duplicates).

Bound: pending + leased pairs never exceed ``cfg.capacity``; past it the lowest-priority
pending pairs are dropped (ties: the oldest entry first) and counted. Leased pairs are in a
worker's hands and never dropped.

Durability is by snapshot: ``snapshot()`` holds every pending and leased pair, and
``restore`` queues them all as pending, so a queue restarted from its last snapshot loses
nothing that snapshot held; leased pairs may be evaluated again (a duplicate, counted).
What *can* be lost is what changed after the last snapshot: pairs put since are gone (the
verifier enqueues a pair again the next time its user is served while it is still missing),
and pairs acked since come back and are evaluated twice.

Wall time comes from the injected ``clock`` (or a ``now_wall`` argument), never from
``time.time`` inside; event time only travels with the pairs.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from solaris import wire
from solaris.cache.inputs import check_ids, check_version
from solaris.clock import EventClock, SkewGuard
from solaris.config import QueueConfig
from solaris.errors import DataError, RequestError

log = logging.getLogger(__name__)

PairKey = tuple[int, int, str]  # (user, item, version)
GroupKey = tuple[int, float, int, str]  # (user, event time, surface, version)
_COUNTERS = ("put", "accepted", "merged", "dropped", "leases", "leased_pairs", "acks",
             "acked_pairs", "late_acks", "nacks", "expired_leases", "expired_pairs")
_COLUMNS = ("user", "item", "version", "priority", "now", "surface", "leased")


@dataclass
class Group:
    """One request's pairs, as a worker receives them (the request part runs once for it)."""

    user: int
    now: float  # event time of the request: the history is read as of it
    surface: int
    version: str  # FM+encoder version to compute
    items: np.ndarray  # (n,) int64, highest priority first
    priorities: np.ndarray  # (n,) float64
    queued_at: float = float("nan")  # wall time the group was first queued (precompute lag)


@dataclass
class Lease:
    """Whole request groups leased to one worker until ``deadline`` (wall time)."""

    lease_id: str
    groups: list[Group]
    deadline: float
    # the event time every group's history is read as of (the replay's gate: the tick end
    # that releases the lease, ``ScheduleConfig.history_at="visible"``); None: each group's
    # own request time. The cache entries keep their request's time either way.
    read_at: float | None = None

    @property
    def num_pairs(self) -> int:
        return sum(len(g.items) for g in self.groups)

    def to_frame(self) -> bytes:
        """This lease as one ``lease`` frame (``solaris.wire``): what an FM worker receives."""
        g = self.groups
        versions = [x.version for x in g]
        if any(_SEP in v for v in versions):
            raise ValueError(f"lease: a version string holds {_SEP!r}")
        n = len(g)
        return wire.encode("lease", (
            str(self.lease_id), float(self.deadline),
            np.fromiter((x.user for x in g), np.int64, n),
            np.fromiter((x.now for x in g), np.float64, n),
            np.fromiter((x.surface for x in g), np.int64, n), _SEP.join(versions),
            np.fromiter((len(x.items) for x in g), np.int64, n),
            (np.concatenate([np.asarray(x.items, np.int64) for x in g]) if n
             else np.zeros(0, np.int64)),
            (np.concatenate([np.asarray(x.priorities, np.float64) for x in g]) if n
             else np.zeros(0)),
            np.fromiter((x.queued_at for x in g), np.float64, n),
            float("nan") if self.read_at is None else float(self.read_at)))

    @classmethod
    def from_frame(cls, buf: Any) -> "Lease":
        """The lease ``to_frame`` framed (writable arrays, as leased)."""
        lease_id, deadline, users, nows, surfs, versions, counts, items, prios, queued, at = (
            wire.decode(buf, "lease", 11))
        ends = np.cumsum(counts).tolist()
        starts = [0, *ends[:-1]]
        vs = versions.split(_SEP) if len(users) else []
        groups = [Group(u, t, s, v, items[a:b].copy(), prios[a:b].copy(), q)
                  for u, t, s, v, a, b, q in zip(users.tolist(), nows.tolist(), surfs.tolist(),
                                                 vs, starts, ends, queued.tolist())]
        return cls(lease_id, groups, deadline, None if math.isnan(at) else at)


_SEP = "\x1f"  # between the groups' version strings in a lease frame


class _Pair:
    __slots__ = ("prio", "gid", "token")

    def __init__(self, prio: float, gid: int, token: int) -> None:
        self.prio, self.gid, self.token = prio, gid, token


class _Group:
    __slots__ = ("key", "items", "prio", "token", "order", "born")

    def __init__(self, key: GroupKey, order: int, born: float = float("nan")) -> None:
        self.key = key
        self.born = born  # wall time first queued
        self.items: dict[int, float] = {}  # item -> priority
        self.prio = -np.inf
        self.token = -1
        self.order = order  # creation order: FIFO among equal priorities


class PrecomputeQueue:
    """Bounded priority queue of (user, item, version) pairs grouped by request, with leases.

    Not thread-safe: one call at a time (the queue actor serialises its calls).
    """

    def __init__(self, cfg: QueueConfig, clock: Callable[[], float] = time.monotonic,
                 event_clock: EventClock | None = None) -> None:
        self.cfg = cfg
        self._clock = clock
        # a request's event time too far ahead is refused (``solaris/clock.py``): an FM
        # worker would read the history as of it and stamp the cache with it
        self.guard = SkewGuard(event_clock)
        self._epoch = uuid.uuid4().hex[:8]  # lease ids never repeat across restarts
        self._pending: dict[PairKey, _Pair] = {}
        self._groups: dict[int, _Group] = {}
        self._gid_of: dict[GroupKey, int] = {}
        self._next_gid = 0
        self._tok = 0
        self._drop_heap: list[tuple[float, int, PairKey]] = []  # (prio, token, key), lazy
        self._lease_heap: list[tuple[float, int, int, int]] = []  # (-prio, order, token, gid)
        self._leases: dict[str, Lease] = {}
        self._leased: dict[PairKey, str] = {}  # leased pair -> lease id
        self._next_lease = 0
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._lag = [0, 0.0]  # acked groups, their summed queued -> acked wall seconds
        # the event-time gate (replay): only groups whose request time is <= ``_until`` are
        # leased, and at most ``_allowance`` pairs in all (None: no gate / no limit)
        self._until: float | None = None
        self._allowance: int | None = None
        self._read_at: float | None = None  # the history time of the gate's leases

    # ------------------------------------------------------------------ internals
    def _token(self) -> int:
        self._tok += 1
        return self._tok

    def _group_for(self, key: GroupKey) -> int:
        gid = self._gid_of.get(key)
        if gid is None:
            gid = self._gid_of[key] = self._next_gid
            self._groups[gid] = _Group(key, gid, self._clock())
            self._next_gid += 1
        return gid

    def _push_group(self, g: _Group, gid: int) -> None:
        g.token = self._token()
        heapq.heappush(self._lease_heap, (-g.prio, g.order, g.token, gid))

    def _group_set(self, gid: int, item: int, prio: float) -> None:
        g = self._groups[gid]
        g.items[item] = prio
        if prio > g.prio:
            g.prio = prio
            self._push_group(g, gid)

    def _group_remove(self, gid: int, item: int) -> None:
        g = self._groups[gid]
        prio = g.items.pop(item)
        if not g.items:
            del self._groups[gid], self._gid_of[g.key]
        elif prio >= g.prio:
            g.prio = max(g.items.values())
            self._push_group(g, gid)

    def _add(self, key: PairKey, prio: float, now: float, surface: int) -> str:
        """Queue one pair as pending; 'new', 'merged' (into pending) or 'in_flight' (leased)."""
        if key in self._leased:
            return "in_flight"
        p = self._pending.get(key)
        gkey = (key[0], now, surface, key[2])
        if p is None:
            gid = self._group_for(gkey)
            p = self._pending[key] = _Pair(prio, gid, self._token())
            self._group_set(gid, key[1], prio)
            heapq.heappush(self._drop_heap, (prio, p.token, key))
            return "new"
        old = self._groups[p.gid]
        # the earlier request, whatever order the puts came in (a router's concurrent
        # requests flush in the order they finish)
        if now < old.key[1]:
            self._group_remove(p.gid, key[1])
            p.gid = self._group_for(gkey)
        p.prio = max(p.prio, prio)
        p.token = self._token()
        self._group_set(p.gid, key[1], p.prio)
        heapq.heappush(self._drop_heap, (p.prio, p.token, key))
        return "merged"

    def _remove_pending(self, key: PairKey) -> None:
        p = self._pending.pop(key)
        self._group_remove(p.gid, key[1])

    def _enforce_bound(self) -> None:
        over = len(self._pending) + len(self._leased) - self.cfg.capacity
        while over > 0 and self._pending:
            prio, token, key = heapq.heappop(self._drop_heap)
            p = self._pending.get(key)
            if p is None or p.token != token:
                continue  # stale heap entry
            self._remove_pending(key)
            self.counters["dropped"] += 1
            over -= 1
        self._compact()

    def _compact(self) -> None:
        """Rebuild a heap once stale entries outnumber live ones (bounds their memory)."""
        if len(self._drop_heap) > 2 * len(self._pending) + 1024:
            self._drop_heap = [(p.prio, p.token, k) for k, p in self._pending.items()]
            heapq.heapify(self._drop_heap)
        if len(self._lease_heap) > 2 * len(self._groups) + 1024:
            self._lease_heap = [(-g.prio, g.order, g.token, gid)
                                for gid, g in self._groups.items()]
            heapq.heapify(self._lease_heap)

    def _now(self, now_wall: float | None) -> float:
        now = float(self._clock() if now_wall is None else now_wall)
        if not np.isfinite(now):
            raise RequestError(f"now_wall={now!r}: must be a finite wall-clock time")
        return now

    def _return(self, lease: Lease) -> int:
        """Put a lease's pairs back as pending (merging with anything queued since)."""
        n = 0
        for g in lease.groups:
            for item, prio in zip(g.items.tolist(), g.priorities.tolist()):
                key = (g.user, item, g.version)
                del self._leased[key]
                self._add(key, prio, g.now, g.surface)
                n += 1
        return n

    def _reclaim(self, now_wall: float) -> None:
        for lid in [lid for lid, ls in self._leases.items() if now_wall >= ls.deadline]:
            n = self._return(self._leases.pop(lid))
            self.counters["expired_leases"] += 1
            self.counters["expired_pairs"] += n
            log.warning("lease %s expired: %d pairs back in the queue", lid, n)

    # ------------------------------------------------------------------ API
    def put(self, users: np.ndarray, items: np.ndarray, priorities: np.ndarray,
            now: np.ndarray | float, surfaces: np.ndarray | int, version: str,
            now_wall: float | None = None) -> int:
        """Queue a batch of pairs; returns how many were new (not merged, not in flight).

        ``now`` / ``surfaces``: each pair's request event time and surface (scalars or
        (n,)); pairs sharing (user, now, surface, version) form one request group.
        """
        self._reclaim(self._now(now_wall))
        users, items = check_ids(users, "users"), check_ids(items, "items")
        version = check_version(version)
        n = len(users)
        pr = np.asarray(priorities, np.float64)
        nows = np.broadcast_to(np.asarray(now, np.float64), (n,))
        surf = np.broadcast_to(np.asarray(surfaces), (n,))
        if len(items) != n or pr.shape != (n,):
            raise RequestError(f"items / priorities: lengths {len(items)} / {pr.shape} != "
                               f"users length {n}")
        if not (np.isfinite(pr).all() and np.isfinite(nows).all()):
            raise RequestError("priorities / now: must be finite")
        if n and (surf.dtype.kind not in "iu" or surf.min() < 0):
            raise RequestError(f"surfaces: expected non-negative integer codes, got {surf.dtype}")
        self.guard.check(nows)  # the whole batch or none of it
        new = 0
        for u, i, p, t, s in zip(users.tolist(), items.tolist(), pr.tolist(), nows.tolist(),
                                 surf.tolist()):
            what = self._add((u, i, version), p, t, s)
            new += what == "new"
        self.counters["put"] += n
        self.counters["accepted"] += new
        self.counters["merged"] += n - new
        self._enforce_bound()
        return new

    def lease(self, max_pairs: int | None = None, now_wall: float | None = None,
              version: str | None = None) -> Lease | None:
        """Lease the highest-priority request groups, whole, up to ``max_pairs`` pairs (at
        least one group, however large); only groups of ``version`` when given. None when
        nothing is pending."""
        now = self._now(now_wall)
        self._reclaim(now)
        limit = self.cfg.lease_pairs if max_pairs is None else int(max_pairs)
        if limit < 1:
            raise RequestError(f"max_pairs={max_pairs!r}: must be >= 1")
        taken: list[Group] = []
        skipped: list[tuple[float, int, int, int]] = []
        total = 0
        while self._lease_heap:
            entry = self._lease_heap[0]
            g = self._groups.get(entry[3])
            if g is None or g.token != entry[2]:
                heapq.heappop(self._lease_heap)  # stale
                continue
            if (version is not None and g.key[3] != version) or \
                    (self._until is not None and g.key[1] > self._until):
                skipped.append(heapq.heappop(self._lease_heap))
                continue
            room = None if self._allowance is None else self._allowance - total
            if room is not None and room <= 0:
                break
            if taken and total + len(g.items) > limit:
                break
            if room is not None and len(g.items) > room:  # the allowance ends inside it
                taken.append(self._take_top(entry[3], room))
            else:
                heapq.heappop(self._lease_heap)
                taken.append(self._take(entry[3]))
            total += len(taken[-1].items)
        for entry in skipped:
            heapq.heappush(self._lease_heap, entry)
        if not taken:
            return None
        if self._allowance is not None:
            self._allowance -= total
        lid = f"{self._epoch}-{self._next_lease}"
        self._next_lease += 1
        lease = Lease(lid, taken, now + self.cfg.lease_timeout_s, self._read_at)
        self._leases[lid] = lease
        for g in taken:
            for item in g.items.tolist():
                self._leased[(g.user, item, g.version)] = lid
        self.counters["leases"] += 1
        self.counters["leased_pairs"] += total
        self._compact()
        return lease

    def _take(self, gid: int) -> Group:
        g = self._groups.pop(gid)
        del self._gid_of[g.key]
        user, now, surface, version = g.key
        items = np.fromiter(g.items.keys(), np.int64, len(g.items))
        prios = np.fromiter(g.items.values(), np.float64, len(g.items))
        o = np.lexsort((items, -prios))
        for item in items.tolist():
            del self._pending[(user, item, version)]
        return Group(user, now, surface, version, items[o], prios[o], g.born)

    def _take_top(self, gid: int, n: int) -> Group:
        """The ``n`` highest-priority pairs of group ``gid`` (ties: smaller item id); the
        rest stay pending in the group."""
        g = self._groups[gid]
        user, now, surface, version = g.key
        items = np.fromiter(g.items.keys(), np.int64, len(g.items))
        prios = np.fromiter(g.items.values(), np.float64, len(g.items))
        o = np.lexsort((items, -prios))[:n]
        for item in items[o].tolist():
            self._group_remove(gid, item)
            del self._pending[(user, item, version)]
        return Group(user, now, surface, version, items[o], prios[o], g.born)

    def set_gate(self, until: float | None, allowance: int | None,
                 read_at: float | None = None) -> None:
        """The replay's event-time gate: from now on lease only request groups of event time
        <= ``until``, and at most ``allowance`` pairs in all until the next call (None: no
        gate / no limit). A group the allowance ends inside is split: its best pairs go,
        the rest stays pending. Leases issued under it carry ``read_at`` (``Lease.read_at``:
        the event time the workers read every group's history as of; None: each group's
        request time). Production runs with no gate."""
        for name, v in (("until", until), ("read_at", read_at)):
            if v is not None and not np.isfinite(v):
                raise RequestError(f"{name}={v!r}: must be a finite event time or None")
        if allowance is not None and int(allowance) < 0:
            raise RequestError(f"allowance={allowance!r}: must be >= 0 or None")
        if read_at is not None and until is not None and read_at < until:
            raise RequestError(f"read_at={read_at!r}: before the gate's until={until!r} (a "
                               "group's history would miss events before its own request)")
        self._until = None if until is None else float(until)
        self._allowance = None if allowance is None else int(allowance)
        self._read_at = None if read_at is None else float(read_at)

    def eligible(self) -> int:
        """Pending pairs a lease could take now (under the gate and its allowance)."""
        if self._allowance == 0:
            return 0
        n = sum(len(g.items) for g in self._groups.values()
                if self._until is None or g.key[1] <= self._until)
        return n if self._allowance is None else min(n, self._allowance)

    def ack(self, lease_id: str, now_wall: float | None = None) -> bool:
        """The lease's pairs are in the cache: forget them. False if the lease is unknown
        or already expired (its pairs went back to the queue; counted as a late ack)."""
        self._reclaim(self._now(now_wall))
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            self.counters["late_acks"] += 1
            return False
        for g in lease.groups:
            for item in g.items.tolist():
                del self._leased[(g.user, item, g.version)]
        self.counters["acks"] += 1
        self.counters["acked_pairs"] += lease.num_pairs
        now = self._now(now_wall)
        for g in lease.groups:  # queued -> written (acked): the precompute lag, wall seconds
            if g.queued_at == g.queued_at:
                self._lag[0] += 1
                self._lag[1] += now - g.queued_at
        return True

    def nack(self, lease_id: str, now_wall: float | None = None) -> bool:
        """Give a lease back unprocessed (a worker that failed): its pairs are pending now."""
        self._reclaim(self._now(now_wall))
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        self._return(lease)
        self.counters["nacks"] += 1
        return True

    def contains(self, users: np.ndarray, items: np.ndarray, version: str) -> np.ndarray:
        """(n,) bool: pair pending or leased (in flight; the verifier skips these)."""
        users, items = check_ids(users, "users"), check_ids(items, "items")
        if len(items) != len(users):
            raise RequestError(f"items: length {len(items)} != users length {len(users)}")
        keys = zip(users.tolist(), items.tolist())
        return np.fromiter(((u, i, version) in self._pending or (u, i, version) in self._leased
                            for u, i in keys), bool, len(users))

    def metrics(self, now_wall: float | None = None) -> dict:
        """Depth (pending pairs), groups, leased pairs and leases, counters; ``oldest_wait_s``:
        wall seconds the longest-waiting pending group has been queued (0 when none is; what
        the FM pool scales on besides the depth)."""
        now = self._now(now_wall)
        self._reclaim(now)
        born = [g.born for g in self._groups.values() if g.born == g.born]
        return {"depth": len(self._pending), "groups": len(self._groups),
                "oldest_wait_s": max(0.0, now - min(born)) if born else 0.0,
                "eligible": self.eligible(), "gate_until": self._until,
                "gate_read_at": self._read_at,
                "oldest_pending": min((g.key[1] for g in self._groups.values()), default=None),
                "allowance": self._allowance,
                "leased": len(self._leased), "open_leases": len(self._leases),
                "capacity": self.cfg.capacity, **self.counters, **self.guard.metrics(),
                "lag_s_mean": self._lag[1] / self._lag[0] if self._lag[0] else None}

    # ------------------------------------------------------------------ durability
    def snapshot(self) -> pa.Table:
        """Every pending and leased pair (one row each), counters in the schema metadata."""
        rows: dict[str, list] = {c: [] for c in _COLUMNS}

        def emit(key: PairKey, prio: float, now: float, surface: int, leased: bool) -> None:
            for c, v in zip(_COLUMNS, (key[0], key[1], key[2], prio, now, surface, leased)):
                rows[c].append(v)
        for key, p in self._pending.items():
            _, now, surface, _ = self._groups[p.gid].key
            emit(key, p.prio, now, surface, False)
        for lease in self._leases.values():
            for g in lease.groups:
                for item, prio in zip(g.items.tolist(), g.priorities.tolist()):
                    emit((g.user, item, g.version), prio, g.now, g.surface, True)
        schema = pa.schema([("user", pa.int64()), ("item", pa.int64()), ("version", pa.string()),
                            ("priority", pa.float64()), ("now", pa.float64()),
                            ("surface", pa.int64()), ("leased", pa.bool_())],
                           metadata={"solaris.queue": json.dumps({
                               "counters": self.counters,
                               "latest": self.guard.latest if math.isfinite(self.guard.latest)
                               else None})})
        return pa.table(rows, schema=schema)

    def restore(self, table: pa.Table) -> int:
        """Queue a snapshot's pairs (pending and leased alike) as pending, merging with
        anything already queued, and add its counters; returns the pairs queued. A snapshot
        whose latest request time is ahead of the guard's wall clock by more than its skew
        is reported, and its pairs of requests after the clock are dropped."""
        missing = [c for c in _COLUMNS if c not in table.column_names]
        if missing:
            raise DataError(f"queue snapshot: missing columns {missing}")
        raw = (table.schema.metadata or {}).get(b"solaris.queue")
        meta = json.loads(raw) if raw else {}
        for k, v in meta.get("counters", {}).items():
            if k in self.counters:
                self.counters[k] += int(v)
        c = {k: table.column(k).to_pylist() for k in _COLUMNS}
        latest = meta.get("latest")
        if latest is None:
            latest = max(c["now"], default=-math.inf)
        cut = self.guard.restored(float(latest), "queue snapshot")
        if cut is not None:
            keep = [t <= cut for t in c["now"]]
            c = {k: [x for x, kept in zip(v, keep) if kept] for k, v in c.items()}
        for u, i, v, p, t, s in zip(c["user"], c["item"], c["version"], c["priority"],
                                    c["now"], c["surface"]):
            self._add((int(u), int(i), str(v)), float(p), float(t), int(s))
        self._enforce_bound()
        log.info("queue: restored %d pairs (%d were leased)", table.num_rows, sum(c["leased"]))
        return len(self._pending)
