"""The online behaviour history per user, in event time: what the FM's request part reads.

DESIGN.md step 6. Impressions arrive when a request is served; labels arrive later (or for
impressions this store never saw). ``batch`` turns the history *as of* each request's event
time into the FM's request-side inputs, the same keys and codes ``FeatureTables.batch``
builds offline (``solaris/features.py``), so the precompute path feeds the FM what training
fed it:

- events strictly before ``now``, most recent first (ties by arrival order), padded with 0;
- ``hist_item`` = item + 1, ``hist_surface`` = surface + 1 (0 where unknown),
  ``hist_item_cat`` = category + 1;
- ``hist_action`` = 1 + sum_k y_k 2^k; an impression whose labels have not arrived counts as
  all-zero labels;
- ``hist_age`` = log1p(hours between the event and ``now``).

Storage is bounded twice: a ring of ``cfg.max_events`` per user in preallocated numpy slabs
(the oldest arrival is overwritten) and at most ``cfg.max_users`` users (the least recently
active are evicted, ``cfg.evict_share`` of the bound at once). Not thread-safe.

Every write's event time is checked by a ``SkewGuard`` (``solaris/clock.py``) first: a time
too far ahead of the store's reference is refused before anything changes, so no user's
activity time (what eviction follows) can be pushed into the future.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pyarrow as pa

from solaris.cache.inputs import check_ids, check_time, check_times, check_user
from solaris.clock import EventClock, SkewGuard
from solaris.config import HistoryConfig
from solaris.errors import DataError, RequestError

log = logging.getLogger(__name__)

_MIN_SLOTS = 64
_MAX_TASKS = 15  # label bits live in an int32 action code
_COUNTERS = ("impressions", "labels_matched", "labels_appended", "overwritten", "users_evicted",
             "seed_present")
_COLUMNS = ("user", "item", "ts", "surface", "bits", "labelled", "seq", "active")


class HistoryStore:
    """Per-user event-time behaviour history: record impressions and labels, read FM inputs."""

    def __init__(self, cfg: HistoryConfig, clock: EventClock | None = None) -> None:
        self.cfg = cfg
        self.guard = SkewGuard(clock)  # the app's actors pass its clock; None: any time
        self._slot: dict[int, int] = {}  # user -> slot
        self._free: list[int] = []
        self._seq_next = 0  # global arrival counter (ties between equal times)
        self.num_tasks: int | None = None  # label width, fixed by the first labels
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._alloc_slabs(0)
        self._grow(min(cfg.max_users, _MIN_SLOTS))  # never empty: reads index slot 0

    # ------------------------------------------------------------------ slabs
    def _alloc_slabs(self, n: int) -> None:
        e = self.cfg.max_events
        self._item = np.zeros((n, e), np.int64)
        self._ts = np.zeros((n, e), np.float64)
        self._surface = np.zeros((n, e), np.int32)  # -1 = unknown
        self._bits = np.zeros((n, e), np.int32)  # sum_k y_k 2^k
        self._labelled = np.zeros((n, e), bool)
        self._seq = np.full((n, e), -1, np.int64)  # arrival order; -1 = empty cell
        self._count = np.zeros(n, np.int64)  # events ever written to the slot
        self._active = np.full(n, -np.inf)  # latest event time recorded for the user
        self._user = np.full(n, -1, np.int64)  # slot -> user; -1 = free

    def _grow(self, n: int) -> None:
        old = len(self._count)
        keep = {k: getattr(self, k) for k in ("_item", "_ts", "_surface", "_bits", "_labelled",
                                              "_seq", "_count", "_active", "_user")}
        self._alloc_slabs(n)
        for k, a in keep.items():
            getattr(self, k)[:old] = a
        self._free.extend(range(n - 1, old - 1, -1))

    def _evict(self) -> None:
        live = np.flatnonzero(self._user >= 0)
        k = min(len(live), max(1, int(self.cfg.max_users * self.cfg.evict_share)))
        victims = live[np.argpartition(self._active[live], k - 1)[:k]]
        for s in victims.tolist():
            del self._slot[int(self._user[s])]
        self._clear(victims)
        self._free.extend(victims.tolist())
        self.counters["users_evicted"] += k
        log.debug("history: evicted %d least recently active users", k)

    def _clear(self, slots: np.ndarray) -> None:
        self._seq[slots] = -1
        self._count[slots] = 0
        self._active[slots] = -np.inf
        self._user[slots] = -1

    def _slot_for(self, user: int) -> int:
        s = self._slot.get(user)
        if s is not None:
            return s
        if len(self._slot) >= self.cfg.max_users:
            self._evict()
        if not self._free:
            self._grow(min(self.cfg.max_users, max(_MIN_SLOTS, int(len(self._count) * 1.5))))
        s = self._free.pop()
        self._slot[user] = s
        self._user[s] = user
        return s

    def _append(self, s: int, items: np.ndarray, ts: np.ndarray, surfaces: np.ndarray,
                bits: np.ndarray, labelled: bool) -> None:
        e = self.cfg.max_events
        n = len(items)
        seq = self._seq_next + np.arange(n)
        self._seq_next += n
        if n > e:  # only the last e arrivals survive the ring
            self.counters["overwritten"] += n - e
            self._count[s] += n - e
            items, ts, surfaces, bits, seq = (a[n - e:] for a in (items, ts, surfaces, bits, seq))
            n = e
        pos = (self._count[s] + np.arange(n)) % e
        self.counters["overwritten"] += int(np.count_nonzero(self._seq[s, pos] >= 0))
        self._item[s, pos] = items
        self._ts[s, pos] = ts
        self._surface[s, pos] = surfaces
        self._bits[s, pos] = bits
        self._labelled[s, pos] = labelled
        self._seq[s, pos] = seq
        self._count[s] += n

    # ------------------------------------------------------------------ writes
    @staticmethod
    def _surfaces(surfaces: np.ndarray | int | None, n: int) -> np.ndarray:
        if surfaces is None:
            return np.full(n, -1, np.int32)
        s = np.broadcast_to(np.asarray(surfaces), (n,)) if np.ndim(surfaces) == 0 \
            else np.asarray(surfaces)
        if s.shape != (n,) or (n and (s.dtype.kind not in "iu" or s.min() < 0)):
            raise RequestError(f"surfaces: expected {n} non-negative integer codes, got "
                               f"shape {s.shape} dtype {s.dtype}")
        return s.astype(np.int32)

    def record_impressions(self, user: int, items: np.ndarray, surfaces: np.ndarray | int,
                           now: float) -> None:
        """Candidates shown to ``user`` at event time ``now`` (labels unknown yet)."""
        user = check_user(user)
        items = check_ids(items, "items")
        now = check_time(now)
        surf = self._surfaces(surfaces, len(items))
        if not len(items):
            return
        self.guard.check(now)
        s = self._slot_for(user)
        n = len(items)
        self._append(s, items, np.full(n, now), surf, np.zeros(n, np.int32), False)
        self._active[s] = max(self._active[s], now)
        self.counters["impressions"] += n

    def replay_log(self, users: np.ndarray, items: np.ndarray, surfaces: np.ndarray,
                   labels: np.ndarray, ts: np.ndarray) -> None:
        """Feed a logged interaction log (event order; one request per (user, ts)): each
        request's impressions, then its labels at the same event time. Idempotent: an event
        the user's history already holds (same item at the same time) is not added again
        (``seed_present``), so a seeding run that is repeated or resumed adds nothing twice."""
        if len(ts):  # the whole log or none of it
            self.guard.check(check_times(np.asarray(ts, np.float64), len(ts)), "ts")
        key = np.stack([np.asarray(users), np.asarray(ts)], 1)
        _, start, count = np.unique(key, axis=0, return_index=True, return_counts=True)
        for s, c in zip(start.tolist(), count.tolist()):
            rows = np.arange(s, s + c)
            u, t = int(users[s]), float(ts[s])
            slot = self._slot.get(u)
            if slot is not None:
                held = (self._seq[slot] >= 0) & (self._ts[slot] == t)
                if held.any():
                    rows = rows[~np.isin(items[rows], self._item[slot][held])]
                    self.counters["seed_present"] += c - len(rows)
                    if not len(rows):
                        continue
            self.record_impressions(u, items[rows], surfaces[rows], t)
            self.record_labels(u, items[rows], labels[rows], t,
                               ts=np.asarray(ts[rows], dtype=float))

    def record_labels(self, user: int, items: np.ndarray, labels: np.ndarray, now: float,
                      ts: np.ndarray | None = None,
                      surfaces: np.ndarray | int | None = None) -> None:
        """Labels (n, T) of 0/1 for ``user``'s ``items``, arriving at event time ``now``.

        Each label goes to the matching impression: same item, at ``ts`` when the
        impression times are given (else at or before ``now``), the earliest unlabelled one
        first (labels arrive in impression order), else the latest labelled one (labels are
        OR-ed: a later conversion adds to a click). A label with no matching impression
        (late past the ring, or never seen) is appended as an event at ``ts`` (else
        ``now``) with ``surfaces`` (else unknown).
        """
        user = check_user(user)
        items = check_ids(items, "items")
        now = check_time(now)
        n = len(items)
        y = np.asarray(labels, dtype=np.float64)
        if y.ndim != 2 or y.shape[0] != n or not np.isin(y, (0.0, 1.0)).all():
            raise RequestError(f"labels: expected ({n}, T) of 0/1, got shape {y.shape}")
        t = y.shape[1]
        ev_ts = np.full(n, now) if ts is None else np.asarray(ts, np.float64)
        if ev_ts.shape != (n,) or not np.isfinite(ev_ts).all():
            raise RequestError(f"ts: expected {n} finite event times, got shape {ev_ts.shape}")
        if n:  # one check of the latest: a refused call moves nothing
            latest = float(ev_ts.max())
            self.guard.check(max(now, latest), "ts" if latest > now else "now")
        if self.num_tasks is None:
            if not 1 <= t <= _MAX_TASKS:
                raise RequestError(f"labels: {t} tasks; 1..{_MAX_TASKS} supported")
            self.num_tasks = t
        elif t != self.num_tasks:
            raise RequestError(f"labels: {t} tasks, this history holds {self.num_tasks}")
        bits = (y.astype(np.int64) << np.arange(t)).sum(axis=1).astype(np.int32)  # (n,)
        surf = self._surfaces(surfaces, n)
        if not n:
            return
        s = self._slot_for(user)
        unmatched = []
        for j in range(n):
            when = (self._ts[s] == ev_ts[j]) if ts is not None else (self._ts[s] <= now)
            cand = np.flatnonzero((self._seq[s] >= 0) & (self._item[s] == items[j]) & when)
            if not len(cand):
                unmatched.append(j)
                continue
            fresh = cand[~self._labelled[s, cand]]
            # labels come in impression order: the earliest unlabelled impression first
            c = fresh[np.argmin(self._seq[s, fresh])] if len(fresh) else \
                cand[np.argmax(self._seq[s, cand])]
            self._bits[s, c] |= bits[j]
            self._labelled[s, c] = True
        self.counters["labels_matched"] += n - len(unmatched)
        if unmatched:
            u = np.asarray(unmatched)
            self._append(s, items[u], ev_ts[u], surf[u], bits[u], True)
            self.counters["labels_appended"] += len(u)
        self._active[s] = max(self._active[s], now)

    # ------------------------------------------------------------------ reads
    def window(self, users: np.ndarray, now: np.ndarray, history_len: int
               ) -> dict[str, np.ndarray]:
        """The raw history window of R requests as of their ``now``: the up to
        ``history_len`` events strictly before ``now``, most recent first (ties by latest
        arrival), as ``WINDOW_KEYS`` arrays of shape (R, L) -- ``valid`` marks real events,
        ``item``/``ts``/``surface``/``bits`` are 0 beyond them (``surface`` -1 = unknown).

        No side table is needed: a cache shard answers this for its users and the FM
        worker turns it into model inputs (``request_inputs``) with the tables it holds.
        """
        users = check_ids(users, "users")
        r = len(users)
        now = np.asarray(now, np.float64)
        if now.shape != (r,) or not np.isfinite(now).all():
            raise RequestError(f"now: expected {r} finite event times, got shape {now.shape}")
        if not isinstance(history_len, (int, np.integer)) or history_len < 1:
            raise RequestError(f"history_len={history_len!r}: must be an integer >= 1")
        L = int(history_len)
        slots = np.fromiter((self._slot.get(u, -1) for u in users.tolist()), np.int64, r)
        known = slots >= 0
        sc = np.where(known, slots, 0)
        seq, ts_all = self._seq[sc], self._ts[sc]  # (R, E) each
        valid = known[:, None] & (seq >= 0) & (ts_all < now[:, None])  # (R, E)
        # per row: valid events first, most recent first, ties by latest arrival
        k_ts = np.where(valid, -ts_all, np.inf)
        k_seq = np.where(valid, -seq, 0)
        order = np.lexsort((k_seq, k_ts), axis=-1)[:, :L]  # (R, min(E, L))

        def first_l(a: np.ndarray) -> np.ndarray:  # (R, E) -> (R, L), zero (pad) beyond E
            a = np.take_along_axis(a, order, 1)
            return np.pad(a, ((0, 0), (0, L - a.shape[1]))) if a.shape[1] < L else a

        v = first_l(valid)  # (R, L)
        return {"valid": v,
                "item": np.where(v, first_l(self._item[sc]), 0),  # (R, L)
                "ts": np.where(v, first_l(ts_all), 0.0),  # (R, L)
                "surface": np.where(v, first_l(self._surface[sc]), 0).astype(np.int32),
                "bits": np.where(v, first_l(self._bits[sc]), 0).astype(np.int32)}

    def batch(self, users: np.ndarray, now: np.ndarray, surfaces: np.ndarray,
              history_len: int, item_cat: np.ndarray, user_cat: np.ndarray,
              user_cont: np.ndarray, *, unseen_users: bool = False) -> dict[str, np.ndarray]:
        """FM request-side inputs (``REQUEST_KEYS``) of R requests, as of their ``now``:
        ``request_inputs`` over ``window`` (``unseen_users`` as there).

        ``item_cat`` (num_items, n_ic), ``user_cat`` (num_users, n_uc) and ``user_cont``
        (num_users, n_ud) are the side-feature tables (as in ``FeatureTables``).
        """
        win = self.window(users, now, history_len)
        return request_inputs(win, users, now, surfaces, item_cat, user_cat, user_cont,
                              unseen_users=unseen_users)

    def events(self, user: int) -> int:
        """Events held for ``user`` (0 when unknown or evicted)."""
        s = self._slot.get(int(user))
        return 0 if s is None else int(np.count_nonzero(self._seq[s] >= 0))

    def metrics(self) -> dict:
        """Users and events held, slab bytes and counters."""
        nbytes = sum(a.nbytes for a in (self._item, self._ts, self._surface, self._bits,
                                        self._labelled, self._seq, self._count, self._active,
                                        self._user))
        return {"users": len(self._slot), "events": int(np.count_nonzero(self._seq >= 0)),
                "slots": len(self._count), "bytes": int(nbytes), **self.counters,
                **self.guard.metrics()}

    # ------------------------------------------------------------------ state
    def snapshot(self) -> pa.Table:
        """Every held event (one row each) with its user's activity time; counters in the
        schema metadata. ``restore`` rebuilds a store that answers identically."""
        slot_ix, cell = np.nonzero(self._seq >= 0)
        o = np.argsort(self._seq[slot_ix, cell], kind="stable")
        slot_ix, cell = slot_ix[o], cell[o]
        cols = {"user": self._user[slot_ix], "item": self._item[slot_ix, cell],
                "ts": self._ts[slot_ix, cell], "surface": self._surface[slot_ix, cell],
                "bits": self._bits[slot_ix, cell], "labelled": self._labelled[slot_ix, cell],
                "seq": self._seq[slot_ix, cell], "active": self._active[slot_ix]}
        meta = {"counters": self.counters, "seq_next": self._seq_next,
                "num_tasks": self.num_tasks,
                "latest": self.guard.latest if math.isfinite(self.guard.latest) else None}
        return pa.table(cols).replace_schema_metadata({"solaris.history": json.dumps(meta)})

    def restore(self, table: pa.Table) -> None:
        """Replace this store's state with a snapshot's (the newest events per user and the
        most recently active users, if this store's bounds are smaller). A snapshot whose
        latest time is ahead of the guard's wall clock by more than its skew is reported:
        its events after the clock are dropped and no activity time passes the clock."""
        missing = [c for c in _COLUMNS if c not in table.column_names]
        if missing:
            raise DataError(f"history snapshot: missing columns {missing}")
        raw = (table.schema.metadata or {}).get(b"solaris.history")
        meta = json.loads(raw) if raw else {}
        c = {k: table.column(k).to_numpy() for k in _COLUMNS}
        times = np.concatenate([c["ts"], c["active"]])
        latest = meta.get("latest")
        if latest is None:
            latest = float(times[np.isfinite(times)].max()) if np.isfinite(times).any() \
                else -math.inf
        cut = self.guard.restored(float(latest), "history snapshot")
        if cut is not None:
            keep = c["ts"] <= cut
            c = {k: v[keep] for k, v in c.items()}
            c["active"] = np.minimum(c["active"], cut)
        self._slot, self._free = {}, []
        self._alloc_slabs(0)
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.counters.update(meta.get("counters", {}))
        self.num_tasks = meta.get("num_tasks")
        self._seq_next = int(meta.get("seq_next", int(c["seq"].max()) + 1 if len(c["seq"]) else 0))
        users, first = np.unique(c["user"], return_index=True)
        if len(users) > self.cfg.max_users:  # keep the most recently active
            keep = np.argsort(-c["active"][first], kind="stable")[:self.cfg.max_users]
            users = np.sort(users[keep])
        o = np.lexsort((c["seq"], c["user"]))
        su = c["user"][o]
        self._grow(max(len(users), min(self.cfg.max_users, _MIN_SLOTS)))
        e = self.cfg.max_events
        for u in users.tolist():
            lo, hi = np.searchsorted(su, [u, u + 1])
            rows = o[max(lo, hi - e):hi]  # the newest e arrivals, in arrival order
            s = self._slot_for(u)
            n = len(rows)
            self._item[s, :n], self._ts[s, :n] = c["item"][rows], c["ts"][rows]
            self._surface[s, :n], self._bits[s, :n] = c["surface"][rows], c["bits"][rows]
            self._labelled[s, :n], self._seq[s, :n] = c["labelled"][rows], c["seq"][rows]
            self._count[s] = n
            self._active[s] = c["active"][rows[-1]] if n else -math.inf
        log.info("history: restored %d users, %d events", len(self._slot),
                 int(np.count_nonzero(self._seq >= 0)))


WINDOW_KEYS = ("valid", "item", "ts", "surface", "bits")


def request_inputs(window: dict[str, np.ndarray], users: np.ndarray, now: np.ndarray,
                   surfaces: np.ndarray, item_cat: np.ndarray, user_cat: np.ndarray,
                   user_cont: np.ndarray, *, unseen_users: bool = False
                   ) -> dict[str, np.ndarray]:
    """FM request-side inputs (``REQUEST_KEYS``) from R requests' history ``window``
    (``HistoryStore.window``) and the side-feature tables; the codes are the module
    docstring's (the same ``FeatureTables.batch`` builds offline).

    A user id past the user tables (one the FM never saw: an appended or provisional code)
    is an error, unless ``unseen_users`` (an FM that declares
    ``solaris.models.api.ReadsUnseenUsers``): then its ``user`` is its id and its side
    features are zeros, as the VM reads such a user."""
    users = check_ids(users, "users")
    r = len(users)
    now = np.asarray(now, np.float64)
    if now.shape != (r,) or not np.isfinite(now).all():
        raise RequestError(f"now: expected {r} finite event times, got shape {now.shape}")
    surf = HistoryStore._surfaces(surfaces, r).astype(np.int64)
    missing = [k for k in WINDOW_KEYS if k not in window]
    if missing:
        raise RequestError(f"window: missing keys {missing}")
    v = np.asarray(window["valid"], bool)  # (R, L)
    if v.ndim != 2 or v.shape[0] != r:
        raise RequestError(f"window: expected ({r}, L) arrays, got shape {v.shape}")
    seen = users < len(user_cat)  # (R,)
    if not unseen_users and not seen.all():
        raise RequestError(f"users: id {int(users.max())} outside the user table "
                           f"({len(user_cat)} users)")
    item = np.where(v, window["item"], 0)  # (R, L)
    ts, bits = np.asarray(window["ts"]), np.asarray(window["bits"]).astype(np.int64)
    surf_h = np.asarray(window["surface"]).astype(np.int64)
    unknown = v & (item >= len(item_cat))  # items the FM has no row for (served as unknown)
    if unknown.any():  # left out, the rest moved up: the window the FM would have seen
        v = v & ~unknown
        order = np.argsort(~v, axis=1, kind="stable")  # (R, L) valid events first, in order
        v, item, ts, bits, surf_h = (np.take_along_axis(a, order, 1)
                                     for a in (v, item, ts, bits, surf_h))
        item = np.where(v, item, 0)
    age_h = (now[:, None] - ts) / 3600.0  # (R, L)
    rows = np.where(seen, users, 0)  # (R,) an unseen user's side features: zeros, below
    return {
        "user": users.copy(),
        "surface": surf,
        "user_cat": np.where(seen[:, None], np.asarray(user_cat)[rows], 0).astype(np.int64),
        "user_cont": np.where(seen[:, None], np.asarray(user_cont)[rows], 0
                              ).astype(np.float32),
        "hist_item": np.where(v, item + 1, 0),  # (R, L)
        "hist_action": np.where(v, 1 + bits, 0),  # (R, L)
        "hist_surface": np.where(v, surf_h + 1, 0),  # (R, L); unknown surface -> 0
        "hist_age": np.where(v, np.log1p(np.clip(age_h, 0.0, None)), 0.0
                             ).astype(np.float32),  # (R, L)
        "hist_item_cat": np.where(v[..., None], np.asarray(item_cat)[item] + 1, 0
                                  ).astype(np.int64),  # (R, L, n_ic)
    }


def merge_windows(parts: list[tuple[np.ndarray, dict[str, np.ndarray]]], rows: int,
                  history_len: int) -> dict[str, np.ndarray]:
    """One window of ``rows`` requests from partial windows: each part is (row indices,
    the window of those rows), e.g. one per cache shard. Rows no part covers read as
    empty histories."""
    L = history_len
    out = {"valid": np.zeros((rows, L), bool), "item": np.zeros((rows, L), np.int64),
           "ts": np.zeros((rows, L), np.float64), "surface": np.zeros((rows, L), np.int32),
           "bits": np.zeros((rows, L), np.int32)}
    for idx, win in parts:
        for k, a in out.items():
            a[idx] = win[k]
    return out
