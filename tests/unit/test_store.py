"""PairStore against a slow exact reference, on a scripted event clock (no wall time)."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solaris.cache.codec import Codec, error_bound
from solaris.cache.index import HashIndex, key_hash, key_hash_one
from solaris.cache.query import ShardQuery
from solaris.cache.snapshot import read_snapshot, snapshot_location, write_snapshot
from solaris.cache.store import PairStore, lowest
from solaris.config import CacheConfig
from solaris.errors import RequestError

T0 = 900.0 * 1112  # event time origin of the fake clock, on a bucket boundary
D = 4
USERS, ITEMS, VERSIONS = 5, 7, ("v1", "v2")


def make_cfg(**kw) -> CacheConfig:
    base = dict(dim=D, read_ttl_s=3600, retention_s=4 * 3600, bucket_s=900, capacity=100_000)
    base.update(kw)
    return CacheConfig(**base)


class Reference:
    """Dict of every retained entry; the rules written out one key at a time."""

    def __init__(self, cfg: CacheConfig) -> None:
        self.cfg = cfg
        self.codec = Codec(cfg.codec, cfg.dim)
        self.entries: dict[tuple[int, int, str], tuple[np.ndarray, float]] = {}
        self.max_now = -math.inf

    def advance(self, now: float) -> None:
        self.max_now = max(self.max_now, now)
        cutoff = math.floor((self.max_now - self.cfg.retention_s) / self.cfg.bucket_s)
        for key, (_, w) in list(self.entries.items()):
            if math.floor(w / self.cfg.bucket_s) < cutoff:
                del self.entries[key]

    def put(self, users, items, vecs, version, now) -> None:
        self.advance(now)
        dec = self.codec.decode(self.codec.encode(vecs))
        for u, i, v in zip(users.tolist(), items.tolist(), dec):
            self.entries[(u, i, version)] = (v.copy(), now)

    def get(self, u, i, version, now):
        self.advance(now)
        e = self.entries.get((u, i, version))
        if e is None or not 0 <= now - e[1] <= self.cfg.read_ttl_s:  # none from the future
            return None
        return e[0], now - e[1]

    def aggregate(self, u, excl, version, now):
        self.advance(now)
        vs = [v for (uu, ii, ver), (v, _) in self.entries.items()
              if uu == u and ver == version and ii != excl]
        return (np.mean(np.asarray(vs, np.float64), axis=0), len(vs)) if vs else (None, 0)


def check_against(store: PairStore, ref: Reference, now: float) -> None:
    users = np.repeat(np.arange(USERS), ITEMS)
    items = np.tile(np.arange(ITEMS), USERS)
    for version in VERSIONS + ("never-written",):
        found, vecs, age = store.get(users, items, version, now)
        for k, (u, i) in enumerate(zip(users.tolist(), items.tolist())):
            want = ref.get(u, i, version, now)
            assert found[k] == (want is not None), (u, i, version)
            if want is not None:
                assert np.array_equal(vecs[k], want[0]) and age[k] == want[1]
                assert age[k] <= store.cfg.read_ttl_s
            else:
                assert not vecs[k].any() and age[k] == 0
        agg, present, count = store.aggregate(users, items, version, now)
        for k, (u, i) in enumerate(zip(users.tolist(), items.tolist())):
            mean, cnt = ref.aggregate(u, i, version, now)
            assert count[k] == cnt and present[k] == (cnt > 0)
            if cnt:
                np.testing.assert_allclose(agg[k], mean, rtol=1e-5, atol=1e-5)
        nbr_users = np.array([3, 0, 4, 1])
        nbr_items = np.array([6, 2, 2, 0, 5])
        it_idx, us_idx, hv, hage = store.holders(nbr_items, nbr_users, version, now)
        want = [(a, b) for a, i in enumerate(nbr_items.tolist())
                for b, u in enumerate(nbr_users.tolist()) if ref.get(u, i, version, now)]
        assert list(zip(it_idx.tolist(), us_idx.tolist())) == want
        for a, b, v, g in zip(it_idx, us_idx, hv, hage):
            rv, rage = ref.get(int(nbr_users[b]), int(nbr_items[a]), version, now)
            assert np.array_equal(v, rv) and g == rage
    assert store.metrics()["entries"] == len(ref.entries)


op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(st.integers(0, USERS - 1),
                                                 st.integers(0, ITEMS - 1)),
                                       min_size=1, max_size=8),
              st.sampled_from(VERSIONS), st.integers(0, 2**31)),
    st.tuples(st.just("advance"), st.sampled_from([0, 1, 450, 899, 900, 1800, 3599, 3600,
                                                   3601, 7200, 4 * 3600, 5 * 3600])),
)


@pytest.mark.parametrize("codec", ["fp32", "fp16", "int8"])
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=20))
def test_store_matches_reference(codec, ops):
    cfg = make_cfg(codec=codec)
    store, ref = PairStore(cfg), Reference(cfg)
    now = T0
    for o in ops:
        if o[0] == "put":
            keys = np.array(o[1], dtype=np.int64)
            vecs = np.random.default_rng(o[3]).normal(size=(len(keys), D)).astype(np.float32)
            store.put(keys[:, 0], keys[:, 1], vecs, o[2], now)
            ref.put(keys[:, 0], keys[:, 1], vecs, o[2], now)
        else:
            now += o[1]
        check_against(store, ref, now)


def test_version_is_part_of_the_key_and_other_versions_are_counted():
    store = PairStore(make_cfg())
    store.put(np.array([1]), np.array([2]), np.ones((1, D)), "old", T0)
    found, _, _ = store.get(np.array([1]), np.array([2]), "new", T0)
    assert not found[0]
    store.put(np.array([1]), np.array([3]), np.ones((1, D)), "new", T0)
    found, _, _ = store.get(np.array([1, 1]), np.array([2, 3]), "new", T0)
    assert found.tolist() == [False, True]
    m = store.metrics()
    assert m["pair_other_version"] == 2 and m["versions"] == {"old": 1, "new": 1}
    vids = store.table.meta["vid"]
    assert sorted(vids[vids != 0].tolist()) == [store.version_id("old"), store.version_id("new")]
    assert store.version_id("never") == 0 and 0 not in (store.version_id("old"),
                                                         store.version_id("new"))


def test_read_ttl_boundary_and_retention_keeps_stale_pairs_for_the_aggregate():
    cfg = make_cfg()
    store = PairStore(cfg)
    store.put(np.array([0, 0]), np.array([1, 2]), np.eye(2, D), "v1", T0)
    found, _, age = store.get(np.array([0]), np.array([1]), "v1", T0 + cfg.read_ttl_s)
    assert found[0] and age[0] == cfg.read_ttl_s
    later = T0 + cfg.read_ttl_s + 1
    found, _, _ = store.get(np.array([0]), np.array([1]), "v1", later)
    assert not found[0] and store.metrics()["pair_stale"] == 1
    agg, present, count = store.aggregate(np.array([0]), np.array([2]), "v1", later)
    assert present[0] and count[0] == 1 and np.array_equal(agg[0], np.eye(2, D)[0])


def test_retention_drops_whole_buckets_once_all_of_them_is_older():
    cfg = make_cfg()
    store = PairStore(cfg)
    store.put(np.array([0, 0]), np.array([1, 2]), np.ones((2, D)), "v1", T0)  # bucket start
    store.put(np.array([0]), np.array([3]), np.ones((1, D)), "v1", T0 + cfg.bucket_s - 1)
    edge = T0 + cfg.bucket_s + cfg.retention_s  # the bucket's end is retention_s old
    _, _, count = store.aggregate(np.array([0]), np.array([9]), "v1", edge - 0.5)
    assert count[0] == 3 and store.metrics()["expired"] == 0
    _, present, count = store.aggregate(np.array([0]), np.array([9]), "v1", edge)
    assert count[0] == 0 and not present[0] and store.metrics()["expired"] == 3


def test_put_rejects_bad_input_by_name():
    store = PairStore(make_cfg())
    one = np.ones((1, D), np.float32)
    with pytest.raises(RequestError, match="users: negative id -3"):
        store.put(np.array([-3]), np.array([1]), one, "v1", T0)
    with pytest.raises(RequestError, match="now=nan"):
        store.put(np.array([1]), np.array([1]), one, "v1", float("nan"))
    with pytest.raises(RequestError, match="NaN or inf"):
        store.put(np.array([1]), np.array([1]), one * np.nan, "v1", T0)
    with pytest.raises(RequestError, match=r"shape=\(1, 3\)"):
        store.put(np.array([1]), np.array([1]), np.ones((1, 3)), "v1", T0)
    with pytest.raises(RequestError, match="version=''"):
        store.put(np.array([1]), np.array([1]), one, "", T0)


@settings(max_examples=40, deadline=None, database=None)
@given(times=st.lists(st.sampled_from([0.0, 10.0, 899.0, 900.0, 3599.0, 5 * 3600.0]),
                      min_size=1, max_size=12))
def test_a_put_with_a_time_per_pair_is_one_put_per_time(times):
    """``now`` per pair (an FM worker's lease: each pair at its own request's time) stores
    what one put per distinct time, oldest first, stores: the same entries, ages and TTLs
    (a pair past retention is dropped on the put instead of expiring after it; within
    retention the counters agree too). Keys are distinct, so no write replaces another."""
    n = len(times)
    at = T0 + np.asarray(times)
    users, items = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64) + 100
    vecs = np.random.default_rng(n).normal(size=(n, D)).astype(np.float32)
    cfg = make_cfg()
    one, many = PairStore(cfg), PairStore(cfg)
    stored = one.put(users, items, vecs, "v1", at)
    each = sum(many.put(users[at == t], items[at == t], vecs[at == t], "v1", float(t))
               for t in np.unique(at))
    later = float(at.max()) + 60.0
    for a, b in zip(one.get(users, items, "v1", later), many.get(users, items, "v1", later)):
        np.testing.assert_array_equal(a, b)
    assert one.metrics()["entries"] == many.metrics()["entries"]
    if at.max() - at.min() < cfg.retention_s:
        assert stored == each and one.metrics() == many.metrics()


def test_a_put_past_retention_drops_only_its_late_pairs():
    cfg = make_cfg()
    store = PairStore(cfg)
    at = np.array([T0, T0 + cfg.retention_s + 2 * cfg.bucket_s])  # the first is too old
    assert store.put(np.array([1, 2]), np.array([5, 6]), np.ones((2, D)), "v1", at) == 1
    assert store.metrics()["dropped_on_put"] == 1
    found, _, age = store.get(np.array([1, 2]), np.array([5, 6]), "v1", float(at[1]))
    assert found.tolist() == [False, True] and age[1] == 0.0
    with pytest.raises(RequestError, match=r"now: expected one finite event time or 2"):
        store.put(np.array([1, 2]), np.array([5, 6]), np.ones((2, D)), "v1", at[:1])
    with pytest.raises(RequestError, match="now: expected"):
        store.put(np.array([1, 2]), np.array([5, 6]), np.ones((2, D)), "v1",
                  np.array([T0, np.nan]))


# ------------------------------------------------------------------ capacity and eviction

@settings(max_examples=30, deadline=None, database=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30),
                                           st.floats(0, 1, width=32)),
                                 min_size=1, max_size=12), min_size=1, max_size=12),
       capacity=st.integers(1, 20))
def test_capacity_bound_and_lowest_scores_go_first(batches, capacity):
    store = PairStore(make_cfg(capacity=capacity))
    live: dict[tuple[int, int], float] = {}  # what the store should hold, with scores
    evicted = 0
    for step, batch in enumerate(batches):
        now = T0 + step
        last = {(u, i): s for u, i, s in batch}  # last write of a key in a batch wins
        keys = np.array(list(last), dtype=np.int64)
        scores = np.array(list(last.values()), dtype=np.float32)
        store.put(keys[:, 0], keys[:, 1], np.ones((len(keys), D)), "v1", now, scores=scores)
        live.update({k: float(np.float32(s)) for k, s in last.items()})
        found, _, _ = store.get(np.array([k[0] for k in live]), np.array([k[1] for k in live]),
                                "v1", now)
        kept = {k: s for (k, s), f in zip(live.items(), found) if f}
        gone = {k: s for (k, s), f in zip(live.items(), found) if not f}
        assert len(kept) <= capacity and store.metrics()["entries"] == len(kept)
        if gone and kept:
            assert max(gone.values()) <= min(kept.values())
        evicted += len(gone)
        live = kept
    assert store.metrics()["evictions"] == evicted


def test_equal_scores_evict_the_oldest_first():
    store = PairStore(make_cfg(capacity=4))
    for t in range(6):
        store.put(np.array([0]), np.array([t]), np.ones((1, D)), "v1", T0 + t)
    found, _, _ = store.get(np.zeros(6, np.int64), np.arange(6), "v1", T0 + 6)
    assert found.tolist() == [False, False, True, True, True, True]


def test_lowest_matches_a_full_sort():
    rng = np.random.default_rng(0)
    score = rng.integers(0, 5, 500).astype(np.float32)  # many ties
    written = rng.permutation(500).astype(np.float64)
    for k in (0, 1, 7, 100, 499, 500):
        got = set(lowest(score, written, k).tolist())
        want = set(np.lexsort((written, score))[:k].tolist())
        assert got == want


# ------------------------------------------------------------------ memory

def _fill(store: PairStore, n: int, start: float, span_s: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for b in range(10):
        users = rng.integers(0, n // 20, n // 10)
        items = rng.integers(0, 10**6, n // 10)
        store.put(users, items, rng.normal(size=(n // 10, store.cfg.dim)), "v1",
                  start + b * span_s / 10)


@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_expired_memory_is_reclaimed_without_writes(codec):
    cfg = make_cfg(dim=32, codec=codec)
    tracemalloc.start()
    try:
        # the slabs' memory (the journal for read replicas keeps at most its record limit:
        # tests/unit/test_replica.py)
        store = PairStore(cfg, journal=False)
        _fill(store, 40_000, T0, span_s=2 * 3600)  # ten write times over two hours
        full, traced_full = store.metrics(), tracemalloc.get_traced_memory()[0]
        assert full["entries"] > 39_000
        # half the write times pass out of retention: about half the memory goes back
        store.get(np.array([0]), np.array([0]), "v1", T0 + cfg.retention_s + 3600 + 1)
        half = store.metrics()
        assert 0 < half["entries"] < 0.7 * full["entries"]
        assert half["total_bytes"] < 0.75 * full["total_bytes"]
        # everything passes out of retention: reads alone free it all
        store.aggregate(np.array([0]), np.array([0]), "v1", T0 + cfg.retention_s + 3 * 3600)
        empty, traced_empty = store.metrics(), tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert empty["entries"] == 0 and empty["expired"] == full["entries"]
    assert empty["expired_unread"] == full["entries"]  # nothing was read while fresh
    assert empty["total_bytes"] < 0.05 * full["total_bytes"]
    assert traced_full - traced_empty > 0.9 * full["total_bytes"]


def test_bytes_per_entry_budget():
    """fp32 total <= 300 B/entry incl. the index; int8 payload <= 0.3x, total <= 0.6x."""
    per = {}
    for codec in ("fp32", "int8"):
        store = PairStore(make_cfg(dim=32, codec=codec))
        _fill(store, 40_000, T0, span_s=600)
        m = store.metrics()
        per[codec] = (m["payload_bytes"] / m["entries"], m["total_bytes"] / m["entries"])
    assert per["fp32"][1] <= 300
    assert per["int8"][0] <= 0.3 * per["fp32"][0]
    assert per["int8"][1] <= 0.6 * per["fp32"][1]


# ------------------------------------------------------------------ codecs

@pytest.mark.parametrize("codec", ["fp32", "fp16", "int8"])
@settings(max_examples=60, deadline=None, database=None)
@given(seed=st.integers(0, 2**31),
       scale=st.sampled_from([1e-44, 1e-38, 1e-6, 1e-3, 1.0, 30.0, 6e4]),
       n=st.integers(0, 20))
def test_codec_error_within_stated_bound(codec, seed, scale, n):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 16)) * scale).astype(np.float32)
    if n:
        x[0] = 0.0  # a zero vector decodes to zeros
    if codec == "fp16":
        x = np.clip(x, -65504, 65504)
    c = Codec(codec, 16)
    rows = c.encode(x)
    assert rows.shape == (n, c.row_bytes) and rows.dtype == np.uint8
    err = np.abs(c.decode(rows).astype(np.float64) - x)
    assert (err <= error_bound(codec, x)).all()
    if n:
        assert not c.decode(rows)[0].any()


def test_int8_payload_and_fp16_overflow():
    assert Codec("int8", 32).row_bytes == 36 and Codec("fp32", 32).row_bytes == 128
    with pytest.raises(RequestError, match="fp16 range"):
        Codec("fp16", 2).encode(np.array([[1e5, 0.0]]))


# ------------------------------------------------------------------ snapshot

@settings(max_examples=10, deadline=None, database=None)
@given(seed=st.integers(0, 2**31), codec=st.sampled_from(["fp32", "fp16", "int8"]))
def test_snapshot_restore_round_trip_is_exact(tmp_path_factory, seed, codec):
    cfg = make_cfg(codec=codec)
    rng = np.random.default_rng(seed)
    store = PairStore(cfg)
    now = T0
    for step in range(12):  # overwrites, two versions, expiry on the way
        n = int(rng.integers(1, 20))
        store.put(rng.integers(0, 6, n), rng.integers(0, 9, n), rng.normal(size=(n, D)),
                  VERSIONS[step % 2], now, scores=rng.random(n))
        now += float(rng.integers(0, 3000))
    store.get(np.array([1, 2]), np.array([3, 4]), "v1", now)
    path = tmp_path_factory.mktemp("snap") / "shard.parquet"
    pq.write_table(store.snapshot(), path)
    back = PairStore.restore(cfg, pq.read_table(path))
    for version in VERSIONS:
        for user in range(6):
            q = ShardQuery(version=version, now=now + 10, items=np.arange(9), user=user,
                           item_nbrs=(np.arange(9)[:, None] + np.arange(1, 4)) % 9,
                           aggregate=True, nbr_users=np.array([(user + 1) % 6, (user + 3) % 6]),
                           nbr_all=True)
            a, b = store.answer(q), back.answer(q)
            for name in a.__dataclass_fields__:
                assert np.array_equal(getattr(a, name), getattr(b, name)), name
            found, vecs, age = store.get(np.full(9, user), np.arange(9), version, now + 10)
            assert [np.array_equal(x, y) for x, y in
                    zip((found, vecs, age), back.get(np.full(9, user), np.arange(9), version,
                                                     now + 10))] == [True] * 3
            agg = store.aggregate(np.full(9, user), np.arange(9), version, now + 10)
            assert all(np.array_equal(x, y) for x, y in
                       zip(agg, back.aggregate(np.full(9, user), np.arange(9), version, now + 10)))
    after = store.metrics()
    assert {k: v for k, v in back.metrics().items() if k not in ("slots", "total_bytes",
            "payload_bytes", "index_bytes", "sums_bytes")} == \
        {k: v for k, v in after.items() if k not in ("slots", "total_bytes", "payload_bytes",
                                                     "index_bytes", "sums_bytes")}


def test_snapshot_write_is_atomic_and_stale_temps_are_removed(tmp_path):
    fs, path = snapshot_location(str(tmp_path), "g", 1, 3)
    assert path.endswith("/g/shard-001-of-003.parquet")
    assert read_snapshot(fs, path) is None
    write_snapshot(fs, path, pa.table({"x": [1, 2, 3]}))
    stray = tmp_path / "g" / "shard-001-of-003.parquet.tmp-deadbeef"
    stray.write_bytes(b"half a parquet file")  # what a crash mid-write leaves behind
    assert read_snapshot(fs, path).column("x").to_pylist() == [1, 2, 3]
    assert not stray.exists()
    assert sorted(p.name for p in stray.parent.iterdir()) == ["shard-001-of-003.parquet"]


def test_restore_rejects_a_snapshot_of_another_codec():
    from solaris.errors import DataError
    empty = PairStore.restore(make_cfg(), PairStore(make_cfg()).snapshot())
    assert empty.metrics()["entries"] == 0
    store = PairStore(make_cfg(codec="int8"))
    store.put(np.array([1]), np.array([1]), np.ones((1, D)), "v1", T0)
    with pytest.raises(DataError, match="codec='int8'"):
        PairStore.restore(make_cfg(codec="fp32"), store.snapshot())
    with pytest.raises(DataError, match="metadata"):
        PairStore.restore(make_cfg(), pa.table({"user": [1]}))


# ------------------------------------------------------------------ hash index

@settings(max_examples=30, deadline=None, database=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 400), max_size=60)),
                    max_size=15),
       collide=st.booleans())
def test_hash_index_matches_a_dict(ops, collide):
    """Inserts and removes against a dict; with ``collide`` every key shares a few hashes,
    so fingerprint matches are rejected by the owner and probes run long."""
    index, truth = HashIndex(), {}
    keys_of_slot = np.full(1000, -1, dtype=np.int64)

    def h_of(keys):
        return (np.uint64(7) * (keys % 3).astype(np.uint64) if collide
                else key_hash(keys, 0, 1))

    free = list(range(1000))
    for insert, keys in ops:
        keys = np.unique(np.array(keys, dtype=np.int64))
        verify = lambda pos, s, keys=keys: keys_of_slot[s] == keys[pos]  # noqa: E731
        slot, cell = index.lookup(h_of(keys), verify)
        assert [int(s) for s in slot] == [truth.get(int(k), -1) for k in keys]
        if insert:
            new = keys[slot < 0]
            slots = np.array([free.pop() for _ in new], dtype=np.int64)
            keys_of_slot[slots] = new
            if index.needs_rebuild(len(new)):
                old = np.array(list(truth.values()), dtype=np.int64)
                index.rebuild(h_of(keys_of_slot[old]), old, len(new))
            index.insert(h_of(new), slots)
            truth.update(zip(new.tolist(), slots.tolist()))
        else:
            hit = slot >= 0
            index.remove(cell[hit])
            for k, s in zip(keys[hit].tolist(), slot[hit].tolist()):
                del truth[k]
                keys_of_slot[s] = -1
                free.append(s)
    everything = np.arange(401)
    slot, _ = index.lookup(h_of(everything),
                           lambda pos, s: keys_of_slot[s] == everything[pos])
    assert [int(s) for s in slot] == [truth.get(k, -1) for k in range(401)]
    for k, hk in zip(range(0, 401, 7), h_of(everything[::7]).tolist()):
        assert index.find_one(hk, lambda s, k=k: keys_of_slot[s] == k) == truth.get(k, -1)


@pytest.mark.parametrize("seed", range(4))
def test_hash_index_stays_exact_when_filled_past_its_load_limit(seed):
    """Batches inserted with no rebuild up to 95% of the cells: keys whose two buckets are
    full are placed by a one-move displacement (vectorised) or kicks, and every key is still
    found at its slot -- also after removing a third and inserting again."""
    rng = np.random.default_rng(seed)
    index = HashIndex(2000)  # sized for 2,000 keys at the target load: 4,000 cells
    keys = rng.choice(10**9, size=int(0.95 * index.size), replace=False).astype(np.int64)
    h = key_hash(keys, 0, 1)
    placed = []
    displace = index._displace

    def spy(*args):
        out = displace(*args)
        placed.append(int(out.sum()))
        return out
    index._displace = spy

    def check(live: np.ndarray) -> None:
        slot, _ = index.lookup(h[live], lambda pos, s: s == live[pos])
        assert (slot == live).all()

    for part in np.array_split(np.arange(len(keys)), 12):
        index.insert(h[part], part)
    check(np.arange(len(keys)))
    assert sum(placed) > 0  # the displacement path ran
    gone = rng.choice(len(keys), len(keys) // 3, replace=False)
    _, cells = index.lookup(h[gone], lambda pos, s: s == gone[pos])
    index.remove(cells)
    index.insert(h[gone], gone)
    check(np.arange(len(keys)))
    assert index.live == len(keys)


def test_scalar_hash_equals_the_vectorised_one():
    a = np.array([0, 1, 2**40, 2**62, 12345], dtype=np.int64)
    b = np.array([7, 0, 3, 2**50, 99], dtype=np.int64)
    for c in (0, 1, 65535):
        assert [key_hash_one(int(x), int(y), c) for x, y in zip(a, b)] == \
            key_hash(a, b, c).tolist()


# ------------------------------------------------------------------ how entries end

def test_every_way_an_entry_ends_is_counted_with_its_read_flag():
    """Replaced (a duplicate while still fresh for reads, a refresh after), evicted, expired:
    each ending counts the entry's read flag -- what speculation precision is made of."""
    store = PairStore(make_cfg(capacity=3))
    one, v = np.ones((1, D)), "v1"
    store.put(np.array([0, 0]), np.array([1, 2]), np.ones((2, D)), v, T0)
    store.get(np.array([0]), np.array([1]), v, T0 + 10)  # (0, 1) read
    store.put(np.array([0]), np.array([1]), one, v, T0 + 20)  # fresh: a duplicate
    m = store.metrics()
    assert (m["replaced"], m["replaced_read"], m["duplicates"]) == (1, 1, 1)
    store.get(np.array([0]), np.array([1]), v, T0 + 30)  # the new (0, 1) read too
    store.put(np.array([0]), np.array([2]), one, v, T0 + 4000)  # stale: a refresh
    m = store.metrics()
    assert (m["replaced"], m["replaced_read"], m["duplicates"]) == (2, 1, 1)
    # two higher-scored newcomers into a store of 3: both old entries are evicted
    store.put(np.array([0, 0]), np.array([3, 4]), np.ones((2, D)), v, T0 + 4001,
              scores=np.array([1.0, 1.0]))
    m = store.metrics()
    assert (m["evicted_live"], m["evicted_read"], m["entries"]) == (2, 1, 2)
    store.expire(T0 + 4001 + 5 * 3600)  # the rest expire unread
    m = store.metrics()
    assert (m["expired"], m["expired_unread"], m["entries"]) == (2, 2, 0)
