"""bench/serve_floor.py's floor check: the calls per request it counts, the bound priced with
back-to-back calls and, when given, with paced ones; bench/actor_call.py's paced mode refuses
a bad rate, fan-out or round count by name."""

from __future__ import annotations

import pytest

from tests.benches import load_bench

actor_call = load_bench("actor_call")
serve_floor = load_bench("serve_floor")


def _serve(extra_ms: float) -> dict:
    """A bench/serve.py JSON with 2 lookup calls and 0.5 after-answer calls per request."""
    vm = {"router": 10.0, "vm": 6.0}
    return {
        "cpu_ms_per_request": {"vm_500": vm,
                               "solaris_500": {"router": 10.0 + extra_ms, "vm": 6.0}},
        "config": {"trials": 3, "warmup_trials": 1, "requests": 100},
        # 400 SOLARIS requests of the timed rounds, one user and one probe call each
        "shard_answer_ms": {"user": {"calls": 400}, "probe_only": {"calls": 400}},
        "after_answer": {"requests": 400, "queue_calls": 100},
        "cache_client": {"history_writes": {"sent": 100}},
        "p50_overhead_500": 1.2, "p50_overhead_500_per_trial": [1.2, 1.1, 1.3],
        "tier_share": {}, "errors": 0}


CALL = {"kinds": {"threaded_group": {"caller_cpu_ms": 0.5, "callee_cpu_ms": 0.5}}}
PACED = {"caller_cpu_ms": 0.9, "callee_cpu_ms": 1.1, "rate": 25.0, "fanout": 2}


def test_floor_counts_calls_and_prices_them_both_ways() -> None:
    serve = _serve(extra_ms=4.5)
    assert serve_floor.lookup_calls(serve) == 2.0
    f = serve_floor.floor_of(serve, CALL, paced=PACED)
    assert f["extra_cpu_ms"] == pytest.approx(4.5)
    assert f["actor_calls_per_request"] == pytest.approx(2.5)  # 2 lookups + (100 + 100) / 400
    assert f["bound_ms"] == pytest.approx(2.5 * 1.0 + 1.5)
    assert not f["within_bound"]  # 4.5 > 4.0
    assert f["bound_paced_ms"] == pytest.approx(2.5 * 2.0 + 1.5)
    assert f["within_bound_paced"]  # 4.5 <= 6.5
    assert (f["paced_rate"], f["paced_fanout"]) == (25.0, 2)


def test_floor_without_paced_block_has_no_paced_bound() -> None:
    f = serve_floor.floor_of(_serve(extra_ms=3.0), CALL)
    assert f["within_bound"] and "bound_paced_ms" not in f


@pytest.mark.parametrize("rate, fanout, rounds, bad", [(0.0, 2, 10, "rate=0.0"),
                                                       (25.0, 0, 10, "fanout=0"),
                                                       (25.0, 2, 0, "rounds=0")])
def test_paced_refuses_bad_arguments_by_name(rate, fanout, rounds, bad) -> None:
    with pytest.raises(ValueError, match=bad):
        actor_call.measure_paced(rate, fanout, rounds, arg_bytes=100)


def test_paced_refuses_an_unknown_caller_by_name() -> None:
    with pytest.raises(ValueError, match="caller='spin'"):
        actor_call.measure_paced(25.0, 2, 10, arg_bytes=100, caller="spin")
