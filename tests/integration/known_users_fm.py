"""An FM class for the new-user test (test_new_users_live.py): the example causal FM, which
reads no user id, declaring that it does not read users it never saw -- the same weights
served under both declarations."""

from __future__ import annotations

from examples.causal_fm import CausalTransformerFM


class KnownUsersOnlyFM(CausalTransformerFM):
    reads_unseen_users = False
