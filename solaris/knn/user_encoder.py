"""User and item embeddings for the KNN tables, read off the trained FM (DESIGN.md step 7).

**User encoder: the FM's own user vector** (``FMModel.user_vectors``, ``solaris.models.api``),
from a user's features and event-time history, the user id not read: a cold-start user
with only features and a few events gets an embedding from the same function as everyone
in the table. The built-in FM's (``solaris.models.fm``) is what the user's side contributes
to its first shared layer. Measured with it (default synthetic data, 1,500 users, FM trained
by ``solaris train``): the mean cosine between the pair embeddings z(u, i) and z(v, i) of the
same item for a user u and its 10 nearest users v is 0.942 against 0.878 for random v; with
the id embedding added 0.944 (so leaving it out costs little); with the mean of the
history's FM item embeddings (the other candidate) 0.879, no better than random for
imputation, although its neighbours share more items (item Jaccard 0.052 vs 0.033).

The router embeds a cold-start user with ``UserEncoder.encode(history.batch(...))`` (the
history store builds the same request-side inputs) and asks ``solaris.knn.tables.LiveIndex``.
The job builds them from logged events with ``recent_history`` + ``request_inputs``, which
give exactly what ``HistoryStore.batch`` gives for the same events (tested).

**Item embeddings**: the FM's item vectors (``FMModel.item_vectors``), cosine.
"""

from __future__ import annotations

import numpy as np
import torch

from solaris.errors import DataError, RequestError
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
