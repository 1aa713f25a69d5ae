"""How many FM workers a pool wants, and what each one asks Ray for: pure policy, no Ray.

``actors.precompute.WorkerPool`` owns the Ray calls; this module decides.

Resources (``worker_resources``): in the cluster profile a worker asks for
``PrecomputeConfig.accelerator_resources`` (``{"GPU": 1, "fm_gpu": 1}``: cluster.yaml's
gpu_worker node type), locally for their ``GPU`` alone, or for nothing beyond its CPU
share. ``accelerator: auto`` asks in the cluster profile whether or not a GPU node is up --
a request no node can place yet is what makes Ray's autoscaler launch one -- and, locally,
only where the cluster already has a GPU when the pool starts (a local Ray never grows).
``device`` stays the worker's own choice of torch device, so a worker may hold the resource
and still run on the CPU (``device: cpu`` with ``accelerator: always``: the autoscaling
test's fake GPU node).

Pool size (``resolve``): ``workers`` and ``min_workers`` left None take the profile's: 0
and 0 in the cluster profile (no GPU held while there is no work), 1 and ``workers``
locally (a local pool never shrinks below what it started with).

Scaling (``decide``), each call given the worker count, the queue's load and the time:

- bounds: a count outside ``[min_workers, max_workers]`` is brought inside at once;
- up on depth: ``ceil(depth / scale_up_depth)`` workers when that is more than now;
- up on lag: the oldest pending pair waited more than ``scale_up_lag_s``: one more worker,
  unless one is still being placed (a GPU node takes minutes to launch) or the pool changed
  size within the last ``scale_up_lag_s``;
- down: ``pending + leased`` pairs within ``scale_down_depth`` per worker for one worker
  fewer (0: nothing queued, nothing leased), and not lagging, continuously for
  ``scale_down_after_s`` (the cool-down): the pool shrinks to what that load needs, never
  below ``min_workers``. Between the two thresholds the pool holds its size (hysteresis).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from solaris.config import PROFILES, PrecomputeConfig
from solaris.errors import ConfigError


def resolve(cfg: PrecomputeConfig, profile: str) -> PrecomputeConfig:
    """``cfg`` with ``workers`` and ``min_workers`` set where they are None (module
    docstring): what the pool and ``decide`` run with."""
    _check_profile(profile)
    cluster = profile == "cluster"
    workers = cfg.workers
    if workers is None:
        workers = max(cfg.min_workers or 0, 0 if cluster else 1)
    floor = cfg.min_workers
    if floor is None:
        floor = 0 if cluster else workers
    return replace(cfg, workers=workers, min_workers=floor)


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ConfigError(f"serve.profile={profile!r}: must be one of {', '.join(PROFILES)}")


def wants_accelerator(cfg: PrecomputeConfig, profile: str, cluster_gpus: float) -> bool:
    """Whether a worker asks for ``cfg.accelerator_resources`` (module docstring);
    ``cluster_gpus``: the GPUs the cluster has now (read only for a local profile)."""
    _check_profile(profile)
    if cfg.accelerator != "auto":
        return cfg.accelerator == "always"
    if cfg.device != "auto":
        return cfg.device == "cuda"
    return profile == "cluster" or cluster_gpus >= 1


def worker_resources(cfg: PrecomputeConfig, profile: str, cluster_gpus: float
                     ) -> dict[str, float]:
    """The Ray resources one worker asks for beyond its CPU share ({}: a CPU worker): all
    of ``accelerator_resources`` in the cluster profile, only their ``GPU`` locally (a
    local Ray has the machine's GPUs but none of a cluster's custom node resources)."""
    if not wants_accelerator(cfg, profile, cluster_gpus):
        return {}
    res = {k: float(v) for k, v in cfg.accelerator_resources.items()}
    if profile != "cluster":
        res = {k: v for k, v in res.items() if k == "GPU"}
    return res


@dataclass(frozen=True)
class PoolLoad:
    """What the policy reads each tick: the queue's state and the pool's unplaced workers."""

    depth: int  # pending pairs in the queue
    leased: int = 0  # pairs in the workers' hands
    wait_s: float = 0.0  # wall seconds the oldest pending pair has waited (0: none pending)
    pending: int = 0  # workers requested but not placed yet

    @classmethod
    def of(cls, queue_metrics: Mapping[str, Any], pending: int = 0) -> "PoolLoad":
        """From the queue actor's ``metrics()`` (``depth``, ``leased``, ``oldest_wait_s``)."""
        return cls(int(queue_metrics.get("depth") or 0), int(queue_metrics.get("leased") or 0),
                   float(queue_metrics.get("oldest_wait_s") or 0.0), int(pending))

    def __post_init__(self) -> None:
        for name in ("depth", "leased", "pending"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0")
        if not self.wait_s >= 0:
            raise ValueError(f"wait_s={self.wait_s!r}: must be >= 0")


@dataclass(frozen=True)
class ScaleState:
    """The policy's memory between ticks."""

    changed_at: float = -math.inf  # when the pool last changed size
    idle_since: float | None = None  # since when it has had a worker too many (None: not)


def decide(cfg: PrecomputeConfig, workers: int, load: PoolLoad, state: ScaleState,
           now: float) -> tuple[int, ScaleState]:
    """The worker count the pool should have now, and the state for the next tick
    (``cfg``: ``resolve``d)."""
    assert cfg.min_workers is not None, "decide() needs a resolve()d config"
    lo, hi = cfg.min_workers, cfg.max_workers
    if not lo <= workers <= hi:
        return min(hi, max(lo, workers)), ScaleState(now, None)
    need = math.ceil(load.depth / cfg.scale_up_depth)
    if need > workers and min(hi, need) > workers:
        return min(hi, need), ScaleState(now, None)
    lagging = load.depth > 0 and load.wait_s > cfg.scale_up_lag_s
    if (lagging and workers < hi and load.pending == 0
            and now - state.changed_at >= cfg.scale_up_lag_s):
        return workers + 1, ScaleState(now, None)
    busy = load.depth + load.leased
    if cfg.scale_down_depth > 0:
        keep = math.ceil(busy / cfg.scale_down_depth)
    else:
        keep = 0 if busy == 0 else workers
    keep = max(lo, keep)
    if keep >= workers or lagging:  # inside the band: hold, and the idle clock restarts
        return workers, replace(state, idle_since=None)
    idle_since = now if state.idle_since is None else state.idle_since
    if now - idle_since >= cfg.scale_down_after_s:
        return keep, ScaleState(now, None)
    return workers, replace(state, idle_since=idle_since)


class ScalingPolicy:
    """``decide`` with its state kept and time read from ``clock`` (wall seconds, monotonic);
    ``cfg`` is ``resolve``d for ``profile``."""

    def __init__(self, cfg: PrecomputeConfig, clock: Callable[[], float] = time.monotonic,
                 profile: str = "serving") -> None:
        self.cfg = resolve(cfg, profile)
        self.clock = clock
        self.state = ScaleState()

    def target(self, workers: int, load: PoolLoad) -> int:
        """The worker count to have now (``workers``: the pool's, placed or not)."""
        want, self.state = decide(self.cfg, workers, load, self.state, float(self.clock()))
        return want
