"""A shard count change (``solaris.cache.reshard``): the old shards' pair and history
snapshots re-split onto a new ring put every old row on exactly one new shard -- the one the
new ring assigns its user to -- unchanged, checked against a brute-force placement on seeded
data; the restored stores answer as the old ones; which set a shard restores from."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from solaris.cache.reshard import SnapshotSet, choose, plan, snapshot_sets, split_history, \
    split_pairs
from solaris.cache.ring import HashRing
from solaris.cache.snapshot import from_table, history_location, snapshot_location, \
    write_snapshot
from solaris.cache.store import PairStore
from solaris.config import CacheConfig, HistoryConfig
from solaris.errors import DataError
from solaris.history import HistoryStore

T0 = 900.0 * 1112
D = 6
HCFG = HistoryConfig(max_events=8, max_users=1000)


def cache_cfg(num_shards: int, codec: str = "int8") -> CacheConfig:
    return CacheConfig(dim=D, codec=codec, num_shards=num_shards, capacity=100_000,
                       read_ttl_s=3600, retention_s=4 * 3600, bucket_s=900)


def old_pair_stores(m: int, seed: int = 0, codec: str = "int8") -> list[PairStore]:
    """``m`` shards' stores of two versions' pairs, each user on its shard of the m-ring."""
    rng = np.random.default_rng(seed)
    cfg = cache_cfg(m, codec)
    stores, ring = [PairStore(cfg) for _ in range(m)], HashRing.from_config(cfg)
    for step in range(4):
        users = rng.integers(0, 300, size=400)
        items = rng.integers(0, 50, size=400)
        vecs = rng.normal(size=(400, D)).astype(np.float32)
        version = ("fm1", "fm2")[step % 2]
        owner = ring.shard_of(users)
        for s in range(m):
            sel = owner == s
            stores[s].put(users[sel], items[sel], vecs[sel], version, T0 + 60.0 * step,
                          rng.random(int(sel.sum())).astype(np.float32))
    return stores


def pair_rows(table: pa.Table, codec) -> dict[tuple, tuple]:
    """(user, item, version) -> (written, score, read, codec bytes, its group's sum or None)."""
    e = from_table(table, codec)
    sums = {int(r): e.sums[k].tobytes() for k, r in enumerate(e.sum_rows)}
    first = {}
    for r in range(len(e.users)):
        first.setdefault((int(e.users[r]), e.versions[r]), r)
    out = {}
    for r in range(len(e.users)):
        key = (int(e.users[r]), int(e.items[r]), str(e.versions[r]))
        g = first[(key[0], key[2])]
        out[key] = (float(e.written[r]), float(e.score[r]), int(e.read[r]),
                    e.rows[r].tobytes(), sums.get(g))
    return out


@pytest.mark.parametrize("m,n", [(2, 3), (3, 2), (4, 4), (1, 5)])
def test_pairs_land_on_exactly_one_new_shard_unchanged(m: int, n: int):
    olds = old_pair_stores(m, seed=m * 10 + n)
    codec = olds[0].codec
    before: dict[tuple, tuple] = {}
    for st in olds:
        before.update(pair_rows(st.snapshot(), codec))
    ring = HashRing.from_config(cache_cfg(n))
    seen: dict[tuple, int] = {}
    for s in range(n):
        table = split_pairs((st.snapshot() for st in olds), ring, s)
        rows = pair_rows(table, codec)
        for key, val in rows.items():
            assert key not in seen, f"{key} on new shards {seen[key]} and {s}"
            seen[key] = s
            assert val == before[key], key  # bytes, times, score, read flag, running sum
            assert ring.shard_of(np.array([key[0]]))[0] == s
        # the re-split restores into a store that holds exactly those rows, sums bit for bit
        restored = PairStore.restore(cache_cfg(n), table)
        assert pair_rows(restored.snapshot(), codec) == rows
        assert restored.metrics()["entries"] == len(rows)
    assert seen.keys() == before.keys()  # every old entry on some new shard (and once: above)


def test_a_store_restored_from_a_split_answers_the_old_sums():
    olds = old_pair_stores(2, seed=5, codec="fp32")
    ring = HashRing.from_config(cache_cfg(3))
    new = [PairStore.restore(cache_cfg(3, "fp32"),
                             split_pairs((o.snapshot() for o in olds), ring, s))
           for s in range(3)]
    old_ring = HashRing.from_config(cache_cfg(2))
    for u in range(300):
        o, k = olds[old_ring.shard_of(np.array([u]))[0]], new[ring.shard_of(np.array([u]))[0]]
        for v in ("fm1", "fm2"):
            vo, vk = o._vid.get(v), k._vid.get(v)
            ro = o._sums.find(np.array([u]), np.array([vo], np.uint16))[0] if vo is not None \
                else -1
            rk = k._sums.find(np.array([u]), np.array([vk], np.uint16))[0] if vk is not None \
                else -1
            assert (ro >= 0) == (rk >= 0)
            if ro >= 0:
                np.testing.assert_array_equal(o._sums.sums[ro], k._sums.sums[rk])


def test_split_pairs_refuses_mixed_codecs_and_keeps_the_latest_time():
    a, b = old_pair_stores(1, seed=1, codec="int8")[0], old_pair_stores(1, seed=2, codec="fp16")[0]
    ring = HashRing(2)
    with pytest.raises(DataError, match="codec='int8'.*codec='fp16'"):
        split_pairs([a.snapshot(), b.snapshot()], ring, 0)
    assert split_pairs([], ring, 0) is None
    t = split_pairs([a.snapshot(), old_pair_stores(1, seed=3)[0].snapshot()], ring, 1)
    meta = json.loads(t.schema.metadata[b"solaris_pair_store"])
    assert meta["counters"] == {} and meta["max_now"] == T0 + 180.0


def old_histories(m: int, seed: int = 0) -> list[HistoryStore]:
    """``m`` shards' histories: impressions and labels of users on their shard of the
    m-ring, some users past ``max_events`` (their rings wrapped)."""
    rng = np.random.default_rng(seed)
    ring = HashRing(m)
    stores = [HistoryStore(HCFG) for _ in range(m)]
    for j in range(300):
        u = int(rng.integers(0, 60))
        st = stores[ring.shard_of(np.array([u]))[0]]
        items = rng.integers(0, 40, size=3)
        now = T0 + 10.0 * j
        st.record_impressions(u, items, int(rng.integers(0, 2)), now)
        if rng.random() < 0.5:
            st.record_labels(u, items, rng.integers(0, 2, size=(3, 2)).astype(float), now + 5.0)
    return stores


def history_rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names)))


@pytest.mark.parametrize("m,n", [(2, 3), (3, 2)])
def test_history_rows_land_on_exactly_one_new_shard_and_windows_agree(m: int, n: int):
    olds = old_histories(m, seed=m + n)
    old_ring, ring = HashRing(m), HashRing(n)
    before = [r for st in olds for r in history_rows(st.snapshot())]
    after, news = [], []
    for s in range(n):
        t = split_history((st.snapshot() for st in olds), ring, s)
        rows = history_rows(t)
        assert all(ring.shard_of(np.array([r[0]]))[0] == s for r in rows)
        after += rows
        news.append(HistoryStore(HCFG))
        news[-1].restore(t)
        meta = json.loads(t.schema.metadata[b"solaris.history"])
        assert meta["num_tasks"] == 2 and meta["seq_next"] == max(o._seq_next for o in olds)
    assert sorted(after) == sorted(before)  # each old event row once, unchanged
    users = np.arange(60)
    now = np.full(60, T0 + 10.0 * 300)
    for u in users:
        o = olds[old_ring.shard_of(np.array([u]))[0]].window(users[u:u + 1], now[u:u + 1], 8)
        k = news[ring.shard_of(np.array([u]))[0]].window(users[u:u + 1], now[u:u + 1], 8)
        for key in o:
            np.testing.assert_array_equal(o[key], k[key], err_msg=f"user {u} {key}")
    assert split_history([], ring, 0) is None


# ---- which set a shard restores from --------------------------------------------------------
def files(*specs: tuple[int, int, int, bool]) -> list[tuple[str, int]]:
    """(shard, count, mtime, history?) -> the listing's (name, mtime)."""
    return [(f"shard-{s:03d}-of-{c:03d}{'.history' if h else ''}.parquet", t)
            for s, c, t, h in specs]


def test_snapshot_sets_group_by_count_and_ignore_other_names():
    listing = files((0, 2, 10, False), (1, 2, 12, True), (0, 3, 20, False)) + [
        ("shard-000-of-002.parquet.tmp-ab12", 99), ("notes.txt", 99),
        ("shard-005-of-002.parquet", 99)]
    sets = snapshot_sets("/s/g", listing)
    assert [s.num_shards for s in sets] == [2, 3]
    two = sets[0]
    assert two.pairs == ("/s/g/shard-000-of-002.parquet", None)
    assert two.history == (None, "/s/g/shard-001-of-002.history.parquet")
    assert two.complete and two.written == (10, 12) and two.written_ns == 12
    assert not sets[1].complete


def test_choose_own_first_else_the_newest_complete_set():
    two = files((0, 2, 10, False), (1, 2, 11, False))
    three_incomplete = files((0, 3, 30, False), (1, 3, 30, False))
    four = files(*((s, 4, 40, False) for s in range(4)))
    # no files at all, or only its own: its own (None)
    assert choose(snapshot_sets("/g", []), 0, 3) is None
    assert choose(snapshot_sets("/g", two), 1, 2) is None
    # a new count, a complete old set: that set
    got = choose(snapshot_sets("/g", two), 2, 3)
    assert isinstance(got, SnapshotSet) and got.num_shards == 2
    # an incomplete set is never read; of two complete sets the newer wins
    assert choose(snapshot_sets("/g", three_incomplete), 0, 5) is None
    assert choose(snapshot_sets("/g", two + three_incomplete + four), 0, 5).num_shards == 4
    # a rollback: its own files are older than a complete set of another count
    assert choose(snapshot_sets("/g", two + four), 0, 2).num_shards == 4
    # its own file newer than every other set: its own
    assert choose(snapshot_sets("/g", four + files((0, 2, 50, False))), 0, 2) is None
    # only this shard's own file counts: a sibling's newer file does not hide the set
    assert choose(snapshot_sets("/g", four + files((1, 2, 50, False), (0, 2, 5, True))),
                  0, 2).num_shards == 4


def test_plan_reads_the_folder(tmp_path):
    cfg2, uri = cache_cfg(2), str(tmp_path / "snap")
    for s in range(2):
        fs, path = snapshot_location(uri, "g", s, 2)
        write_snapshot(fs, path, PairStore(cfg2).snapshot())
        write_snapshot(fs, history_location(path), HistoryStore(HCFG).snapshot())
    fs, own = snapshot_location(uri, "g", 1, 3)
    got = plan(fs, own, 1, 3)
    assert got.num_shards == 2 and got.complete and all(got.history)
    fs, own = snapshot_location(uri, "g", 0, 2)
    assert plan(fs, own, 0, 2) is None
    assert plan(pafs.LocalFileSystem(), str(tmp_path / "nowhere" / "g" / "x.parquet"), 0, 2) \
        is None
