"""A small vertical model (VM) with the two SOLARIS input slots.

The VM sees only what serving has in real time: ids, every side feature the spec declares
(each categorical column through an embedding, each item multi-hot column as the mean of its
codes' embeddings, the user's and the item's continuous columns as they are), the surface,
the request-time features, and (optionally) the looked-up pair slot and user slot. It never
reads the behaviour history.
Each slot enters twice: through a small projection into the MLP, and through a direct linear
term on the logit so an FM-quality signal can be read straight off the embedding.
Absent slots (presence 0) are zeroed before use, so their embedding values never matter.
The output logit goes through ``calibration`` (a, b): ``a * logit + b``, identity until
training folds in a Platt fit on validation (``vm.calibrate``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris.config import VMConfig
from solaris.data.schema import FeatureSpec
from solaris.tiers import NUM_TIERS

Tensor = torch.Tensor

# categorical columns a side may declare: each is an embedding table and E inputs of the MLP,
# so past this a spec is more likely a mapping error (an id or free text listed as a
# category) than a model; refused, never truncated (a column the VM ignored would be a
# feature its team believes it serves)
MAX_CAT_COLUMNS = 32


class VerticalModel(nn.Module):
    """Small ranking model: embeddings + MLP -> one logit, plus the SOLARIS slots; the VM
    alone (no slot) is the built-in implementation of ``solaris.models.api.VMModel``. The
    slots are read only by the transfer report's offline arms; served VMs are residual
    (``solaris.models.residual``)."""

    @classmethod
    def from_config(cls, cfg: VMConfig, spec: FeatureSpec, num_users: int, num_items: int,
                    slot_dim: int = 0) -> "VerticalModel":
        """The VM ``cfg``'s own fields describe (``vm.kwargs`` is for other classes)."""
        if cfg.kwargs:
            raise ValueError(f"vm.kwargs={dict(cfg.kwargs)!r}: the built-in VM reads the vm.* "
                             "fields, not kwargs")
        return cls(cfg, spec, num_users, num_items, slot_dim)

    def __init__(self, cfg: VMConfig, spec: FeatureSpec, num_users: int, num_items: int,
                 slot_dim: int):
        super().__init__()
        if num_users < 1 or num_items < 1:
            raise ValueError(f"num_users={num_users!r}, num_items={num_items!r}: must be >= 1")
        if (cfg.use_pair or cfg.use_agg) and slot_dim < 1:
            raise ValueError(f"slot_dim={slot_dim!r}: must be >= 1 when a SOLARIS slot is used")
        self.cfg = cfg
        self.slot_dim = slot_dim
        E = cfg.emb_dim
        self.user_emb = nn.Embedding(num_users, E)
        self.item_emb = nn.Embedding(num_items, E)
        self.surface_emb = nn.Embedding(spec.num_surfaces, E)
        for side, cats in (("user", spec.user_categorical), ("item", spec.item_categorical)):
            if len(cats) > MAX_CAT_COLUMNS:
                raise ValueError(f"spec.{side}_categorical: {len(cats)} columns "
                                 f"({', '.join(cats)}); the built-in VM reads at most "
                                 f"{MAX_CAT_COLUMNS} per side")
        user_cards = list(spec.user_categorical.values())
        item_cards = list(spec.item_categorical.values())
        self.user_cat_emb = nn.ModuleList(nn.Embedding(c, E) for c in user_cards)
        self.item_cat_emb = nn.ModuleList(nn.Embedding(c, E) for c in item_cards)
        n_id = len(spec.item_continuous)
        in_dim = E * (3 + len(user_cards) + len(item_cards)) + n_id
        # built only where the spec declares them, so a spec without these features builds
        # the same parameters in the same order
        self.item_mh_emb: nn.ModuleList | None = None
        if spec.item_multihot:
            # codes + 1, 0 = pad (``SideTables.item_mh``): the mean over a row's codes; an
            # item without any (or unknown to serving: all pad) reads zeros
            self.item_mh_emb = nn.ModuleList(nn.EmbeddingBag(v + 1, E, mode="mean",
                                                             padding_idx=0)
                                             for v in spec.item_multihot.values())
            in_dim += E * len(spec.item_multihot)
        # continuous inputs, read as they are (standardised by the loader / request_vector)
        self.n_user_cont = len(spec.user_continuous)
        self.n_request_cont = len(spec.request_continuous)
        in_dim += self.n_user_cont + self.n_request_cont
        if cfg.use_pair:
            # [z * present, present, one-hot tier, age * present]
            self.pair_proj = nn.Linear(slot_dim + 1 + NUM_TIERS + 1, cfg.slot_hidden)
            self.pair_direct = nn.Linear(slot_dim, 1, bias=False)
            in_dim += cfg.slot_hidden
        if cfg.use_agg:
            # [agg * present, present]
            self.agg_proj = nn.Linear(slot_dim + 1, cfg.slot_hidden)
            self.agg_direct = nn.Linear(slot_dim, 1, bias=False)
            in_dim += cfg.slot_hidden

        layers: list[nn.Module] = []
        for h in cfg.hidden:
            layers += [nn.Linear(in_dim, h), nn.ReLU(), nn.Dropout(cfg.dropout)]
            in_dim = h
        layers.append(nn.Linear(in_dim, 1))
        self.mlp = nn.Sequential(*layers)
        # (a, b) of the folded-in Platt recalibration; identity until set
        self.register_buffer("calibration", torch.tensor([1.0, 0.0]))

    def with_unknown_ids(self) -> "VerticalModel":
        """In place: user id ``num_users`` and item id ``num_items`` read an
        out-of-vocabulary row, the mean of the trained rows (serving never refuses an id)."""
        self.user_emb = _with_oov_row(self.user_emb)
        self.item_emb = _with_oov_row(self.item_emb)
        return self

    def set_calibration(self, a: float, b: float) -> None:
        if not (math.isfinite(a) and math.isfinite(b) and a > 0):
            raise ValueError(f"calibration=({a!r}, {b!r}): need a finite slope > 0 and a finite bias")
        self.calibration.copy_(torch.tensor([float(a), float(b)]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before the calibration existed load as uncalibrated
        state_dict.setdefault(prefix + "calibration", torch.tensor([1.0, 0.0]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        user_cat = batch["user_cat"]  # (B, n_uc)
        item_cat = batch["item_cat"]  # (B, n_ic)
        parts = [self.user_emb(batch["user"]), self.item_emb(batch["item"]),
                 self.surface_emb(batch["surface"])]  # 3 x (B, E)
        parts += [emb(user_cat[:, j]) for j, emb in enumerate(self.user_cat_emb)]  # (B, E) each
        parts += [emb(item_cat[:, j]) for j, emb in enumerate(self.item_cat_emb)]  # (B, E) each
        parts.append(batch["item_cont"])  # (B, n_id)
        if self.item_mh_emb is not None:
            item_mh = batch["item_mh"]  # (B, n_mh, M)
            parts += [emb(item_mh[:, j]) for j, emb in enumerate(self.item_mh_emb)]  # (B, E) each
        if self.n_user_cont:  # keys of features the spec lacks need not be in the batch
            parts.append(batch["user_cont"])  # (B, n_ud)
        if self.n_request_cont:
            parts.append(batch["request_cont"])  # (B, n_rq)
        direct = None
        if self.cfg.use_pair:
            present = batch["pair_present"].unsqueeze(-1)  # (B, 1)
            # where(), not a product: an absent slot may hold anything, even NaN
            z = torch.where(present > 0, batch["pair_emb"], 0.0)  # (B, slot_dim)
            tier = F.one_hot(batch["pair_tier"], NUM_TIERS).to(z.dtype)  # (B, 4)
            age = torch.where(present > 0, batch["pair_age"].unsqueeze(-1), 0.0)  # (B, 1)
            slot = torch.cat([z, present, tier, age], dim=-1)  # (B, slot_dim + 6)
            parts.append(F.relu(self.pair_proj(slot)))  # (B, slot_hidden)
            direct = self.pair_direct(z)  # (B, 1)
        if self.cfg.use_agg:
            present = batch["agg_present"].unsqueeze(-1)  # (B, 1)
            a = torch.where(present > 0, batch["agg_emb"], 0.0)  # (B, slot_dim)
            parts.append(F.relu(self.agg_proj(torch.cat([a, present], dim=-1))))  # (B, slot_hidden)
            d = self.agg_direct(a)  # (B, 1)
            direct = d if direct is None else direct + d
        logit = self.mlp(torch.cat(parts, dim=-1))  # (B, 1)
        if direct is not None:
            logit = logit + direct  # (B, 1)
        return logit.squeeze(-1) * self.calibration[0] + self.calibration[1]  # (B,)


def _with_oov_row(emb: nn.Embedding) -> nn.Embedding:
    """The table plus one row (index n) holding the mean of the trained rows."""
    w = emb.weight.detach()
    return nn.Embedding.from_pretrained(torch.cat([w, w.mean(0, keepdim=True)]), freeze=True)
