"""One call per cache shard, waited on with a deadline: the shards of a group, the ring that
places users on them, and the collection of a round's answers.

``ShardSet`` is what every part of the cache group's client (``actors.cache.CacheGroup``)
shares: the handles, the consistent-hash ring, the fan-out of one call per shard involved and
the gathering of the answers, where a shard that is dead, late or failing reads as a default
value (logged), never an exception. ``collect`` and ``collect_async`` wait for a round's refs
until a ``time.monotonic()`` deadline, blocking or awaited.

Ray is not initialised here: callers call ``ray.init`` (or run inside a Ray job / Serve app).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError

from solaris.cache.ring import HashRing
from solaris.config import CacheConfig
from solaris.errors import ConfigError

log = logging.getLogger(__name__)


class ShardSet:
    """A group's shard handles and ring: where a user lives, one call per shard, the answers.

    Picklable (handles and the ring travel), so a Serve deployment can receive one.
    """

    def __init__(self, cfg: CacheConfig, handles: Sequence[Any], group_id: str):
        if len(handles) != cfg.num_shards:
            raise ConfigError(f"cache.num_shards={cfg.num_shards}: got {len(handles)} shard "
                              "handles")
        self.cfg = cfg
        self.group_id = group_id
        self.handles = list(handles)
        self.ring = HashRing.from_config(cfg)

    def shard_of(self, users: np.ndarray) -> np.ndarray:
        """Shard index of each user (consistent hashing: a user's pairs live on one shard)."""
        return self.ring.shard_of(np.asarray(users, dtype=np.int64))

    def rows_by_shard(self, users: np.ndarray) -> dict[int, np.ndarray]:
        """The positions of ``users`` each shard owns (shards owning none left out)."""
        shard = self.shard_of(users)
        return {int(s): np.flatnonzero(shard == s) for s in np.unique(shard)}

    def fan_out(self, rows: dict[int, np.ndarray], call: Callable[[Any, np.ndarray], Any]
                ) -> dict[int, Any]:
        """One call per shard in ``rows`` (``rows_by_shard``): ``call(shard handle,
        positions)``; the refs by shard, for ``gather`` or ``collect``."""
        return {s: call(self.handles[s], r) for s, r in rows.items()}

    def call_all(self, method: str, timeout_s: float, default: Any) -> list[Any]:
        """``method`` (no arguments) on every shard in one parallel round; each shard's
        value in shard order, ``default`` where it failed or missed ``timeout_s``."""
        got = self.gather({s: getattr(h, method).remote() for s, h in enumerate(self.handles)},
                          timeout_s, method, default)
        return [got[s] for s in range(len(self.handles))]

    def gather(self, refs: dict[int, Any], timeout_s: float, what: str, default: Any,
               level: int = logging.WARNING) -> dict[int, Any]:
        """Each ref's value, or ``default`` where it failed or missed ``timeout_s``."""
        got, late, failed = collect(refs, time.monotonic() + timeout_s)
        for s in late:
            log.log(level, "cache shard %d: %s timed out after %.1f s", s, what, timeout_s)
        for s, exc in failed.items():
            log.log(level, "cache shard %d: %s failed: %s", s, what, type(exc).__name__)
        return {s: got.get(s, default) for s in refs}


class RoundCounts:
    """A client's counts of its rounds: lookups, and per shard the answers that came late or
    failed (lookups and history reads). Thread-safe; a pickled copy carries the counts so far
    (writable again) and its own lock."""

    def __init__(self, num_shards: int) -> None:
        self._lock = threading.Lock()
        self._lookups = 0
        self._late = np.zeros(num_shards, np.int64)  # answers past the deadline
        self._failed = np.zeros(num_shards, np.int64)  # answers that raised (dead shard)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # an object-store copy (e.g. an FM worker's constructor argument) holds read-only
        # arrays: the counters must be writable
        self._late, self._failed = self._late.copy(), self._failed.copy()
        self._lock = threading.Lock()

    def add(self, late: list[int], failed: list[int], lookup: bool) -> None:
        """Count a round's late and failed shards (and the round, if it was a lookup)."""
        with self._lock:
            self._lookups += int(lookup)
            self._late[late] += 1
            self._failed[failed] += 1

    def counts(self) -> dict[str, Any]:
        """Lookups, late and failed answers per shard."""
        with self._lock:
            return {"lookups": self._lookups, "late": self._late.tolist(),
                    "failed": self._failed.tolist()}


def collect(refs: dict[int, Any], deadline: float
            ) -> tuple[dict[int, Any], list[int], dict[int, RayError]]:
    """(values, late, failed) of the refs by ``deadline`` (a ``time.monotonic()`` instant).

    The usual round -- every shard answers in time -- is one ``ray.get`` of all the refs;
    ``ray.wait`` and a ``ray.get`` per ref (what a late or failed shard needs) cost ~0.15 ms
    per shard more on 2 cores, so they run only when that one get did not succeed.
    """
    keys = list(refs)
    if not keys:
        return {}, [], {}
    try:
        values = ray.get([refs[s] for s in keys], timeout=max(0.0, deadline - time.monotonic()))
        return dict(zip(keys, values)), [], {}
    except (GetTimeoutError, RayError):
        pass
    done, _ = ray.wait([refs[s] for s in keys], num_returns=len(keys),
                       timeout=max(0.0, deadline - time.monotonic()))
    ready = set(done)
    got: dict[int, Any] = {}
    late: list[int] = []
    failed: dict[int, RayError] = {}
    for s in keys:
        if refs[s] not in ready:
            late.append(s)
            continue
        try:
            got[s] = ray.get(refs[s], timeout=0)
        except RayError as exc:
            failed[s] = exc
    return got, late, failed


async def collect_async(refs: dict[int, Any], deadline: float
                        ) -> tuple[dict[int, Any], list[int], dict[int, RayError]]:
    """``collect`` awaited: (values, late, failed) of the refs by ``deadline``.

    One future for the whole round: each ref's completion is recorded from Ray's thread
    (``ObjectRef._on_completed``, as Ray Serve's own replica results use it) and only the
    round's last wakes the event loop, once. Awaiting each ref wakes it once per ref, through
    a future per ref; on 2 cores that cost the caller 0.1-0.2 ms more per call at the serving
    rate (``bench/actor_call.py --rate R --callers``).
    """
    if not refs:
        return {}, [], {}
    loop = asyncio.get_running_loop()
    whole = loop.create_future()
    arrived: dict[int, Any] = {}
    lock = threading.Lock()

    def settle() -> None:
        if not whole.done():  # cancelled when the deadline came first
            whole.set_result(None)

    def on_done(s: int, value: Any) -> None:  # on a Ray thread
        with lock:
            arrived[s] = value
            last = len(arrived) == len(refs)
        if last:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is gone: nobody waits for this round any more
                pass

    for s, ref in refs.items():
        ref._on_completed(functools.partial(on_done, s))
    try:
        await asyncio.wait_for(whole, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        pass
    with lock:
        done = dict(arrived)
    got: dict[int, Any] = {}
    late: list[int] = []
    failed: dict[int, RayError] = {}
    for s in refs:
        if s not in done:
            late.append(s)
        elif isinstance(done[s], RayError):
            failed[s] = done[s]
        elif isinstance(done[s], BaseException):
            failed[s] = RayError(repr(done[s]))
        else:
            got[s] = done[s]
    return got, late, failed
