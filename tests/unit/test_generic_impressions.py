"""A team's own impression log through the generic loader (request id, shown flag, labels on
shown rows only), and every native dataset exported to that format reading back the same."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

from solaris.cli import main
from solaris.config import load_config
from solaris.data.export import export_generic
from solaris.data.generic import ColumnMapping, FeatureColumns, load_generic, load_generic_yaml
from solaris.data.load import load_dataset
from solaris.data.movielens import load_movielens
from solaris.errors import ConfigError, DataError
from solaris.simulate.log import build_request_log
from tests.tiny import TINY, tiny_movielens

NAN = float("nan")


def impressions() -> pa.Table:
    """Three requests of two or three candidates; the unshown rows carry no labels."""
    return pa.table({
        "req": ["r2", "r2", "r2", "r1", "r1", "r3", "r3"],
        "uid": ["u2", "u2", "u2", "u1", "u1", "u1", "u1"],
        "iid": ["c", "a", "b", "b", "a", "c", "b"],
        "t": [20, 20, 20, 10, 10, 30, 30],
        "shown": [1, 0, 1, 1, 0, 0, 1],
        "click": [1.0, None, 0.0, 1.0, None, None, 0.0],
        "pos": [2, 0, 1, 0, 1, 0, 1],
    })


MAPPING = ColumnMapping(user="uid", item="iid", timestamp="t", labels={"click": "click"},
                        request="req", shown="shown", order="pos")


def write(tmp_path, table: pa.Table, fmt: str = "parquet"):
    path = tmp_path / f"imp.{fmt}"
    pq.write_table(table, path) if fmt == "parquet" else pacsv.write_csv(table, path)
    return path


def test_an_impression_log_gives_interactions_and_requests(tmp_path) -> None:
    ds = load_generic(write(tmp_path, impressions()), MAPPING)
    # items coded as first met in event order (ties by the order column): b, a, c
    assert ds.items.column("raw_id").to_pylist() == ["b", "a", "c"]
    inter = ds.interactions.to_pydict()
    # the shown rows, by (ts, the order column): r1's b; r2's b (pos 1) then c (pos 2); r3's b
    assert inter["item_id"] == [0, 0, 2, 0]
    assert inter["ts"] == [10, 20, 20, 30]
    assert inter["click"] == [1.0, 0.0, 1.0, 0.0]
    req = ds.requests.to_pydict()
    assert req["request_id"] == [0, 1, 2]  # r1, r2, r3: as first met, in (ts, id) order
    assert req["ts"] == [10, 20, 30] and req["user_id"] == [0, 1, 0]
    assert req["candidates"] == [[0, 1], [2, 1, 0], [2, 0]]  # file order within a request
    assert req["impressed"] == [[True, False], [True, False, True], [False, True]]
    lab = req["label_click"]
    assert lab[1][0] == 1.0 and math.isnan(lab[1][1]) and lab[1][2] == 0.0
    # the CSV form loads the same
    csv = load_generic(write(tmp_path, impressions(), "csv"), MAPPING)
    assert csv.interactions.equals(ds.interactions)
    assert repr(csv.requests.to_pydict()) == repr(ds.requests.to_pydict())  # NaN == NaN


def test_the_replay_reads_the_requests_as_logged(tmp_path) -> None:
    table = impressions()
    table = table.filter(pa.array([r != "r2" for r in table.column("req").to_pylist()]))
    ds = load_generic(write(tmp_path, table), MAPPING)  # two candidates per request
    lg = build_request_log(ds, 0)
    assert lg.num_requests == 2 and lg.num_candidates == 2
    assert lg.candidates.tolist() == [[0, 1], [2, 0]]
    assert lg.labelled.tolist() == [[True, False], [False, True]]
    assert lg.labels[0, 0, 0] == 1.0 and lg.labels[1, 1, 0] == 0.0
    # requests of unequal length: the replay says so
    with pytest.raises(DataError, match="rows hold 2..3 values"):
        build_request_log(load_generic(write(tmp_path, impressions()), MAPPING), 0)


@pytest.mark.parametrize("change, error, match", [
    (lambda t: t.set_column(1, "uid", pa.array(["u2", "u1", "u2", "u1", "u1", "u1", "u1"])),
     DataError, "request 'r2' holds more than one uid"),
    (lambda t: t.set_column(3, "t", pa.array([20, 21, 20, 10, 10, 30, 30])),
     DataError, "request 'r2' holds more than one t"),
    (lambda t: t.set_column(2, "iid", pa.array(["c", "c", "b", "b", "a", "c", "b"])),
     DataError, "request 'r2' lists the item twice"),
    (lambda t: t.set_column(4, "shown", pa.array([1, 2, 1, 1, 0, 0, 1])),
     DataError, "shown 2.0 is not 0/1"),
    (lambda t: t.set_column(5, "click", pa.array([None, None, 0.0, 1.0, None, None, 0.0])),
     DataError, "label is null on a shown row"),
])
def test_bad_impression_logs_name_the_request_or_row(tmp_path, change, error, match) -> None:
    with pytest.raises(error, match=match):
        load_generic(write(tmp_path, change(impressions())), MAPPING)


def test_mapping_checks_name_the_field() -> None:
    with pytest.raises(ConfigError, match="mapping.shown='s': needs mapping.request"):
        ColumnMapping(user="u", item="i", timestamp="t", labels=("y",), shown="s")
    with pytest.raises(ConfigError, match="codes\\['x'\\]: only categorical"):
        FeatureColumns(continuous=("x",), codes={"x": 3})
    with pytest.raises(ConfigError, match="codes\\['c'\\]=0"):
        FeatureColumns(categorical=("c",), codes={"c": 0})
    with pytest.raises(ConfigError, match="a coded multi-hot column must be a list"):
        FeatureColumns(multihot={"m": "|"}, codes={"m": 3})
    with pytest.raises(ConfigError, match="unknown"):
        ColumnMapping.from_dict({"user": "u", "item": "i", "timestamp": "t", "labels": ["y"],
                                 "requests": "r"})
    m = ColumnMapping.from_dict({"user": "u", "item": "i", "timestamp": "t", "labels": ["y"],
                                 "request": "r", "shown": "s", "order": "o",
                                 "item_features": {"categorical": ["c"], "codes": {"c": 4},
                                                   "scaled": ["p"]}})
    assert (m.request, m.shown, m.order) == ("r", "s", "o")
    assert m.item_features.codes == {"c": 4} and m.item_features.scaled == ("p",)


def test_coded_features_are_checked(tmp_path) -> None:
    items = pa.table({"iid": ["a", "b", "c"], "cat": [0, 3, 1]})
    pq.write_table(items, tmp_path / "items.parquet")
    m = ColumnMapping(user="uid", item="iid", timestamp="t", labels={"click": "click"},
                      request="req", shown="shown",
                      item_features=FeatureColumns(categorical=("cat",), codes={"cat": 3}))
    with pytest.raises(DataError, match="code 3 outside 0..2"):
        load_generic(write(tmp_path, impressions()), m, items=tmp_path / "items.parquet")
    m = ColumnMapping(user="uid", item="iid", timestamp="t", labels={"click": "click"},
                      request="req", shown="shown",
                      item_features=FeatureColumns(categorical=("cat",), codes={"cat": 5}))
    ds = load_generic(write(tmp_path, impressions()), m, items=tmp_path / "items.parquet")
    assert ds.spec.item_categorical == {"cat": 5}  # the stated count, not the values seen
    assert ds.items.column("cat").to_pylist() == [0, 3, 1]


def assert_same(a, b) -> None:
    assert (a.name, a.tasks, a.spec) == (b.name, b.tasks, b.spec)
    assert a.interactions.equals(b.interactions)
    for side in ("users", "items"):
        x, y = getattr(a, side), getattr(b, side)
        assert x.column_names == y.column_names  # in the native loaders' order too
        for c in x.column_names:
            assert x.column(c).equals(y.column(c)), (side, c)
    if a.requests is None:
        assert b.requests is None
        return
    ra, rb = a.requests.sort_by("request_id"), b.requests.sort_by("request_id")
    assert ra.schema == rb.schema
    for c in ra.column_names:
        va, vb = ra.column(c).to_pylist(), rb.column(c).to_pylist()
        if c.startswith("label_"):
            va, vb = (np.nan_to_num(np.concatenate(v), nan=-1.0) for v in (va, vb))
            assert np.array_equal(va, vb), c
        else:
            assert va == vb, c


def test_synthetic_exported_reads_back_the_same(tmp_path) -> None:
    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    path = export_generic(ds, tmp_path / "syn")
    doc = yaml.safe_load(path.read_text())
    assert doc["mapping"]["request"] == "request_id" and doc["mapping"]["shown"] == "shown"
    back = load_generic_yaml(path)
    assert_same(ds, back)
    # so the replay's request log is the same, row for row
    start = int(np.quantile(ds.interactions.column("ts").to_numpy(), 0.85))
    a, b = build_request_log(ds, start), build_request_log(back, start)
    for f in ("user", "ts", "surface", "candidates"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert np.array_equal(np.nan_to_num(a.labels, nan=-1), np.nan_to_num(b.labels, nan=-1))


def test_movielens_exported_reads_back_the_same(tmp_path) -> None:
    ds = load_movielens(tiny_movielens(tmp_path / "ml"))
    path = export_generic(ds, tmp_path / "out")
    assert "request" not in yaml.safe_load(path.read_text())["mapping"]
    assert_same(ds, load_generic_yaml(path))


def test_export_command_and_the_prediction_on_the_exported_log(tmp_path, capsys) -> None:
    """``solaris export`` writes the directory ``--dataset generic`` reads, and the figures
    computed from it equal the native dataset's (here: the prediction from the past)."""
    from solaris.replay.predict import predict
    from solaris.train.artifacts import train_artifacts

    sets = [f"--set={k}={json.dumps(v)}" for k, v in TINY.items() if k.startswith("data.")]
    assert main(["export", *sets, "--out", str(tmp_path / "gen")]) == 0
    assert "generic impression log" in capsys.readouterr().out
    cfg = load_config(None, TINY)
    native = load_dataset(cfg.data)
    generic = load_dataset(load_config(None, {**TINY, "data.dataset": "generic",
                                              "data.data_dir": str(tmp_path / "gen")}).data)
    art = tmp_path / "art"
    train_artifacts(cfg, native, art, seed=0)
    a, b = predict(art, native, resamples=20), predict(art, generic, resamples=20)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
