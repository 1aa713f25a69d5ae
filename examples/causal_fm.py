"""A second foundation model: a causal transformer over the behaviour sequence (SASRec / HSTU
style), plugged in by import path.

Select it with ``fm.cls: examples.causal_fm:CausalTransformerFM`` and its own keyword
arguments in ``fm.kwargs`` (``configs/example-causal-fm.yaml``); SOLARIS builds it with
``solaris.models.api.build_fm`` and reads it through ``solaris.models.api.FMModel`` only.

How it differs from the built-in FM (DCNv2 interaction stack + target attention):

- **request side**: the history (most recent first in the inputs) is turned into tokens --
  item id + item categories + action + surface + age + recency position -- laid out oldest
  first, followed by one *state token* built from the user's features (categorical
  embeddings, projected continuous features; not the user id, not the request's surface).
  Pre-LN causal self-attention blocks run over that sequence with pad keys masked; the state
  token's output is the user state. Every token may attend to itself, so a row with no
  history (or a pad token) never softmaxes over nothing: no NaN.
- **candidate side**: the user state of the pair's request, the request's surface embedding,
  the candidate's item vector (id embedding shared with the history tokens + category,
  multi-hot and continuous features) and the elementwise product state * item go through an
  MLP to ``shared_dim``. Nothing mixes rows.

The user id is read nowhere in this model (it has no user table): ``user_vectors`` is the
user state, so a user the FM never saw gets a vector from the same function as everyone.

Codes follow the request / candidate contract: history codes and multi-hot codes are +1 with
0 for padding; the candidate's item id and categorical codes and the request's surface are
raw and shifted here so the candidate shares one table per feature with its history.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris.data.schema import FeatureSpec
from solaris.models.api import shared_layer

Tensor = torch.Tensor

__all__ = ["CausalTransformerFM"]


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be an int >= {low}")


class CausalBlock(nn.Module):
    """Pre-LN transformer block; ``allowed`` (R, N, N) says which keys each query may read."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        R, N, D = x.shape
        qkv = self.to_qkv(self.attn_norm(x))  # (R, N, 3D)
        qkv = qkv.view(R, N, 3, self.heads, D // self.heads)  # (R, N, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (R, H, N, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])  # (R, H, N, hd)
        x = x + self.drop(self.attn_out(y.transpose(1, 2).reshape(R, N, D)))  # (R, N, D)
        return x + self.drop(self.ffn(self.ffn_norm(x)))  # (R, N, D)


def causal_mask(valid: Tensor) -> Tensor:
    """(R, N, N) bool: query i reads key j iff j <= i and key j is valid, and always itself.

    ``valid`` (R, N) marks real tokens. The diagonal keeps every softmax over >= 1 key (pads
    and rows with no history stay finite); a real token never reads a pad.
    """
    N = valid.shape[1]
    ar = torch.arange(N, device=valid.device)
    causal = ar[None, :] <= ar[:, None]  # (N, N)
    eye = ar[None, :] == ar[:, None]  # (N, N)
    return (causal[None] & valid[:, None, :]) | eye[None]  # (R, N, N)


class CausalTransformerFM(nn.Module):
    """Multi-task FM: causal transformer user state x candidate item, MLP to the shared layer.

    Keyword arguments (``fm.kwargs``): ``dim`` token / embedding width, ``layers`` causal
    blocks, ``heads`` attention heads (must divide ``dim``), ``shared_dim`` width of the last
    shared layer (what SOLARIS compresses and caches), ``dropout`` in the blocks and the MLP.
    """

    # ``solaris.models.api.ReadsUnseenUsers``: the user id is read nowhere, so a user it never
    # saw (an id >= num_users, zero side features) is read like any other: its pairs are
    # precomputed and served from its first requests on
    reads_unseen_users = True

    def __init__(self, spec: FeatureSpec, num_users: int, num_items: int,
                 tasks: tuple[str, ...], history_len: int, version: str, dim: int = 32,
                 layers: int = 2, heads: int = 2, shared_dim: int = 128, dropout: float = 0.1):
        super().__init__()
        self._check_args(spec, num_users, num_items, tasks, history_len, version, dim, layers,
                         heads, shared_dim, dropout)
        self.spec = spec
        self.num_users = num_users  # kept for reference: the model has no user-id table
        self.num_items = num_items
        self.tasks = tuple(tasks)
        self.history_len = history_len
        self.version = version
        self.dim = dim
        self.shared_dim = shared_dim
        self._build_tables(spec, num_items, dim, history_len)
        self.blocks = nn.ModuleList(CausalBlock(dim, heads, dropout) for _ in range(layers))
        self.out_ln = nn.LayerNorm(dim)
        S = shared_dim
        self.mlp = nn.Sequential(nn.Linear(4 * dim, S), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(S, S), nn.GELU())
        self.task_heads = nn.ModuleList(
            nn.Sequential(nn.Linear(S, dim), nn.ReLU(), nn.Linear(dim, 1)) for _ in self.tasks)

    @staticmethod
    def _check_args(spec: FeatureSpec, num_users: int, num_items: int, tasks: tuple[str, ...],
                    history_len: int, version: str, dim: int, layers: int, heads: int,
                    shared_dim: int, dropout: float) -> None:
        """ValueError naming the first bad argument."""
        if not isinstance(spec, FeatureSpec):
            raise ValueError(f"spec={spec!r}: expected a FeatureSpec")
        for name, value in (("num_users", num_users), ("num_items", num_items),
                            ("history_len", history_len), ("dim", dim), ("layers", layers),
                            ("heads", heads), ("shared_dim", shared_dim)):
            _check_int(name, value, 1)
        if dim % heads != 0:
            raise ValueError(f"dim={dim!r}: must be divisible by heads={heads!r}")
        if not tasks or not all(isinstance(t, str) and t for t in tasks):
            raise ValueError(f"tasks={tasks!r}: need at least one non-empty task name")
        if not isinstance(version, str) or not version:
            raise ValueError(f"version={version!r}: must be a non-empty string")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r}: must be a number in [0, 1)")

    def _build_tables(self, spec: FeatureSpec, num_items: int, D: int, history_len: int) -> None:
        """Embedding tables; item-side and history tables reserve row 0 for padding."""
        self.item_emb = nn.Embedding(num_items + 1, D, padding_idx=0)
        self.item_cat_emb = nn.ModuleList(nn.Embedding(c + 1, D, padding_idx=0)
                                          for c in spec.item_categorical.values())
        self.item_mh_emb = nn.ModuleList(nn.EmbeddingBag(v + 1, D, mode="mean", padding_idx=0)
                                         for v in spec.item_multihot.values())
        n_id = len(spec.item_continuous)
        self.item_cont_proj = nn.Linear(n_id, D) if n_id > 0 else None
        self.surface_emb = nn.Embedding(spec.num_surfaces + 1, D, padding_idx=0)
        self.action_emb = nn.Embedding(1 + 2 ** len(self.tasks), D, padding_idx=0)
        self.age_proj = nn.Linear(1, D)
        self.pos_emb = nn.Parameter(torch.randn(history_len, D) * 0.02)  # by recency
        # the state token: user features only
        self.user_cat_emb = nn.ModuleList(nn.Embedding(c, D)
                                          for c in spec.user_categorical.values())
        n_ud = len(spec.user_continuous)
        self.user_cont_proj = nn.Linear(n_ud, D) if n_ud > 0 else None
        self.state_bias = nn.Parameter(torch.randn(D) * 0.02)

    # ---- request side -------------------------------------------------------------------

    def _history_tokens(self, req: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """History tokens (R, L, D) and their validity (R, L), oldest first, pads first."""
        hist_item = req["hist_item"]  # (R, L), most recent first, pads at the end
        L = hist_item.shape[1]
        if L > self.history_len:
            raise ValueError(f"hist_item has length {L}; this FM reads at most "
                             f"{self.history_len}")
        hist_cat = req["hist_item_cat"]  # (R, L, n_ic)
        cats = [emb(hist_cat[:, :, j]) for j, emb in enumerate(self.item_cat_emb)]  # (R, L, D) each
        tok = sum(cats, self.item_emb(hist_item))  # (R, L, D)
        tok = tok + self.action_emb(req["hist_action"])  # (R, L, D)
        tok = tok + self.surface_emb(req["hist_surface"])  # (R, L, D)
        tok = tok + self.age_proj(req["hist_age"][..., None])  # (R, L, D)
        tok = tok + self.pos_emb[:L]  # (R, L, D), position 0 = the most recent event
        # reversed: oldest first, so the newest event sits next to the state token
        return tok.flip(1), (hist_item > 0).flip(1)  # (R, L, D), (R, L)

    def _state_token(self, req: dict[str, Tensor]) -> Tensor:
        """(R, D): the user's features (no id, no surface)."""
        user_cat = req["user_cat"]  # (R, n_uc)
        x = self.state_bias.expand(user_cat.shape[0], -1)  # (R, D)
        for j, emb in enumerate(self.user_cat_emb):
            x = x + emb(user_cat[:, j])  # (R, D)
        if self.user_cont_proj is not None:
            x = x + self.user_cont_proj(req["user_cont"])  # (R, D)
        return x

    def _user_state(self, req: dict[str, Tensor]) -> Tensor:
        """(R, D): the state token's output after the causal blocks (``req["user"]`` unread)."""
        tok, valid = self._history_tokens(req)  # (R, L, D), (R, L)
        state = self._state_token(req)  # (R, D)
        x = torch.cat([tok, state[:, None]], dim=1)  # (R, L + 1, D)
        valid = torch.cat([valid, valid.new_ones(valid.shape[0], 1)], dim=1)  # (R, L + 1)
        allowed = causal_mask(valid)  # (R, L + 1, L + 1)
        for block in self.blocks:
            x = block(x, allowed)  # (R, L + 1, D)
        return self.out_ln(x[:, -1])  # (R, D)

    def request_part(self, req: dict[str, Tensor]) -> dict[str, Tensor]:
        """Per-request state, R rows first: the user state and the request's surface."""
        return {
            "state": self._user_state(req),  # (R, D)
            "surface": self.surface_emb(req["surface"] + 1),  # (R, D)
        }

    # ---- candidate side -----------------------------------------------------------------

    def _item_vector(self, cand: dict[str, Tensor]) -> Tensor:
        """(B, D): the candidate's id embedding plus its side features."""
        x = self.item_emb(cand["item"] + 1)  # (B, D)
        item_cat = cand["item_cat"]  # (B, n_ic)
        for j, emb in enumerate(self.item_cat_emb):
            x = x + emb(item_cat[:, j] + 1)  # (B, D)
        item_mh = cand["item_mh"]  # (B, n_mh, M)
        for j, emb in enumerate(self.item_mh_emb):
            x = x + emb(item_mh[:, j])  # (B, D)
        if self.item_cont_proj is not None:
            x = x + self.item_cont_proj(cand["item_cont"])  # (B, D)
        return x

    def candidate_part(self, state: dict[str, Tensor], cand: dict[str, Tensor],
                       req_index: Tensor) -> Tensor:
        """Last shared layer (B, shared_dim); ``req_index`` (B,) maps pairs to state rows."""
        user = state["state"].index_select(0, req_index)  # (B, D)
        surface = state["surface"].index_select(0, req_index)  # (B, D)
        item = self._item_vector(cand)  # (B, D)
        x = torch.cat([user, surface, item, user * item], dim=-1)  # (B, 4D)
        return self.mlp(x)  # (B, S)

    # ---- whole model --------------------------------------------------------------------

    def heads(self, shared: Tensor) -> Tensor:
        """Per-task logits from the last shared layer."""
        return torch.cat([head(shared) for head in self.task_heads], dim=-1)  # (B, T)

    def shared_layer(self, batch: dict[str, Tensor]) -> Tensor:
        """Last shared layer for a batch whose rows each carry their own request side."""
        return shared_layer(self, batch)  # (B, S)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Per-task logits (B, T) of rows that each carry their own request side (training)."""
        return self.heads(self.shared_layer(batch))  # (B, T)

    # ---- vectors for the KNN tiers ------------------------------------------------------

    def user_vectors(self, req: dict[str, Tensor]) -> Tensor:
        """(R, dim) user states; the user id is not read, so any id (or a zeroed one) works."""
        return self._user_state(req)  # (R, D)

    def item_vectors(self) -> Tensor:
        """(num_items, dim) item-id embeddings of items 0..num_items-1 (pad row 0 left out),
        detached: they feed the item-neighbour tier, not training."""
        return self.item_emb.weight[1:].detach()  # (num_items, D)

    def flops_per_pair(self) -> float | None:
        """None: ``solaris.models.flops`` counts the request and candidate parts itself."""
        return None
