"""bench/precompute_gpu.py's settings and its agreement figures: the GPU block sizes it is
told, bad values refused by name, and the distance between two devices' vectors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benches import load_bench

bench = load_bench("precompute_gpu")


def test_settings_name_the_cpu_threads_and_the_gpu_blocks() -> None:
    sets = bench.settings(["cpu", "cuda"], bench.parse_threads(["1", "4"]),
                          bench.parse_blocks(["32:256", "512:4096", "0:0"]))
    assert [(n, d, t, b) for n, d, t, b in sets] == [
        ("cpu1", "cpu", 1, (32, 256)), ("cpu4", "cpu", 4, (32, 256)),
        ("cuda", "cuda", 0, (32, 256)), ("cuda_512x4096", "cuda", 0, (512, 4096)),
        ("cuda_whole", "cuda", 0, (0, 0))]
    assert bench.parse_threads(["all"]) == [max(1, __import__("os").cpu_count() or 1)]


@pytest.mark.parametrize("bad,flag", [(["3"], "--blocks '3'"), (["a:b"], "--blocks 'a:b'")])
def test_bad_blocks_are_refused_by_name(bad, flag) -> None:
    with pytest.raises(SystemExit, match=flag):
        bench.parse_blocks(bad)


def test_bad_threads_and_devices_are_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="--cpu-threads '0'"):
        bench.parse_threads(["0"])
    with pytest.raises(SystemExit, match="--devices 'tpu'"):
        bench.settings(["tpu"], [1], [(0, 0)])


def test_agreement_measures_the_largest_difference_against_the_int8_step() -> None:
    a = np.array([[1.0, -2.54], [0.5, 0.0]], np.float32)
    b = a.copy()
    assert bench.agreement(a, b)["bit_identical"]
    b[1, 0] += 0.01
    got = bench.agreement(a, b)
    assert not got["bit_identical"]
    assert got["max_abs_diff"] == pytest.approx(0.01, abs=1e-6)
    assert got["max_abs_entry"] == pytest.approx(2.54)
    assert got["diff_over_int8_step"] == pytest.approx(0.01 / (2.54 / 127), rel=1e-4)
    assert got["min_cosine"] == pytest.approx(1.0)  # the same direction, a longer vector
