"""The provenance tier of the pair slot: where a candidate's pair embedding came from.

One type for the concept (STYLE 13). In arrays, checkpoints and saved files a tier is its
int code (``Slots.pair_tier``, the one-hot in the VMs, the scale columns); on the wire (JSON,
HTTP, manifests, metric tags) it is its label. Convert with ``Tier.label`` and
``Tier.from_label`` at those boundaries only. The order is the lookup order (pair ->
user neighbour -> item neighbour), and the cumulative coverage shares rely on it.

This module imports nothing of the project, so every layer (models, cache, serving) can.
"""

from __future__ import annotations

import enum


class Tier(enum.IntEnum):
    """Tier codes of the pair slot, in lookup order."""

    NONE = 0  # no pair embedding: the slot is absent
    PAIR = 1  # the user's own fresh pair
    USER_NEIGHBOUR = 2  # a nearby user's pair of the same item
    ITEM_NEIGHBOUR = 3  # the user's own pair of a nearby item

    @property
    def label(self) -> str:
        """The wire name: "none", "pair", "user_neighbour", "item_neighbour"."""
        return self.name.lower()

    @classmethod
    def from_label(cls, name: str) -> Tier:
        """The tier of a wire name; ValueError naming ``name`` if it is none of them."""
        try:
            return _BY_LABEL[name]
        except (KeyError, TypeError):
            raise ValueError(f"tier={name!r}: one of {', '.join(LABELS)}") from None


NUM_TIERS = len(Tier)  # width of the tier one-hot and of a scale array's rows
LABELS = tuple(t.label for t in Tier)  # ("none", "pair", "user_neighbour", "item_neighbour")
_BY_LABEL = {t.label: t for t in Tier}

# the served inputs switched on cumulatively in lookup order, then the aggregate:
# (name, pair tiers kept, aggregate on) -- the steps of ``tier_worth`` and ``tr_online_by_tier``
STEPS = ((Tier.PAIR.label, frozenset({Tier.PAIR}), False),
         (Tier.USER_NEIGHBOUR.label, frozenset({Tier.PAIR, Tier.USER_NEIGHBOUR}), False),
         (Tier.ITEM_NEIGHBOUR.label,
          frozenset({Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR}), False),
         ("aggregate", frozenset({Tier.PAIR, Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR}), True))
