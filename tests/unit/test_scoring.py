"""The serving-path scorers on a tiny trained artifact: batching across requests changes no
score (not a bit), unknown ids are scored (never refused), absent slots are the VM alone, and the inline
FM's shared request part equals its plain per-pair forward."""

from __future__ import annotations

import numpy as np
import pytest

from solaris.cache.query import Slots
from solaris.config import HistoryConfig, load_config
from solaris.data.load import load_dataset
from solaris.errors import CheckpointError, RequestError
from solaris.history import HistoryStore
from solaris.online.scoring import Artifacts, InlineFM, ScoreRequest, VMScorer
from solaris.tiers import Tier
from solaris.train.artifacts import train_artifacts
from tests import tiny

TINY = {**tiny.TINY,  # smaller still: scorers only
        "data.synthetic.num_users": 200, "data.synthetic.num_items": 150,
        "data.synthetic.days": 8.0, "data.synthetic.target_interactions": 5000,
        "fm.shared_dim": 32, "fm.head_hidden": 16, "features.history_len": 8,
        "encoder.width": 8}


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Artifacts:
    cfg = load_config(None, TINY)
    out = tmp_path_factory.mktemp("art")
    train_artifacts(cfg, load_dataset(cfg.data), out, seed=0)
    return Artifacts.open(out)


def test_batching_across_requests_changes_no_score(art):
    vm = VMScorer(art, "click", art.side_tables())
    rng = np.random.default_rng(0)
    reqs = [ScoreRequest(int(u), rng.choice(art.num_items, n, replace=False), 0, None)
            for u, n in ((1, 5), (7, 30), (3, 1))]
    together = vm.score(reqs)
    alone = [vm.score([r])[0] for r in reqs]
    for a, b in zip(together, alone):  # bit for bit: the forward runs in fixed-size blocks
        np.testing.assert_array_equal(a, b)
    assert [len(x) for x in together] == [5, 30, 1]
    # requests across block boundaries, in any order, with the VM alone inside: the same bits
    big = [ScoreRequest(int(u), rng.choice(art.num_items, n), 0, None)
           for u, n in ((2, 300), (9, 77), (4, 256), (6, 1))]
    mixed = [big[1], reqs[1], big[3], big[0], reqs[0], big[2]]
    for r, both in zip(mixed, vm.score(mixed, with_base=True)):
        np.testing.assert_array_equal(both, vm.score([r], with_base=True)[0])


def test_unknown_ids_get_finite_scores_and_absent_slots_equal_none(art):
    vm = VMScorer(art, "click", art.side_tables())
    items = np.array([0, art.num_items, 10**12])
    p = vm.score([ScoreRequest(10**9, items, 99, None)])[0]
    assert p.shape == (3,) and np.isfinite(p).all() and ((p > 0) & (p < 1)).all()
    c, d = 3, vm.dim
    absent = Slots(pair_emb=np.full((c, d), np.nan, np.float32), pair_present=np.zeros(c, bool),
                   pair_tier=np.full(c, Tier.NONE), pair_age_s=np.zeros(c),
                   agg_emb=np.full((c, d), np.nan, np.float32), agg_present=np.zeros(c, bool),
                   missing=np.ones(c, bool))
    q = vm.score([ScoreRequest(10**9, items, 99, absent)])[0]
    np.testing.assert_allclose(p, q, rtol=1e-6)  # NaNs in absent slots never leak


def test_inline_fm_shared_equals_per_pair(art):
    hist = HistoryStore(HistoryConfig())
    rng = np.random.default_rng(1)
    for k in range(12):
        hist.record_impressions(4, rng.choice(art.num_items, 2), 0, 1000.0 + k)
    items = np.array([0, 5, art.num_items + 3, 17])
    shared = InlineFM(art, art.side_tables(), hist, sharing=True)
    plain = InlineFM(art, art.side_tables(), hist, sharing=False)
    z1, k1 = shared.embed(4, items, 0, 2000.0)
    z2, k2 = plain.embed(4, items, 0, 2000.0)
    assert k1.tolist() == [True, True, False, True] and (k1 == k2).all()
    np.testing.assert_allclose(z1, z2, rtol=1e-4, atol=1e-5)
    assert not z1[~k1].any()
    z3, k3 = plain.embed(10**9, items, 0, 2000.0)  # unknown user: nothing computed
    assert not k3.any() and not z3.any()


def test_missing_task_and_missing_artifacts_are_named(art, tmp_path):
    with pytest.raises(RequestError, match="nope"):
        VMScorer(art, "nope", art.side_tables())
    with pytest.raises(CheckpointError, match="manifest"):
        Artifacts.open(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(CheckpointError, match="malformed"):
        Artifacts.open(tmp_path)


def test_packed_slots_round_trip_exactly():
    from solaris.online.scoring import PackedSlots

    rng = np.random.default_rng(3)
    c, d = 50, 8
    present = rng.random(c) < 0.4
    tier = np.where(present, rng.choice([Tier.PAIR, Tier.USER_NEIGHBOUR], c), Tier.NONE)
    base = rng.normal(size=d).astype(np.float32)
    agg = np.tile(base, (c, 1))
    held = rng.random(c) < 0.2
    agg[held] = rng.normal(size=(held.sum(), d))
    agg_present = rng.random(c) < 0.9
    agg[~agg_present] = 0
    z = Slots(pair_emb=np.where(present[:, None], rng.normal(size=(c, d)), 0).astype(np.float32),
              pair_present=present, pair_tier=tier.astype(np.int64),
              pair_age_s=np.where(present, rng.uniform(0, 9000, c), 0.0),
              agg_emb=agg.astype(np.float32), agg_present=agg_present, missing=~present)
    p = PackedSlots.pack(z)
    assert len(p.agg_idx) <= held.sum() + 1
    u = p.unpack()
    for f in ("pair_emb", "pair_present", "pair_tier", "agg_emb", "agg_present"):
        np.testing.assert_array_equal(getattr(u, f), getattr(z, f), err_msg=f)
    np.testing.assert_allclose(u.pair_age_s, z.pair_age_s, rtol=1e-6)
    empty = PackedSlots.pack(Slots(np.zeros((3, d), np.float32), np.zeros(3, bool),
                                   np.zeros(3, np.int64), np.zeros(3), np.zeros((3, d), np.float32),
                                   np.zeros(3, bool), np.ones(3, bool)))
    assert not empty.unpack().agg_emb.any()


def test_the_served_vm_is_residual_on_its_vm_alone_with_live_scales(art):
    """The artifact's VM wraps ``vm_<task>_alone.pt``: with no slot present (or every scale at
    0) it scores as the VM alone, exactly; ``with_base`` gives the verifier that base; scales
    carried by a request apply to it alone."""
    import dataclasses

    import torch

    from solaris.models.blocks import blockwise

    vm = VMScorer(art, "click", art.side_tables())
    alone = art.vm_alone("click")[0].with_unknown_ids()  # vm_click_alone.pt, on its own
    items = np.arange(40)
    c, d = len(items), vm.dim
    rng = np.random.default_rng(1)
    slots = Slots(pair_emb=rng.normal(size=(c, d)).astype(np.float32),
                  pair_present=np.arange(c) % 2 == 0,
                  pair_tier=np.where(np.arange(c) % 2 == 0, 1, 0),
                  pair_age_s=np.zeros(c), agg_emb=np.zeros((c, d), np.float32),
                  agg_present=np.zeros(c, bool), missing=np.arange(c) % 2 == 1)
    req = ScoreRequest(5, items, 0, slots)
    with torch.no_grad():
        base_only = blockwise(lambda b: torch.sigmoid(alone(b)),
                              vm.batch([ScoreRequest(5, items, 0, None)], base_only=True),
                              vm.block_rows).numpy()
    np.testing.assert_array_equal(vm.score([ScoreRequest(5, items, 0, None)])[0], base_only)
    both = vm.score([req], with_base=True)[0]
    assert both.shape == (2, c)
    np.testing.assert_array_equal(both[1], base_only)  # the base is the VM alone's weights
    np.testing.assert_array_equal(both[0], vm.score([req])[0])
    miss = ~slots.pair_present
    np.testing.assert_array_equal(both[0][miss], base_only[miss])
    off = vm.scales()
    off[:] = 0.0
    zero = vm.score([dataclasses.replace(req, scales=off), req])
    np.testing.assert_array_equal(zero[0], base_only)
    np.testing.assert_array_equal(zero[1], both[0])  # the other request keeps its scales
    np.testing.assert_array_equal(vm.scales(), vm.model.scale.numpy())  # restored


def test_a_new_fm_version_keeps_the_vm_alone_and_retrains_the_corrections(art, tmp_path):
    import torch

    from solaris.train.checkpoint import load_checkpoint

    cfg = load_config(None, {**TINY, "fm.version": "fm-v2"})
    m = train_artifacts(cfg, load_dataset(cfg.data), tmp_path, seed=1, base_dir=art.root)
    assert m["version"] != art.version
    for name in ("vm_click_alone.pt", "vm_conversion_alone.pt"):
        old = load_checkpoint(art.root / name, "vm")["state_dict"]
        new = load_checkpoint(tmp_path / name, "vm")["state_dict"]
        assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    served = load_checkpoint(tmp_path / "vm_click.pt", "vm")["state_dict"]
    alone = load_checkpoint(art.root / "vm_click_alone.pt", "vm")["state_dict"]
    assert all(torch.equal(served[f"base.{k}"], v) for k, v in alone.items())


def test_training_leaves_the_callers_thread_count_as_it_was(tmp_path):
    """Training sets torch's thread count; a process that trains and then scores must score
    as one that only scores (a matrix product rounds by how its threads split it)."""
    import torch

    cfg = load_config(None, TINY)
    before = torch.get_num_threads()
    mine = cfg.train.threads + 1
    torch.set_num_threads(mine)
    try:
        train_artifacts(cfg, load_dataset(cfg.data), tmp_path, seed=0)
        assert torch.get_num_threads() == mine
    finally:
        torch.set_num_threads(before)


def _random_slots(rng: np.random.Generator, c: int, d: int) -> Slots:
    """Slots of every tier (own pair, user and item neighbour, none), ages across the TTL, an
    aggregate on most candidates; NaN where a slot is absent (it must never leak)."""
    tier = rng.choice([Tier.NONE, Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR], c)
    present = tier != Tier.NONE
    agg_present = rng.random(c) < 0.8
    return Slots(pair_emb=np.where(present[:, None], rng.normal(size=(c, d)),
                                   np.nan).astype(np.float32),
                 pair_present=present, pair_tier=tier.astype(np.int64),
                 pair_age_s=np.where(present, rng.uniform(0, 14400, c), 0.0),
                 agg_emb=np.where(agg_present[:, None], rng.normal(size=(c, d)),
                                  np.nan).astype(np.float32),
                 agg_present=agg_present, missing=~present)


def test_the_router_side_head_gives_the_served_scores_bit_for_bit(art):
    """``VMScorer.base_logits`` (the VM replica) and ``ResidualHead.served`` (the router) give
    exactly ``score(with_base=True)``'s bits, request by request, whatever the requests that
    shared the replica's batch, their sizes across block boundaries, the slots' tiers, NaNs in
    absent slots, and per-request scales; with no slots both rows are the VM alone's."""
    import dataclasses

    from solaris.online.scoring import ResidualHead

    vm = VMScorer(art, "click", art.side_tables())
    head = ResidualHead(art, "click", vm.read_ttl_s)
    assert head.model.base is None
    # every tier on (a trained VM may ship a neighbour tier at 0), then one request with its own
    on = vm.scales()
    on[0, 1:] = 1.0
    on[1, 1] = 1.0
    half = on * 0.5
    rng = np.random.default_rng(7)
    reqs = []
    for u, n, sc in ((3, 40, on), (8, 600, on), (1, 512, half), (4, 1, on), (2, 77, on)):
        items = rng.choice(art.num_items + 5, n)  # a few unknown items too
        reqs.append(ScoreRequest(u, items, 0, _random_slots(rng, n, vm.dim), sc))
    reqs.append(ScoreRequest(6, rng.choice(art.num_items, 90), 0, None, on))
    want = vm.score(reqs, with_base=True)
    logits = vm.base_logits(reqs[::-1])[::-1]  # another batch order on the replica side
    for r, w, b in zip(reqs, want, logits):
        got = head.served(b, r.slots, r.scales, r.items)
        assert got.dtype == np.float32 and got.shape == w.shape
        np.testing.assert_array_equal(got, w)
        if r.slots is not None:
            assert (got[0] != got[1]).any()  # the corrections did something here
            miss = ~r.slots.pair_present & ~r.slots.agg_present
            np.testing.assert_array_equal(got[0][miss], got[1][miss])
    np.testing.assert_array_equal(head.served(logits[-1], None)[0], want[-1][1])
    assert np.array_equal(head.model.scale.numpy(), vm.model.scale.numpy())  # restored
    with pytest.raises(CheckpointError, match="jointly trained"):  # the legacy kind is refused
        ResidualHead(dataclasses.replace(art, vm_files={"click": "vm_click_alone.pt"}), "click")
    with pytest.raises(RequestError, match="shape"):
        head.served(np.zeros((2, 3), np.float32), None)
