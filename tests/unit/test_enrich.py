"""Enrichment (plan -> route -> shard answers -> assemble) against a slow exact reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris.cache.query import ShardQuery
from solaris.cache import wire
from solaris.cache.ring import HashRing
from solaris.cache.store import PairStore
from solaris.config import CacheConfig, EnrichConfig
from solaris.knn.neighbours import NeighbourTable
from solaris.online.enrich import assemble, enrich_local, plan, route
from solaris.errors import DataError, RequestError
from solaris.tiers import Tier

D, N_USERS, N_ITEMS, V = 3, 14, 16, "fm-v1"
T0 = 900.0 * 2000
CACHE = CacheConfig(dim=D, read_ttl_s=3600, retention_s=4 * 3600, bucket_s=900)


def make_world(seed: int):
    """Entries {(user, item): (vector, written_at)}, KNN tables, and the request time."""
    rng = np.random.default_rng(seed)
    now = T0 + 3 * 3600
    entries = {}
    for u in range(N_USERS):
        for i in range(N_ITEMS):
            if rng.random() < 0.35:
                age = float(rng.choice([0, 10, 1800, 3600, 3601, 7000]))  # some stale
                entries[(u, i)] = (rng.normal(size=D).astype(np.float32), now - age)

    def knn(n, k, universe):
        ids = rng.integers(-1, universe, (n, k))  # -1 pads, repeats and all
        sims = np.sort(rng.uniform(-0.3, 1.0, (n, k)).astype(np.float32))[:, ::-1]
        for r in range(n):  # a row may list itself: it must be skipped
            if rng.random() < 0.3:
                ids[r, rng.integers(k)] = r
        return NeighbourTable(ids, sims.copy(), "knn-1")

    return entries, knn(N_USERS - 2, 6, N_USERS), knn(N_ITEMS - 3, 5, N_ITEMS), now


def fill(store: PairStore, entries, users_on_shard=None) -> None:
    for (u, i), (vec, w) in sorted(entries.items(), key=lambda kv: kv[1][1]):
        if users_on_shard is None or u in users_on_shard:
            store.put(np.array([u]), np.array([i]), vec[None, :], V, w)


def nbrs_of(table: NeighbourTable, key: int, k: int):
    if table is None or key >= len(table.ids):
        return []
    out = [(int(j), float(s)) for j, s in zip(table.ids[key], table.sims[key])
           if j >= 0 and j != key]
    return out[:k]


def reference(entries, user, cands, now, user_knn, item_knn, cfg: EnrichConfig, up=None):
    """Per-candidate slots, one key at a time. ``up(u)``: is user u's shard answering."""
    up = up or (lambda u: True)

    def fresh(u, i):
        e = entries.get((u, i))
        return e if e is not None and up(u) and 0 <= now - e[1] <= CACHE.read_ttl_s else None

    nb = nbrs_of(user_knn, user, cfg.user_knn_probe)
    rows = []
    for c in cands.tolist():
        emb, tier, age = np.zeros(D), Tier.NONE, 0.0
        own = fresh(user, c)
        if own is not None:
            emb, tier, age = own[0], Tier.PAIR, now - own[1]
        else:
            hold = [(s, fresh(v, c)) for v, s in nb if fresh(v, c) is not None]
            if hold and cfg.user_knn_mode == "nearest":
                e = hold[0][1]
                emb, tier, age = e[0], Tier.USER_NEIGHBOUR, now - e[1]
            elif hold:
                w = np.array([max(s, 1e-6) for s, _ in hold])
                emb = (w[:, None] * np.array([e[0] for _, e in hold], np.float64)).sum(0) / w.sum()
                age = float((w * np.array([now - e[1] for _, e in hold])).sum() / w.sum())
                tier = Tier.USER_NEIGHBOUR
            elif cfg.item_tier:
                for j, _ in nbrs_of(item_knn, c, cfg.item_knn_probe):
                    e = fresh(user, j)
                    if e is not None:
                        emb, tier, age = e[0], Tier.ITEM_NEIGHBOUR, now - e[1]
                        break
        others = [v for (u, i), (v, _) in entries.items() if u == user and i != c and up(u)]
        agg = np.mean(others, axis=0) if others and cfg.aggregate else None
        rows.append((emb, tier, age, agg, own is None))
    return rows


def check(slots, want):
    assert slots.pair_emb.shape == (len(want), D) and slots.agg_emb.shape == (len(want), D)
    for k, (emb, tier, age, agg, missing) in enumerate(want):
        assert slots.pair_tier[k] == tier, k
        assert slots.pair_present[k] == (tier != Tier.NONE)
        np.testing.assert_allclose(slots.pair_emb[k], emb, rtol=1e-5, atol=1e-6)
        assert slots.pair_age_s[k] == pytest.approx(age)
        assert slots.agg_present[k] == (agg is not None)
        np.testing.assert_allclose(slots.agg_emb[k], 0 if agg is None else agg, rtol=1e-5,
                                   atol=1e-6)
        assert slots.missing[k] == missing


configs = st.builds(EnrichConfig, user_knn_probe=st.integers(0, 6),
                    user_knn_mode=st.sampled_from(["nearest", "weighted"]),
                    item_knn_probe=st.integers(0, 5), item_tier=st.booleans(),
                    aggregate=st.booleans())


@settings(max_examples=40, deadline=None, database=None)
@given(seed=st.integers(0, 2**31), cfg=configs, user=st.integers(0, N_USERS - 1),
       cands=st.lists(st.integers(0, N_ITEMS + 2), min_size=0, max_size=20))
def test_local_enrichment_matches_reference(seed, cfg, user, cands):
    entries, uk, ik, now = make_world(seed)
    store = PairStore(CACHE)
    fill(store, entries)
    cands = np.array(cands, dtype=np.int64)
    slots = enrich_local(store, user, cands, now, V, uk, ik, cfg)
    check(slots, reference(entries, user, cands, now, uk, ik, cfg))


@settings(max_examples=30, deadline=None, database=None)
@given(seed=st.integers(0, 2**31), cfg=configs, user=st.integers(0, N_USERS - 1),
       n_shards=st.integers(1, 4), down=st.integers(-1, 3))
def test_sharded_enrichment_routes_once_per_shard_and_reads_dead_shards_as_misses(
        seed, cfg, user, n_shards, down):
    entries, uk, ik, now = make_world(seed)
    ring = HashRing(n_shards, 16)
    stores = [PairStore(CACHE) for _ in range(n_shards)]
    for s in range(n_shards):
        fill(stores[s], entries, {u for u in range(N_USERS) if ring(np.array([u]))[0] == s})
    cands = np.arange(N_ITEMS)
    p = plan(user, cands, uk, ik, cfg)
    queries = route(p, ring.shard_of, V, now)

    # one query per shard holding any key, each key on the shard the ring says
    nbrs = [v for v, _ in nbrs_of(uk, user, cfg.user_knn_probe)]
    expect = {int(ring(np.array([user]))[0])} | {int(s) for s in ring(np.array(nbrs, int))}
    assert set(queries) == expect
    for s, q in queries.items():
        assert isinstance(q, ShardQuery) and q.version == V and q.now == now
        assert q.user == -1 or (q.user == user and ring(np.array([user]))[0] == s)
        assert (ring(q.nbr_users) == s).all()
    assert [q.user for q in queries.values()].count(user) == 1
    probed = np.concatenate([q.nbr_users for q in queries.values()])
    assert sorted(probed.tolist()) == sorted(nbrs)
    # what crosses the wire comes back bit for bit
    for q in queries.values():
        back = wire.decode_query(wire.encode_query(q))
        assert (back.version, back.now, back.user, back.aggregate, back.nbr_all) == \
            (q.version, q.now, q.user, q.aggregate, q.nbr_all)
        for name in ("items", "item_nbrs", "nbr_users"):
            assert np.array_equal(getattr(back, name), getattr(q, name)), name

    answers = {s: (None if s == down else stores[s].answer(q)) for s, q in queries.items()}
    slots = assemble(p, answers, D)
    # an answer that crossed the wire assembles into the same slots, bit for bit
    over = {s: None if a is None else wire.decode_answer(wire.encode_answer(a))
            for s, a in answers.items()}
    same = assemble(p, over, D)
    for name in slots.__dataclass_fields__:
        assert np.array_equal(getattr(slots, name), getattr(same, name)), name
    up = lambda u: int(ring(np.array([u]))[0]) != down  # noqa: E731
    check(slots, reference(entries, user, cands, now, uk, ik, cfg, up=up))
    if down not in queries:  # every shard up: the same slots as one store holding everything, bit for bit
        whole = PairStore(CACHE)
        fill(whole, entries)
        local = enrich_local(whole, user, cands, now, V, uk, ik, cfg)
        for name in slots.__dataclass_fields__:
            assert np.array_equal(getattr(slots, name), getattr(local, name)), name


def test_tier_order_nearest_and_weighted_by_hand():
    store = PairStore(CACHE)
    now = T0
    z = lambda x: np.full((1, D), x, np.float32)  # noqa: E731
    store.put(np.array([0]), np.array([10]), z(1.0), V, now - 60)  # own pair of item 10
    store.put(np.array([2]), np.array([11]), z(2.0), V, now - 120)  # 2nd neighbour has 11
    store.put(np.array([3]), np.array([11]), z(5.0), V, now - 30)  # 3rd neighbour has 11
    store.put(np.array([0]), np.array([21]), z(7.0), V, now - 10)  # own pair of 21 ~ 12
    uk = NeighbourTable(np.array([[0, 1, 2, 3]] + [[-1] * 4] * 3),
                        np.array([[1.0, 0.9, 0.6, 0.2]] + [[0] * 4] * 3), "k")
    ik = NeighbourTable(np.full((25, 2), -1), np.zeros((25, 2)), "k")
    ik.ids[12] = [20, 21]  # 20 not held, 21 held: the nearest holding one
    cands = np.array([10, 11, 12, 13])
    nearest = enrich_local(store, 0, cands, now, V, uk, ik, EnrichConfig(user_knn_mode="nearest"))
    assert nearest.pair_tier.tolist() == [Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR,
                                          Tier.NONE]
    assert nearest.pair_emb[:, 0].tolist() == [1.0, 2.0, 7.0, 0.0]
    assert nearest.pair_age_s.tolist() == [60, 120, 10, 0]
    assert nearest.missing.tolist() == [False, True, True, True]
    assert nearest.pair_present.tolist() == [True, True, True, False]
    weighted = enrich_local(store, 0, cands, now, V, uk, ik,
                            EnrichConfig(user_knn_mode="weighted"))
    assert weighted.pair_emb[1, 0] == pytest.approx((0.6 * 2 + 0.2 * 5) / 0.8)
    assert weighted.pair_age_s[1] == pytest.approx((0.6 * 120 + 0.2 * 30) / 0.8)
    # the aggregate leaves out the candidate itself: user 0 holds items 10 and 21
    assert nearest.agg_present.all()
    assert nearest.agg_emb[:, 0].tolist() == [7.0, 4.0, 4.0, 4.0]
    # a wrong version reads as misses everywhere
    other = enrich_local(store, 0, cands, now, "fm-v0", uk, ik, EnrichConfig())
    assert not other.pair_present.any() and not other.agg_present.any()


def test_neighbour_table_skips_self_and_pads():
    t = NeighbourTable(np.array([[0, 2, -1, 1], [-1, -1, -1, -1]]),
                       np.array([[1.0, 0.8, 0.0, 0.5], [0, 0, 0, 0]]), "k")
    ids, sims = t.neighbours(np.array([0, 1, 7, -3]), 3)
    assert ids.tolist() == [[2, 1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]]
    assert sims[0].tolist() == pytest.approx([0.8, 0.5, 0.0])


@pytest.mark.parametrize("call, message", [
    (lambda s: enrich_local(s, 1, np.arange(5), T0, V, None, None,
                            EnrichConfig(max_candidates=4)),
     "candidates: 5 > enrich.max_candidates=4"),
    (lambda s: enrich_local(s, 1, np.array([3, -7]), T0, V, None, None, EnrichConfig()),
     "candidates: negative id -7"),
    (lambda s: enrich_local(s, -2, np.array([3]), T0, V, None, None, EnrichConfig()),
     "user=-2"),
    (lambda s: enrich_local(s, 1, np.array([3]), float("nan"), V, None, None, EnrichConfig()),
     "now=nan"),
    (lambda s: enrich_local(s, 1, np.array([[3]]), T0, V, None, None, EnrichConfig()),
     r"candidates: expected a 1-D integer array, got shape \(1, 1\)"),
    (lambda s: enrich_local(s, 1, np.array([3]), T0, "", None, None, EnrichConfig()),
     "version=''"),
])
def test_bad_requests_name_the_value(call, message):
    with pytest.raises(RequestError, match=message):
        call(PairStore(CACHE))


def test_nearest_of_one_key_equals_its_neighbours_row():
    rng = np.random.default_rng(5)
    t = NeighbourTable(rng.integers(-1, 9, (9, 7)), rng.random((9, 7)), "k")
    for key in range(-1, 11):
        for k in (0, 1, 3, 7, 9):
            ids, sims = t.nearest(key, k)
            row_ids, row_sims = t.neighbours(np.array([key]), k)
            keep = row_ids[0] >= 0
            assert ids.tolist() == row_ids[0][keep].tolist()
            assert sims.tolist() == row_sims[0][keep].tolist()


def test_a_one_row_table_answers_as_its_row_of_the_dense_table():
    """A cold-start user's query is a one-row ``NeighbourTable`` (``first`` = the user):
    for that user it answers exactly as the dense table's row would, for every other id
    it holds nothing."""
    from solaris.online.serving import is_cold

    rng = np.random.default_rng(6)
    dense = NeighbourTable(rng.integers(-1, 12, (12, 7)), rng.random((12, 7)), "k")
    for user in range(12):
        one = NeighbourTable.one(user, dense.ids[user], dense.sims[user], "k")
        keys = np.array([user, user - 1, user + 1, -1, 10**9])
        for k in (0, 1, 3, 7, 9):
            assert [a.tolist() for a in one.nearest(user, k)] == \
                [a.tolist() for a in dense.nearest(user, k)]
            assert one.nearest(user + 1, k)[0].size == 0
            ids, sims = one.neighbours(keys, k)
            want_ids, want_sims = dense.neighbours(keys[:1], k)
            assert ids[0].tolist() == want_ids[0].tolist()
            assert sims[0].tolist() == want_sims[0].tolist()
            assert (ids[1:] == -1).all() and (sims[1:] == 0).all()
            assert (one.neighbour_ids(keys, k) == ids).all()
        assert one.has(user) == dense.has(user) == (not is_cold(dense, user))
        assert not one.has(user + 1) and not one.has(user - 1)
    with pytest.raises(DataError, match="first=-1"):
        NeighbourTable(np.zeros((1, 2)), np.zeros((1, 2)), "k", first=-1)
