"""The FM's cost (the ledger) and what speculation buys (the shards' counts), combined by
``speculation_report``: per-1,000 costs, duplicates, speculation precision."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.cache.store import PairStore
from solaris.config import CacheConfig
from solaris.errors import RequestError
from solaris.precompute.ledger import SHARD_COUNTERS, CostLedger, speculation_report


def a(*x: int) -> np.ndarray:
    return np.array(x, dtype=np.int64)


def test_the_ledger_counts_evaluations_and_fm_seconds():
    led = CostLedger()
    assert led.evaluated(a(1, 1, 2), a(10, 11, 10), seconds=0.5) == 3
    assert led.evaluated(a(1), a(10), seconds=0.25) == 1  # a repeat is the shards' business
    assert led.report() == {"evaluations": 4, "fm_seconds": 0.75}


def test_bad_inputs_name_the_value():
    led = CostLedger()
    with pytest.raises(RequestError, match="seconds"):
        led.evaluated(a(1), a(1), seconds=float("nan"))
    with pytest.raises(RequestError, match="items: length"):
        led.evaluated(a(1, 2), a(1), seconds=1.0)
    with pytest.raises(RequestError, match="served=-1"):
        speculation_report(None, [], served=-1)
    assert led.report()["evaluations"] == 0  # nothing counted from a refused call


def test_report_sums_the_shards_and_divides_by_the_requests_served():
    shards = [dict.fromkeys(SHARD_COUNTERS, 0) for _ in range(2)]
    shards[0].update(expired=4, expired_unread=3, replaced=2, replaced_read=1, duplicates=2)
    shards[1].update(evicted_live=2, evicted_read=2, expired=2, expired_unread=0)
    r = speculation_report({"evaluations": 20, "fm_seconds": 2.0}, shards, served=500)
    assert r["ended"] == 10 and r["ended_read"] == 1 + 1 + 2 + 2
    assert r["speculation_precision"] == pytest.approx(0.6)
    assert r["expired_unread_share"] == pytest.approx(3 / 6)
    assert r["duplicates"] == 2 and r["unique_evaluations"] == 18
    assert r["evaluations_per_1k"] == pytest.approx(40.0)
    assert r["duplicates_per_1k"] == pytest.approx(4.0)
    assert r["fm_seconds_per_1k"] == pytest.approx(4.0)
    assert r["duplicate_share"] == pytest.approx(0.1)
    empty = speculation_report(None, [], served=0)  # nothing yet: undefined, not 0
    assert empty["speculation_precision"] is None and empty["evaluations_per_1k"] is None
    assert empty["evaluations"] is None and empty["duplicates_per_1k"] is None


def test_precision_from_a_real_store_matches_its_entries_followed_one_at_a_time():
    """Random writes, reads and time on a store; beside it a dict follows every entry (its
    write time and whether it was read) and ends it by the store's rules -- replaced,
    expired by its time bucket -- one key at a time. The report's counts equal the dict's."""
    rng = np.random.default_rng(0)
    cfg = CacheConfig(dim=2, read_ttl_s=600, retention_s=1800, bucket_s=300)
    store, t, max_now = PairStore(cfg), 300.0 * 1000, -np.inf
    live: dict[tuple[int, int], list] = {}  # key -> [written, read]
    ref = dict(ended=0, ended_read=0, duplicates=0)

    def advance(now: float) -> None:
        nonlocal max_now
        max_now = max(max_now, now)
        cutoff = np.floor((max_now - cfg.retention_s) / cfg.bucket_s)
        for k, (w, rd) in list(live.items()):
            if np.floor(w / cfg.bucket_s) < cutoff:
                del live[k]
                ref["ended"] += 1
                ref["ended_read"] += rd
    for _ in range(400):
        t += float(rng.integers(0, 200))
        keys = rng.choice(18, size=4, replace=False)  # distinct keys in a batch
        u, i = keys // 6, keys % 6
        advance(t)
        if rng.random() < 0.5:
            store.put(u, i, rng.normal(size=(4, 2)), "v", t)
            for k in zip(u.tolist(), i.tolist()):
                if k in live:
                    ref["ended"] += 1
                    ref["ended_read"] += live[k][1]
                    ref["duplicates"] += t - live[k][0] <= cfg.read_ttl_s
                live[k] = [t, False]
        else:
            store.get(u, i, "v", t)
            for k in zip(u.tolist(), i.tolist()):
                if k in live and t - live[k][0] <= cfg.read_ttl_s:
                    live[k][1] = True
    store.expire(t + 10 * cfg.retention_s)
    advance(t + 10 * cfg.retention_s)  # everything ends
    r = speculation_report({"evaluations": 1, "fm_seconds": 0.0}, [store.metrics()], served=1)
    assert not live and ref["ended"] > 100 and 0 < ref["ended_read"] < ref["ended"]
    assert ref["duplicates"] > 0
    assert {k: r[k] for k in ref} == ref
    assert r["speculation_precision"] == pytest.approx(ref["ended_read"] / ref["ended"])
