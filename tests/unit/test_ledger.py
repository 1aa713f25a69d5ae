"""Cost ledger: per-1,000 costs with duplicates counted, speculation precision."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.errors import RequestError
from solaris.precompute.ledger import CostLedger


def a(*x: int) -> np.ndarray:
    return np.array(x, dtype=np.int64)


def test_costs_per_thousand_served_with_duplicates_counted():
    led = CostLedger()
    assert led.report()["evaluations_per_1k"] is None  # nothing served yet
    led.served(400)
    led.served()
    led.served(99)
    assert led.evaluated(a(1, 1, 2), a(10, 11, 10), seconds=0.5) == 0
    # pair (1, 10) again, e.g. its lease expired after the cache write: inferred duplicate
    assert led.evaluated(a(1, 3), a(10, 30), seconds=0.25) == 1
    # the caller knows better (a cache lookup found a live entry written before a restart)
    assert led.evaluated(a(4, 5), a(40, 50), seconds=0.25,
                         duplicate_mask=np.array([True, False])) == 1
    r = led.report()
    assert r["served"] == 500 and r["evaluations"] == 7 and r["duplicates"] == 2
    assert r["unique_evaluations"] == 5
    assert r["evaluations_per_1k"] == pytest.approx(14.0)
    assert r["duplicates_per_1k"] == pytest.approx(4.0)
    assert r["fm_seconds_per_1k"] == pytest.approx(2.0)
    assert r["duplicate_share"] == pytest.approx(2 / 7)
    assert r["replaced"] == 1 and r["live"] == 6


def test_speculation_precision_and_expired_unread():
    led = CostLedger()
    led.evaluated(a(1, 1, 1, 2), a(1, 2, 3, 1), seconds=1.0)
    led.read(a(1, 1, 1, 9), a(1, 1, 2, 9))  # (1,1) twice, (1,2) once, (9,9) never evaluated
    led.expired(a(1, 1, 1, 2), a(1, 2, 3, 1))
    r = led.report()
    assert r["reads"] == 4 and r["first_reads"] == 2 and r["reads_untracked"] == 1
    assert r["expired"] == 4 and r["expired_read"] == 2 and r["expired_unread"] == 2
    assert r["speculation_precision"] == pytest.approx(0.5)
    assert r["expired_unread_share"] == pytest.approx(0.5)
    assert r["live"] == 0


def test_cache_read_flags_override_and_untracked_expiries():
    led = CostLedger()
    led.evaluated(a(1), a(1), seconds=0.1)
    led.expired(a(1, 7), a(1, 7), was_read=np.array([True, False]))  # the cache's flags
    led.expired(a(8), a(8))  # unknown to the ledger, no flags: not counted
    r = led.report()
    assert r["expired"] == 2 and r["expired_read"] == 1 and r["expired_untracked"] == 1
    assert r["speculation_precision"] == pytest.approx(0.5)


def test_a_replaced_entry_ends_with_its_read_flag():
    led = CostLedger()
    led.evaluated(a(1, 2), a(1, 2), seconds=0.1)
    led.read(a(1), a(1))
    led.evaluated(a(1, 2), a(1, 2), seconds=0.1)  # both re-evaluated: (1,1) had been read
    led.expired(a(1, 2), a(1, 2))
    r = led.report()
    assert r["replaced"] == 2 and r["replaced_read"] == 1 and r["expired_read"] == 0
    assert r["speculation_precision"] == pytest.approx(1 / 4)


def test_bad_inputs_name_the_value():
    led = CostLedger()
    with pytest.raises(RequestError, match="seconds"):
        led.evaluated(a(1), a(1), seconds=float("nan"))
    with pytest.raises(RequestError, match="duplicate_mask"):
        led.evaluated(a(1), a(1), seconds=1.0, duplicate_mask=np.array([True, False]))
    with pytest.raises(RequestError, match="items: length"):
        led.read(a(1, 2), a(1))
    with pytest.raises(RequestError, match="n=-1"):
        led.served(-1)


# ------------------------------------------------------------------ the batch path vs a loop

class LoopLedger:
    """The ledger's rules one pair at a time (the reference the batch code must match)."""

    def __init__(self) -> None:
        self.open: dict[int, bool] = {}
        self.c = dict.fromkeys(("evaluations", "duplicates", "replaced", "replaced_read",
                                "reads", "reads_untracked", "first_reads", "expired",
                                "expired_read", "expired_untracked"), 0)

    def evaluated(self, keys, mask=None) -> int:
        n_dup = 0
        for j, k in enumerate(keys):
            prev = self.open.get(k)
            if prev is not None:
                self.c["replaced"] += 1
                self.c["replaced_read"] += prev
            n_dup += (prev is not None) if mask is None else bool(mask[j])
            self.open[k] = False
        self.c["evaluations"] += len(keys)
        self.c["duplicates"] += n_dup
        return n_dup

    def read(self, keys) -> None:
        self.c["reads"] += len(keys)
        for k in keys:
            prev = self.open.get(k)
            if prev is None:
                self.c["reads_untracked"] += 1
            elif not prev:
                self.open[k] = True
                self.c["first_reads"] += 1

    def expired(self, keys, flags=None) -> None:
        for j, k in enumerate(keys):
            prev = self.open.pop(k, None)
            if prev is None and flags is None:
                self.c["expired_untracked"] += 1
                continue
            self.c["expired"] += 1
            self.c["expired_read"] += bool(flags[j]) if flags is not None else prev


@pytest.mark.parametrize("seed", range(12))
def test_batch_counting_matches_a_pair_by_pair_loop(seed):
    """Repeated keys within a batch, re-evaluations, reads and expiries (with and without
    the cache's flags): every counter, the return values and the live set agree."""
    rng = np.random.default_rng(seed)
    led, ref = CostLedger(), LoopLedger()
    for _ in range(60):
        n = int(rng.integers(0, 12))
        u, i = rng.integers(0, 3, n), rng.integers(0, 4, n)  # few keys: many repeats
        keys = ((u << 32) | i).tolist()
        op = rng.integers(0, 5)
        if op == 0:
            assert led.evaluated(u, i, 0.1) == ref.evaluated(keys)
        elif op == 1:
            mask = rng.random(n) < 0.5
            assert led.evaluated(u, i, 0.1, duplicate_mask=mask) == ref.evaluated(keys, mask)
        elif op == 2:
            led.read(u, i)
            ref.read(keys)
        elif op == 3:
            led.expired(u, i)
            ref.expired(keys)
        else:
            flags = rng.random(n) < 0.5
            led.expired(u, i, was_read=flags)
            ref.expired(keys, flags)
        r = led.report()
        assert {k: r[k] for k in ref.c} == ref.c
        assert r["live"] == len(ref.open) and r["live_read"] == sum(ref.open.values())
