"""The example plug-in FM (examples/causal_fm.py), built by import path through the FM interface."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from solaris.config import FMConfig, load_config
from solaris.data.schema import FeatureSpec
from solaris.errors import ConfigError
from solaris.models.api import CANDIDATE_KEYS, REQUEST_KEYS, FMModel, build_fm, shared_layer
from tests.unit.test_models import EMPTY_SPEC, TINY_SPEC

ROOT = Path(__file__).resolve().parents[2]
CLS = "examples.causal_fm:CausalTransformerFM"
TASKS = ("click", "like")
NUM_USERS, NUM_ITEMS, HIST = 7, 11, 5
SMALL = {"dim": 8, "layers": 2, "heads": 2, "shared_dim": 16, "dropout": 0.1}
SPEC = TINY_SPEC  # the built-in FM's tests' spec: every feature group present


def make_fm(spec: FeatureSpec = SPEC, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    cfg = FMConfig(cls=CLS, kwargs={**SMALL, **kwargs}, version="causal-v1")
    return build_fm(cfg, spec, NUM_USERS, NUM_ITEMS, TASKS, HIST).eval()


def make_batch(spec: FeatureSpec = SPEC, B: int = 6, L: int = HIST, M: int = 3,
               empty_rows: tuple[int, ...] = (1,), seed: int = 0) -> dict[str, torch.Tensor]:
    """B random rows in the request / candidate contract; ``empty_rows`` have no history."""
    g = torch.Generator().manual_seed(seed)

    def ints(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=g)

    uc, ic, mh = (list(d.values()) for d in (spec.user_categorical, spec.item_categorical,
                                             spec.item_multihot))
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    lengths[list(empty_rows)] = 0
    valid = torch.arange(L)[None, :] < lengths[:, None]  # (B, L) most recent first, pads last
    vl = valid.long()

    def stack(codes: list[torch.Tensor], *empty: int) -> torch.Tensor:
        return torch.stack(codes, dim=-1) if codes else torch.zeros(*empty, 0, dtype=torch.long)

    item_mh = stack([ints(v + 1, B, M) for v in mh], B, M).transpose(1, 2)  # (B, n_mh, M)
    return {
        "user": ints(NUM_USERS, B),
        "surface": ints(spec.num_surfaces, B),
        "user_cat": stack([ints(c, B) for c in uc], B),
        "user_cont": torch.randn(B, len(spec.user_continuous), generator=g),
        "hist_item": (ints(NUM_ITEMS, B, L) + 1) * vl,
        "hist_action": (ints(2 ** len(TASKS), B, L) + 1) * vl,
        "hist_surface": (ints(spec.num_surfaces, B, L) + 1) * vl,
        "hist_age": torch.log1p(torch.rand(B, L, generator=g) * 100) * valid,
        "hist_item_cat": stack([ints(c, B, L) + 1 for c in ic], B, L) * vl.unsqueeze(-1),
        "item": ints(NUM_ITEMS, B),
        "item_cat": stack([ints(c, B) for c in ic], B),
        "item_mh": item_mh.contiguous(),
        "item_cont": torch.randn(B, len(spec.item_continuous), generator=g),
    }


def rows(batch: dict[str, torch.Tensor], idx) -> dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in batch.items()}


@pytest.mark.parametrize("spec", [SPEC, EMPTY_SPEC], ids=["features", "no-features"])
def test_built_by_import_path_with_the_fm_interface(spec):
    fm = make_fm(spec)
    assert isinstance(fm, FMModel)
    assert type(fm).__module__ == "examples.causal_fm"
    assert fm.version == "causal-v1" and fm.tasks == TASKS
    assert fm.history_len == HIST and fm.shared_dim == SMALL["shared_dim"]
    b = make_batch(spec, B=6)
    state = fm.request_part(b)
    assert all(v.shape[0] == 6 for v in state.values())
    shared = fm.candidate_part(state, b, torch.arange(6))
    assert shared.shape == (6, SMALL["shared_dim"])
    assert fm.heads(shared).shape == (6, len(TASKS))
    assert fm.user_vectors(b).shape == (6, SMALL["dim"])
    assert fm.item_vectors().shape == (NUM_ITEMS, SMALL["dim"])
    torch.testing.assert_close(fm(b), fm.heads(shared))


def test_config_file_selects_it():
    cfg = load_config(ROOT / "configs" / "example-causal-fm.yaml").fm
    assert cfg.cls == CLS and cfg.version == "causal-v1"
    fm = build_fm(cfg, SPEC, NUM_USERS, NUM_ITEMS, TASKS, HIST)
    assert fm.shared_dim == cfg.kwargs["shared_dim"]
    assert fm.user_vectors(make_batch()).shape == (6, cfg.kwargs["dim"])


def test_shared_request_part_equals_per_pair():
    """candidate_part on one request part per request == shared_layer on per-pair copies."""
    fm = make_fm()
    n_req, B = 3, 8
    req = make_batch(B=n_req, seed=1)
    cand = make_batch(B=B, seed=2)
    req_index = torch.tensor([0, 0, 0, 0, 1, 2, 1, 2])
    per_pair = {k: req[k][req_index] for k in REQUEST_KEYS}
    per_pair.update({k: cand[k] for k in CANDIDATE_KEYS})
    with torch.no_grad():
        shared = fm.candidate_part(fm.request_part({k: req[k] for k in REQUEST_KEYS}), cand,
                                   req_index)  # (B, S)
        torch.testing.assert_close(shared, shared_layer(fm, per_pair), atol=1e-6, rtol=0)
        torch.testing.assert_close(shared, fm.shared_layer(per_pair), atol=1e-6, rtol=0)


def test_a_row_does_not_depend_on_the_other_rows():
    fm = make_fm()
    b = make_batch(B=6)
    with torch.no_grad():
        together = fm(b)  # (6, T)
        for i in range(6):
            alone = fm(rows(b, [i]))  # (1, T)
            torch.testing.assert_close(alone, together[i:i + 1], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(fm(rows(b, [5, 2, 0])), together[[5, 2, 0]],
                                   atol=1e-6, rtol=1e-5)


def test_history_padding_length_does_not_change_a_row():
    """Extra trailing pads (a shorter history_len's batch vs a longer one) read the same."""
    fm = make_fm()
    b = make_batch(B=4, L=3)
    padded = dict(b)
    for k in ("hist_item", "hist_action", "hist_surface", "hist_age", "hist_item_cat"):
        pad = torch.zeros_like(b[k][:, :2])
        padded[k] = torch.cat([b[k], pad], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(fm(b), fm(padded), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("spec", [SPEC, EMPTY_SPEC], ids=["features", "no-features"])
def test_empty_history_is_finite_in_training_too(spec):
    fm = make_fm(spec).train()
    b = make_batch(spec, B=4, empty_rows=(0, 1, 2, 3))
    out = fm(b)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in fm.parameters() if p.grad is not None)
    with torch.no_grad():
        assert torch.isfinite(fm.eval().user_vectors(b)).all()


def test_history_is_read():
    fm = make_fm()
    b = make_batch(B=4, empty_rows=())
    other = dict(b, hist_item=(b["hist_item"] % NUM_ITEMS + 1) * (b["hist_item"] > 0))
    with torch.no_grad():
        assert not torch.allclose(fm.user_vectors(b), fm.user_vectors(other))


def test_user_vectors_do_not_read_the_user_id():
    fm = make_fm()
    b = make_batch(B=5)
    moved = dict(b, user=(b["user"] + 3) % NUM_USERS)
    unseen = dict(b, user=torch.full_like(b["user"], 10 ** 6))  # no such user anywhere
    with torch.no_grad():
        u = fm.user_vectors(b)
        assert torch.equal(u, fm.user_vectors(moved))
        assert torch.equal(u, fm.user_vectors(unseen))
        assert torch.equal(fm(b), fm(unseen))


def test_item_vectors_are_the_id_embeddings_without_the_pad_row():
    fm = make_fm()
    iv = fm.item_vectors()
    assert not iv.requires_grad
    torch.testing.assert_close(iv, fm.item_emb(torch.arange(NUM_ITEMS) + 1))


def test_unknown_kwarg_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="emb_dim"):
        make_fm(emb_dim=8)


@pytest.mark.parametrize("bad, name", [({"heads": 3}, "dim=8"), ({"layers": 0}, "layers=0"),
                                       ({"dropout": 1.0}, "dropout=1.0"),
                                       ({"shared_dim": "128"}, "shared_dim='128'")])
def test_bad_kwarg_value_is_a_config_error_naming_it(bad, name):
    with pytest.raises(ConfigError, match=name):
        make_fm(**bad)


def test_history_longer_than_history_len_is_refused():
    fm = make_fm()
    with pytest.raises(ValueError, match="hist_item has length 7"):
        fm.request_part(make_batch(L=HIST + 2))


def test_module_imports_nothing_of_the_builtin_fm():
    tree = ast.parse((ROOT / "examples" / "causal_fm.py").read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    solaris = {m for m in modules if m and m.startswith("solaris")}
    assert "solaris.models.fm" not in solaris
    assert solaris <= {"solaris.models.api", "solaris.data.schema"}
