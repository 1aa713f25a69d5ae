"""Users the FM never saw (solaris/online/newusers.py): their pairs are queued only for an FM
that declares it reads them (``ReadsUnseenUsers``), and the FM workers compute them for such
an FM, with the user's live history and zero side features."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from solaris.config import EncoderConfig, FeatureConfig, FMConfig, HistoryConfig, load_config
from solaris.data.load import load_dataset
from solaris.errors import RequestError
from solaris.features import FeatureTables
from solaris.history import HistoryStore
from solaris.ids import PROVISIONAL_BASE
from solaris.models import api, check
from solaris.models.encoder import PairEncoder
from solaris.online import newusers
from solaris.online.newusers import computable, computable_picks
from solaris.precompute.pqueue import Group
from solaris.precompute.worker import PrecomputeWorker
from solaris.train.checkpoint import save_checkpoint

CAUSAL = "examples.causal_fm:CausalTransformerFM"
USERS, ITEMS = 10, 20


def arts(root: Path, cls: str) -> SimpleNamespace:
    """What ``computable_picks`` reads of ``Artifacts``: the sizes, and an FM checkpoint
    that names ``cls`` (its weights are not read)."""
    root.mkdir(parents=True, exist_ok=True)
    save_checkpoint(root / "fm.pt", torch.nn.Linear(1, 1), "fm", {"cls": cls})
    return SimpleNamespace(root=root, version=f"v-{root.name}", num_users=USERS,
                           num_items=ITEMS)


def test_a_known_user_gets_every_known_item_whatever_the_fm():
    items = np.array([0, 5, 19, 20, 10**9])
    for unseen in (False, True):
        np.testing.assert_array_equal(computable(3, items, USERS, ITEMS, unseen),
                                      [True, True, True, False, False])


@pytest.mark.parametrize("user", [USERS, USERS + 7, PROVISIONAL_BASE + 99])
def test_a_user_the_fm_never_saw_gets_pairs_only_from_an_fm_that_reads_such_users(user):
    items = np.array([0, 5, 25])
    assert not computable(user, items, USERS, ITEMS, False).any()
    np.testing.assert_array_equal(computable(user, items, USERS, ITEMS, True),
                                  [True, True, False])
    assert not computable(-1, items, USERS, ITEMS, True).any()


def test_the_router_asks_the_class_its_fm_checkpoint_names(tmp_path):
    items = np.array([4, 30, 7, 2])
    picks = np.array([0, 1, 2])  # the verifier's picks, positions into items
    new = USERS + 1
    causal, builtin = arts(tmp_path / "causal", CAUSAL), arts(tmp_path / "b", api.BUILTIN_FM)
    assert newusers.fm_reads_unseen_users(causal)
    assert not newusers.fm_reads_unseen_users(builtin)
    np.testing.assert_array_equal(computable_picks(causal, new, items, picks), [0, 2])
    assert computable_picks(builtin, new, items, picks).size == 0
    np.testing.assert_array_equal(computable_picks(builtin, 3, items, picks), [0, 2])


def test_a_class_that_does_not_import_where_the_router_runs_queues_no_new_user(tmp_path,
                                                                                caplog):
    art = arts(tmp_path / "gone", "no_such_module_here:FM")
    with caplog.at_level(logging.WARNING, logger="solaris.online.newusers"):
        assert not newusers.fm_reads_unseen_users(art)
    assert "cannot import 'no_such_module_here'" in caplog.text
    assert "its new users' pairs are not queued" in caplog.text
    assert computable_picks(art, USERS + 1, np.array([1]), np.array([0])).size == 0


@pytest.fixture(scope="module")
def world():
    ds = load_dataset(load_config(None, check.WORLD).data)
    ft = FeatureTables(ds, FeatureConfig(history_len=8))
    hs = HistoryStore(HistoryConfig(max_events=32, max_users=200))
    for u in (ds.num_users + 2, PROVISIONAL_BASE + 5):  # two new users, the same history
        hs.record_impressions(u, np.array([3, 11, 40]), 1, 1000.0)
        hs.record_labels(u, np.array([11]), np.array([[1.0, 0.0]], np.float32), 1000.0)
    return ds, ft, hs


def worker(world, cls: str, **kwargs) -> PrecomputeWorker:
    ds, ft, hs = world
    fm = api.build_fm(FMConfig(cls=cls, version="v", kwargs=kwargs, emb_dim=8,
                               shared_dim=16), ds.spec, ds.num_users, ds.num_items, ds.tasks, 8)
    enc = PairEncoder(fm.shared_dim, EncoderConfig(width=8, hidden=16))
    return PrecomputeWorker(fm, enc, hs, ft, "v")


def test_the_workers_compute_a_new_users_pairs_for_an_fm_that_reads_them(world):
    ds, _, _ = world
    w = worker(world, CAUSAL, dim=8, layers=1, heads=2, shared_dim=16)
    assert w.unseen_users
    items = np.array([0, 7, ds.num_items - 1])
    groups = [Group(u, 2000.0, 0, "v", items, np.zeros(3))
              for u in (ds.num_users + 2, PROVISIONAL_BASE + 5, ds.num_users + 9)]
    users, its, z, _ = w.run(groups)
    assert z.shape == (9, 8) and np.isfinite(z).all()
    np.testing.assert_array_equal(users[::3], [g.user for g in groups])
    np.testing.assert_allclose(z[:3], z[3:6], atol=1e-6)  # the id is not read: same history
    assert np.abs(z[:3] - z[6:]).max() > 1e-3  # the history is: the third user has none


def test_the_workers_refuse_a_new_user_for_an_fm_that_does_not_read_them(world):
    ds, _, _ = world
    w = worker(world, api.BUILTIN_FM)
    assert not w.unseen_users
    with pytest.raises(RequestError, match="outside the user table"):
        w.run([Group(ds.num_users + 2, 2000.0, 0, "v", np.array([1]), np.zeros(1))])
