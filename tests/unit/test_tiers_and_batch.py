"""One tier type and one VM-batch builder: the tier codes and wire labels round-trip, and
training (``VMInputs.batch``) and serving (``VMScorer.batch``) hand a VM the same tensors for
the same rows, because both build them with ``vm_batch``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from solaris.cache.query import Slots
from solaris.config import load_config
from solaris.data.load import load_dataset
from solaris.features import FeatureTables
from solaris.models.batch import KEYS, vm_batch
from solaris.models.blocks import blockwise
from solaris.online.scoring import Artifacts, ScoreRequest, VMScorer
from solaris.tiers import LABELS, NUM_TIERS, Tier
from solaris.train.artifacts import train_artifacts
from solaris.train.vertical import SlotArrays, VMInputs
from tests.unit.test_scoring import TINY


def test_tier_codes_and_labels_round_trip():
    assert [int(t) for t in Tier] == [0, 1, 2, 3] and NUM_TIERS == 4
    assert LABELS == ("none", "pair", "user_neighbour", "item_neighbour")
    for t in Tier:
        assert Tier.from_label(t.label) is t and Tier(int(t)) is t and LABELS[t] == t.label
    # on the wire a label is a plain string and a code a plain int
    assert json.dumps([Tier.USER_NEIGHBOUR.label, Tier.ITEM_NEIGHBOUR]) == '["user_neighbour", 3]'
    assert np.where(np.array([True, False]), Tier.PAIR, Tier.NONE).dtype == np.int64


@pytest.mark.parametrize("bad", ["user_neighbor", "PAIR", "", None])
def test_from_label_names_the_bad_value(bad):
    with pytest.raises(ValueError, match=f"tier={bad!r}"):
        Tier.from_label(bad)


def _ids(n: int) -> tuple[np.ndarray, ...]:
    return (np.arange(n), np.arange(n) + 1, np.zeros(n, np.int64), np.ones((n, 2), np.int64),
            np.ones((n, 3), np.int64), np.ones((n, 1), np.float32))


def _feats(n: int) -> dict[str, np.ndarray]:
    return dict(user_cont=np.ones((n, 2), np.float32), item_mh=np.ones((n, 1, 3), np.int64),
                request_cont=np.zeros((n, 0), np.float32))


def test_vm_batch_without_slots_has_both_slots_absent():
    b = vm_batch(*_ids(5), dim=4, **_feats(5))
    assert list(b) == list(KEYS)
    for k, dtype in KEYS.items():
        assert b[k].dtype == torch.from_numpy(np.zeros(1, dtype)).dtype and len(b[k]) == 5, k
    assert b["pair_emb"].shape == b["agg_emb"].shape == (5, 4)
    assert not b["pair_present"].any() and not b["agg_present"].any()
    assert (b["pair_tier"] == Tier.NONE).all() and not b["pair_age"].any()
    assert not b["pair_emb"].any() and not b["agg_emb"].any()
    with pytest.raises(ValueError, match="dim"):
        vm_batch(*_ids(5), **_feats(5))
    with pytest.raises(ValueError, match="item_cont: 4 rows"):
        vm_batch(*_ids(5)[:5], np.zeros((4, 1), np.float32), dim=4, **_feats(5))
    with pytest.raises(ValueError, match="request_cont: 4 rows"):
        vm_batch(*_ids(5), dim=4, **{**_feats(5), "request_cont": np.zeros((4, 1), np.float32)})
    with pytest.raises(TypeError, match="user_cont"):  # every feature is passed by name
        vm_batch(*_ids(5), dim=4)


def test_vm_batch_reads_the_tier_and_age_only_with_a_read_ttl():
    present = np.array([True, True, False])
    z = Slots(pair_emb=np.ones((3, 2), np.float32), pair_present=present,
              pair_tier=np.array([Tier.PAIR, Tier.ITEM_NEIGHBOUR, Tier.NONE]),
              pair_age_s=np.array([0.0, 1800.0, 0.0]), agg_emb=np.zeros((3, 2), np.float32),
              agg_present=np.zeros(3, bool), missing=~present)
    aware = vm_batch(*_ids(3), z, read_ttl_s=3600.0, **_feats(3))
    assert aware["pair_tier"].tolist() == [1, 3, 0]
    assert aware["pair_age"].tolist() == [0.0, 0.5, 0.0]
    blind = vm_batch(*_ids(3), z, **_feats(3))  # a VM trained offline: tier PAIR where present, age 0
    assert blind["pair_tier"].tolist() == [1, 1, 0] and not blind["pair_age"].any()
    assert aware["pair_present"].tolist() == blind["pair_present"].tolist() == [1.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    cfg = load_config(None, TINY)
    ds = load_dataset(cfg.data)
    out = tmp_path_factory.mktemp("art")
    train_artifacts(cfg, ds, out, seed=0)
    return Artifacts.open(out), FeatureTables(ds, cfg.features)


def test_training_and_serving_build_the_same_batch_for_the_same_rows(world):
    art, tables = world
    vm = VMScorer(art, "click", art.side_tables())
    rng = np.random.default_rng(0)
    n, d = tables.num_rows, vm.dim
    arrays = SlotArrays(rng.normal(size=(n, d)).astype(np.float32),
                        rng.normal(size=(n, d)).astype(np.float32), rng.random(n) < 0.7)
    inputs = VMInputs(tables, arrays)
    # rows grouped into requests: each request one (user, surface), its candidates in order
    rows = rng.choice(n, 60, replace=False)
    rows = rows[np.lexsort((rows, tables.surface[rows], tables.user[rows]))]
    present, agg_on = rng.random(60) < 0.5, rng.random(60) < 0.5
    want = inputs.batch(rows, present, agg_on)
    key = np.stack([tables.user[rows], tables.surface[rows]], 1)
    cuts = np.flatnonzero((key[1:] != key[:-1]).any(1)) + 1
    reqs = []
    for idx in np.split(np.arange(60), cuts):
        r, p = rows[idx], present[idx]
        ap = arrays.agg_present[r] & agg_on[idx]
        z = Slots(pair_emb=np.where(p[:, None], arrays.pair_emb[r], 0).astype(np.float32),
                  pair_present=p, pair_tier=np.where(p, Tier.PAIR, Tier.NONE),
                  pair_age_s=np.zeros(len(r)),  # offline: the own pair, fresh
                  agg_emb=np.where(ap[:, None], arrays.agg_emb[r], 0).astype(np.float32),
                  agg_present=ap, missing=~p)
        reqs.append(ScoreRequest(int(tables.user[r[0]]), tables.item[r],
                                 int(tables.surface[r[0]]), z))
    assert len(reqs) > 1
    got = vm.batch(reqs)
    assert list(got) == list(want) == list(KEYS)
    for k in KEYS:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    # and so the same scores, bit for bit, run in the same fixed-size blocks
    with torch.no_grad():
        offline = blockwise(lambda b: torch.sigmoid(vm.model(b)), want, vm.block_rows).numpy()
        whole = torch.sigmoid(vm.model(want)).numpy()  # one call on the 60 rows: ulps apart
    np.testing.assert_allclose(whole, offline, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.concatenate(vm.score(reqs)), offline)
