"""The FM worker pool's parts (``actors.precompute.WorkerPool``): its members (``PoolMembers``:
the workers started, placed or not, and retiring) and the watch on their errors
(``ErrorWatch``: failed cycles, restarts, workers that do not answer). The pool decides how
many workers it wants (``solaris.precompute.scaling``) and forwards to these.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import ray
from ray.exceptions import RayError

log = logging.getLogger(__name__)

# wall seconds a removed worker gets to finish and ack its leases before it is killed anyway
# (then its leases come back after the queue's lease timeout)
RETIRE_TIMEOUT_S = 60.0


def kill(w: Any) -> None:
    """Kill worker ``w`` for good (no restart); one already gone is fine."""
    try:
        ray.kill(w, no_restart=True)
    except RayError:
        pass


class PoolMembers:
    """The pool's worker actors: started (``spawn(worker_id)``), unplaced until their first
    call answers, retired (stopped, then killed)."""

    def __init__(self, spawn: Callable[[int], Any], clock: Callable[[], float],
                 name: str) -> None:
        """``clock``: the retirement deadlines' (wall seconds); ``name``: the pool's, for
        logs."""
        self._spawn = spawn
        self._clock = clock
        self._name = name
        self.workers: list[Any] = []
        self.unplaced: dict[int, Any] = {}  # id(worker) -> its first call, until answered
        self.retiring: list[tuple[Any, Any, float]] = []  # (worker, its stop call, deadline)
        self.running = False  # the workers' loops run (a new worker starts its own)
        self._next_id = 0

    def add(self) -> Any:
        """Start one more worker; while the pool runs, its loop starts once it is placed
        and built."""
        w = self._spawn(self._next_id)
        self._next_id += 1
        self.workers.append(w)
        self.unplaced[id(w)] = w.metrics.remote()
        if self.running:
            w.start.remote()  # queued behind __init__: runs once the worker is built
        return w

    def pending(self) -> int:
        """Workers requested but not answering yet: not placed (no node with the resources
        they ask for: the autoscaler's cue) or still loading their models."""
        if self.unplaced:
            refs = list(self.unplaced.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(ready)
            self.unplaced = {k: r for k, r in self.unplaced.items() if r not in done}
        return len(self.unplaced)

    def placed(self) -> list[Any]:
        """The workers that have answered (after ``pending``)."""
        self.pending()
        return [w for w in self.workers if id(w) not in self.unplaced]

    def remove(self, n: int) -> list[int]:
        """Retire ``n`` workers: unplaced ones first, killed at once, then the newest placed
        ones, which are asked to stop (``reap`` kills them). Returns the retired workers'
        keys (``id``)."""
        self.pending()
        order = sorted(range(len(self.workers)),
                       key=lambda i: (id(self.workers[i]) not in self.unplaced, -i))
        victims = set(order[:max(0, n)])
        deadline = float(self._clock()) + RETIRE_TIMEOUT_S
        keys = []
        for i in sorted(victims):
            w = self.workers[i]
            keys.append(id(w))
            if self.unplaced.pop(id(w), None) is not None:
                kill(w)
            else:
                self.retiring.append((w, w.stop.remote(), deadline))
        self.workers = [w for i, w in enumerate(self.workers) if i not in victims]
        return keys

    def reap(self) -> int:
        """Kill the retiring workers whose loop has stopped (every lease they held acked), or
        that ran past ``RETIRE_TIMEOUT_S``; returns how many are still retiring."""
        now = float(self._clock())
        keep = []
        for w, ref, deadline in self.retiring:
            done = bool(ray.wait([ref], timeout=0)[0])
            if done or now >= deadline:
                if not done:
                    log.warning("precompute %s: a retiring worker did not stop in %.0f s: "
                                "killed, its leases return after the lease timeout",
                                self._name, RETIRE_TIMEOUT_S)
                kill(w)
            else:
                keep.append((w, ref, deadline))
        self.retiring = keep
        return len(keep)

    def shutdown(self) -> None:
        """Kill every worker for good (retiring ones included)."""
        for w in [*self.workers, *(r[0] for r in self.retiring)]:
            kill(w)
        self.workers, self.retiring, self.unplaced = [], [], {}
        self.running = False


class ErrorWatch:
    """The errors of a pool's workers, read from their metrics: new failed cycles, a restart
    (a new process), a worker that does not answer (counted once, until it answers again)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int]] = {}  # id(worker) -> (pid, errors) last read
        self._silent: set[int] = set()  # workers whose last check failed (counted once)

    def forget(self, keys: list[int]) -> None:
        """Retired workers: no longer watched."""
        for key in keys:
            self._seen.pop(key, None)
            self._silent.discard(key)

    def check(self, placed: list[Any], running: bool, timeout_s: float) -> int:
        """Read every worker of ``placed``'s metrics (waiting up to ``timeout_s``); while the
        pool is ``running``, start the loop of a worker that has none (a restarted one).
        Returns the errors found now."""
        refs = [w.metrics.remote() for w in placed]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) if refs else ()
        new = 0
        for w, ref in zip(placed, refs):
            key = id(w)
            if ref not in ready:  # busy or restarting: read next time
                continue
            try:
                m = ray.get(ref)
            except RayError:
                new += key not in self._silent
                self._silent.add(key)
                continue
            self._silent.discard(key)
            pid, errs = int(m["pid"]), int(m["errors"])
            last = self._seen.get(key)
            if last is None:  # first read: a restart before it counts too
                new += errs + int(bool(m["restarted"]))
            elif pid != last[0]:  # a new process since the last read: its counts start at 0
                new += 1 + errs
            else:
                new += max(0, errs - last[1])
            self._seen[key] = (pid, errs)
            if running and not m["running"]:
                w.start.remote()
        return new
