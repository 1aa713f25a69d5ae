"""Write-behind durability (``solaris.durable``): a snapshot is written only after changes
(or when forced), lands whole and restores; a corrupt snapshot starts the state empty; a
failed write is counted and leaves the state dirty; the timer survives a failing step."""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from solaris.durable import Durable, every


def keys(location) -> Durable[set]:
    return Durable("test keys", location, set, lambda t: set(t.column("k").to_pylist()),
                   lambda st: pa.table({"k": sorted(st)}))


def test_no_location_means_not_durable():
    d = keys(None)
    with d.lock:
        d.state.add(1)
        d.touch()
    assert d.snapshot() is None and d.snapshot(force=True) is None and not d.dirty


def test_snapshot_after_changes_only_then_restores(tmp_path):
    loc = (pafs.LocalFileSystem(), str(tmp_path / "s" / "keys.parquet"))
    d = keys(loc)
    assert d.state == set() and d.restored == 0 and not d.dirty
    assert d.snapshot() is None  # nothing changed: nothing written
    with d.lock:
        d.state.update({3, 1, 2})
        d.touch()
    assert d.dirty and d.snapshot() == 3 and not d.dirty
    assert d.snapshot() is None and d.snapshots == 1
    assert d.snapshot(force=True) == 3 and d.snapshots == 2
    again = keys(loc)  # a restarted actor
    assert again.state == {1, 2, 3} and again.restored == 3 and not again.dirty
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["keys.parquet"]  # no temp left


def test_corrupt_snapshot_starts_empty_and_says_so(tmp_path, caplog):
    path = tmp_path / "keys.parquet"
    path.write_bytes(b"not parquet")
    with caplog.at_level(logging.ERROR, logger="solaris.durable"):
        d = keys((pafs.LocalFileSystem(), str(path)))
    assert d.state == set() and d.restored == 0
    assert "test keys: could not restore" in caplog.text and str(path) in caplog.text


def test_failed_write_counts_and_stays_dirty(tmp_path):
    d = keys((pafs.LocalFileSystem(), str(tmp_path / "keys.parquet")))
    with d.lock:
        d.state.add(5)
        d.touch()

    def boom(st):
        raise OSError("disk full")
    d._to_table = boom
    with pytest.raises(OSError, match="disk full"):
        d.snapshot()
    assert d.errors == 0 and d.dirty  # the copy failed before any write: not a write error
    d._to_table = lambda st: pa.table({"k": sorted(st)})
    (tmp_path / "blocker").write_text("a file where the folder should be")
    d.location = (pafs.LocalFileSystem(), str(tmp_path / "blocker" / "keys.parquet"))
    with pytest.raises(OSError):
        d.snapshot()
    assert d.errors == 1 and d.dirty and d.stats()["snapshot_errors"] == 1


def test_timer_runs_its_step_and_survives_a_failure():
    calls, done = [], threading.Event()

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first step fails")
        if len(calls) >= 3:
            done.set()
    t = every(0.01, step, "test-timer")
    assert done.wait(10) and t.daemon and len(calls) >= 3


def test_a_state_loaded_from_elsewhere_is_written_to_its_own_location(tmp_path):
    """``load`` (a shard of a new count re-splitting the old snapshots) replaces the read of
    the location; what it loaded is dirty, so the next snapshot writes it there."""
    loc = (pafs.LocalFileSystem(), str(tmp_path / "own" / "keys.parquet"))
    d = Durable("test keys", loc, set, lambda t: set(t.column("k").to_pylist()),
                lambda st: pa.table({"k": sorted(st)}),
                load=("the old set", lambda: pa.table({"k": [7, 8]})))
    assert d.state == {7, 8} and d.source == "the old set" and d.restored == 2 and d.dirty
    assert d.snapshot() == 2 and not d.dirty
    assert keys(loc).state == {7, 8} and keys(loc).source == loc[1]
    empty = Durable("test keys", loc, set, lambda t: set(), lambda st: pa.table({"k": []}),
                    load=("nothing", lambda: None))
    assert empty.state == set() and empty.source is None and not empty.restore_failed

    def boom():
        raise OSError("unreachable")
    failed = Durable("test keys", loc, set, lambda t: set(), lambda st: pa.table({"k": []}),
                     load=("the old set", boom))
    assert failed.state == set() and failed.restore_failed and not failed.dirty
