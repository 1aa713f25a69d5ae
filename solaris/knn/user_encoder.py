"""User and item embeddings for the KNN tables, read off the trained FM (DESIGN.md step 7).

Two user vectors, chosen by ``knn.user_vector``; both read only what the FM interface
exposes, so a team's FM works with either, and both are functions of a user's events (and
features), never of its id, so a cold-start user gets its vector from the same function as
everyone in the table.

**``clicked_items`` (the default): the mean of the FM's item vectors** (``FMModel.item_vectors``)
over the user's last ``knn.user_events`` events that are positive for the first task (its
clicks), over every event for a user with none, zeros for a user with no event
(``ClickedItemsEncoder``). It finds users who like alike: on the cohorts world (800 users,
docs/results/2026-12-07-cohorts-world.md) the mean cosine of a user's hidden interest with its
10 nearest users' is 0.437 with it over all history (0.372 over the last 128 events, 0.258
over the last 32), against 0.127 with the request tower, 0.077 for random users and 0.840
at best; on the feed world 0.225 against 0.055. With it the user-neighbour tier is the first
fallback tier that training's guard serves.

**``request_tower``: the FM's own user vector** (``FMModel.user_vectors``; ``UserEncoder``)
from a user's features and its last ``history_len`` events, the id not read. It captures the
user's state of the moment, which is what a neighbour cannot share. The built-in FM's is what
the user's side contributes to its first shared layer. Measured with it on the classic world
(1,500 users): the mean cosine between the pair embeddings z(u, i) and z(v, i) of the same
item for a user u and its 10 nearest users v is 0.942 against 0.878 for random v; with the
mean of the FM item vectors over the last ``history_len`` events (every event, not the
clicked ones alone) 0.879, no better than random by that measure, although those neighbours
share more items (item Jaccard 0.052 against 0.033). That measure is the pair embeddings'
likeness, not the worth of the tier they feed; by the worth the guard and the replays
measure, the clicked items' mean is the better vector (docs/results/2026-12-07-user-neighbours.md).

The router embeds a cold-start user with ``user_encoder(...).encode(history.batch(...))``
(the history store builds the same request-side inputs; the encoder the table records it was
built with) and asks ``solaris.knn.tables.LiveIndex``. The job builds them from logged events
with ``recent_history`` + ``request_inputs``, which give exactly what ``HistoryStore.batch``
gives for the same events (tested).

**Item embeddings**: the FM's item vectors (``FMModel.item_vectors``), cosine.
"""

from __future__ import annotations

import numpy as np
import torch

from solaris.errors import ConfigError, DataError, RequestError
from solaris.models.api import REQUEST_KEYS, FMModel

Tensor = torch.Tensor

# what ``UserEncoder.encode`` reads: the request-side inputs less the user id, which it zeros
# (two requests equal on these get the same embedding, whoever the user)
ENCODER_INPUTS = tuple(k for k in REQUEST_KEYS if k != "user")


class UserEncoder:
    """User embeddings (R, U) from the FM's ``user_vectors`` (module docstring)."""

    def __init__(self, fm: FMModel, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.fm = fm.to(self.device).eval()

    def encode(self, req: dict[str, np.ndarray | Tensor]) -> np.ndarray:
        """(R, U) float32 embeddings of R users from their request-side inputs
        (``REQUEST_KEYS``, as ``HistoryStore.batch`` or ``request_inputs`` build them)."""
        missing = [k for k in REQUEST_KEYS if k not in req]
        if missing:
            raise RequestError(f"user encoder: request inputs lack {missing}")
        batch = {k: torch.as_tensor(np.asarray(req[k]) if not isinstance(req[k], Tensor)
                                    else req[k]).to(self.device) for k in REQUEST_KEYS}
        # the id is not read (see above): any user id works, even one the FM's table has no
        # row for
        batch["user"] = torch.zeros_like(batch["user"])
        with torch.inference_mode():
            z = self.fm.user_vectors(batch)  # (R, U)
        return z.float().cpu().numpy()


# what ``ClickedItemsEncoder.encode`` reads
CLICKED_INPUTS = ("hist_item", "hist_action")
USER_VECTORS = ("clicked_items", "request_tower")  # knn.user_vector's values
LEGACY_USER_VECTOR = "request_tower"  # what a table that records no user vector was built with


class ClickedItemsEncoder:
    """User embeddings (R, I): the mean FM item vector over each user's clicked events
    (module docstring). ``encode`` takes the request-side inputs as ``UserEncoder.encode``
    does and reads only ``hist_item`` (item + 1, 0 pad) and ``hist_action`` (1 + the label
    bits, 0 pad); a click is bit 0, the first task."""

    def __init__(self, fm: FMModel, device: str | torch.device = "cpu") -> None:
        self.items = item_embeddings(fm)  # (num_items, I), read once

    def encode(self, req: dict[str, np.ndarray | Tensor]) -> np.ndarray:
        missing = [k for k in CLICKED_INPUTS if k not in req]
        if missing:
            raise RequestError(f"user encoder: request inputs lack {missing}")
        item = np.asarray(req["hist_item"], np.int64) - 1  # (R, L), -1 pad
        bits = np.asarray(req["hist_action"], np.int64) - 1
        if item.shape != bits.shape or item.ndim != 2:
            raise RequestError(f"user encoder: hist_item {item.shape} and hist_action "
                               f"{bits.shape} must be one (R, L) shape")
        seen = item >= 0
        if seen.any() and item.max() >= len(self.items):
            raise DataError(f"history item {int(item.max())} outside the FM's item table "
                            f"({len(self.items)} items)")
        clicked = seen & ((bits & 1) > 0)
        use = np.where(clicked.any(axis=1, keepdims=True), clicked, seen)
        rows, cols = np.nonzero(use)
        out = np.zeros((len(item), self.items.shape[1]), np.float64)
        np.add.at(out, rows, self.items[item[rows, cols]])
        return (out / np.maximum(use.sum(axis=1, keepdims=True), 1)).astype(np.float32)


def events_read(kind: str, fm: FMModel, user_events: int) -> int:
    """How many of a user's latest events the ``kind`` user vector reads."""
    check_user_vector(kind)
    return int(fm.history_len) if kind == "request_tower" else int(user_events)


def check_user_vector(kind: str) -> None:
    if kind not in USER_VECTORS:
        raise ConfigError(f"knn.user_vector={kind!r}: must be one of {', '.join(USER_VECTORS)}")


def user_encoder(kind: str, fm: FMModel, device: str | torch.device = "cpu"
                 ) -> "UserEncoder | ClickedItemsEncoder":
    """The encoder of the ``kind`` user vector (``knn.user_vector``)."""
    check_user_vector(kind)
    return (UserEncoder if kind == "request_tower" else ClickedItemsEncoder)(fm, device)


def item_embeddings(fm: FMModel) -> np.ndarray:
    """(num_items, I) float32: the FM's vector of every item."""
    with torch.inference_mode():
        return fm.item_vectors().detach().float().cpu().numpy()


def recent_history(users: np.ndarray, items: np.ndarray, ts: np.ndarray, seq: np.ndarray,
                   surfaces: np.ndarray, labels: np.ndarray, as_of: float, length: int
                   ) -> dict[str, np.ndarray]:
    """Each user's last ``length`` events strictly before ``as_of``, most recent first (ties:
    latest ``seq`` first), from a log of events in any order.

    ``labels`` (N, T) 0/1. A row with ``items < 0`` only says its user exists (a user with no
    event gets an all-pad history). Returns, per distinct user (sorted): ``user`` (U,),
    ``item`` / ``surface`` / ``bits`` (U, L) int64 and ``ts`` (U, L) float64; pads are item
    -1. ``bits`` = sum_k y_k 2^k, as the history store keeps them.
    """
    users = np.asarray(users, np.int64)
    n = len(users)
    cols = [np.asarray(a) for a in (items, ts, seq, surfaces)]
    y = np.asarray(labels).reshape(n, -1)
    if any(len(a) != n for a in cols) or length < 1:
        raise DataError(f"events: columns of unequal length or length={length!r} < 1")
    items, ts, seq, surfaces = cols
    ts = ts.astype(np.float64)
    uniq = np.unique(users)
    out = {"user": uniq,
           "item": np.full((len(uniq), length), -1, np.int64),
           "ts": np.zeros((len(uniq), length), np.float64),
           "surface": np.zeros((len(uniq), length), np.int64),
           "bits": np.zeros((len(uniq), length), np.int64)}
    keep = np.flatnonzero((items >= 0) & (ts < as_of))
    order = keep[np.lexsort((-seq[keep], -ts[keep], users[keep]))]  # user, newest first
    u = users[order]
    start = np.searchsorted(u, u, side="left")
    rank = np.arange(len(order)) - start  # position within the user's events
    sel = rank < length
    order, row, col = order[sel], np.searchsorted(uniq, u[sel]), rank[sel]
    out["item"][row, col] = items[order]
    out["ts"][row, col] = ts[order]
    out["surface"][row, col] = surfaces[order]
    out["bits"][row, col] = (y[order].astype(np.int64) << np.arange(y.shape[1])).sum(axis=1)
    return out


def request_inputs(hist: dict[str, np.ndarray], as_of: float, item_cat: np.ndarray,
                   user_cat: np.ndarray, user_cont: np.ndarray) -> dict[str, np.ndarray]:
    """FM request-side inputs (``REQUEST_KEYS``) of ``recent_history``'s users at ``as_of``,
    coded as ``HistoryStore.batch`` codes them (surface 0: the encoder does not read it)."""
    users = hist["user"]
    if len(users) and (users.min() < 0 or users.max() >= len(user_cat)):
        raise DataError(f"users: ids outside the user table (0..{len(user_cat) - 1})")
    item = hist["item"]  # (U, L), -1 pad
    v = item >= 0
    if v.any() and item.max() >= len(item_cat):
        raise DataError(f"history item {int(item.max())} outside the item table "
                        f"({len(item_cat)} items)")
    ic = np.where(v, item, 0)
    age_h = (as_of - hist["ts"]) / 3600.0
    return {
        "user": users.astype(np.int64),
        "surface": np.zeros(len(users), np.int64),
        "user_cat": np.asarray(user_cat)[users].astype(np.int64),
        "user_cont": np.asarray(user_cont)[users].astype(np.float32),
        "hist_item": np.where(v, item + 1, 0),  # (U, L)
        "hist_action": np.where(v, 1 + hist["bits"], 0),  # (U, L)
        "hist_surface": np.where(v, hist["surface"] + 1, 0),  # (U, L)
        "hist_age": np.where(v, np.log1p(np.clip(age_h, 0.0, None)), 0.0
                             ).astype(np.float32),  # (U, L)
        "hist_item_cat": np.where(v[..., None], np.asarray(item_cat)[ic] + 1, 0
                                  ).astype(np.int64),  # (U, L, n_ic)
    }
