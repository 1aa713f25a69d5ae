"""A shop team's own FM, as a team outside the project writes one: a two-tower model over a
mean-pooled behaviour history. The journey test (``test_journey.py``) copies this file into
its own directory and selects it by import path (``fm.cls: shop_models:TwoTowerFM``), so
it is imported from there by every process, never from the repository.

- **user tower**: the mean of the history's tokens (item id + item categories + action),
  valid events only, beside the user's categorical and continuous features, through an MLP.
  The user id is read nowhere, so ``user_vectors`` serves a user the FM never saw, and the
  class says so (``reads_unseen_users``).
- **item tower**: the candidate's item id and categorical embeddings (the same tables as the
  history's tokens), through an MLP.
- **shared layer**: an MLP over both towers and their elementwise product.

Input codes (``solaris/history.py``): history item ids and categories are the raw codes + 1
with 0 as padding, ``hist_action`` is 1 + the event's label bitmask (0 = padding); the
candidate's item id and categories are raw (0-based), shifted here to share the tables.
"""

from __future__ import annotations

import torch
import torch.nn as nn

Tensor = torch.Tensor


class TwoTowerFM(nn.Module):
    """Keyword arguments (``fm.kwargs``): ``dim`` tower width, ``shared_dim`` width of the
    last shared layer."""

    # it has no user-id table: a user it never saw is read like any other (the optional
    # capability of solaris.models.api), so a new user's pairs are precomputed too
    reads_unseen_users = True

    def __init__(self, spec, num_users: int, num_items: int, tasks: tuple[str, ...],
                 history_len: int, version: str, dim: int = 16, shared_dim: int = 32):
        super().__init__()
        if dim < 1 or shared_dim < 1:
            raise ValueError(f"dim={dim!r}, shared_dim={shared_dim!r}: must be >= 1")
        self.version = version
        self.tasks = tuple(tasks)
        self.history_len = history_len
        self.shared_dim = shared_dim
        self.num_items = num_items
        D = dim
        # row 0 of the item-side tables is padding; raw code c reads row c + 1
        self.item_emb = nn.Embedding(num_items + 1, D, padding_idx=0)
        self.item_cat_emb = nn.ModuleList(nn.Embedding(n + 1, D, padding_idx=0)
                                          for n in spec.item_categorical.values())
        self.action_emb = nn.Embedding(1 + 2 ** len(self.tasks), D, padding_idx=0)
        self.user_cat_emb = nn.ModuleList(nn.Embedding(n, D)
                                          for n in spec.user_categorical.values())
        n_ud = len(spec.user_continuous)
        self.user_cont = nn.Linear(n_ud, D) if n_ud else None
        self.user_tower = nn.Sequential(nn.Linear(2 * D, D), nn.ReLU(), nn.Linear(D, D))
        self.item_tower = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))
        self.shared = nn.Sequential(nn.Linear(3 * D, shared_dim), nn.ReLU())
        self.task_heads = nn.Linear(shared_dim, len(self.tasks))

    def _user(self, req: dict[str, Tensor]) -> Tensor:
        """(R, D) user-tower output; ``req["user"]`` is not read."""
        hist = req["hist_item"]  # (R, L), 0 = padding
        tok = self.item_emb(hist) + self.action_emb(req["hist_action"])  # (R, L, D)
        for j, emb in enumerate(self.item_cat_emb):
            tok = tok + emb(req["hist_item_cat"][:, :, j])  # (R, L, D)
        valid = (hist > 0).to(tok.dtype)[..., None]  # (R, L, 1)
        pooled = (tok * valid).sum(1) / valid.sum(1).clamp(min=1.0)  # (R, D)
        feats = torch.zeros_like(pooled)  # (R, D)
        for j, emb in enumerate(self.user_cat_emb):
            feats = feats + emb(req["user_cat"][:, j])  # (R, D)
        if self.user_cont is not None:
            feats = feats + self.user_cont(req["user_cont"])  # (R, D)
        return self.user_tower(torch.cat([pooled, feats], -1))  # (R, D)

    def _item(self, cand: dict[str, Tensor]) -> Tensor:
        """(B, D) item-tower output."""
        x = self.item_emb(cand["item"] + 1)  # (B, D)
        for j, emb in enumerate(self.item_cat_emb):
            x = x + emb(cand["item_cat"][:, j] + 1)  # (B, D)
        return self.item_tower(x)  # (B, D)

    def request_part(self, req: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"user": self._user(req)}  # (R, D)

    def candidate_part(self, state: dict[str, Tensor], cand: dict[str, Tensor],
                       req_index: Tensor) -> Tensor:
        u = state["user"].index_select(0, req_index)  # (B, D)
        v = self._item(cand)  # (B, D)
        return self.shared(torch.cat([u, v, u * v], -1))  # (B, S)

    def heads(self, shared: Tensor) -> Tensor:
        return self.task_heads(shared)  # (B, T)

    def user_vectors(self, req: dict[str, Tensor]) -> Tensor:
        return self._user(req)  # (R, D)

    def item_vectors(self) -> Tensor:
        return self.item_emb.weight[1:].detach()  # (num_items, D)
