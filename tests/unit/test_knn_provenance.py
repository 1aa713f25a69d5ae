"""KNN tables carry what they were built from (no Ray): the FM version and id map digest
survive publish and read; an app serving another FM version or id map disables those
tables by name (log once, ``/healthz``), serves none of their neighbours, and serves a table
without a record with a warning."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from solaris.config import KnnConfig
from solaris.errors import DataError
from solaris.ids import IdMap
from solaris.knn.neighbours import KnnSnapshot, NeighbourTable
from solaris.knn.provenance import BuiltFrom, judge, restrict
from solaris.knn.tables import build_table, load_build, publish, published_built_from
from solaris.online import health
from solaris.online.serving import KnnTables, load_knn

V1, V2 = "fm-v1", "fm-v2"
IDS = IdMap.identity(30, 20).digest()
SERVED = {V2: IDS}


def table(version: str) -> NeighbourTable:
    return NeighbourTable(np.array([[1, 2], [0, 2], [0, 1]]), np.ones((3, 2), np.float32),
                          version)


def snapshot(users: BuiltFrom | None, items: BuiltFrom | None, version: str = "k1"
             ) -> KnnSnapshot:
    built = {k: b for k, b in (("user", users), ("item", items)) if b is not None}
    return KnnSnapshot(f"{version}|{version}", table(version), table(version), "live", built)


def test_the_id_map_digest_tells_maps_apart_and_equal_maps_alike():
    ints = IdMap.of(pa.array(np.arange(30)), pa.array(np.arange(20)))
    assert ints.digest() == IdMap.identity(30, 20).digest()  # saved identity == no map
    assert IdMap.identity(31, 20).digest() != IDS  # one more user
    strs = IdMap.of(pa.array(["a", "b"]), pa.array(["x"]))
    assert strs.digest() == IdMap.of(pa.array(["a", "b"]), pa.array(["x"])).digest()
    assert strs.digest() != IdMap.of(pa.array(["b", "a"]), pa.array(["x"])).digest()
    assert strs.digest() != IdMap.of(pa.array(["ab"]), pa.array(["x"])).digest()
    assert IdMap.of(pa.array(["0", "1"]), pa.array(["0"])).digest() != \
        IdMap.of(pa.array([0, 1]), pa.array([0])).digest()  # strings are not integers


def test_judge_serves_a_matching_table_and_disables_another_version_or_id_map():
    assert judge("user", "k1", BuiltFrom(V2, IDS), SERVED).served
    other = judge("user", "k1", BuiltFrom(V1, IDS), SERVED)
    assert not other.served
    assert other.line().startswith("user table k1 disabled:")
    assert V1 in other.reason and V2 in other.reason
    remapped = judge("item", "k1", BuiltFrom(V2, IdMap.identity(31, 20).digest()), SERVED)
    assert not remapped.served and "id map" in remapped.reason
    assert remapped.line().startswith("item table k1 disabled:")
    # during a rollover the app serves both versions: a table of either is served
    assert judge("user", "k1", BuiltFrom(V1, IDS), {V1: IDS, V2: IDS}).served


def test_a_table_without_a_record_is_served_with_a_warning():
    v = judge("user", "k0", None, SERVED)
    assert v.served and "rebuild" in v.reason
    assert v.line().startswith("user table k0 served, but")


def test_restrict_drops_disabled_tables_and_the_user_tables_live_index():
    snap, verdicts = restrict(snapshot(BuiltFrom(V1, IDS), BuiltFrom(V2, IDS)), SERVED)
    assert snap.users is None and snap.live is None  # the user table's build: off
    assert snap.items is not None and snap.version == "k1|k1"
    assert [(v.kind, v.served) for v in verdicts] == [("user", False), ("item", True)]
    kept, verdicts = restrict(snapshot(BuiltFrom(V2, IDS), None), SERVED)
    assert kept.users is not None and kept.items is not None and kept.live == "live"
    assert [(v.kind, v.served, bool(v.reason)) for v in verdicts] == [
        ("user", True, False), ("item", True, True)]


def test_built_from_is_checked_on_entry():
    with pytest.raises(DataError, match="fm_version"):
        BuiltFrom("", IDS)
    with pytest.raises(DataError, match="ids"):
        BuiltFrom(V1, "")
    assert BuiltFrom.from_dict(None) is None
    assert BuiltFrom.from_dict(BuiltFrom(V1, IDS).to_dict()) == BuiltFrom(V1, IDS)


def test_publish_records_what_a_table_was_built_from_and_readers_get_it(tmp_path):
    cfg = KnnConfig(k=5, item_k=5, exact_max=1000, recall_queries=50)
    x = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    uri = f"file://{tmp_path}"
    built = BuiltFrom(V1, IDS)
    user, live = build_table("user", np.arange(30), x, 5, cfg, "k1", built_from=built)
    publish(uri, user, cfg, live)
    assert published_built_from(uri, "user") == built
    assert load_build(uri, "user")[0].built_from == built
    publish(uri, build_table("item", np.arange(20), x[:20], 5, cfg, "k1")[0], cfg)
    assert published_built_from(uri, "item") is None
    assert load_build(uri, "item", with_index=False)[0].built_from is None
    snap = load_knn(uri)
    assert snap.built_from == {"user": built}
    assert snap.shareable().usable().built_from == {"user": built}  # survives the holder


def test_knn_tables_disable_by_name_log_once_and_health_says_so(caplog):
    snaps = {"k1": snapshot(BuiltFrom(V1, IDS), BuiltFrom(V1, IDS), "k1"),
             "k2": snapshot(BuiltFrom(V2, IDS), BuiltFrom(V2, IDS), "k2")}
    published = {"v": "k1|k1"}
    clock = [0.0]
    t = KnnTables(KnnConfig(table_uri="mem://x", poll_s=1.0),
                  lambda uri: snaps[published["v"].split("|")[0]], lambda uri: published["v"],
                  lambda: clock[0], served=SERVED)
    with caplog.at_level(logging.WARNING, logger="solaris.online.serving"):
        snap = t.current()
        clock[0] = 5.0
        t.current()  # the same version again: no second line
    assert snap.users is None and snap.items is None and snap.live is None
    lines = [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()]
    assert len(lines) == 2 and "user table k1 disabled" in lines[0] and V1 in lines[0]
    check = health.knn_check(True, t.version, 0.0, 1e12, t.verdicts)
    assert not check.ok and "user table k1 disabled" in check.detail
    assert set(check.to_dict()["disabled"]) == {"user", "item"}
    assert health.verdict([check]) == health.DEGRADED
    published["v"], clock[0] = "k2|k2", 10.0  # rebuilt from the served FM: back on
    snap = t.current()
    assert snap.users is not None and snap.live == "live"
    assert health.knn_check(True, t.version, 0.0, 1e12, t.verdicts).ok


def test_a_holder_without_served_versions_keeps_every_table():
    t = KnnTables(KnnConfig(table_uri="mem://x"), lambda uri: snapshot(BuiltFrom(V1, IDS), None),
                  lambda uri: "k1|k1", lambda: 0.0)
    assert t.current().users is not None and t.verdicts == []
