"""The FM input contract (solaris/models/contract.py, docs/reference/fm-inputs.md) is what the
code builds: every key's dtype, shape, range and padding on training's batches
(``FeatureTables.batch``) and on the FM workers' (``PrecomputeWorker`` over the history
store), and each coding the page states, row by row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from solaris.config import EncoderConfig, FeatureConfig, FMConfig, HistoryConfig, load_config
from solaris.data.load import load_dataset
from solaris.errors import RequestError
from solaris.features import FeatureTables
from solaris.history import HistoryStore, request_inputs
from solaris.models import api, check, contract
from solaris.models.encoder import PairEncoder
from solaris.models.fm import FoundationModel
from solaris.precompute.pqueue import Group
from solaris.precompute.worker import PrecomputeWorker

L = 8


@pytest.fixture(scope="module")
def world():
    ds = load_dataset(load_config(None, check.WORLD).data)
    ft = FeatureTables(ds, FeatureConfig(history_len=L))
    sizes = contract.Sizes(ds.spec, ds.num_users, ds.num_items, tuple(ds.tasks), L,
                           ft.item_mh.shape[2])
    return ds, ft, sizes


def test_the_contract_names_every_key_of_the_interface_once():
    assert [f.name for f in contract.INPUTS] == [*api.REQUEST_KEYS, *api.CANDIDATE_KEYS]
    for f in contract.INPUTS:
        assert f.side == ("request" if f.name in api.REQUEST_KEYS else "candidate")
        assert f.dtype in ("int64", "float32") and f.high in contract.HIGHS
        assert set(f.shape) <= set(contract.DIMS)
        assert f.shape[0] == ("R" if f.side == "request" else "B")
        assert (f.high == "-") == (f.dtype == "float32")


def test_training_batches_hold_the_contract(world):
    ds, ft, sizes = world
    rows = np.arange(ft.num_rows)
    batch = ft.batch(rows)
    assert contract.mismatches(batch, sizes, len(rows)) == []
    assert set(batch) == {f.name for f in contract.INPUTS}
    empty = (batch["hist_item"] == 0).all(1)
    assert empty.any() and (~empty).any()  # both kinds of rows were checked
    assert (batch["hist_item"] == ds.num_items).any()  # the largest code occurs
    assert batch["item_mh"].shape[1:] == (len(ds.spec.item_multihot), sizes.multihot_width)


def test_the_workers_batches_hold_the_contract(world):
    ds, ft, sizes = world
    hs = HistoryStore(HistoryConfig(max_events=64, max_users=500))
    hs.replay_log(ft.user, ft.item, ft.surface, ft.labels, ft.ts.astype(float))
    fm = FoundationModel(FMConfig(emb_dim=8, shared_dim=16, head_hidden=8, dense_hidden=8),
                         ds.spec, ds.num_users, ds.num_items, ds.tasks, L)
    worker = PrecomputeWorker(fm, PairEncoder(16, EncoderConfig(width=8, hidden=16)), hs, ft,
                              version=fm.version)
    rng = np.random.default_rng(0)
    rows = rng.choice(ft.num_rows, 12, replace=False)
    groups = [Group(int(ft.user[r]), float(ft.ts[r]) + 1.0, int(ft.surface[r]), fm.version,
                    rng.choice(ds.num_items, 1 + j % 4, replace=False), np.zeros(1 + j % 4))
              for j, r in enumerate(rows)]
    req, cand, req_index, _, _ = worker._batches(groups)
    B = len(req_index)
    assert contract.mismatches({**req, **cand}, sizes, B, requests=len(groups)) == []
    assert (req["hist_item"] > 0).any()
    assert req_index.dtype == torch.int64 and int(req_index.max()) == len(groups) - 1


def test_each_coding_is_what_the_page_says(world):
    """For every row's most recent event: the item + 1, 1 + the label bits, the surface + 1,
    log1p of the hours to the request, the categories + 1; the candidate's codes raw."""
    ds, ft, _ = world
    b = {k: v.numpy() for k, v in ft.batch(np.arange(ft.num_rows)).items()}
    r = np.flatnonzero(ft.hist[:, 0] >= 0)
    h = ft.hist[r, 0]  # (n,) the row of each row's latest event
    bits = (ft.labels[h].astype(np.int64) << np.arange(len(ds.tasks))).sum(1)
    np.testing.assert_array_equal(b["hist_item"][r, 0], ft.item[h] + 1)
    np.testing.assert_array_equal(b["hist_action"][r, 0], 1 + bits)
    assert set(np.unique(b["hist_action"][r, 0])) >= {1, 2}  # no label, and a click
    np.testing.assert_array_equal(b["hist_surface"][r, 0], ft.surface[h] + 1)
    hours = (ft.req_ts[r] - ft.ts[h]) / 3600.0
    np.testing.assert_allclose(b["hist_age"][r, 0], np.log1p(hours), rtol=1e-6)
    np.testing.assert_array_equal(b["hist_item_cat"][r, 0], ft.item_cat[ft.item[h]] + 1)
    np.testing.assert_array_equal(b["item"], ft.item)
    np.testing.assert_array_equal(b["item_cat"], ft.item_cat[ft.item])
    mh = b["item_mh"][:, 0]  # (N, M) the first multi-hot column, codes + 1
    tags = ds.items.column(list(ds.spec.item_multihot)[0]).to_pylist()
    for n in range(0, ft.num_rows, 97):
        listed = tags[ft.item[n]] or []
        np.testing.assert_array_equal(mh[n, :len(listed)], np.array(listed) + 1)
        assert not mh[n, len(listed):].any()


def test_a_batch_coded_off_by_one_breaks_the_contract(world):
    """History ids read as raw item ids with num_items for padding: the page's coding
    check names it."""
    ds, ft, sizes = world
    rows = np.arange(200)
    b = {k: v.numpy() for k, v in ft.batch(rows).items()}
    h = b["hist_item"]
    off = {**b, "hist_item": np.where(h == 0, ds.num_items, h - 1)}
    found = contract.mismatches(off, sizes, len(rows))
    assert "hist_item: a padded slot" not in " ".join(found)
    assert any(m.startswith("hist_action: a padded slot (hist_item == 0) is not 0")
               for m in found), found
    assert any(m.startswith("hist_action: an event's action is 0") for m in found), found
    wrong = {**b, "hist_age": b["hist_age"].astype(np.float64), "item": b["item"][:-1]}
    assert contract.mismatches(wrong, sizes, len(rows)) == [
        "hist_age: dtype float64, the contract says float32",
        f"item: shape ({len(rows) - 1},), the contract says ({len(rows)},) (B)"]


def test_a_user_past_the_tables_reads_zero_side_features_only_when_asked(world):
    ds, ft, sizes = world
    hs = HistoryStore(HistoryConfig(max_events=16, max_users=100))
    new, old = ds.num_users + 3, 5
    for u in (new, old):
        hs.record_impressions(u, np.array([7, 9]), 1, 1000.0)
    users, now, surf = np.array([old, new]), np.array([2000.0, 2000.0]), np.array([0, 1])
    win = hs.window(users, now, L)
    with pytest.raises(RequestError, match=f"users: id {new} outside the user table"):
        request_inputs(win, users, now, surf, ft.item_cat, ft.user_cat, ft.user_cont)
    req = request_inputs(win, users, now, surf, ft.item_cat, ft.user_cat, ft.user_cont,
                         unseen_users=True)
    assert contract.mismatches({k: v for k, v in req.items() if k != "user"}, sizes, 2) == []
    np.testing.assert_array_equal(req["user"], users)
    np.testing.assert_array_equal(req["user_cat"], [ft.user_cat[old], np.zeros(3)])
    np.testing.assert_array_equal(req["user_cont"], [ft.user_cont[old], np.zeros(1)])
    # its history, + 1, the later arrival of the same instant first
    np.testing.assert_array_equal(req["hist_item"][:, :2], [[10, 8], [10, 8]])
    np.testing.assert_array_equal(hs.batch(users, now, surf, L, ft.item_cat, ft.user_cat,
                                           ft.user_cont, unseen_users=True)["user_cat"],
                                  req["user_cat"])


def test_the_reference_page_shows_every_key_every_spec_field_and_every_probe():
    import dataclasses

    from solaris import reference
    from solaris.data.schema import FeatureSpec

    page = reference.render("fm-inputs.md")
    for f in contract.INPUTS:
        shape = f"({', '.join(f.shape)}{',' if len(f.shape) == 1 else ''})"
        assert f"| `{f.name}` | `{f.dtype}` | `{shape}` |" in page, f.name
    assert "| `hist_item` | `int64` | `(R, L)` | `0 .. num_items` | " in page
    assert "| `item_mh` | `int64` | `(B, n_mh, M)` | `0 .. vocab` | " in page
    for f in dataclasses.fields(FeatureSpec):
        assert f"| `{f.name}` | " in page, f.name
    for probe in check.PROBES:
        assert f"| `{probe}` | " in page, probe
