"""The read replica (solaris/cache/replica.py, journal.py): a router answering from mirrors of
its shards gives the shard path's slots bit for bit, and the shards end with the same
counters, read flags and entries."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.cache.journal import Journal
from solaris.cache.replica import (MirrorStore, ReadReplica, decode_reads, encode_changes)
from solaris.cache.ring import HashRing
from solaris.cache.store import PairStore
from solaris.config import CacheConfig, EnrichConfig
from solaris.errors import RequestError
from solaris.knn.neighbours import NeighbourTable
from solaris.online.enrich import assemble, plan, route

D, N_USERS, N_ITEMS = 4, 20, 24
T0 = 900.0 * 4000


def _cfg(capacity: int, codec: str, shards: int, journal: int = 100_000) -> CacheConfig:
    return CacheConfig(dim=D, codec=codec, read_ttl_s=1800, retention_s=3 * 3600,
                       bucket_s=900, capacity=capacity, num_shards=shards, virtual_nodes=16,
                       journal_records=journal)


def _knn(rng, n: int, k: int, universe: int) -> NeighbourTable:
    ids = rng.integers(-1, universe, (n, k))
    sims = np.sort(rng.uniform(0.0, 1.0, (n, k)).astype(np.float32))[:, ::-1]
    return NeighbourTable(ids, sims.copy(), "knn")


class _Path:
    """One way of serving: ``shards`` the stores (the truth), and either the shard calls
    (``replica`` None) or a replica pulled at refreshes and sent reads back at flushes."""

    def __init__(self, cfg: CacheConfig, use_replica: bool):
        self.cfg = cfg
        self.ring = HashRing(cfg.num_shards, cfg.virtual_nodes)
        self.shards = [PairStore(cfg) for _ in range(cfg.num_shards)]
        self.replica = ReadReplica(cfg, stale_s=1e9) if use_replica else None

    def put(self, users, items, vecs, version, written, scores):
        shard = self.ring.shard_of(users)
        for s in np.unique(shard).tolist():
            m = shard == s
            self.shards[s].put(users[m], items[m], vecs[m], version, written[m], scores[m])

    def lookup(self, user, cands, now, version, uk, ik, ecfg):
        p = plan(user, cands, uk, ik, ecfg)
        queries = route(p, self.ring.shard_of, version, now)
        if self.replica is None:
            answers = {s: self.shards[s].answer(q) for s, q in queries.items()}
        else:
            answers = self.replica.answers(queries)
        return assemble(p, answers, self.cfg.dim)

    def flush(self):
        if self.replica is None:
            return
        for s, store in enumerate(self.shards):
            frame = self.replica.take_reads(s)
            if frame is not None:
                users, items, names, vix, written, counts, max_now = decode_reads(frame)
                store.apply_reads(users, items, names, vix, written, counts, max_now)

    def refresh(self):
        if self.replica is None:
            return
        for s, store in enumerate(self.shards):
            e, q = self.replica.epoch[s], self.replica.seq[s]
            self.replica.apply(s, encode_changes(*store.changes(e, q)))


# derandomized: the same 25 cases on every run, so CI does not depend on a draw (a random
# draw found the case of the next test)
@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(seed=st.integers(0, 2**31), capacity=st.sampled_from([40, 120, 10_000]),
       codec=st.sampled_from(["fp32", "int8"]), shards=st.integers(1, 3),
       journal=st.sampled_from([50, 100_000]), weighted=st.booleans())
def test_replica_path_equals_the_shard_path(seed, capacity, codec, shards, journal, weighted):
    """Ticks of reads (event time advancing past TTL and retention), then the reads'
    flush, then writes (two versions, repeats, evictions at small capacities), then the
    replica's refresh: every request's slots are the shard path's bit for bit, and every
    shard ends with the same counters, entries and read flags."""
    rng = np.random.default_rng(seed)
    cfg = _cfg(capacity, codec, shards, journal)
    uk, ik = _knn(rng, N_USERS, 5, N_USERS), _knn(rng, N_ITEMS, 4, N_ITEMS)
    ecfg = EnrichConfig(user_knn_probe=4, item_knn_probe=3,
                        user_knn_mode="weighted" if weighted else "nearest")
    a, b = _Path(cfg, False), _Path(cfg, True)
    b.refresh()  # a replica answers nothing before its first pull
    now = T0
    for tick in range(10):
        for _ in range(6):
            now += float(rng.choice([1.0, 60.0, 700.0, 2000.0]))
            user, version = int(rng.integers(N_USERS)), str(rng.choice(["v1", "v2"]))
            cands = rng.choice(N_ITEMS, int(rng.integers(1, 12)), replace=False)
            sa = a.lookup(user, cands, now, version, uk, ik, ecfg)
            sb = b.lookup(user, cands, now, version, uk, ik, ecfg)
            for name in sa.__dataclass_fields__:
                assert np.array_equal(getattr(sa, name), getattr(sb, name)), (tick, name)
        a.flush(), b.flush()
        n = int(rng.integers(1, 40))
        users = rng.integers(0, N_USERS, n)
        items = rng.integers(0, N_ITEMS, n)
        vecs = rng.normal(size=(n, D)).astype(np.float32)
        written = now - rng.choice([0.0, 30.0, 1500.0, 5000.0, 20000.0], n)
        scores = rng.random(n).astype(np.float32)
        version = str(rng.choice(["v1", "v2"]))
        for p in (a, b):
            p.put(users, items, vecs, version, written, scores)
        b.refresh()
    for sa, sb in zip(a.shards, b.shards):
        ma, mb = sa.metrics(), sb.metrics()
        for k in ("entries", "pair_hits", "pair_misses", "pair_stale", "pair_other_version",
                  "nbr_probes", "nbr_hits", "inbr_probes", "inbr_hits", "agg_requests",
                  "agg_present", "expired", "expired_unread", "replaced", "replaced_read",
                  "duplicates", "evicted_live", "evicted_read", "dropped_on_put"):
            assert ma[k] == mb[k], k
        ra, rb = sa.snapshot().sort_by([("user", "ascending"), ("item", "ascending")]), \
            sb.snapshot().sort_by([("user", "ascending"), ("item", "ascending")])
        assert ra.column("read").to_pylist() == rb.column("read").to_pylist()


def test_a_shard_learns_the_latest_event_time_read_even_without_reads_to_send():
    """A random draw's case: a shard whose mirror answered queries that marked nothing read
    and counted nothing got no reads frame, so it never learned the event time, kept a write
    its retention would have refused, and later expired one entry more than the shard path
    (18 vs 19). The frame now goes when only the time moved."""
    test_replica_path_equals_the_shard_path.hypothesis.inner_test(
        seed=168191, capacity=40, codec="fp32", shards=3, journal=50, weighted=False)


def test_journal_keeps_the_last_records_and_says_when_a_reader_fell_behind():
    j = Journal(limit=5, row_bytes=2)
    j.upserts(np.arange(3), np.arange(3), 1, np.zeros(3), np.zeros(3, np.float32),
              np.zeros((3, 2), np.uint8))
    j.removes(np.array([0]), np.array([0]), np.array([1]))
    got = j.since(2)
    assert got.kind.tolist() == [0, 1] and got.users.tolist() == [2, 0]
    assert len(got.written) == 1  # upsert fields come for upserts only
    assert len(j.since(4)) == 0
    j.upserts(np.arange(4), np.arange(4), 2, np.zeros(4), np.zeros(4, np.float32),
              np.zeros((4, 2), np.uint8))
    assert j.seq == 8 and j.low >= 3  # whole batches are dropped past the limit
    assert j.since(0) is None and j.since(j.seq + 1) is None
    assert j.since(j.low) is not None


def test_a_journal_holds_at_most_its_record_limit():
    cfg = _cfg(100_000, "int8", 1, journal=5_000)
    store = PairStore(cfg)
    rng = np.random.default_rng(0)
    for b in range(40):
        n = 1000
        store.put(rng.integers(0, 500, n), rng.integers(0, 10**6, n),
                  rng.normal(size=(n, D)), "v", T0 + 60 * b)
    j = store.journal
    assert j.seq >= 40_000 and j.seq - j.low <= 5_000
    per_upsert = 8 + 8 + 4 + 8 + 4 + store.codec.row_bytes  # key, vid, written, score, row
    assert j.nbytes <= 5_000 * per_upsert


def test_a_restarted_shard_is_read_whole_and_a_stale_one_reads_as_misses():
    cfg = _cfg(1000, "fp32", 1)
    clock = [100.0]
    rep = ReadReplica(cfg, stale_s=5.0, clock=lambda: clock[0])
    store = PairStore(cfg)
    store.put(np.array([1, 2]), np.array([3, 4]), np.ones((2, D), np.float32), "v", T0)
    rep.apply(0, encode_changes(*store.changes(rep.epoch[0], rep.seq[0])))
    assert rep.stats["whole"] == [1] and rep.mirrors[0].live == 2
    # a restarted shard (restored from its snapshot): a new epoch, read whole again
    restored = PairStore.restore(cfg, store.snapshot())
    restored.put(np.array([5]), np.array([6]), np.ones((1, D), np.float32), "v", T0)
    rep.apply(0, encode_changes(*restored.changes(rep.epoch[0], rep.seq[0])))
    assert rep.stats["whole"] == [2] and rep.mirrors[0].live == 3
    ecfg = EnrichConfig(user_knn_probe=0, item_knn_probe=0, aggregate=False)
    p = plan(1, np.array([3]), None, None, ecfg)
    queries = route(p, lambda u: np.zeros(len(u), np.int64), "v", T0 + 1)
    assert assemble(p, rep.answers(queries), D).pair_present.tolist() == [True]
    clock[0] += 6.0  # no refresh for longer than stale_s: the shard's keys read as misses
    assert assemble(p, rep.answers(queries), D).pair_present.tolist() == [False]
    assert rep.stats["stale_answers"] == [1]


def test_a_store_without_a_journal_says_so():
    store = PairStore(_cfg(10, "fp32", 1, journal=0))
    with pytest.raises(RequestError, match="journal_records=0"):
        store.changes("", 0)


def test_reads_sent_back_mark_only_the_entry_that_was_read():
    """An entry rewritten after the replica read it is not marked: the read was of the
    older write."""
    cfg = _cfg(1000, "fp32", 1)
    store = PairStore(cfg)
    store.put(np.array([1, 1]), np.array([3, 4]), np.ones((2, D), np.float32), "v", T0)
    mirror = MirrorStore(cfg)
    mirror.apply(*store.changes("", 0)[3:])
    found, _, _ = mirror.get(np.array([1, 1]), np.array([3, 4]), "v", T0 + 10)
    assert found.all()
    store.put(np.array([1]), np.array([4]), np.ones((1, D), np.float32), "v", T0 + 5)
    recs, counts, max_now = mirror.take_reads()
    names = list(mirror._vnames)
    marked = store.apply_reads(recs["user"], recs["item"], names, recs["vid"].astype(np.int64),
                               recs["written"], counts, max_now)
    assert marked == 1 and counts["pair_hits"] == 2 and "pair_misses" not in counts
    snap = store.snapshot().to_pydict()
    read = {(u, i): r for u, i, r in zip(snap["user"], snap["item"], snap["read"])}
    assert read == {(1, 3): 1, (1, 4): 0}
    assert store.counters["pair_hits"] == 2
    # nothing read since: nothing to send
    assert mirror.take_reads()[0].size == 0 and mirror.take_reads()[1] == {}


def test_mirror_drops_a_write_already_past_its_retention():
    cfg = _cfg(1000, "fp32", 1)
    store, mirror = PairStore(cfg), MirrorStore(cfg)
    mirror.get(np.array([0]), np.array([0]), "v", T0 + 5 * 3600)  # the mirror read late
    store.put(np.array([1]), np.array([2]), np.ones((1, D), np.float32), "v", T0)
    mirror.apply(*store.changes("", 0)[3:])
    assert mirror.live == 0 and store.live == 1


def test_capacity_of_a_mirror_is_twice_its_shards():
    cfg = dataclasses.replace(_cfg(10, "fp32", 1))
    assert MirrorStore(cfg).table.capacity == 20
