"""The residual SOLARIS VM: the VM alone, frozen, plus a masked correction per slot.

    logit = base(x)
            + sum_slot where(present, s[slot, tier] * g_slot(tier, age) * delta_slot(e, b), 0)

``base`` is the VM alone of the same seed (the very weights the ``vm`` arm scores with), frozen.
``delta_slot`` reads the slot's embedding ``e`` (pair slot: z or its imputation; user slot: the
aggregate) and the base logit ``b``; ``g_slot`` is a gate in (0, 2) on the tier and the age
(1 at initialisation); ``s`` is a scale in [0, 1] per slot and tier chosen on validation and
changeable at runtime (0: the tier is switched off and need not be looked up). A missing slot's
term is masked with ``where`` (an absent slot may hold anything, NaN included), so a candidate
with no SOLARIS input scores exactly as the VM alone in the same batch.

``present_affine`` (per pair tier, ``alpha + beta * logit``; identity ``(0, 1)`` unless set):
where a pair tier is served, the whole logit is mapped once more. That a pair is in the cache at
all is information (the verifier bet on it, or it was asked for before), and the corrections,
trained offline where every row has its pair, never see it; ``fit_served_tiers`` fits the map
on the training rows simulated serving covers. A row with no pair tier served is untouched.

``use_z`` False is the control arm: the same correction without the embedding, so what it
gains is recalibration of the base on covered rows, not transfer.

``imputed``: the imputed tiers (user neighbour, item neighbour) get a correction of their own
(``delta`` and gate, started as a copy of the own pair's and trained on simulated serving), so
learning them never moves how the own pair is read.

``agg_items`` (``(num_items, K)``): the aggregate's correction meets the candidate. A user's
aggregate is one vector for every candidate of a request, so a correction that reads only it
and the base logit can shift the user's whole logit and no more; with a table of what each
candidate is (``solaris.train.residual.candidate_table``: its side features and/or the FM's
``item_vectors()``, standardised, frozen; row ``num_items``, an item serving does not know,
reads zeros) it also reads the cross ``q(a) * k(v_item)`` of the aggregate and the
candidate, where a user's recent interest meets what the item is.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris.models.vm import VerticalModel
from solaris.tiers import NUM_TIERS, Tier

Tensor = torch.Tensor

SLOTS = ("pair", "agg")
AGG_TIER = int(Tier.PAIR)  # the user slot has one tier: present (scale column of the pair tier)


CROSS_DIM = 16  # width of the aggregate-candidate cross (``SlotCorrection.q`` and ``.k``)


class SlotCorrection(nn.Module):
    """delta(e, b[, q(e) * k(v_item)]) * g(tier, age) for one slot: (B,) before scale and
    mask. ``items`` (``(num_items, K)``): the cross with the candidate's item vector."""

    def __init__(self, slot_dim: int, hidden: int, use_z: bool, tiered: bool,
                 items: tuple[int, int] | None = None):
        super().__init__()
        self.use_z = use_z
        self.tiered = tiered
        self.crossed = items is not None and use_z
        in_dim = (slot_dim if use_z else 0) + 1  # (e, base logit)
        if self.crossed:
            n, k = items
            # the candidates' vectors; the last row (an item serving does not know) stays 0
            self.register_buffer("item_vec", torch.zeros(n + 1, k))
            self.q = nn.Linear(slot_dim, CROSS_DIM)
            self.k = nn.Linear(k, CROSS_DIM, bias=False)
            in_dim += CROSS_DIM
        self.delta = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        if tiered:
            self.gate = nn.Linear(NUM_TIERS + 1, 1)  # (one-hot tier, age share of the TTL)
            nn.init.zeros_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)

    @torch.no_grad()
    def set_item_vectors(self, vectors: Tensor) -> None:
        """Copy ``vectors`` (num_items, K), standardised per column, into the item table."""
        if not self.crossed:
            raise ValueError("set_item_vectors: this correction reads no candidate")
        v = torch.as_tensor(vectors, dtype=torch.float32)
        if tuple(v.shape) != (self.item_vec.shape[0] - 1, self.item_vec.shape[1]):
            raise ValueError(f"item vectors of shape {tuple(v.shape)}: expected "
                             f"{(self.item_vec.shape[0] - 1, self.item_vec.shape[1])}")
        if not bool(torch.isfinite(v).all()):
            raise ValueError("item vectors: not all finite")
        v = (v - v.mean(0)) / v.std(0).clamp_min(1e-6)
        self.item_vec[:-1] = v
        self.item_vec[-1] = 0.0

    def forward(self, e: Tensor, b: Tensor, tier: Tensor, age: Tensor,
                item: Tensor | None = None) -> Tensor:
        x = torch.cat([e, b[:, None]], dim=-1) if self.use_z else b[:, None]  # (B, D+1) | (B, 1)
        if self.crossed:
            if item is None:
                raise ValueError("this correction reads the candidate: pass its item ids")
            v = self.item_vec[item.clamp(0, self.item_vec.shape[0] - 1)]  # (B, K)
            x = torch.cat([x, self.q(e) * self.k(v)], dim=-1)  # (B, D+1+CROSS_DIM)
        d = self.delta(x).squeeze(-1)  # (B,)
        if not self.tiered:
            return d
        t = F.one_hot(tier, NUM_TIERS).to(d.dtype)  # (B, 4)
        g = 2.0 * torch.sigmoid(self.gate(torch.cat([t, age[:, None]], dim=-1)).squeeze(-1))
        return g * d  # (B,)


class ResidualVM(nn.Module):
    """The frozen VM alone plus the masked pair-slot and user-slot corrections."""

    def __init__(self, base: VerticalModel, slot_dim: int, hidden: int,
                 use_pair: bool = True, use_agg: bool = True, use_z: bool = True,
                 imputed: bool = False, agg_items: tuple[int, int] | None = None):
        super().__init__()
        if base.cfg.use_pair or base.cfg.use_agg:
            raise ValueError("base: must be the VM alone (use_pair=False, use_agg=False)")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.slot_dim = slot_dim
        self.use_z = use_z
        self.pair = SlotCorrection(slot_dim, hidden, use_z, tiered=True) if use_pair else None
        self.agg = SlotCorrection(slot_dim, hidden, use_z, tiered=False, items=agg_items) \
            if use_agg else None
        self.imputed = SlotCorrection(slot_dim, hidden, use_z, tiered=True) \
            if imputed and use_pair else None
        # scale per slot (0 pair, 1 agg) and tier; the "none" tier never counts. A tier the
        # correction never trained on starts switched off: only the own pair (Tier.PAIR) and the
        # aggregate are on until training on simulated serving sets the others
        scale = torch.zeros(len(SLOTS), NUM_TIERS)
        scale[0, Tier.PAIR] = 1.0 if use_pair else 0.0
        scale[1, AGG_TIER] = 1.0 if use_agg else 0.0
        self.register_buffer("scale", scale)
        affine = torch.zeros(NUM_TIERS, 2)
        affine[:, 1] = 1.0  # identity: alpha 0, beta 1
        self.register_buffer("present_affine", affine)

    def train(self, mode: bool = True) -> "ResidualVM":
        super().train(mode)
        self.base.eval()  # frozen: no dropout, whatever the mode of the rest
        return self

    def set_scale(self, slot: str, tier: int, value: float) -> None:
        if slot not in SLOTS:
            raise ValueError(f"slot={slot!r}: one of {SLOTS}")
        if not Tier.NONE < tier < NUM_TIERS:
            raise ValueError(f"tier={tier!r}: must be in {int(Tier.PAIR)}..{NUM_TIERS - 1}")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"scale={value!r}: must be in [0, 1]")
        self.scale[SLOTS.index(slot), tier] = float(value)

    def set_present_affine(self, tier: int, alpha: float, beta: float) -> None:
        """The logit map ``alpha + beta * logit`` on rows served pair tier ``tier``."""
        if not Tier.NONE < tier < NUM_TIERS:
            raise ValueError(f"tier={tier!r}: must be in {int(Tier.PAIR)}..{NUM_TIERS - 1}")
        if not (math.isfinite(alpha) and math.isfinite(beta) and beta > 0):
            raise ValueError(f"present_affine=({alpha!r}, {beta!r}): need finite values and "
                             "beta > 0")
        self.present_affine[tier, 0] = float(alpha)
        self.present_affine[tier, 1] = float(beta)

    def pair_on(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(tier (B,), on (B,)): the pair tier read and whether its term is served."""
        tier = batch["pair_tier"].clamp(0, NUM_TIERS - 1)  # (B,)
        on = (batch["pair_present"] > 0) & (tier > Tier.NONE) & (self.scale[0][tier] > 0)
        return tier, on

    def terms(self, batch: dict[str, Tensor], b: Tensor,
              pair_on: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """(pair term, user term), each (B,), already masked and scaled, given base logits;
        ``pair_on``: ``self.pair_on(batch)`` where the caller has it."""
        zero = torch.zeros_like(b)
        pair_t, agg_t = zero, zero
        # without gradients (serving, evaluation) a correction no row reads is not computed:
        # its where() would give exact zeros; with them every term runs, so that training
        # (an optimizer's step on a zero gradient included) is as it was
        lazy = not torch.is_grad_enabled()
        if self.pair is not None:
            tier, on = self.pair_on(batch) if pair_on is None else pair_on  # (B,), (B,)
            if not lazy or bool(on.any()):
                s = self.scale[0][tier]  # (B,)
                e = torch.where(on[:, None], batch["pair_emb"], 0.0)  # (B, D)
                age = torch.where(on, batch["pair_age"], 0.0)  # (B,)
                d = self.pair(e, b, tier, age)  # (B,)
                imputed = tier >= Tier.USER_NEIGHBOUR  # (B,)
                if self.imputed is not None and (not lazy or bool((on & imputed).any())):
                    d = torch.where(imputed, self.imputed(e, b, tier, age), d)
                pair_t = torch.where(on, s * d, zero)
        if self.agg is not None:
            s = self.scale[1, AGG_TIER]
            on = (batch["agg_present"] > 0) & (s > 0)  # (B,)
            if not lazy or bool(on.any()):
                e = torch.where(on[:, None], batch["agg_emb"], 0.0)  # (B, D)
                # the item ids only where the correction reads them (a batch of the slots
                # alone has none)
                agg_t = torch.where(on, s * self.agg(e, b, zero.long(), zero,
                                                     batch.get("item")), zero)
        return pair_t, agg_t

    def forward_both(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(logits, base logits), each (B,): the verifier ranks by the base's."""
        with torch.no_grad():
            b = self.base(batch)  # (B,)
        return self.forward(batch, base_logit=b), b

    def forward(self, batch: dict[str, Tensor], base_logit: Tensor | None = None) -> Tensor:
        """Logits (B,). ``base_logit`` replaces base(x) (training on out-of-sample logits)."""
        if base_logit is None:
            with torch.no_grad():
                base_logit = self.base(batch)  # (B,)
        on_pair = self.pair_on(batch) if self.pair is not None else None
        pair_t, agg_t = self.terms(batch, base_logit.detach(), on_pair)
        logit = base_logit + pair_t + agg_t  # absent slots add an exact 0.0
        if on_pair is None:
            return logit
        tier, on = on_pair
        if not torch.is_grad_enabled() and not bool(on.any()):
            return logit  # no row mapped (the where() below would return it as it is)
        ab = self.present_affine[tier]  # (B, 2)
        return torch.where(on, ab[:, 0] + ab[:, 1] * logit, logit)
