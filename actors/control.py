"""The app's control holder (one named actor per app) and the routers' client of it.

``ControlHolder`` keeps ``solaris.online.control.Control``: the scales set at runtime and the
rollouts' switches, one revision for all. It is a named, detached actor restarted by Ray
after a crash (``max_restarts=-1``), re-reading its state from ``serve.control_uri``.

``ControlClient`` is what a router holds: it reads the state once at start (a new replica
serves the current state from its first request), then a thread long-polls the holder
(``wait``: answered at the next change, or after ``serve.control_wait_s`` with nothing) and
hands every new state to the router's callback. A router's own change goes to the holder
first and is served once the holder has committed it, so every replica -- the one that made
it included -- serves the holder's order of changes. If the holder is unreachable the router
keeps serving its last state; the follower retries with a backoff.

Why an actor and not Serve's ``user_config``: the changes are made at runtime, over HTTP and
by the routers' own rollout decisions; a replica cannot change its deployment's
``user_config``, and a later ``serve deploy`` of the static file would overwrite it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import ray

from actors import names
from solaris.errors import SolarisError
from solaris.online.control import Control, change_lag_s

log = logging.getLogger(__name__)

HOLDER_NUM_CPUS = 0.01


class ControlUnavailable(SolarisError):
    """The app's control holder did not answer in time."""


@ray.remote(num_cpus=HOLDER_NUM_CPUS, max_restarts=-1, max_task_retries=-1)
class ControlHolder:
    """One app's control state; ``wait`` is a long poll (an async actor: many routers wait at
    once)."""

    def __init__(self, location: str | None) -> None:
        self.control = Control(location)
        self._changed = asyncio.Event()
        self.started_at = time.time()

    def _bump(self, state: dict[str, Any]) -> dict[str, Any]:
        self._changed.set()  # wakes every waiter; the next wait gets a fresh event
        self._changed = asyncio.Event()
        return state

    async def get(self) -> dict[str, Any]:
        return self.control.snapshot()

    async def wait(self, revision: int, timeout_s: float) -> dict[str, Any] | None:
        """The state once its revision is past ``revision`` (at once if it already is), or
        None after ``timeout_s`` with no change."""
        if self.control.state.revision > revision:
            return self.control.snapshot()
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self.control.snapshot()

    async def set_scale(self, setting: dict[str, Any]) -> dict[str, Any]:
        before = self.control.state.revision
        state = self.control.set_scale(setting)
        return self._bump(state) if state["revision"] != before else state

    async def promote(self, task: str, version: str) -> dict[str, Any]:
        before = self.control.state.revision
        state = self.control.promote(task, version)
        return self._bump(state) if state["revision"] != before else state

    async def metrics(self) -> dict[str, Any]:
        return {"revision": self.control.state.revision, "writes": self.control.writes,
                "restored": self.control.restored, "location": self.control.path,
                "started_at": self.started_at}


NAMESPACE = "solaris"  # the holders' own: a detached actor in an anonymous namespace makes
# the GCS warn the job's driver (a replay's console), and every replica must find the same one


def create_control(app_id: str, location: str | None, detached: bool = True) -> Any:
    """Start (or attach to) the app's control holder, named after ``app_id``."""
    return ControlHolder.options(name=names.control(app_id), get_if_exists=True,
                                 namespace=NAMESPACE,
                                 lifetime="detached" if detached else None).remote(location)


class ControlClient:
    """A router's view of the app's control state: ``state`` now, ``on_state`` called on
    the follower thread with every newer state, ``set_scale`` / ``promote`` through the
    holder."""

    def __init__(self, app_id: str, location: str | None, on_state: Callable[[dict], None],
                 wait_s: float = 10.0, detached: bool = True, timeout_s: float = 10.0) -> None:
        self.holder = create_control(app_id, location, detached)
        self.wait_s = float(wait_s)
        self.timeout_s = float(timeout_s)
        self._on_state = on_state
        self._lock = threading.Lock()  # revision and the callback, one at a time
        self.revision = -1
        self.stats = {"states": 0, "polls": 0, "errors": 0, "last_error": None,
                      "lag_s": None, "last_poll_ok": True}
        self._stop = threading.Event()
        self._promotions: list[tuple[str, str]] = []  # switches not yet recorded
        self.accept(ray.get(self.holder.get.remote(), timeout=60), at_start=True)
        self._thread = threading.Thread(target=self._follow, name="control-follow",
                                        daemon=True)
        self._thread.start()

    def accept(self, state: dict[str, Any] | None, at_start: bool = False) -> bool:
        """Hand ``state`` to the router if it is newer than the last one; True if it was.
        ``at_start``: the state found as the router starts (its lag is not measured)."""
        if state is None:
            return False
        with self._lock:
            if state["revision"] <= self.revision:
                return False
            self._on_state(state)
            self.revision = state["revision"]
            self.stats["states"] += 1
            # how long after its commit this router served it (wall clocks of one cluster)
            self.stats["lag_s"] = change_lag_s(state, time.time(), at_start)
            return True

    def _follow(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            self._push_promotions()
            try:
                ref = self.holder.wait.remote(self.revision, self.wait_s)
                state = ray.get(ref, timeout=self.wait_s + self.timeout_s)
                self.stats["polls"] += 1
                self.stats["last_poll_ok"] = True
                self.accept(state)
                backoff = 0.1
            except Exception as e:  # the holder restarting or gone: keep the last state
                self.stats["errors"] += 1
                self.stats["last_poll_ok"] = False
                self.stats["last_error"] = type(e).__name__
                log.warning("control state: poll failed (%s); retrying in %.1f s",
                            type(e).__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)

    def _push_promotions(self) -> None:
        with self._lock:
            todo, self._promotions = self._promotions, []
        for i, (task, version) in enumerate(todo):
            try:
                self.accept(ray.get(self.holder.promote.remote(task, version),
                                    timeout=self.timeout_s))
            except Exception as e:
                log.warning("control state: recording %s -> %s failed (%s); will retry", task,
                            version, type(e).__name__)
                with self._lock:
                    self._promotions[:0] = todo[i:]
                return

    async def set_scale(self, setting: dict[str, Any]) -> dict[str, Any]:
        """Commit one scale at the holder and serve the state it answers; ControlUnavailable
        if the holder does not answer in time."""
        try:
            state = await asyncio.wait_for(self.holder.set_scale.remote(setting),
                                           self.timeout_s)
        except Exception as e:
            raise ControlUnavailable(f"the app's control state did not answer "
                                     f"({type(e).__name__}); nothing changed here") from e
        await asyncio.get_running_loop().run_in_executor(None, self.accept, state)
        return state

    def promote(self, task: str, version: str) -> None:
        """Record this router's switch of ``task`` to ``version`` (on the follower thread:
        the request path never waits for it)."""
        with self._lock:
            self._promotions.append((task, version))
        self._push_now()

    def _push_now(self) -> None:
        threading.Thread(target=self._push_promotions, name="control-promote",
                         daemon=True).start()

    def metrics(self) -> dict[str, Any]:
        return {"revision": self.revision, "wait_s": self.wait_s, **self.stats}

    def alive(self) -> bool:
        """Whether the follower thread runs (Serve's health check of the router)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
