"""Users the FM never saw: whether their pairs are precomputed.

A user who arrives after the FM was trained has an id past its tables (appended to the
deployment's id map, or a provisional code: ``solaris.ids``). The VM reads such a user through
its out-of-vocabulary row and every request is answered; whether the FM can read it is the
FM's to say (``solaris.models.api.ReadsUnseenUsers``). An FM that declares it gets the user's
pairs queued, computed (``solaris.history.request_inputs`` gives it the id and zero side
features) and served like anyone's; any other FM gets none of them, and the user is served
by the VM alone and the user-KNN cold start until the FM is retrained.

The router's after-answer picks and the inline FM both ask ``computable``. No Ray.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import numpy as np

from solaris.errors import SolarisError
from solaris.models.api import import_class, reads_unseen_users

log = logging.getLogger(__name__)


def computable(user: int, items: np.ndarray, num_users: int, num_items: int,
               unseen_users: bool) -> np.ndarray:
    """(C,) bool: which of ``items`` the FM can compute a pair with ``user`` for: an item it
    has a row for, and a user it was trained on or, where the FM reads users it never saw
    (``unseen_users``), any user."""
    items = np.asarray(items, np.int64)
    user_ok = 0 <= user < num_users or (unseen_users and user >= 0)
    return (items >= 0) & (items < num_items) & bool(user_ok)


def computable_picks(art: Any, user: int, items: np.ndarray, picks: np.ndarray
                     ) -> np.ndarray:
    """The positions ``picks`` (into a request's ``items``) whose pair with ``user`` the FM
    of ``art`` (``solaris.artifacts.Artifacts``) can compute: what the router queues."""
    picks = np.asarray(picks, np.int64)
    return picks[computable(user, np.asarray(items)[picks], art.num_users, art.num_items,
                            fm_reads_unseen_users(art))]


def fm_reads_unseen_users(art: Any) -> bool:
    """Whether the FM of ``art`` (``solaris.artifacts.Artifacts``) declares
    ``ReadsUnseenUsers``: read from the class its FM checkpoint names (the one the FM
    workers build), imported, not built; once per artifacts."""
    return _reads(str(art.root), art.version)


@lru_cache(maxsize=64)
def _reads(root: str, version: str) -> bool:
    from solaris.artifacts import check_fm_class

    try:
        return reads_unseen_users(import_class(check_fm_class(root), "fm.cls"))
    except SolarisError as e:  # the FM workers, which build it, fail readiness with it
        log.warning("FM %s: %s; its new users' pairs are not queued", version, e)
        return False
