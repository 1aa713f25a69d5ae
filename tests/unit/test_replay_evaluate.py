"""Re-scoring the replay's feature log: tier masks, the tier-aware start, TR halves."""

from __future__ import annotations

import numpy as np
import torch

from solaris.config import VMConfig
from solaris.data.schema import FeatureSpec
from solaris.models.vm import VerticalModel
from solaris.replay.evaluate import ServedRows, _tiers_start_as_pair, halves, transfer
from solaris.tiers import Tier

D = 4


def _rows(n: int = 6) -> ServedRows:
    rng = np.random.default_rng(0)
    tier = np.array([Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR, Tier.NONE, Tier.PAIR,
                     Tier.ITEM_NEIGHBOUR])[:n]
    emb = rng.normal(size=(n, D)).astype(np.float32) * (tier != Tier.NONE)[:, None]
    return ServedRows(req=np.repeat(np.arange(3), 2)[:n], ts=np.repeat([10., 20., 30.], 2)[:n],
                      user=np.zeros(n, np.int64), item=np.arange(n), surface=np.zeros(n, np.int64),
                      y=np.array([1, 0, 1, 0, 1, 0.])[:n], score=np.full(n, 0.5),
                      tier=tier, age_s=np.full(n, 60.0) * (tier != Tier.NONE), pair_emb=emb,
                      agg_emb=np.ones((n, D), np.float32), agg_present=np.ones(n, bool))


def test_slots_keep_only_the_tiers_switched_on() -> None:
    rows = _rows()
    z = rows.slots(np.arange(6), tiers={Tier.PAIR, Tier.USER_NEIGHBOUR}, agg=False)
    assert z.pair_tier.tolist() == [1, 2, 0, 0, 1, 0]
    assert not z.pair_emb[[2, 3, 5]].any() and (z.pair_age_s[[2, 5]] == 0).all()
    assert not z.agg_present.any() and not z.agg_emb.any()
    real = np.full((6, D), 7.0)
    full = rows.slots(np.arange(6), pair=real)
    assert full.pair_present.all() and (full.pair_tier == Tier.PAIR).all()
    assert (full.pair_emb == 7.0).all() and (full.pair_age_s == 0).all()


def test_a_tier_aware_copy_starts_out_scoring_like_the_offline_vm() -> None:
    torch.manual_seed(0)
    vm = VerticalModel(VMConfig(use_pair=True, use_agg=True), FeatureSpec(), 3, 5, D).eval()
    n = 4
    base = {"user": torch.zeros(n, dtype=torch.long), "item": torch.arange(n),
            "surface": torch.zeros(n, dtype=torch.long),
            "user_cat": torch.zeros(n, 0, dtype=torch.long),
            "item_cat": torch.zeros(n, 0, dtype=torch.long), "item_cont": torch.zeros(n, 0),
            "pair_emb": torch.randn(n, D), "pair_present": torch.ones(n),
            "agg_emb": torch.randn(n, D), "agg_present": torch.ones(n)}
    as_pair = {**base, "pair_tier": torch.full((n,), Tier.PAIR), "pair_age": torch.zeros(n)}
    served = {**base, "pair_tier": torch.tensor([1, 2, 3, 2]), "pair_age": torch.rand(n)}
    with torch.no_grad():
        before = vm(as_pair)
        assert not torch.allclose(vm(served), before)  # untrained tier/age weights matter
        _tiers_start_as_pair(vm)
        assert torch.allclose(vm(served), before, atol=1e-6)


def test_halves_split_by_request_time_and_transfer_uses_the_second() -> None:
    rows = _rows()
    first, second = halves(rows)
    assert first.tolist() == [True, True, False, False, False, False]  # ts < median 20
    assert (second == ~first).all()
    y = np.array([1, 0, 1, 0, 1, 0.] * 20)
    f = np.arange(120) < 60
    p_vm, p_fm = np.full(120, 0.5), np.where(y == 1, 0.8, 0.2)
    r = transfer(y, p_vm, p_fm, p_fm, f, ~f)  # X as good as the FM: TR 1
    assert abs(r["tr_raw"] - 1.0) < 1e-9 and abs(r["tr_cal"] - 1.0) < 1e-9
