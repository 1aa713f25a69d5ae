"""A router's read replica of a shard group: every lookup answered in its own process.

The shards stay the source of truth: they take every write, own TTL, retention, eviction,
versions, the history and the snapshots, and journal each change to their entries
(``solaris.cache.journal``). A ``ReadReplica`` keeps one ``MirrorStore`` per shard -- a
``PairStore`` that only follows its shard -- and its client (``actors.replica``) pulls each
shard's changes since the replica's sequence once per refresh period. A request is planned
and routed exactly as for the shard calls (``solaris.online.enrich``), each shard's query is
answered by its mirror with the same answer code (``PairStore.answer``), and the answers are
assembled the same way: with the mirrors in step, the slots are the shard path's, bit for bit.

What a mirror does on its own, and why it stays safe:

- **Versions**: a shard's version ids are its own (first-write order); the mirror keeps its
  own map by name.
- **Freshness and retention at read time**: the TTL is checked against the request's event
  time, and the mirror expires retention buckets by the times it reads at, as a shard does;
  so a refresh that comes late can only miss (an entry not yet pulled), never serve an entry
  past its TTL or of another version.
- **Reads go back**: a read marks an entry read (speculation precision counts it) and counts
  hits and probes; the mirror records both and the router sends them to the shard with its
  after-answer flush (``take_reads`` -> ``PairStore.apply_reads``), with the latest event
  time read, so the shard expires as the reads would have made it.
- **A shard that restarts** is another epoch: the mirror starts over from the shard's whole
  store. A shard whose last successful refresh is older than ``stale_s`` reads as misses,
  as a late shard does on the shard path.

No Ray here: ``actors.replica`` makes the calls.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from typing import Any

import numpy as np

from solaris import wire
from solaris.cache.index import key_hash
from solaris.cache.journal import REMOVE, UPSERT, Changes
from solaris.cache.query import ShardAnswer, ShardQuery
from solaris.cache.slab import SlotTable, gather
from solaris.cache.store import READ_COUNTERS, PairStore
from solaris.config import CacheConfig
from solaris.errors import RequestError


class _ReadLog(SlotTable):
    """A slot table that remembers which entries were marked read (key and written-at)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read_log: list[np.ndarray] = []

    def mark_read(self, slots: np.ndarray) -> None:
        super().mark_read(slots)
        if len(slots):
            self.read_log.append(gather(self.meta, slots))


class MirrorStore(PairStore):
    """A ``PairStore`` that follows one shard: ``apply`` the shard's changes, ``answer`` as
    the shard would. No journal, no clock of its own (the router checks event times), and
    room for twice the shard's capacity so it never evicts what the shard keeps."""

    table_class = _ReadLog

    def __init__(self, cfg: CacheConfig) -> None:
        super().__init__(dataclasses.replace(cfg, capacity=2 * cfg.capacity), None,
                         journal=False)
        self.sent_counts = dict.fromkeys(READ_COUNTERS, 0)  # read counts already sent back

    def apply(self, versions: list[str], ch: Changes) -> int:
        """Apply a shard's changes in order (``versions``: its version names by id)."""
        vmap = np.array([self._version_id(v, create=True) if v else 0 for v in versions],
                        np.int64)
        for kind, rec, up in ch.runs():
            users, items = ch.users[rec], ch.items[rec]
            vids = vmap[ch.vids[rec]]
            if kind == UPSERT:
                self._upsert(users, items, vids, ch.written[up], ch.score[up], ch.rows[up])
            elif kind == REMOVE:
                slot, _ = self.table.lookup(users, items, vids)
                slot = np.unique(slot[slot >= 0])
                if len(slot):
                    self._remove(slot)
        return len(ch)

    def _upsert(self, users, items, vids, written, score, rows) -> None:
        # the last record of each key wins; one ``_write`` per version id
        h = key_hash(users, items, vids)
        _, last_rev = np.unique(h[::-1], return_index=True)
        keep = np.sort(len(h) - 1 - last_rev)
        users, items, vids, h = users[keep], items[keep], vids[keep], h[keep]
        written, score, rows = written[keep], score[keep], rows[keep]
        late = (np.floor(written / self.cfg.bucket_s) < self._cutoff()
                if math.isfinite(self._max_now) else np.zeros(len(written), bool))
        for vid in np.unique(vids).tolist():
            sel = np.flatnonzero((vids == vid) & ~late)  # past retention here: dropped
            if len(sel):
                self._write(users[sel], items[sel], int(vid), written[sel], score[sel],
                            np.zeros(len(sel), np.uint8), rows[sel], h[sel])

    def take_reads(self) -> tuple[np.ndarray, dict[str, int], float | None]:
        """(read records since the last take, read counts since the last take, the latest
        event time read at): what goes back to the shard."""
        log = self.table.read_log
        recs = np.concatenate(log) if log else gather(self.table.meta, np.zeros(0, np.int64))
        log.clear()
        counts = {k: self.counters[k] - self.sent_counts[k] for k in READ_COUNTERS}
        self.sent_counts = {k: self.counters[k] for k in READ_COUNTERS}
        now = self._max_now if math.isfinite(self._max_now) else None
        return recs, {k: v for k, v in counts.items() if v}, now


# ---- frames ------------------------------------------------------------------------------
def encode_changes_query(epoch: str, seq: int) -> bytes:
    return wire.encode("changes_query", (str(epoch), int(seq)))


def decode_changes_query(buf: bytes) -> tuple[str, int]:
    epoch, seq = wire.decode(buf, "changes_query", 2)
    return epoch, int(seq)


def encode_changes(epoch: str, seq: int, whole: bool, versions: list[str], ch: Changes
                   ) -> bytes:
    """A shard's answer to a pull (``PairStore.changes``)."""
    return wire.encode("changes", (epoch, int(seq), bool(whole), json.dumps(versions),
                                   ch.kind, ch.users, ch.items, ch.vids, ch.written, ch.score,
                                   ch.rows))


def decode_changes(buf: bytes) -> tuple[str, int, bool, list[str], Changes]:
    (epoch, seq, whole, versions, kind, users, items, vids, written, score,
     rows) = wire.decode(buf, "changes", 11)
    return (epoch, int(seq), bool(whole), json.loads(versions),
            Changes(kind, users, items, vids, written, score, rows))


def encode_reads(recs: np.ndarray, names: list[str], counts: dict[str, int],
                 max_now: float | None) -> bytes:
    """A mirror's reads (``MirrorStore.take_reads``; ``names``: its version names by id)."""
    return wire.encode("reads", (recs["user"].astype(np.int64), recs["item"].astype(np.int64),
                                 json.dumps(names), recs["vid"].astype(np.int64),
                                 recs["written"].astype(np.float64), json.dumps(counts),
                                 max_now))


def decode_reads(buf: bytes) -> tuple:
    """(users, items, version names, version index per read, written, counts, max_now)."""
    users, items, names, vix, written, counts, max_now = wire.decode(buf, "reads", 7)
    counts = json.loads(counts)
    if not isinstance(counts, dict):
        raise RequestError("reads: counts must be an object")
    return users, items, json.loads(names), vix, written, counts, max_now


# ---- the replica -------------------------------------------------------------------------
class ReadReplica:
    """One mirror per shard, the cursor (epoch, sequence) each follows, and when each was
    last refreshed. Thread-safe: the refresh thread applies while requests answer."""

    def __init__(self, cfg: CacheConfig, stale_s: float,
                 clock: Any = time.monotonic) -> None:
        self.cfg = cfg
        self.stale_s = float(stale_s)
        self._clock = clock
        n = cfg.num_shards
        self.mirrors = [MirrorStore(cfg) for _ in range(n)]
        self.epoch = [""] * n
        self.seq = [0] * n
        self.refreshed_at = [-math.inf] * n  # monotonic time of the last successful pull
        self._sent_now: list[float | None] = [None] * n  # latest event time sent per shard
        self.lock = threading.Lock()
        self.stats = {"refreshes": [0] * n, "records": [0] * n, "whole": [0] * n,
                      "bytes": [0] * n, "apply_cpu_s": [0.0] * n, "stale_answers": [0] * n,
                      "failed": [0] * n}

    def cursor(self, s: int) -> bytes:
        """The pull shard ``s`` gets: this replica's epoch and sequence of it."""
        return encode_changes_query(self.epoch[s], self.seq[s])

    def apply(self, s: int, frame: bytes, at: float | None = None) -> int:
        """Apply shard ``s``'s answer to a pull (``at``: the monotonic time the pull was
        sent: the mirror is as fresh as that); returns the records applied."""
        c0 = time.thread_time()
        epoch, seq, whole, versions, ch = decode_changes(frame)
        with self.lock:
            if whole:
                self.mirrors[s] = MirrorStore(self.cfg)
                self.stats["whole"][s] += 1
            n = self.mirrors[s].apply(versions, ch)
            self.epoch[s], self.seq[s] = epoch, seq
            self.refreshed_at[s] = self._clock() if at is None else at
            st = self.stats
            st["refreshes"][s] += 1
            st["records"][s] += n
            st["bytes"][s] += len(frame)
            st["apply_cpu_s"][s] += time.thread_time() - c0
        return n

    def failed(self, s: int) -> None:
        with self.lock:
            self.stats["failed"][s] += 1

    def answers(self, queries: dict[int, ShardQuery]) -> dict[int, ShardAnswer]:
        """Each shard's answer from its mirror; a mirror not refreshed within ``stale_s``
        answers empty (every key a miss)."""
        out: dict[int, ShardAnswer] = {}
        now = self._clock()
        with self.lock:
            for s, q in queries.items():
                if now - self.refreshed_at[s] > self.stale_s:
                    self.stats["stale_answers"][s] += 1
                    out[s] = ShardAnswer.empty(self.cfg.dim)
                else:
                    out[s] = self.mirrors[s].answer(q)
        return out

    def take_reads(self, s: int) -> bytes | None:
        """Shard ``s``'s reads since the last take, as a ``reads`` frame (None: none). A
        frame goes also when only the latest event time read moved: the shard's retention
        and its refusal of late writes run on it, as they would had it answered the reads."""
        with self.lock:
            m = self.mirrors[s]
            recs, counts, now = m.take_reads()
            names = list(m._vnames)
            moved = now is not None and now != self._sent_now[s]
            self._sent_now[s] = now
        if not len(recs) and not counts and not moved:
            return None
        return encode_reads(recs, names, counts, now)

    def metrics(self) -> dict[str, Any]:
        """Per shard: entries and bytes held, the cursor, refreshes, records and bytes pulled,
        apply CPU, whole re-reads, answers given as misses for staleness, failed pulls, and
        seconds since the last refresh."""
        now = self._clock()
        with self.lock:
            return {"entries": [m.live for m in self.mirrors],
                    "bytes": [int(m.table.nbytes + m._sums.nbytes) for m in self.mirrors],
                    "seq": list(self.seq),
                    "age_s": [round(now - t, 3) if math.isfinite(t) else None
                              for t in self.refreshed_at],
                    **{k: list(v) for k, v in self.stats.items()}}
