"""The Ray actor names of one app's stateful actors, in one place.

Every actor an app owns is named after the app id, so two apps on one cluster stay apart and
a restarted driver or router finds its actors again (``ray.get_actor``). No Ray import: the
names are plain strings.
"""

from __future__ import annotations


def cache_shard(group_id: str, shard: int) -> str:
    """One cache shard of the group ``group_id`` (the app id)."""
    return f"solaris-cache-{group_id}-{shard}"


def queue(app_id: str) -> str:
    """The app's precompute queue."""
    return f"solaris-queue-{app_id}"


def ledger(app_id: str) -> str:
    """The app's cost ledger."""
    return f"solaris-ledger-{app_id}"


def knn_holder(app_id: str) -> str:
    """The app's KNN table holder."""
    return f"solaris-knn-{app_id}"


def control(app_id: str) -> str:
    """The app's control holder (runtime scales, rollout switches)."""
    return f"solaris-control-{app_id}"
