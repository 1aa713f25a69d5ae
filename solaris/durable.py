"""Write-behind durability for the state an actor holds (a shard's pairs, a shard's history,
the precompute queue): one helper instead of one copy per actor.

A ``Durable`` owns the state, the lock that guards it, a count of the changes applied, and
the last snapshot: restored at construction (a snapshot that cannot be read or restored is
logged and the state starts empty -- a corrupt file must not crash-loop the actor), written
by ``snapshot`` -- copied under the lock, written outside it as one Parquet file that lands
whole (``solaris.atomic``) -- only when changes were applied since the last one (or when
forced). ``every`` runs a step (e.g. the snapshot) on a timer thread. A write after the last
completed snapshot is lost with the process; that is the contract the actors document.

A caller may name another source of the first state (``load``: e.g. a cache shard of a new
shard count re-splits the snapshots of the old count, ``solaris.cache.reshard``); a state
read from there is written to the Durable's own location at the next snapshot.

No Ray here: the actors wrap it, and a unit test drives it against a local folder.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from solaris.cache.snapshot import read_snapshot, write_snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")


class Durable(Generic[T]):
    """State of type T, its lock, its change count and its write-behind snapshot.

    Callers hold ``lock`` while they read or change ``state`` and call ``touch`` (under the
    lock) for every change that must reach the next snapshot.
    """

    def __init__(self, what: str, location: tuple[pafs.FileSystem, str] | None,
                 fresh: Callable[[], T], restore: Callable[[pa.Table], T],
                 to_table: Callable[[T], pa.Table],
                 load: tuple[str, Callable[[], pa.Table | None]] | None = None) -> None:
        self.what = what  # named in logs, e.g. "shard 3 pairs"
        self.location = location  # None: not durable (snapshot is a no-op)
        # (what, read): read the first state from ``what`` instead of the location's
        # snapshot (None from read: start empty); only when durable
        self._load = load
        self.lock = threading.Lock()
        self._write_lock = threading.Lock()  # one snapshot write at a time
        self._fresh, self._to_table = fresh, to_table
        self.changes = 0  # changes applied
        self.written = 0  # changes the last completed snapshot covered
        self.snapshots = 0
        self.errors = 0
        self.last_s = float("nan")  # seconds the last snapshot took
        self.restored = 0  # rows read back at construction
        self.source: str | None = None  # where the state was read from (None: started empty)
        self.restore_failed = False  # a snapshot was there but could not be read or restored
        self.state: T = self._restore(restore)

    def _restore(self, restore: Callable[[pa.Table], T]) -> T:
        if self.location is None:
            return self._fresh()
        fs, path = self.location
        where, read = self._load or (path, lambda: read_snapshot(fs, path))
        try:
            table = read()
            if table is None:
                return self._fresh()
            state = restore(table)
        except Exception:
            log.exception("%s: could not restore %s; starting empty", self.what, where)
            self.restore_failed = True
            return self._fresh()
        self.restored, self.source = table.num_rows, where
        if self._load is not None:
            self.changes += 1  # not at its own location yet: the next snapshot writes it
        log.info("%s: restored %d rows from %s", self.what, table.num_rows, where)
        return state

    def touch(self, n: int = 1) -> None:
        """``n`` changes applied (call under ``lock``)."""
        self.changes += n

    @property
    def dirty(self) -> bool:
        """Changes applied since the last completed snapshot (never, when not durable)."""
        return self.location is not None and self.changes != self.written

    def snapshot(self, force: bool = False) -> int | None:
        """Write the state now if it changed since the last snapshot (always, ``force``);
        returns the rows written, None when nothing was written. On return, what the state
        held when the copy was taken is durable. A failed write counts and raises."""
        if self.location is None:
            return None
        fs, path = self.location
        with self._write_lock:
            t0 = time.monotonic()
            with self.lock:  # copy out under the lock, write outside it
                changes = self.changes
                if not force and changes == self.written:
                    return None
                table = self._to_table(self.state)
            try:
                write_snapshot(fs, path, table)
            except Exception:
                self.errors += 1
                raise
            self.written = changes
            self.snapshots += 1
            self.last_s = time.monotonic() - t0
        return table.num_rows

    def stats(self) -> dict[str, Any]:
        return {"snapshots": self.snapshots, "snapshot_errors": self.errors,
                "last_snapshot_s": self.last_s, "restored": self.restored, "dirty": self.dirty}


def every(seconds: float, step: Callable[[], Any], name: str) -> threading.Thread:
    """Run ``step`` every ``seconds`` on a daemon thread (started); a failing step is logged
    and the timer goes on."""
    def loop() -> None:
        while True:
            time.sleep(seconds)
            try:
                step()
            except Exception:
                log.exception("%s: timed step failed", name)

    t = threading.Thread(target=loop, name=name, daemon=True)
    t.start()
    return t
