"""Foundation model, pair encoder, vertical model and FLOP counting."""

from __future__ import annotations

import io

import pytest
import torch

from solaris.config import EncoderConfig, FMConfig, VMConfig
from solaris.data.schema import FeatureSpec
from solaris.models.encoder import PairEncoder, encoder_loss
from solaris.models.flops import (fm_amortised_flops, fm_candidate_flops, fm_request_flops,
                                  flops_per_pair)
from solaris.models.api import CANDIDATE_KEYS, REQUEST_KEYS
from solaris.models.fm import FoundationModel
from solaris.models.vm import VerticalModel

TASKS = ("click", "like")
SMALL_FM = FMConfig(emb_dim=8, seq_heads=2, dense_hidden=8, cross_layers=2, shared_dim=16,
                    head_hidden=8, dropout=0.1, version="fm-test")

TINY_SPEC = FeatureSpec(
    user_categorical={"age": 3, "gender": 2},
    user_continuous=("activity",),
    item_categorical={"cat": 4, "brand": 5},
    item_multihot={"tags": 6, "moods": 3},
    item_continuous=("price", "len"),
    num_surfaces=2,
)
EMPTY_SPEC = FeatureSpec(num_surfaces=1)  # every side-feature group has 0 columns
MOVIELENS_SPEC = FeatureSpec(
    user_categorical={"age": 7, "gender": 2, "occupation": 21, "zip": 10},
    user_continuous=("activity",),
    item_categorical={"decade": 9},
    item_multihot={"genres": 19},
    item_continuous=("year",),
    num_surfaces=1,
)


def make_batch(spec: FeatureSpec, B: int = 6, L: int = 5, *, num_users: int = 7,
               num_items: int = 11, num_tasks: int = len(TASKS), M: int = 3,
               slot_dim: int = 4, pad_rows: tuple[int, ...] = (1,),
               seed: int = 0) -> dict[str, torch.Tensor]:
    """A random batch in the feature contract; rows in ``pad_rows`` have no history at all."""
    g = torch.Generator().manual_seed(seed)

    def ints(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=g)

    def floats(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    uc, ic, mh = (list(d.values()) for d in (spec.user_categorical, spec.item_categorical,
                                             spec.item_multihot))
    n_ud, n_id = len(spec.user_continuous), len(spec.item_continuous)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    lengths[list(pad_rows)] = 0
    valid = torch.arange(L)[None, :] < lengths[:, None]  # (B, L) left-aligned, most recent first
    vl = valid.long()
    hist_item_cat = torch.stack([ints(c, B, L) + 1 for c in ic], dim=-1) if ic else \
        torch.zeros(B, L, 0, dtype=torch.long)
    item_mh = (torch.stack([ints(v + 1, B, M) for v in mh], dim=1) if mh
               else torch.zeros(B, 0, M, dtype=torch.long))
    if mh:
        item_mh[0, 0] = 0  # an all-pad multi-hot row
    batch = {
        "user": ints(num_users, B),
        "surface": ints(spec.num_surfaces, B),
        "user_cat": (torch.stack([ints(c, B) for c in uc], dim=-1) if uc
                     else torch.zeros(B, 0, dtype=torch.long)),
        "user_cont": floats(B, n_ud),
        "hist_item": (ints(num_items, B, L) + 1) * vl,
        "hist_action": (ints(2 ** num_tasks, B, L) + 1) * vl,
        "hist_surface": (ints(spec.num_surfaces, B, L) + 1) * vl,
        "hist_age": torch.log1p(floats(B, L).abs() * 10) * valid,
        "hist_item_cat": hist_item_cat * vl.unsqueeze(-1),
        "item": ints(num_items, B),
        "item_cat": (torch.stack([ints(c, B) for c in ic], dim=-1) if ic
                     else torch.zeros(B, 0, dtype=torch.long)),
        "item_mh": item_mh,
        "item_cont": floats(B, n_id),
        "pair_emb": floats(B, slot_dim),
        "pair_present": (torch.rand(B, generator=g) < 0.5).float(),
        "pair_tier": ints(4, B),
        "pair_age": floats(B).abs(),
        "agg_emb": floats(B, slot_dim),
        "agg_present": (torch.rand(B, generator=g) < 0.5).float(),
    }
    batch["pair_present"][:2] = torch.tensor([1.0, 0.0])  # both cases always present
    batch["agg_present"][:2] = torch.tensor([1.0, 0.0])
    batch["pair_tier"] = batch["pair_tier"] * batch["pair_present"].long()
    batch["request_cont"] = floats(B, len(spec.request_continuous))
    return batch


def make_fm(spec: FeatureSpec = TINY_SPEC, cfg: FMConfig = SMALL_FM, L: int = 5,
            seed: int = 0) -> FoundationModel:
    torch.manual_seed(seed)
    return FoundationModel(cfg, spec, num_users=7, num_items=11, tasks=TASKS, history_len=L)


def make_vm(use_pair: bool, use_agg: bool, spec: FeatureSpec = TINY_SPEC) -> VerticalModel:
    torch.manual_seed(0)
    cfg = VMConfig(emb_dim=4, hidden=(8,), slot_hidden=4, use_pair=use_pair, use_agg=use_agg)
    return VerticalModel(cfg, spec, num_users=7, num_items=11, slot_dim=4).eval()


def _shared_requests(spec: FeatureSpec, B: int, n_req: int, seed: int = 0):
    """A batch of B candidates whose request side comes from n_req distinct requests.

    Returns (batch, req_batch, req_index): ``batch`` holds the request side copied per row,
    ``req_batch`` the n_req unique request rows.
    """
    req = make_batch(spec, B=n_req, seed=seed, pad_rows=(1,))
    cand = make_batch(spec, B=B, seed=seed + 1)
    req_index = torch.arange(B) % n_req
    req_index[: B // 2] = 0  # rows 0..B/2-1 all share request 0
    req_batch = {k: req[k] for k in REQUEST_KEYS}
    batch = {k: req[k][req_index] for k in REQUEST_KEYS}
    batch.update({k: cand[k] for k in CANDIDATE_KEYS})
    return batch, req_batch, req_index


# ---- foundation model ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", [TINY_SPEC, EMPTY_SPEC], ids=["tiny", "no-side-features"])
def test_fm_shapes(spec):
    fm = make_fm(spec).eval()
    batch = make_batch(spec, B=6)
    assert fm.version == "fm-test"
    assert fm(batch).shape == (6, len(TASKS))
    shared = fm.shared_layer(batch)
    assert shared.shape == (6, SMALL_FM.shared_dim)
    assert fm.heads(shared).shape == (6, len(TASKS))
    state = fm.request_part({k: batch[k] for k in REQUEST_KEYS})
    assert all(v.shape[0] == 6 for v in state.values())


@pytest.mark.parametrize("permute", [False, True])
def test_fm_split_matches_forward(permute):
    fm = make_fm().eval()
    batch, req_batch, req_index = _shared_requests(TINY_SPEC, B=10, n_req=3)
    if permute:
        perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
        batch = {k: v[perm] for k, v in batch.items()}
        req_index = req_index[perm]
    cand_batch = {k: batch[k] for k in CANDIDATE_KEYS}
    with torch.no_grad():
        want = fm(batch)
        state = fm.request_part(req_batch)  # 3 requests, not 10
        got = fm.heads(fm.candidate_part(state, cand_batch, req_index))
    assert state["user_vec"].shape[0] == 3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_fm_rows_are_independent():
    # forward runs through the split, so also check it against one row at a time
    fm = make_fm().eval()
    batch = make_batch(TINY_SPEC, B=5, seed=6)
    with torch.no_grad():
        whole = fm(batch)
        rows = torch.cat([fm({k: v[i:i + 1] for k, v in batch.items()}) for i in range(5)])
    torch.testing.assert_close(rows, whole, atol=1e-5, rtol=0)


def test_fm_all_pad_history_is_finite_with_finite_grads():
    fm = make_fm().train()
    batch = make_batch(TINY_SPEC, B=4, pad_rows=(0, 1, 2, 3))
    assert int(batch["hist_item"].count_nonzero()) == 0
    logits = fm(batch)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    for name, p in fm.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_fm_history_changes_output():
    fm = make_fm().eval()
    batch = make_batch(TINY_SPEC, B=4, pad_rows=())
    other = dict(batch, hist_item=(batch["hist_item"] % 11) + (batch["hist_item"] > 0))
    with torch.no_grad():
        assert not torch.allclose(fm(batch), fm(other))


def test_fm_ignores_padded_history_slots():
    fm = make_fm().eval()
    batch = make_batch(TINY_SPEC, B=6, seed=2)
    pad = batch["hist_item"] == 0
    assert pad.any()
    junk = dict(batch, hist_age=torch.where(pad, 99.0, batch["hist_age"]))
    with torch.no_grad():
        torch.testing.assert_close(fm(batch), fm(junk), atol=1e-6, rtol=0)


def test_encoder_loss_through_fm_heads():
    fm = make_fm().eval()
    enc = PairEncoder(SMALL_FM.shared_dim, EncoderConfig(width=4, hidden=8))
    with torch.no_grad():
        shared = fm.shared_layer(make_batch(TINY_SPEC, B=6))
    _, x_hat = enc(shared)
    loss = encoder_loss(shared, x_hat, fm.heads(shared), fm.heads(x_hat), 1.0)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in enc.parameters())


def test_fm_gradient_reaches_every_parameter():
    fm = make_fm().train()
    batch = make_batch(TINY_SPEC, B=16, seed=4)
    fm(batch).sum().backward()
    for name, p in fm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_fm_rejects_longer_history():
    fm = make_fm(L=5)
    with pytest.raises(ValueError, match="hist_item"):
        fm(make_batch(TINY_SPEC, L=6))


# ---- encoder -------------------------------------------------------------------------------


def test_encoder_shapes_and_loss():
    enc = PairEncoder(16, EncoderConfig(width=4, hidden=8))
    x = torch.randn(5, 16)
    z, x_hat = enc(x)
    assert z.shape == (5, 4) and x_hat.shape == (5, 16)
    torch.testing.assert_close(enc.encode(x), z)
    torch.testing.assert_close(enc.decode(z), x_hat)
    logits = torch.randn(5, 2)
    assert encoder_loss(x, x, logits, logits, 1.0).item() == pytest.approx(0.0)
    loss = encoder_loss(x, x_hat, logits, logits + 1.0, 0.5)
    rec = ((x_hat - x) ** 2).mean() / x.var(unbiased=False)
    assert loss.item() == pytest.approx(rec.item() + 0.5, rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in enc.parameters())


def test_encoder_width_zero_is_identity():
    enc = PairEncoder(16, EncoderConfig(width=0))
    x = torch.randn(5, 16)
    z, x_hat = enc(x)
    assert z is x and x_hat is x
    assert enc.width == 16 and not list(enc.parameters())
    enc.version = "fm-v1+enc0"
    assert enc.version == "fm-v1+enc0"


# ---- vertical model ------------------------------------------------------------------------


def test_vm_shapes_and_no_history():
    for use_pair in (False, True):
        for use_agg in (False, True):
            vm = make_vm(use_pair, use_agg)
            batch = make_batch(TINY_SPEC, B=6)
            for k in [k for k in batch if k.startswith("hist_")]:
                del batch[k]
            assert vm(batch).shape == (6,)


def test_vm_without_slots_ignores_them():
    vm = make_vm(use_pair=False, use_agg=False)
    batch = make_batch(TINY_SPEC, B=6)
    changed = dict(batch, pair_emb=batch["pair_emb"] + 5, agg_emb=batch["agg_emb"] - 3)
    with torch.no_grad():
        torch.testing.assert_close(vm(batch), vm(changed), atol=0, rtol=0)


@pytest.mark.parametrize("slot", ["pair", "agg"])
def test_vm_slot_read_only_when_present(slot):
    vm = make_vm(use_pair=slot == "pair", use_agg=slot == "agg")
    batch = make_batch(TINY_SPEC, B=8)
    present = batch[f"{slot}_present"] > 0
    assert present.any() and (~present).any()
    changed = dict(batch)
    changed[f"{slot}_emb"] = batch[f"{slot}_emb"] + 2.0
    changed[f"{slot}_emb"][~present] = float("nan")  # absent values must not matter at all
    with torch.no_grad():
        a, b = vm(batch), vm(changed)
    torch.testing.assert_close(a[~present], b[~present], atol=0, rtol=0)
    assert (a[present] - b[present]).abs().min() > 0


def test_vm_without_side_features():
    vm = make_vm(use_pair=True, use_agg=True, spec=EMPTY_SPEC)
    assert vm(make_batch(EMPTY_SPEC, B=3)).shape == (3,)


# ---- checkpoints ---------------------------------------------------------------------------


def _roundtrip(model: torch.nn.Module, fresh: torch.nn.Module) -> torch.nn.Module:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    return fresh.eval()


def test_state_dict_roundtrip():
    batch = make_batch(TINY_SPEC, B=6)
    fm = make_fm(seed=0).eval()
    fm2 = _roundtrip(fm, make_fm(seed=1))
    vm = make_vm(True, True)
    torch.manual_seed(5)
    vm2 = _roundtrip(vm, VerticalModel(vm.cfg, TINY_SPEC, 7, 11, slot_dim=4))
    enc = PairEncoder(16, EncoderConfig(width=4, hidden=8)).eval()
    enc2 = _roundtrip(enc, PairEncoder(16, EncoderConfig(width=4, hidden=8)))
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(fm(batch), fm2(batch), atol=0, rtol=0)
        torch.testing.assert_close(vm(batch), vm2(batch), atol=0, rtol=0)
        torch.testing.assert_close(enc(x), enc2(x), atol=0, rtol=0)


# ---- compute ---------------------------------------------------------------------------------


def test_default_fm_is_much_bigger_than_vm_per_pair():
    L, n_users, n_items, slot_dim = 50, 943, 1682, 32
    batch = make_batch(MOVIELENS_SPEC, B=8, L=L, num_users=n_users, num_items=n_items, M=6,
                       slot_dim=slot_dim, pad_rows=())
    fm = FoundationModel(FMConfig(), MOVIELENS_SPEC, n_users, n_items, TASKS, history_len=L).eval()
    fm_flops = flops_per_pair(fm, batch)
    for use_pair, use_agg in [(False, False), (True, True)]:
        vm = VerticalModel(VMConfig(use_pair=use_pair, use_agg=use_agg), MOVIELENS_SPEC, n_users,
                           n_items, slot_dim).eval()
        assert fm_flops >= 20 * flops_per_pair(vm, batch)
    # the split: request + candidate work adds up to the whole forward
    req, cand = fm_request_flops(fm, batch), fm_candidate_flops(fm, batch)
    assert req + cand == pytest.approx(fm_flops)
    assert fm_amortised_flops(fm, batch, 200) < fm_flops
