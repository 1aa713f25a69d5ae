"""The FM pool's scaling policy and resource request (solaris/precompute/scaling.py), on a
scripted clock: grows on depth and lag, holds inside the hysteresis band, shrinks only after
the idle cool-down, keeps to its bounds; asks for the accelerator the profile calls for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from solaris.config import PrecomputeConfig, QueueConfig, load_config
from solaris.errors import ConfigError
from solaris.precompute.pqueue import PrecomputeQueue
from solaris.precompute.scaling import (PoolLoad, ScaleState, ScalingPolicy, decide,
                                        resolve, wants_accelerator, worker_resources)

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """Wall seconds the test sets."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(**kw) -> PrecomputeConfig:
    base = dict(min_workers=0, workers=0, max_workers=4, scale_up_depth=100,
                scale_down_depth=10, scale_up_lag_s=30.0, scale_down_after_s=60.0)
    return PrecomputeConfig(**{**base, **kw})


def test_grows_on_depth_up_to_max():
    clock = Clock()
    p = ScalingPolicy(make(), clock)
    assert p.target(0, PoolLoad(depth=0)) == 0  # nothing queued, min 0: no worker
    assert p.target(0, PoolLoad(depth=1)) == 1  # any pair with no worker: one
    assert p.target(1, PoolLoad(depth=250)) == 3  # ceil(250 / 100)
    assert p.target(3, PoolLoad(depth=10_000)) == 4  # max_workers
    assert p.target(4, PoolLoad(depth=10_000)) == 4


def test_holds_inside_the_band_and_shrinks_after_the_cool_down():
    clock = Clock()
    p = ScalingPolicy(make(), clock)
    # 3 workers: grows above 300 pending, has one too many at <= 20 pending + leased
    for busy in (300, 200, 21):
        clock.t += 1000.0  # however long it stays there
        assert p.target(3, PoolLoad(depth=busy)) == 3
    assert p.target(3, PoolLoad(depth=5, leased=10)) == 3  # 15: one too many; clock starts
    clock.t += 59.0
    assert p.target(3, PoolLoad(depth=5, leased=10)) == 3  # inside the cool-down
    clock.t += 1.0
    assert p.target(3, PoolLoad(depth=5, leased=10)) == 2  # ceil(15 / 10) after 60 s idle
    # the idle clock starts again after a change: the next step down waits a cool-down
    assert p.target(2, PoolLoad(depth=0)) == 2
    clock.t += 30.0
    assert p.target(2, PoolLoad(depth=0)) == 2
    clock.t += 30.0
    assert p.target(2, PoolLoad(depth=0)) == 0  # all the way down at once (min 0)


def test_load_inside_the_cool_down_restarts_it():
    clock = Clock()
    p = ScalingPolicy(make(), clock)
    assert p.target(2, PoolLoad(depth=0)) == 2
    clock.t += 50.0
    assert p.target(2, PoolLoad(depth=50)) == 2  # busy again: no longer one too many
    clock.t += 20.0
    assert p.target(2, PoolLoad(depth=0)) == 2  # 70 s since the first idle tick, 0 since this
    clock.t += 59.0
    assert p.target(2, PoolLoad(depth=0)) == 2
    clock.t += 1.0
    assert p.target(2, PoolLoad(depth=0)) == 0


def test_never_below_min_nor_above_max():
    clock = Clock()
    p = ScalingPolicy(make(min_workers=1, workers=1, max_workers=2), clock)
    assert p.target(0, PoolLoad(depth=0)) == 1  # below min: up at once
    assert p.target(5, PoolLoad(depth=0)) == 2  # above max: down at once
    clock.t += 10_000.0
    assert p.target(1, PoolLoad(depth=0)) == 1  # idle for ages: still min
    assert p.target(1, PoolLoad(depth=10_000, wait_s=1e6)) == 2
    assert p.target(2, PoolLoad(depth=10_000, wait_s=1e6)) == 2


def test_zero_down_depth_shrinks_only_when_nothing_is_queued_or_leased():
    clock = Clock()
    p = ScalingPolicy(make(scale_down_depth=0), clock)
    for load in (PoolLoad(depth=1), PoolLoad(depth=0, leased=1)):
        clock.t += 1000.0
        assert p.target(2, load) == 2
    assert p.target(2, PoolLoad(depth=0)) == 2
    clock.t += 60.0
    assert p.target(2, PoolLoad(depth=0)) == 0


def test_lag_adds_one_worker_at_a_time_and_none_while_one_is_being_placed():
    clock = Clock()
    p = ScalingPolicy(make(), clock)
    slow = dict(depth=50, wait_s=31.0)  # depth alone wants 1
    assert p.target(1, PoolLoad(**slow)) == 2
    clock.t += 29.0
    assert p.target(2, PoolLoad(**slow)) == 2  # one step per scale_up_lag_s
    clock.t += 1.0
    assert p.target(2, PoolLoad(**slow, pending=1)) == 2  # a worker is still unplaced
    assert p.target(2, PoolLoad(**slow)) == 3
    clock.t += 1000.0
    assert p.target(3, PoolLoad(depth=50, wait_s=30.0)) == 3  # not past the lag: hold
    # lagging is not idle, even at a load one worker fewer would carry
    p2 = ScalingPolicy(make(max_workers=2, scale_down_depth=60), clock)
    assert p2.target(2, PoolLoad(depth=50, wait_s=31.0)) == 2
    clock.t += 1000.0
    assert p2.target(2, PoolLoad(depth=50, wait_s=31.0)) == 2


def test_decide_is_pure():
    cfg = make()
    state = ScaleState()
    a = decide(cfg, 3, PoolLoad(depth=0), state, 100.0)
    b = decide(cfg, 3, PoolLoad(depth=0), state, 100.0)
    assert a == b == (3, ScaleState(idle_since=100.0))
    assert state == ScaleState()
    assert decide(cfg, 3, PoolLoad(depth=0), a[1], 160.0) == (0, ScaleState(160.0, None))


def test_load_from_the_queue_metrics():
    q = PrecomputeQueue(QueueConfig(), clock=Clock(50.0))
    assert PoolLoad.of(q.metrics()) == PoolLoad(0, 0, 0.0, 0)
    q.put(np.array([1, 1, 2]), np.array([5, 6, 5]), np.array([0.9, 0.8, 0.7]),
          np.array([10.0, 10.0, 11.0]), 0, "v1")
    q._clock.t = 80.0  # thirty wall seconds later
    lease = q.lease(2)  # the first request's group (two pairs)
    assert lease is not None and lease.num_pairs == 2
    load = PoolLoad.of(q.metrics(), pending=1)
    assert load == PoolLoad(depth=1, leased=2, wait_s=30.0, pending=1)
    with pytest.raises(ValueError, match="depth=-1"):
        PoolLoad(depth=-1)


def test_resources_by_profile():
    auto = PrecomputeConfig()
    both = {"GPU": 1.0, "fm_gpu": 1.0}
    # the cluster profile asks whether or not a GPU node is up: the autoscaler's cue
    assert worker_resources(auto, "cluster", 0) == both
    # locally: today's rule, a GPU only where the cluster has one, and no custom resource
    assert worker_resources(auto, "serving", 0) == {}
    assert worker_resources(auto, "replay", 1) == {"GPU": 1.0}
    assert worker_resources(PrecomputeConfig(device="cpu"), "cluster", 8) == {}
    assert worker_resources(PrecomputeConfig(device="cuda"), "serving", 0) == {"GPU": 1.0}
    # always: a worker that holds the (fake) GPU and still runs on the CPU
    forced = PrecomputeConfig(device="cpu", accelerator="always",
                              accelerator_resources={"GPU": 0.5, "fm_gpu": 1})
    assert worker_resources(forced, "cluster", 0) == {"GPU": 0.5, "fm_gpu": 1.0}
    assert not wants_accelerator(PrecomputeConfig(accelerator="never"), "cluster", 4)
    with pytest.raises(ConfigError, match="serve.profile='prod'"):
        worker_resources(auto, "prod", 0)


def test_pool_size_by_profile():
    """Unset, the cluster profile starts empty and may go back to empty (its GPU node with
    it); a local pool starts one worker and never drops below what it started with."""
    size = lambda c, prof: (resolve(c, prof).workers, resolve(c, prof).min_workers)  # noqa: E731
    assert size(PrecomputeConfig(), "cluster") == (0, 0)
    assert size(PrecomputeConfig(), "serving") == size(PrecomputeConfig(), "replay") == (1, 1)
    assert size(PrecomputeConfig(workers=3, max_workers=3), "replay") == (3, 3)  # the replay's
    assert size(PrecomputeConfig(workers=2), "cluster") == (2, 0)
    assert size(PrecomputeConfig(min_workers=2), "serving") == (2, 2)
    assert size(PrecomputeConfig(min_workers=0, workers=1), "serving") == (1, 0)
    p = ScalingPolicy(PrecomputeConfig(scale_down_after_s=0.0), Clock(), "cluster")
    assert p.target(0, PoolLoad(depth=1)) == 1 and p.target(1, PoolLoad(depth=0)) == 0
    p = ScalingPolicy(PrecomputeConfig(scale_down_after_s=0.0), Clock(), "serving")
    assert p.target(1, PoolLoad(depth=0)) == 1
    with pytest.raises(ConfigError, match="serve.profile='prod'"):
        resolve(PrecomputeConfig(), "prod")


def test_config_errors_name_the_field_and_value():
    cases = [
        (dict(min_workers=-1), "precompute.min_workers=-1"),
        (dict(min_workers=2, workers=1), "precompute.workers=1"),
        (dict(workers=-1), "precompute.workers=-1"),
        (dict(min_workers=5), "precompute.max_workers=4"),
        (dict(max_workers=0), "precompute.max_workers=0"),
        (dict(scale_down_depth=5000), "precompute.scale_down_depth=5000"),
        (dict(scale_down_depth=-1), "precompute.scale_down_depth=-1"),
        (dict(scale_up_lag_s=0.0), "precompute.scale_up_lag_s=0.0"),
        (dict(scale_down_after_s=-1.0), "precompute.scale_down_after_s=-1.0"),
        (dict(accelerator="sometimes"), "precompute.accelerator='sometimes'"),
        (dict(accelerator_resources={}), "precompute.accelerator_resources={}"),
        (dict(accelerator_resources={"GPU": 0}), "precompute.accelerator_resources="),
        (dict(accelerator_resources={"CPU": 1}), "precompute.accelerator_resources="),
        (dict(device="cuda", accelerator="never"), "precompute.device='cuda'"),
        (dict(device="cuda", accelerator_resources={"fm_gpu": 1}), "precompute.device='cuda'"),
    ]
    for kw, match in cases:
        with pytest.raises(ConfigError, match=match.replace("{", r"\{").replace("}", r"\}")):
            PrecomputeConfig(**kw)
    cfg = load_config(None, {"precompute.min_workers": 0, "precompute.workers": 0,
                             "precompute.accelerator_resources": {"GPU": 1, "fm_gpu": 1}})
    assert cfg.precompute.workers == 0 and cfg.precompute.accelerator_resources["fm_gpu"] == 1


def test_cluster_gpu_nodes_have_what_a_worker_asks_for():
    """The default request can be placed on cluster.yaml's gpu_worker node type (and the
    autoscaler launches that type for it, min_workers 0)."""
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    node = cluster["available_node_types"]["gpu_worker"]
    ask = worker_resources(PrecomputeConfig(), "cluster", 0)
    assert all(node["resources"].get(k, 0) >= v for k, v in ask.items())
    others = [t for n, t in cluster["available_node_types"].items() if n != "gpu_worker"]
    assert not any(t.get("resources", {}).get("fm_gpu") for t in others)
