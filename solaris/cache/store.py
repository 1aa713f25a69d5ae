"""One shard's pair-embedding store: numpy slabs, a hash index, TTL by time buckets, versions.

Layout (no Python object per entry: ~180 bytes per fp32 entry of width 32, ~90 for int8,
index and running sums included):

- ``table``: the ``slab.SlotTable`` -- one 32-byte ``slab.META`` record per slot (user,
  item, written_at, verifier score, version id, read flag; version id 0 marks a free slot),
  the encoded vector of each slot (``codec.Codec`` bytes, int8 scale inline), the free list
  and the ``HashIndex`` over (user, item, version id) -> slot.
- ``_sums``: ``UserSums``, float64 running sums per (user, version) for the aggregate.
- the versions (name <-> id, live entries of each) and the time buckets (live entries
  written in each).

Answers (``answer.py``) read the table and the sums through a ``StoreView``; snapshots
(``snapshot.py``) are ``to_table`` / ``from_table`` of the same parts.

Two windows (DESIGN.md): an entry is served as a pair embedding while
``now - written_at <= read_ttl_s``, and kept (for the aggregate) until its whole time bucket
(``bucket_s``) is older than ``retention_s``: bucket ``k = floor(t / bucket_s)`` is dropped
once ``(k + 1) * bucket_s <= now - retention_s``. Every public call first drops the buckets
its ``now`` has passed, so memory is reclaimed with no writes: slots are freed, and when
less than 60% of the slab is live the slab and the index are rebuilt smaller.

``now`` is event time, always passed in, and checked by a ``SkewGuard`` (``solaris/clock.py``)
before anything changes: a time too far ahead of the store's reference is refused, so no
single call can expire everything. An entry written after the time it is read at is never
served (no negative ages). Versions travel in the key: a lookup of one version never sees
another's entries.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pyarrow as pa

from solaris.cache import answer as _answer
from solaris.cache import snapshot as _snap
from solaris.cache.codec import Codec
from solaris.cache.index import key_hash
from solaris.cache.journal import Changes, Journal
from solaris.cache.inputs import (check_ids, check_query, check_time, check_times,
                                  check_version)
from solaris.cache.query import ShardAnswer, ShardQuery
from solaris.cache.slab import SlotTable
from solaris.cache.sums import UserSums
from solaris.clock import EventClock, SkewGuard
from solaris.config import CacheConfig
from solaris.errors import RequestError

log = logging.getLogger(__name__)

_COUNTERS = ("pair_hits", "pair_misses", "pair_stale", "pair_other_version", "nbr_probes",
             "nbr_hits", "inbr_probes", "inbr_hits", "agg_requests", "agg_present",
             "evictions", "expired", "expired_unread", "dropped_on_put", "replaced",
             "replaced_read", "duplicates", "evicted_live", "evicted_read", "dropped_on_restore")
# what reads count (answer.py): a read replica counts them and sends them back to the shard
READ_COUNTERS = _COUNTERS[:10]


def lowest(score: np.ndarray, written: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k entries lowest by (score, then written_at): eviction order. O(n)."""
    n = len(score)
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    thr = np.partition(score, k - 1)[k - 1]
    strict = np.flatnonzero(score < thr)
    ties = np.flatnonzero(score == thr)
    need = k - len(strict)
    if need < len(ties):
        ties = ties[np.argpartition(written[ties], need - 1)[:need]]
    return np.concatenate([strict, ties])


class PairStore:
    """Pair embeddings of one shard: batch put / get / aggregate / holders / answer.

    Not thread-safe: one call at a time (the shard actor serialises its calls).

    Every change to the entries is journalled (``journal``; ``cache.journal_records``, 0:
    none) for the routers' read replicas: ``changes`` answers a replica's pull,
    ``apply_reads`` takes back the read marks and read counts it made.
    """

    table_class = SlotTable

    def __init__(self, cfg: CacheConfig, clock: EventClock | None = None,
                 journal: bool = True) -> None:
        self.cfg = cfg
        self.guard = SkewGuard(clock)  # the app's actors pass its clock; None: any time
        self.codec = Codec(cfg.codec, cfg.dim)
        self.table = self.table_class(self.codec, cfg.capacity)
        self.journal = (Journal(cfg.journal_records, self.codec.row_bytes)
                        if journal and cfg.journal_records > 0 else None)
        self._sums = UserSums(cfg.dim)
        self._vid: dict[str, int] = {}  # version -> id (1..65535); ids are never reused
        self._vnames: list[str] = [""]
        self._buckets: dict[int, int] = {}  # time bucket -> live entries written in it
        self._vcount: dict[int, int] = {}  # version id -> live entries
        self._max_now = -math.inf  # latest event time seen; expiry never goes back
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._view = _answer.StoreView(self.table, self._sums, self._vcount, self.counters,
                                       cfg.read_ttl_s)

    @property
    def live(self) -> int:
        """Live entries."""
        return self.table.live

    # ---------------------------------------------------------------- versions and keys
    def version_id(self, version: str) -> int:
        """The id the entries of ``version`` carry in ``table.meta["vid"]`` (0: never written)."""
        return self._version_id(version, create=False)

    def _version_id(self, version: str, create: bool) -> int:
        vid = self._vid.get(check_version(version), 0)
        if vid == 0 and create:
            if len(self._vnames) > np.iinfo(np.uint16).max:
                raise RequestError(f"version={version!r}: more than 65535 versions seen")
            vid = self._vid[version] = len(self._vnames)
            self._vnames.append(version)
        return vid

    # ---------------------------------------------------------------- expiry
    def _cutoff(self) -> int:
        """Buckets below this index are older than retention."""
        return math.floor((self._max_now - self.cfg.retention_s) / self.cfg.bucket_s)

    def _advance(self, now: float) -> None:
        self.guard.check(now)
        if now > self._max_now:
            self._max_now = now
            if self._buckets and min(self._buckets) < self._cutoff():
                self._expire_before(self._cutoff())

    def expire(self, now: float) -> int:
        """Drop every time bucket older than retention at ``now``; returns entries freed."""
        now = check_time(now)
        before = self.counters["expired"]
        self._advance(now)
        return self.counters["expired"] - before

    def _expire_before(self, cutoff: int) -> None:
        m = self.table.meta
        bucket = np.floor(m["written"] / self.cfg.bucket_s)
        slots = np.flatnonzero((m["vid"] != 0) & (bucket < cutoff))
        if len(slots):
            unread = int(np.count_nonzero(m["read"][slots] == 0))
            self.counters["expired"] += len(slots)
            self.counters["expired_unread"] += unread
            self._remove(slots)
            log.debug("expired %d entries (%d never read) before bucket %d", len(slots),
                      unread, cutoff)
        for b in [b for b in self._buckets if b < cutoff]:
            del self._buckets[b]

    # ---------------------------------------------------------------- slot management
    def _bucket_add(self, written: np.ndarray, sign: int) -> None:
        b, c = np.unique(np.floor(written / self.cfg.bucket_s).astype(np.int64),
                         return_counts=True)
        for bi, ci in zip(b.tolist(), c.tolist()):
            left = self._buckets.get(bi, 0) + sign * ci
            if left:
                self._buckets[bi] = left
            else:
                self._buckets.pop(bi, None)

    def _remove(self, slots: np.ndarray) -> None:
        """Free these live slots: table, running sums, bucket and version counts."""
        m, vectors = self.table.free(slots)
        if self.journal is not None:
            self.journal.removes(m["user"], m["item"], m["vid"])
        self._sums.add(m["user"], m["vid"], vectors, -1)
        self._bucket_add(m["written"], -1)
        for v, c in zip(*np.unique(m["vid"], return_counts=True)):
            self._vcount[int(v)] -= int(c)

    # ---------------------------------------------------------------- writes
    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float | np.ndarray, scores: np.ndarray | None = None) -> int:
        """Write a batch of pair embeddings at event time ``now`` (one for all, or (n,): each
        pair's own, e.g. the request that bet on it); returns entries stored.

        A key written again is replaced (last write in a batch wins). ``scores`` (the
        verifier's) rank entries for eviction when the store is full: the lowest (score, then
        oldest) go first, incoming entries included. Missing scores count as 0.
        """
        users, items = check_ids(users, "users"), check_ids(items, "items")
        n = len(users)
        written = check_times(now, n)
        if len(items) != n:
            raise RequestError(f"items: length {len(items)} != users length {n}")
        rows = self.codec.encode(vectors)
        if len(rows) != n:
            raise RequestError(f"vectors: {len(rows)} rows for {n} keys")
        sc = np.zeros(n, np.float32) if scores is None else np.asarray(scores, np.float32)
        if sc.shape != (n,) or not np.isfinite(sc).all():
            raise RequestError(f"scores: expected {n} finite values, got shape {sc.shape}")
        if n == 0:
            if np.ndim(now) == 0:
                self._advance(check_time(now))
            self._version_id(version, create=True)
            return 0
        self._advance(float(written.max()))  # refuses a time too far ahead, changing nothing
        vid = self._version_id(version, create=True)
        late = np.floor(written / self.cfg.bucket_s) < self._cutoff()
        if late.any():  # written already past retention
            self.counters["dropped_on_put"] += int(np.count_nonzero(late))
            if late.all():
                return 0
            on = ~late
            users, items, rows, sc, written = users[on], items[on], rows[on], sc[on], written[on]
        h = key_hash(users, items, vid)
        keep = _last_of_each_key(h, users, items)
        if keep is not None:
            users, items, rows, sc, h = users[keep], items[keep], rows[keep], sc[keep], h[keep]
            written = written[keep]
        return self._write(users, items, vid, written, sc, np.zeros(len(users), np.uint8),
                           rows, h)

    def _write(self, users, items, vid: int, written, sc, read, rows, h) -> int:
        """Overwrite existing keys in place, evict if full, insert the rest (distinct keys)."""
        t = self.table
        dec = self.codec.decode(rows).astype(np.float64)
        slot, _ = t.lookup(users, items, vid, h)
        old = np.flatnonzero(slot >= 0)
        if len(old):
            s = slot[old]
            # a replaced entry ends here, with its read flag (speculation precision); one
            # still fresh for reads was evaluated again for nothing: a duplicate
            self.counters["replaced"] += len(s)
            self.counters["replaced_read"] += int(np.count_nonzero(t.meta["read"][s]))
            self.counters["duplicates"] += int(np.count_nonzero(
                written[old] - t.meta["written"][s] <= self.cfg.read_ttl_s))
            prev = self.codec.decode(t.rows[s]).astype(np.float64)
            self._sums.adjust(self._sums.find(users[old], vid), dec[old] - prev)
            self._bucket_add(t.meta["written"][s], -1)
            self._bucket_add(written[old], +1)
            t.overwrite(s, written[old], sc[old], read[old], rows[old])
            if self.journal is not None:
                self.journal.upserts(users[old], items[old], vid, written[old], sc[old],
                                     rows[old])
        new = np.flatnonzero(slot < 0)
        stored = len(old)
        over = self.live + len(new) - self.cfg.capacity
        if over > 0:
            new = self._evict_for(new, sc, written, over)
        if len(new):
            t.insert(users[new], items[new], vid, written[new], sc[new], read[new], rows[new],
                     h[new])
            if self.journal is not None:
                self.journal.upserts(users[new], items[new], vid, written[new], sc[new],
                                     rows[new])
            self._sums.add(users[new], np.full(len(new), vid), dec[new], +1)
            self._bucket_add(written[new], +1)
            self._vcount[vid] = self._vcount.get(vid, 0) + len(new)
            stored += len(new)
        return stored

    def _evict_for(self, new: np.ndarray, sc, written, over: int) -> np.ndarray:
        """Make room for ``over`` more entries (plus a small batch of headroom so eviction
        runs rarely): drop the lowest (score, written) among live and incoming entries.
        Returns the incoming positions that survive."""
        extra = min(4096, max(1, self.cfg.capacity // 256))
        meta = self.table.meta
        live = self.table.live_slots()
        pool_score = np.concatenate([meta["score"][live], sc[new]])
        pool_written = np.concatenate([meta["written"][live], written[new]])
        k = min(len(pool_score), over + extra) if len(live) else over
        victims = lowest(pool_score, pool_written, k)
        old_v = victims[victims < len(live)]
        if len(old_v):
            self.counters["evictions"] += len(old_v)
            self.counters["evicted_live"] += len(old_v)
            self.counters["evicted_read"] += int(np.count_nonzero(meta["read"][live[old_v]]))
            self._remove(live[old_v])
        dropped = victims[victims >= len(live)] - len(live)
        self.counters["evictions"] += len(dropped)
        return np.delete(new, dropped)

    # ---------------------------------------------------------------- reads
    def get(self, users: np.ndarray, items: np.ndarray, version: str,
            now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found (n,), vectors (n, d) float32, age_s (n,)) of fresh pairs of ``version``."""
        now, vid, users, items = self._read(now, version, users, items, "users", "items")
        return _answer.get_pairs(self._view, vid, now, users, items)

    def aggregate(self, users: np.ndarray, exclude_items: np.ndarray, version: str,
                  now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vectors (a, d), present (a,), count (a,)): mean of each user's retained pairs of
        ``version``, leaving out ``exclude_items`` (one item per row)."""
        now, vid, users, excl = self._read(now, version, users, exclude_items, "users",
                                           "exclude_items")
        return _answer.aggregate_rows(self._view, vid, users, excl)

    def holders(self, items: np.ndarray, users: np.ndarray, version: str, now: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Which of ``users`` hold a fresh pair for which of ``items``.

        Returns (item_idx, user_idx, vectors, age_s) of every hit, ordered by item then user.
        """
        now = check_time(now)
        items, users = check_ids(items, "items"), check_ids(users, "users")
        vid = self._version_id(version, create=False)
        self._advance(now)
        return _answer.holder_grid(self._view, vid, now, items, users)

    def _read(self, now, version, a, b, name_a: str, name_b: str):
        """Checked (now, version id, a, b) of a keyed read, after expiring up to ``now``."""
        now = check_time(now)
        a, b = check_ids(a, name_a), check_ids(b, name_b)
        if len(b) != len(a):
            raise RequestError(f"{name_b}: length {len(b)} != {name_a} length {len(a)}")
        vid = self._version_id(version, create=False)
        self._advance(now)
        return now, vid, a, b

    def answer(self, q: ShardQuery) -> ShardAnswer:
        """Everything one request needs from this shard, in one call (see cache/query.py)."""
        now, items, user, item_nbrs, nbr_users = check_query(q)
        vid = self._version_id(q.version, create=False)
        self._advance(now)
        return _answer.answer_query(self._view, vid, now, items, user, item_nbrs,
                                    bool(q.aggregate), nbr_users, bool(q.nbr_all))

    # ---------------------------------------------------------------- read replicas
    def changes(self, epoch: str, seq: int) -> tuple[str, int, bool, list[str], Changes]:
        """What a replica at (``epoch``, ``seq``) needs to catch up: (epoch, sequence now,
        whole, version names by id, changes). ``whole``: the replica follows another
        incarnation or fell behind the journal, so the changes are every live entry as an
        upsert and it starts over from them."""
        if self.journal is None:
            raise RequestError("cache.journal_records=0: this store keeps no journal for "
                               "read replicas")
        j = self.journal
        got = j.since(int(seq)) if epoch == j.epoch else None
        if got is None:
            live = self.table.live_slots()
            m = self.table.records(live)
            got = Changes(np.zeros(len(live), np.int8), m["user"].copy(), m["item"].copy(),
                          m["vid"].astype(np.int32), m["written"].copy(), m["score"].copy(),
                          self.table.rows.take(live, axis=0))
            return j.epoch, j.seq, True, list(self._vnames), got
        return j.epoch, j.seq, False, list(self._vnames), got

    def apply_reads(self, users: np.ndarray, items: np.ndarray, versions: list[str],
                    vix: np.ndarray, written: np.ndarray, counts: dict[str, int],
                    max_now: float | None) -> int:
        """A replica's reads, sent back: mark read the entries it served as their user's own
        pair (key and written-at time: an entry rewritten since is not marked), add its read
        counts (``pair_hits``, ``nbr_probes``, ...) and expire up to the latest event time it
        read at, as the reads would have here. Returns the entries marked."""
        for k, v in counts.items():
            if k in self.counters and k in READ_COUNTERS:
                self.counters[k] += int(v)
        marked = 0
        if len(users):
            vids = np.array([self._vid.get(v, 0) for v in versions], np.int64)[vix]
            ok = vids > 0
            slot, _ = self.table.lookup(users[ok], items[ok], vids[ok])
            found = slot >= 0
            same = np.zeros(len(slot), bool)
            same[found] = self.table.meta["written"][slot[found]] == written[ok][found]
            self.table.mark_read(slot[same])
            marked = int(np.count_nonzero(same))
        if max_now is not None and math.isfinite(max_now):
            try:
                self._advance(float(max_now))
            except RequestError:  # a time this store's clock refuses: counted by its guard
                pass
        return marked

    # ---------------------------------------------------------------- state
    def metrics(self) -> dict:
        """Entries, bytes and counters (hits / misses by tier, expiry, evictions)."""
        t = self.table
        payload = int(t.rows.nbytes)
        total = int(t.nbytes + self._sums.nbytes)
        out = {"entries": self.live, "capacity": self.cfg.capacity, "slots": len(t.meta),
               "payload_bytes": payload, "total_bytes": total, "index_bytes": t.index.nbytes,
               "sums_bytes": self._sums.nbytes, "user_versions": self._sums.live,
               # the latest event time the store has expired by (None: none yet)
               "latest_event_s": self._max_now if math.isfinite(self._max_now) else None,
               "codec": self.codec.name,
               "versions": {v: self._vcount.get(i, 0) for v, i in self._vid.items()
                            if self._vcount.get(i, 0)}}
        out.update(self.counters)
        out.update(self.guard.metrics())
        return out

    def snapshot(self) -> pa.Table:
        """Every live entry (codec bytes verbatim) plus running sums and counters."""
        return _snap.to_table(self.table, self._sums, self._vnames, self._max_now,
                              self.counters)

    @classmethod
    def restore(cls, cfg: CacheConfig, table: pa.Table,
                clock: EventClock | None = None) -> "PairStore":
        """A store answering exactly as the one that wrote ``table``; DataError on a
        mismatch (codec, width, format). A snapshot whose time is ahead of ``clock``'s wall
        clock by more than its skew is reported: it does not set the expiry time, and its
        entries written after the clock are dropped (``dropped_on_restore``)."""
        store = cls(cfg, clock)
        journal, store.journal = store.journal, None  # a new epoch: replicas read it whole
        e = _snap.from_table(table, store.codec)
        keep = np.ones(len(e.users), bool)
        if e.max_now is not None:
            cut = store.guard.restored(e.max_now, "pair snapshot")
            store._max_now = e.max_now if cut is None else cut
            if cut is not None:
                keep = e.written <= cut
        for v in dict.fromkeys(e.versions.tolist()):
            vid = store._version_id(v, create=True)
            sel = np.flatnonzero((e.versions == v) & keep)
            store._write(e.users[sel], e.items[sel], vid, e.written[sel], e.score[sel],
                         e.read[sel], e.rows[sel], key_hash(e.users[sel], e.items[sel], vid))
        # the writer's running sums, bit for bit (unless a smaller capacity evicted some
        # rows: then the sums re-added on the way in are the right ones)
        g = e.sum_rows
        if len(g) and store.live == len(e.users):  # (none dropped)
            vids = np.array([store._vid[v] for v in e.versions[g]], dtype=np.uint16)
            r = store._sums.find(e.users[g], vids)
            assert (r >= 0).all(), "a restored group without a running sum"
            store._sums.sums[r] = e.sums
        store.counters.update({k: v for k, v in e.counters.items() if k in store.counters})
        store.counters["dropped_on_restore"] += int(np.count_nonzero(~keep))
        store.journal = journal
        return store


def _last_of_each_key(h: np.ndarray, users: np.ndarray, items: np.ndarray) -> np.ndarray | None:
    """Positions keeping the last write of each distinct (user, item); None if all distinct."""
    if len(np.unique(h)) == len(h):
        return None
    o = np.lexsort((np.arange(len(h)), items, users))
    su, si = users[o], items[o]
    last = np.r_[(su[1:] != su[:-1]) | (si[1:] != si[:-1]), True]
    return np.sort(o[last])
