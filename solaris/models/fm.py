"""The foundation model (FM): sparse, dense and sequence arches, a DCNv2 interaction stack, task heads.

The FM is split at the request/candidate boundary so precompute can share request work:
``request_part`` runs once per request (user features and the self-attended behaviour
history), ``candidate_part`` once per (request, candidate) pair (target attention with the
candidate as query, the interaction stack). ``forward`` runs through that split, so the
precompute path and training compute exactly the same function.

Batch keys are ``REQUEST_KEYS`` / ``CANDIDATE_KEYS`` (``solaris.models.api``). Codes marked "+1"
reserve 0 for padding; candidate-side categorical codes are raw (0..card-1) and shifted here so
the candidate and its history share one table per feature.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris.config import FMConfig
from solaris.data.schema import FeatureSpec
from solaris.models import api

Tensor = torch.Tensor


def attend(q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> Tensor:
    """Multi-head attention of q over the keys marked valid; every row needs >= 1 valid key.

    (A row with no valid key would softmax over nothing and return NaN.)
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])  # (B, H, Lq, hd)


class SelfAttentionBlock(nn.Module):
    """Pre-LN transformer block over the history, pad keys masked."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        B, L, D = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # 3 x (B, L, D)
        q = q.view(B, L, H, D // H).transpose(1, 2)  # (B, H, L, hd)
        k = k.view(B, L, H, D // H).transpose(1, 2)  # (B, H, L, hd)
        v = v.view(B, L, H, D // H).transpose(1, 2)  # (B, H, L, hd)
        y = attend(q, k, v, valid).transpose(1, 2).reshape(B, L, D)  # (B, L, D)
        x = x + self.proj(y)  # (B, L, D)
        x = x + self.mlp(self.ln2(x))  # (B, L, D)
        return x


class CrossLayer(nn.Module):
    """DCNv2 cross layer: x_{l+1} = x0 * (W x_l + b) + x_l."""

    def __init__(self, dim: int):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x0: Tensor, x: Tensor) -> Tensor:
        return x0 * self.lin(x) + x  # (B, dim)


class FoundationModel(nn.Module):
    """Multi-task ranking FM whose last shared layer is what SOLARIS caches (compressed);
    the built-in implementation of ``solaris.models.api.FMModel``."""

    # ``ReadsUnseenUsers``: no. ``request_part`` reads the user id through ``user_emb``, a
    # table of ``num_users`` rows, so a user it never saw has no row (its user vectors do
    # not read the id: the user-KNN cold start still serves such a user)
    reads_unseen_users = False

    @classmethod
    def from_config(cls, cfg: FMConfig, spec: FeatureSpec, num_users: int, num_items: int,
                    tasks: tuple[str, ...], history_len: int) -> "FoundationModel":
        """The FM ``cfg``'s own fields describe (``fm.kwargs`` is for other classes)."""
        if cfg.kwargs:
            raise ValueError(f"fm.kwargs={dict(cfg.kwargs)!r}: the built-in FM reads the fm.* "
                             "fields, not kwargs")
        return cls(cfg, spec, num_users, num_items, tasks, history_len)

    def __init__(self, cfg: FMConfig, spec: FeatureSpec, num_users: int, num_items: int,
                 tasks: tuple[str, ...], history_len: int):
        super().__init__()
        if num_users < 1 or num_items < 1:
            raise ValueError(f"num_users={num_users!r}, num_items={num_items!r}: must be >= 1")
        if len(tasks) < 1:
            raise ValueError(f"tasks={tasks!r}: need at least one task")
        if history_len < 1:
            raise ValueError(f"history_len={history_len!r}: must be >= 1")
        self.cfg = cfg
        self.spec = spec
        self.tasks = tuple(tasks)
        self.history_len = history_len
        self.version = cfg.version
        self.shared_dim = cfg.shared_dim
        D = cfg.emb_dim
        n_uc, n_ud = len(spec.user_categorical), len(spec.user_continuous)
        n_ic, n_mh, n_id = len(spec.item_categorical), len(spec.item_multihot), len(spec.item_continuous)

        # sparse arch; item-side tables reserve row 0 for padding (history codes are +1)
        self.user_emb = nn.Embedding(num_users, D)
        self.item_emb = nn.Embedding(num_items + 1, D, padding_idx=0)
        self.surface_emb = nn.Embedding(spec.num_surfaces + 1, D, padding_idx=0)
        self.user_cat_emb = nn.ModuleList(nn.Embedding(c, D) for c in spec.user_categorical.values())
        self.item_cat_emb = nn.ModuleList(nn.Embedding(c + 1, D, padding_idx=0)
                                          for c in spec.item_categorical.values())
        self.item_mh_emb = nn.ModuleList(nn.EmbeddingBag(v + 1, D, mode="mean", padding_idx=0)
                                         for v in spec.item_multihot.values())

        # dense arch over [user_cont, item_cont]; absent when there is no continuous feature
        n_dense = n_ud + n_id
        self.dense = (nn.Sequential(nn.Linear(n_dense, cfg.dense_hidden), nn.ReLU(),
                                    nn.Linear(cfg.dense_hidden, cfg.dense_hidden), nn.ReLU())
                      if n_dense > 0 else None)

        # sequence arch: history tokens, self-attention (request side), target attention
        self.action_emb = nn.Embedding(1 + 2 ** len(self.tasks), D, padding_idx=0)
        self.age_proj = nn.Linear(1, D)
        self.pos_emb = nn.Parameter(torch.randn(history_len, D) * 0.02)
        self.seq_blocks = nn.ModuleList(SelfAttentionBlock(D, cfg.seq_heads)
                                        for _ in range(cfg.seq_layers))
        self.seq_ln = nn.LayerNorm(D)
        self.tgt_q = nn.Linear(D, D)
        self.tgt_kv = nn.Linear(D, 2 * D)
        self.tgt_proj = nn.Linear(D, D)

        # shared interaction stack: projection, then DCNv2 cross and a deep MLP in parallel
        n_user_parts = 2 + n_uc + 1  # user id, surface, user cats, pooled history
        n_item_parts = 1 + n_ic + n_mh + 1  # item id, item cats, multi-hots, target attention
        n_dense_out = cfg.dense_hidden if self.dense is not None else 0
        in_dim = D * (n_user_parts + n_item_parts) + n_dense_out
        S = cfg.shared_dim
        self.inter_proj = nn.Sequential(nn.Linear(in_dim, S), nn.LayerNorm(S))
        self.cross = nn.ModuleList(CrossLayer(S) for _ in range(cfg.cross_layers))
        self.deep = nn.Sequential(nn.Linear(S, S), nn.ReLU(), nn.Dropout(cfg.dropout),
                                  nn.Linear(S, S), nn.ReLU())
        self.fuse = nn.Linear(2 * S, S)
        self.drop = nn.Dropout(cfg.dropout)

        # multi-task heads over the last shared layer
        self.task_heads = nn.ModuleList(
            nn.Sequential(nn.Linear(S, cfg.head_hidden), nn.ReLU(), nn.Linear(cfg.head_hidden, 1))
            for _ in self.tasks)

    # ---- request side -------------------------------------------------------------------

    def request_part(self, req: dict[str, Tensor]) -> dict[str, Tensor]:
        """User state for R requests, computed once per request and shared by its candidates."""
        D, H = self.cfg.emb_dim, self.cfg.seq_heads
        hist_item = req["hist_item"]  # (R, L)
        R, L = hist_item.shape
        if L > self.history_len:
            raise ValueError(f"hist_item has length {L}; this FM reads at most {self.history_len}")
        valid = hist_item > 0  # (R, L)
        has_hist = valid.any(dim=1)  # (R,)

        tok = (self.item_emb(hist_item)  # (R, L, D)
               + self.action_emb(req["hist_action"])  # (R, L, D)
               + self.surface_emb(req["hist_surface"])  # (R, L, D)
               + self.age_proj(req["hist_age"].unsqueeze(-1))  # (R, L, D)
               + self.pos_emb[:L])  # (R, L, D)
        hist_cat = req["hist_item_cat"]  # (R, L, n_ic)
        for j, emb in enumerate(self.item_cat_emb):
            tok = tok + emb(hist_cat[:, :, j])  # (R, L, D)

        # a row with no history attends to its first (pad) slot so softmax stays finite; its
        # outputs are zeroed below and never reach the candidate part
        attn_valid = valid.clone()  # (R, L)
        attn_valid[:, 0] |= ~has_hist
        x = tok
        for block in self.seq_blocks:
            x = block(x, attn_valid)  # (R, L, D)
        x = self.seq_ln(x)  # (R, L, D)

        w = valid.unsqueeze(-1).to(x.dtype)  # (R, L, 1)
        pooled = (x * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)  # (R, D)
        k, v = self.tgt_kv(x).split(D, dim=-1)  # 2 x (R, L, D)
        k = k.view(R, L, H, D // H).transpose(1, 2)  # (R, H, L, hd)
        v = v.view(R, L, H, D // H).transpose(1, 2)  # (R, H, L, hd)

        parts = [self.user_emb(req["user"]), self.surface_emb(req["surface"] + 1)]  # 2 x (R, D)
        user_cat = req["user_cat"]  # (R, n_uc)
        parts += [emb(user_cat[:, j]) for j, emb in enumerate(self.user_cat_emb)]  # n_uc x (R, D)
        parts.append(pooled)
        return {
            "user_vec": torch.cat(parts, dim=-1),  # (R, D * (3 + n_uc))
            "user_cont": req["user_cont"],  # (R, n_ud)
            "hist_k": k,  # (R, H, L, hd)
            "hist_v": v,  # (R, H, L, hd)
            "hist_valid": attn_valid,  # (R, L)
            "has_hist": has_hist,  # (R,)
        }

    # ---- candidate side -----------------------------------------------------------------

    def candidate_part(self, state: dict[str, Tensor], cand: dict[str, Tensor],
                       req_index: Tensor) -> Tensor:
        """Last shared layer for B candidates; ``req_index`` (B,) maps each to its request row."""
        D, H = self.cfg.emb_dim, self.cfg.seq_heads
        item = cand["item"]  # (B,)
        B = item.shape[0]
        item_cat = cand["item_cat"]  # (B, n_ic)
        item_mh = cand["item_mh"]  # (B, n_mh, M)

        id_vec = self.item_emb(item + 1)  # (B, D)
        cat_vecs = [emb(item_cat[:, j] + 1) for j, emb in enumerate(self.item_cat_emb)]  # n_ic x (B, D)
        mh_vecs = [emb(item_mh[:, j]) for j, emb in enumerate(self.item_mh_emb)]  # n_mh x (B, D)

        # target attention: the candidate (in the history tokens' item space) queries the history
        query = id_vec + sum(cat_vecs, torch.zeros_like(id_vec))  # (B, D)
        q = self.tgt_q(query).view(B, H, 1, D // H)  # (B, H, 1, hd)
        k = state["hist_k"].index_select(0, req_index)  # (B, H, L, hd)
        v = state["hist_v"].index_select(0, req_index)  # (B, H, L, hd)
        valid = state["hist_valid"].index_select(0, req_index)  # (B, L)
        has_hist = state["has_hist"].index_select(0, req_index)  # (B,)
        tgt = attend(q, k, v, valid).reshape(B, D)  # (B, D)
        tgt = self.tgt_proj(tgt) * has_hist.unsqueeze(-1).to(tgt.dtype)  # (B, D)

        parts = [state["user_vec"].index_select(0, req_index), id_vec, *cat_vecs, *mh_vecs, tgt]
        if self.dense is not None:
            cont = torch.cat([state["user_cont"].index_select(0, req_index), cand["item_cont"]],
                             dim=-1)  # (B, n_ud + n_id)
            parts.append(self.dense(cont))  # (B, dense_hidden)
        x0 = self.drop(self.inter_proj(torch.cat(parts, dim=-1)))  # (B, S)
        xc = x0
        for layer in self.cross:
            xc = layer(x0, xc)  # (B, S)
        xd = self.deep(x0)  # (B, S)
        return F.relu(self.fuse(torch.cat([xc, xd], dim=-1)))  # (B, S)

    # ---- whole model --------------------------------------------------------------------

    def heads(self, shared: Tensor) -> Tensor:
        """Per-task logits from the last shared layer."""
        return torch.cat([head(shared) for head in self.task_heads], dim=-1)  # (B, T)

    def shared_layer(self, batch: dict[str, Tensor]) -> Tensor:
        """Last shared layer for a batch whose rows each carry their own request side."""
        return api.shared_layer(self, batch)  # (B, S)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.heads(self.shared_layer(batch))  # (B, T)

    # ---- user and item vectors (the KNN tables) ----------------------------------------

    def user_vectors(self, req: dict[str, Tensor]) -> Tensor:
        """(R, shared_dim): what the user's side contributes to the first shared layer.

        ``request_part``'s user vector is [user id, surface, user cats..., pooled history]
        (``emb_dim`` each) and opens ``inter_proj``'s input; the user-cats and
        pooled-history columns of its weight applied to those parts is a vector in the
        space where the FM mixes user and item, so two users close in it get close pair
        embeddings for the same item (what user-neighbour imputation assumes). The id
        embedding and the surface are not read: a user the FM never saw gets a vector from
        the same function as everyone.
        """
        D = self.cfg.emb_dim
        part = slice(2 * D, (3 + len(self.spec.user_categorical)) * D)
        proj = self.inter_proj[0].weight[:, part].detach().T.contiguous()  # ((1 + n_uc) D, S)
        user_vec = self.request_part(req)["user_vec"]  # (R, D * (3 + n_uc))
        return user_vec[:, part] @ proj  # (R, S)

    def item_vectors(self) -> Tensor:
        """(num_items, emb_dim): the item-id embedding of every item (pad row 0 left out)."""
        return self.item_emb.weight[1:]
