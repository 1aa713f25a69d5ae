"""``PairStore.answer`` (the shard-side reduction) against a slow exact reference, and the
wire format's round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.cache import wire
from solaris.cache.query import ShardAnswer, ShardQuery
from solaris.cache.store import PairStore
from solaris.config import CacheConfig
from solaris.errors import RequestError

D, USERS, ITEMS, V = 3, 8, 12, "v1"
T0 = 900.0 * 3000
CFG = CacheConfig(dim=D, read_ttl_s=3600, retention_s=4 * 3600, bucket_s=900)


def world(seed: int, density: float = 0.3):
    """A store and its entries {(user, item, version): (vector, written)}; request at ``now``.
    At a low ``density`` most users hold nothing of a version (the answer skips their keys)."""
    rng = np.random.default_rng(seed)
    now = T0 + 4 * 3600
    entries = {}
    for u in range(USERS):
        for i in range(ITEMS):
            for v in (V, "v0"):
                if rng.random() < density:
                    age = float(rng.choice([0, 5, 3599, 3600, 3601, 9000]))
                    entries[(u, i, v)] = (rng.normal(size=D).astype(np.float32), now - age)
    store = PairStore(CFG)
    for (u, i, v), (vec, w) in sorted(entries.items(), key=lambda kv: kv[1][1]):
        store.put(np.array([u]), np.array([i]), vec[None], v, w)
    return store, entries, now


def reference(entries, now, q: ShardQuery) -> dict:
    """The answer's rows, one key at a time, in the documented order."""
    def fresh(u, i):
        e = entries.get((u, i, q.version))
        return e if e is not None and 0 <= now - e[1] <= CFG.read_ttl_s else None

    items = q.items.tolist()
    own, need = [], [True] * len(items)
    if q.user >= 0:
        for j, i in enumerate(items):
            e, f = entries.get((q.user, i, q.version)), fresh(q.user, i)
            if f is not None or (q.aggregate and e is not None):
                own.append((j, f is not None, e[0], now - e[1]))
            need[j] = f is None
    nbr = []
    for j, i in enumerate(items):
        if not need[j]:
            continue
        hits = [(r, fresh(v, i)) for r, v in enumerate(q.nbr_users.tolist())
                if fresh(v, i) is not None]
        nbr += [(j, r, e[0], now - e[1]) for r, e in (hits if q.nbr_all else hits[:1])]
        need[j] = not hits
    inbr = []
    if q.user >= 0:
        for j in range(len(items)):
            for i2 in (q.item_nbrs[j].tolist() if q.item_nbrs.shape[1] else []):
                e = fresh(q.user, i2) if need[j] and i2 >= 0 else None
                if e is not None:
                    inbr.append((j, e[0], now - e[1]))
                    break
    mine = [v for (u, _, ver), (v, _) in entries.items() if u == q.user and ver == q.version]
    agg = (np.sum(np.array(mine, np.float64), axis=0), len(mine)) if q.aggregate and mine \
        else (np.zeros(D), 0)
    return {"own": own, "nbr": nbr, "inbr": inbr, "agg": agg}


def check(a: ShardAnswer, want: dict) -> None:
    assert a.own_idx.tolist() == [j for j, *_ in want["own"]]
    assert a.own_fresh.tolist() == [f for _, f, *_ in want["own"]]
    assert a.own_age_s.tolist() == [g for *_, g in want["own"]]
    assert np.array_equal(a.own_vectors.reshape(-1, D),
                          np.array([v for _, _, v, _ in want["own"]]).reshape(-1, D))
    assert list(zip(a.nbr_idx.tolist(), a.nbr_rank.tolist())) == [(j, r) for j, r, *_ in
                                                                 want["nbr"]]
    assert a.nbr_age_s.tolist() == [g for *_, g in want["nbr"]]
    assert np.array_equal(a.nbr_vectors.reshape(-1, D),
                          np.array([v for _, _, v, _ in want["nbr"]]).reshape(-1, D))
    assert a.inbr_idx.tolist() == [j for j, *_ in want["inbr"]]
    assert a.inbr_age_s.tolist() == [g for *_, g in want["inbr"]]
    assert np.array_equal(a.inbr_vectors.reshape(-1, D),
                          np.array([v for _, v, _ in want["inbr"]]).reshape(-1, D))
    total, count = want["agg"]
    assert a.agg_count == count
    np.testing.assert_allclose(a.agg_sum, total, rtol=1e-9, atol=1e-9)


@settings(max_examples=120, deadline=None, database=None)
@given(seed=st.integers(0, 2**31), user=st.integers(-1, USERS - 1),
       items=st.lists(st.integers(0, ITEMS + 2), max_size=10, unique=True),
       ki=st.integers(0, 4), nbrs=st.lists(st.integers(0, USERS - 1), max_size=5),
       aggregate=st.booleans(), nbr_all=st.booleans(), version=st.sampled_from([V, "v0", "v9"]),
       density=st.sampled_from([0.3, 0.03]))
def test_answer_matches_reference(seed, user, items, ki, nbrs, aggregate, nbr_all, version,
                                  density):
    store, entries, now = world(seed, density)
    rng = np.random.default_rng(seed + 1)
    items = np.array(sorted(items), dtype=np.int64)
    item_nbrs = rng.integers(-1, ITEMS, size=(len(items), ki))  # pads and repeats
    q = ShardQuery(version=version, now=now, items=items, user=user, item_nbrs=item_nbrs,
                   aggregate=aggregate, nbr_users=np.array(nbrs, dtype=np.int64),
                   nbr_all=nbr_all)
    a = store.answer(q)
    check(a, reference(entries, now, q))
    back = wire.decode_answer(wire.encode_answer(a))
    for name in a.__dataclass_fields__:
        assert np.array_equal(getattr(back, name), getattr(a, name)), name
    bq = wire.decode_query(wire.encode_query(q))
    check(store.answer(bq), reference(entries, now, q))


def test_answer_counts_by_tier():
    store = PairStore(CFG)
    z = np.ones((1, D), np.float32)
    store.put(np.array([0]), np.array([5]), z, V, T0)  # own pair of 5
    store.put(np.array([1]), np.array([6]), z, V, T0)  # neighbour 1 holds 6
    store.put(np.array([0]), np.array([9]), z, V, T0)  # own pair of 9, item neighbour of 7
    q = ShardQuery(version=V, now=T0, items=np.array([5, 6, 7]), user=0,
                   item_nbrs=np.array([[6, 7], [5, -1], [8, 9]]), aggregate=True,
                   nbr_users=np.array([1, 2]))
    a = store.answer(q)
    assert a.own_idx.tolist() == [0] and a.nbr_idx.tolist() == [1]
    assert a.inbr_idx.tolist() == [2] and a.agg_count == 2
    m = store.metrics()
    assert (m["pair_hits"], m["pair_misses"], m["nbr_probes"], m["nbr_hits"]) == (1, 2, 4, 1)
    assert (m["inbr_probes"], m["inbr_hits"], m["agg_requests"], m["agg_present"]) == (3, 1, 3, 3)


@pytest.mark.parametrize("change, message", [
    (dict(user=-2), "user=-2"),
    (dict(items=np.array([1, -4])), "items: negative id -4"),
    (dict(item_nbrs=np.zeros((3, 2), np.int64)), r"item_nbrs: shape \(3, 2\), expected \(2, ki\)"),
    (dict(item_nbrs=np.full((2, 1), -3)), "item_nbrs: id -3"),
    (dict(nbr_users=np.array([[1]])), "nbr_users: expected a 1-D integer array"),
    (dict(version=""), "version=''"),
])
def test_bad_queries_name_the_value(change, message):
    q = dict(version=V, now=T0, items=np.array([1, 2]), user=0,
             item_nbrs=np.zeros((2, 1), np.int64))
    q.update(change)
    with pytest.raises(RequestError, match=message):
        PairStore(CFG).answer(ShardQuery(**q))


def test_wire_rejects_foreign_bytes():
    with pytest.raises(RequestError, match="shard_answer: got a shard_query frame"):
        wire.decode_answer(wire.encode_query(ShardQuery(version=V, now=T0)))
    with pytest.raises(RequestError, match="too short for a frame"):
        wire.decode_query(b"\x00")


def test_stashed_keys_take_the_general_lookup():
    """Index cells waiting in the stash (where failed kicks leave them) are still found."""
    store, entries, now = world(7)
    q = ShardQuery(version=V, now=now, items=np.arange(ITEMS), user=2,
                   item_nbrs=(np.arange(ITEMS)[:, None] + np.arange(1, 4)) % ITEMS,
                   aggregate=True, nbr_users=np.array([0, 5, 6]))
    want = reference(entries, now, q)
    check(store.answer(q), want)
    index = store.table.index
    live = np.flatnonzero(index._cells != np.iinfo(np.uint64).max)
    moved = live[::3]  # a third of the cells move to the stash, as failed kicks leave them
    index._stash_b = moved // 4
    index._stash_v = index._cells[moved].copy()
    index._cells[moved] = np.iinfo(np.uint64).max
    assert index.stashed == len(moved)
    check(store.answer(q), want)
