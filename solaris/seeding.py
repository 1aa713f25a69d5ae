"""Seeding a deployed app's history store from a team's log: each user's last events before
a time, in the codes the app serves under, in chunks that keep a user's events together
(``jobs/seed_history.py`` sends them; ``HistoryStore.replay_log`` skips what a store already
holds, so a repeated or resumed run adds nothing twice).

No Ray; batch-first over numpy and Arrow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solaris.data.schema import ITEM, RAW_ID, SURFACE, TS, USER, Dataset
from solaris.ids import IdMap


@dataclass(frozen=True)
class SeedEvents:
    """Events to seed, by user then event order: (n,) each, ``labels`` (n, T)."""

    users: np.ndarray  # int64 codes
    items: np.ndarray  # int64 codes
    surfaces: np.ndarray  # int32
    labels: np.ndarray  # float64 0/1
    ts: np.ndarray  # float64 event time

    def __len__(self) -> int:
        return len(self.users)

    def arrays(self, rows: slice = slice(None)) -> tuple[np.ndarray, ...]:
        """``(users, items, surfaces, labels, ts)`` of ``rows``: what a store's
        ``replay_log`` takes."""
        return (self.users[rows], self.items[rows], self.surfaces[rows], self.labels[rows],
                self.ts[rows])

    def chunks(self, rows: int) -> list[slice]:
        """Slices of about ``rows`` events that never split a user (a user with more events
        than ``rows`` is one slice)."""
        if rows < 1:
            raise ValueError(f"rows={rows!r}: must be >= 1")
        n = len(self.users)
        bounds = np.r_[0, np.flatnonzero(np.diff(self.users)) + 1, n]  # users' first rows, n
        out, a = [], 0
        while a < n:
            b = int(bounds[np.searchsorted(bounds, a + rows, side="right") - 1])
            if b <= a:  # one user holds more than ``rows``: the whole user
                b = int(bounds[np.searchsorted(bounds, a, side="right")])
            out.append(slice(a, b))
            a = b
        return out


def seed_history(ds: Dataset, start_ts: float, max_events: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, surfaces, labels (n, T), ts) of each user's last ``max_events``
    interactions before ``start_ts``, in event order: the history store's state when
    serving starts at ``start_ts``."""
    t = ds.interactions
    ts = t.column(TS).to_numpy()
    n = int(np.searchsorted(ts, start_ts, side="left"))
    users = t.column(USER).to_numpy()[:n]
    # keep each user's last max_events rows: rank rows from the end within each user
    order = np.lexsort((-np.arange(n), users))  # by user, latest first
    u_sorted = users[order]
    first = np.r_[0, np.flatnonzero(np.diff(u_sorted)) + 1]
    rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    keep = np.sort(order[rank < max_events])
    labels = np.stack([t.column(c).to_numpy()[:n][keep] for c in ds.tasks], 1)
    return (users[keep].astype(np.int64), t.column(ITEM).to_numpy()[:n][keep].astype(np.int64),
            t.column(SURFACE).to_numpy()[:n][keep].astype(np.int32),
            labels.astype(np.float64), ts[keep].astype(np.float64))


def seed_events(ds: Dataset, ids: IdMap, start_ts: float, max_events: int) -> SeedEvents:
    """``seed_history`` in the codes an app serving under ``ids`` reads: its code for every
    id it knows, the provisional code (``solaris.ids``) for one it does not -- the code its
    router gives that id's requests. By user, then event order."""
    users, items, surfaces, labels, ts = seed_history(ds, start_ts, max_events)
    u_code = ids.users.codes(ds.users.column(RAW_ID).to_pylist(), "users")  # ds code -> app's
    i_code = ids.items.codes(ds.items.column(RAW_ID).to_pylist(), "items")
    order = np.lexsort((np.arange(len(users)), users))  # by user, event order kept
    return SeedEvents(u_code[users[order]], i_code[items[order]], surfaces[order],
                      labels[order], ts[order])
