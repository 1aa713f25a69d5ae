"""The built-in VM reads every declared feature: each categorical column of both sides (past
the three it once read), the user's and the item's continuous columns, the item's multi-hot
columns and the request-time features -- a change to one row's value moves that row's logit
and no other row's. Request-time features come from a generic log's mapping
(``request_features``), standardised over its requests, one value per request; serving
standardises a request's raw values the same way (``request_vector``) and carries them to the
VM replica (``ScoreRequest.features`` on the wire)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from solaris.config import VMConfig
from solaris.data.generic import ColumnMapping, load_generic
from solaris.data.schema import FeatureSpec
from solaris.errors import ConfigError, DataError, RequestError
from solaris.models.batch import base_batch, vm_batch
from solaris.models.vm import MAX_CAT_COLUMNS, VerticalModel
from solaris.online.scoring import (ScoreRequest, decode_score_request, encode_score_request,
                                    request_vector)

SPEC = FeatureSpec(
    user_categorical={f"u{j}": 3 + j for j in range(5)},  # five: past the old limit of three
    user_continuous=("activity", "tenure"),
    item_categorical={f"i{j}": 2 + j for j in range(4)},
    item_multihot={"tags": 6, "moods": 3},
    item_continuous=("price",),
    num_surfaces=2,
    request_continuous=("hour", "battery"),
    request_mean=(12.0, 0.5),
    request_std=(6.0, 0.25),
)
B = 6


def _vm(spec: FeatureSpec = SPEC) -> VerticalModel:
    torch.manual_seed(0)
    cfg = VMConfig(emb_dim=4, hidden=(8,), dropout=0.0)
    return VerticalModel(cfg, spec, num_users=7, num_items=11, slot_dim=4).eval()


def _cols(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mh = np.stack([rng.integers(0, v + 1, (B, 3)) for v in SPEC.item_multihot.values()], 1)
    return dict(
        user=rng.integers(0, 7, B), item=rng.integers(0, 11, B), surface=rng.integers(0, 2, B),
        user_cat=np.stack([rng.integers(0, c, B) for c in SPEC.user_categorical.values()], 1),
        item_cat=np.stack([rng.integers(0, c, B) for c in SPEC.item_categorical.values()], 1),
        item_cont=rng.standard_normal((B, 1)).astype(np.float32),
        user_cont=rng.standard_normal((B, 2)).astype(np.float32),
        item_mh=mh, request_cont=rng.standard_normal((B, 2)).astype(np.float32))


def _logits(vm: VerticalModel, c: dict[str, np.ndarray]) -> torch.Tensor:
    with torch.no_grad():
        return vm(vm_batch(c["user"], c["item"], c["surface"], c["user_cat"], c["item_cat"],
                           c["item_cont"], user_cont=c["user_cont"], item_mh=c["item_mh"],
                           request_cont=c["request_cont"], dim=4))


@pytest.mark.parametrize("key,col", [
    ("user_cat", 4), ("item_cat", 3),  # the last columns, past the old limit
    ("user_cont", 0), ("user_cont", 1), ("item_cont", 0),
    ("item_mh", 0), ("item_mh", 1), ("request_cont", 0), ("request_cont", 1)])
def test_every_declared_column_moves_its_rows_logit_only(key, col):
    vm = _vm()
    c = _cols()
    before = _logits(vm, c)
    row = 2
    changed = {k: v.copy() for k, v in c.items()}
    if key == "item_mh":  # another tag set for one item
        changed[key][row, col] = [1, 2, 0] if list(c[key][row, col]) != [1, 2, 0] else [3, 0, 0]
    elif key.endswith("_cat"):
        card = list((SPEC.user_categorical if key == "user_cat" else SPEC.item_categorical)
                    .values())[col]
        changed[key][row, col] = (c[key][row, col] + 1) % card
    else:
        changed[key][row, col] += 1.5
    after = _logits(vm, changed)
    others = np.arange(B) != row
    torch.testing.assert_close(before[others], after[others], atol=0, rtol=0)
    assert before[row] != after[row]


def test_a_multihot_row_reads_the_mean_of_its_codes_and_pad_is_no_code():
    vm = _vm()
    c = _cols()
    c["item_mh"][:, 0] = [[1, 2, 0]] * B
    twice = {k: v.copy() for k, v in c.items()}
    twice["item_mh"][:, 0] = [[1, 2, 2]] * B  # a different mean: the codes, not a set
    swapped = {k: v.copy() for k, v in c.items()}
    swapped["item_mh"][:, 0] = [[2, 0, 1]] * B  # the same codes, padded elsewhere
    torch.testing.assert_close(_logits(vm, c), _logits(vm, swapped))
    assert not torch.equal(_logits(vm, c), _logits(vm, twice))


def test_a_spec_without_the_new_features_builds_the_same_parameters():
    """No multi-hot, user continuous or request columns: the same parameters, in the same
    order and of the same shapes, as a VM that reads only ids, categories and item
    continuous columns (a checkpoint of such a spec loads as before)."""
    plain = FeatureSpec(user_categorical={"a": 3, "b": 2}, item_categorical={"c": 4},
                        item_continuous=("price",), num_surfaces=2)
    vm = _vm(plain)
    names = [n for n, _ in vm.named_parameters()]
    assert names == ["user_emb.weight", "item_emb.weight", "surface_emb.weight",
                     "user_cat_emb.0.weight", "user_cat_emb.1.weight",
                     "item_cat_emb.0.weight", "mlp.0.weight", "mlp.0.bias", "mlp.3.weight",
                     "mlp.3.bias"]
    assert vm.mlp[0].in_features == 4 * (3 + 2 + 1) + 1


def test_the_categorical_limit_is_documented_and_refused_by_name():
    many = FeatureSpec(item_categorical={f"c{j}": 2 for j in range(MAX_CAT_COLUMNS + 1)})
    with pytest.raises(ValueError, match=r"spec.item_categorical: 33 columns"):
        _vm(many)
    _vm(FeatureSpec(user_categorical={f"c{j}": 2 for j in range(MAX_CAT_COLUMNS)}))


def test_base_batch_holds_the_same_features_as_vm_batch():
    c = _cols()
    full = vm_batch(c["user"], c["item"], c["surface"], c["user_cat"], c["item_cat"],
                    c["item_cont"], user_cont=c["user_cont"], item_mh=c["item_mh"],
                    request_cont=c["request_cont"], dim=4)
    base = base_batch(c["user"], c["item"], c["surface"], c["user_cat"], c["item_cat"],
                      c["item_cont"], user_cont=c["user_cont"], item_mh=c["item_mh"],
                      request_cont=c["request_cont"])
    for k, v in base.items():
        assert torch.equal(v, full[k]), k
    assert base["item_mh"].shape == (B, 2, 3) and base["request_cont"].shape == (B, 2)


# ---- the spec, the request vector, the wire ---------------------------------------------------


def test_an_old_feature_spec_dict_without_request_features_loads():
    old = {"user_categorical": {"a": 3}, "user_continuous": ["x"], "item_categorical": {},
           "item_multihot": {"tags": 4}, "item_continuous": [], "num_surfaces": 2}
    spec = FeatureSpec.from_dict(old)
    assert spec.request_continuous == spec.request_mean == spec.request_std == ()
    assert spec.user_continuous == ("x",)
    assert FeatureSpec.from_dict(SPEC.to_dict()) == SPEC


def test_request_vector_standardises_and_names_a_bad_feature():
    v = request_vector(SPEC, {"hour": 18.0})
    assert v.dtype == np.float32 and v.tolist() == [1.0, 0.0]  # battery absent: its mean
    assert request_vector(SPEC, None).tolist() == [0.0, 0.0]
    assert request_vector(SPEC, {"hour": 12, "battery": 1.0}).tolist() == [0.0, 2.0]
    with pytest.raises(RequestError, match="'weekday' is not declared"):
        request_vector(SPEC, {"hour": 1.0, "weekday": 2.0})
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(RequestError, match="'battery': must be a finite number"):
            request_vector(SPEC, {"battery": bad})
    with pytest.raises(RequestError, match="'hour' is not declared .*none"):
        request_vector(FeatureSpec(), {"hour": 1.0})


def test_the_request_features_travel_to_the_vm_replica():
    feats = request_vector(SPEC, {"hour": 3.0, "battery": 0.1})
    req = ScoreRequest(5, np.arange(4), 1, None, None, feats)
    _, back = decode_score_request(encode_score_request("v1", req))
    np.testing.assert_array_equal(back.features, feats)
    _, none = decode_score_request(encode_score_request("v1", ScoreRequest(5, np.arange(4), 1,
                                                                           None)))
    assert none.features is None


# ---- the generic loader --------------------------------------------------------------------


def _log(hour: list) -> pa.Table:
    """Three requests (r1 two rows, r2 three, r3 one), ``hour`` per row."""
    return pa.table({"req": ["r1", "r1", "r2", "r2", "r2", "r3"],
                     "uid": [1, 1, 2, 2, 2, 1], "iid": [10, 11, 10, 12, 11, 12],
                     "t": [5, 5, 9, 9, 9, 20], "click": [1, 0, 0, 1, 0, 1],
                     "hour": hour})


MAPPING = ColumnMapping.from_dict({"user": "uid", "item": "iid", "timestamp": "t",
                                   "labels": {"click": "click"}, "request": "req",
                                   "request_features": ["hour"]})


def test_request_features_load_from_a_generic_log_standardised(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(_log([3.0, 3.0, 9.0, 9.0, 9.0, None]), path)
    ds = load_generic(path, MAPPING)
    spec = ds.spec
    # over the requests (one value each; r3's null is not counted): 3 and 9
    assert spec.request_continuous == ("hour",)
    assert spec.request_mean == (6.0,) and spec.request_std == (3.0,)
    inter = ds.interactions.to_pydict()
    z = dict(zip(zip(inter["user_id"], inter["ts"]), inter["hour"]))
    assert ds.interactions.schema.field("hour").type == pa.float32()
    assert sorted(z.values()) == [-1.0, 0.0, 1.0]  # r1 -1, r2 +1, r3 (null) its mean 0
    assert ds.requests.column("hour").to_pylist() == [-1.0, 1.0, 0.0]  # in (ts, id) order
    # serving reads a raw value as training did
    assert request_vector(spec, {"hour": 9.0}).tolist() == [1.0]
    # the tables hand them to the VM by row
    from solaris.config import FeatureConfig
    from solaris.features import FeatureTables

    t = FeatureTables(ds, FeatureConfig(history_len=2))
    np.testing.assert_array_equal(t.request_cont[:, 0], ds.interactions.column("hour")
                                  .to_numpy())


def test_rows_of_one_request_that_disagree_are_a_data_error_naming_column_and_row(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(_log([3.0, 3.0, 9.0, 8.0, 9.0, 1.0]), path)
    with pytest.raises(DataError, match=r"column 'hour', row 3: .*one value per request"):
        load_generic(path, MAPPING)
    pq.write_table(_log([3.0, None, 9.0, 9.0, 9.0, 1.0]), path)  # a null beside a value
    with pytest.raises(DataError, match=r"column 'hour', row 1"):
        load_generic(path, MAPPING)


def test_an_interaction_log_groups_requests_by_user_and_timestamp(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(_log([3.0, 4.0, 9.0, 9.0, 9.0, 1.0]).drop(["req"]), path)
    mapping = ColumnMapping.from_dict({"user": "uid", "item": "iid", "timestamp": "t",
                                       "labels": {"click": "click"},
                                       "request_features": ["hour"]})
    with pytest.raises(DataError, match=r"column 'hour', row 1: .*user and timestamp"):
        load_generic(path, mapping)
    pq.write_table(_log([3.0, 3.0, 9.0, 9.0, 9.0, 0.0]).drop(["req"]), path)
    ds = load_generic(path, mapping)
    assert ds.spec.request_mean == (4.0,) and ds.requests is None


@pytest.mark.parametrize("names,match", [
    ("hour", "must be a list"), (["click"], "already uses"), (["ts"], "already uses"),
    (["h", "h"], "more than once"), ([""], "not a column name")])
def test_the_mapping_checks_its_request_features(names, match):
    with pytest.raises(ConfigError, match=match):
        ColumnMapping.from_dict({"user": "uid", "item": "iid", "timestamp": "t",
                                 "labels": {"click": "click"}, "request_features": names})


def test_the_replay_and_the_prediction_refuse_a_log_with_request_features(tmp_path):
    """They do not send request features yet: a log declaring some is refused by name
    rather than served at the features' mean, inputs its VM did not train on."""
    from solaris.replay.prepare import check_no_request_features

    path = tmp_path / "log.parquet"
    pq.write_table(_log([3.0, 3.0, 9.0, 9.0, 9.0, 4.0]), path)
    with pytest.raises(DataError, match="request features \\['hour'\\]; the replay does not"):
        check_no_request_features(load_generic(path, MAPPING), "the replay")
    plain = ColumnMapping.from_dict({"user": "uid", "item": "iid", "timestamp": "t",
                                     "labels": {"click": "click"}, "request": "req"})
    check_no_request_features(load_generic(path, plain), "the replay")  # nothing declared
