"""Per-row model inputs: side-feature tables and the user's behaviour history as of each row.

The FM reads the user's behaviour *as of the request*, not as of its training cutoff: a row's
history is the user's previous rows in ``(ts, seq)`` order (most recent first), whatever
period they fall in. Labels of those earlier rows are part of the behaviour (they arrived
before the row). This is the event-time history the online history store serves later.

``FeatureTables.batch(rows)`` returns the batch contract the models read (see
``solaris/models/fm.py``): request-side keys ``user, surface, user_cat, user_cont, hist_*``
and candidate-side keys ``item, item_cat, item_mh, item_cont``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from solaris.config import FeatureConfig
from solaris.data.requests import request_times
from solaris.data.schema import ITEM, SURFACE, TS, USER, Dataset
from solaris.errors import DataError


def _int_matrix(table: pa.Table, cols: list[str]) -> np.ndarray:
    if not cols:
        return np.zeros((table.num_rows, 0), dtype=np.int64)
    return np.stack([table.column(c).to_numpy().astype(np.int64) for c in cols], axis=1)


def _float_matrix(table: pa.Table, cols: list[str]) -> np.ndarray:
    if not cols:
        return np.zeros((table.num_rows, 0), dtype=np.float32)
    return np.stack([np.nan_to_num(table.column(c).to_numpy(zero_copy_only=False)
                                   .astype(np.float32)) for c in cols], axis=1)


def _multihot(table: pa.Table, cols: list[str]) -> np.ndarray:
    """(n, n_cols, M) codes + 1, 0 = pad."""
    lists = [table.column(c).to_pylist() for c in cols]
    width = max([1] + [len(v or []) for col in lists for v in col])
    out = np.zeros((table.num_rows, len(cols), width), dtype=np.int64)
    for j, col in enumerate(lists):
        for i, vals in enumerate(col):
            if vals:
                out[i, j, : len(vals)] = np.asarray(vals, dtype=np.int64) + 1
    return out


def request_matrix(ds: Dataset) -> np.ndarray:
    """(N, n_rq) float32: each interaction row's request-time features
    (``spec.request_continuous``, standardised columns of the interaction table). A table
    without rows may lack the columns (side tables built without the log)."""
    cols = list(ds.spec.request_continuous)
    inter = ds.interactions
    missing = [c for c in cols if c not in inter.column_names]
    if missing and inter.num_rows:
        raise DataError(f"{ds.name}: interactions lack the request feature columns "
                        f"{missing!r} the spec declares")
    if missing:
        return np.zeros((0, len(cols)), np.float32)
    return _float_matrix(inter, cols)


def _before(gid: np.ndarray, sts: np.ndarray, sreq: np.ndarray) -> np.ndarray:
    """For rows grouped by ``gid`` (event order inside a group): first position in the row's
    group whose ts is >= the row's request time ``sreq`` (its history ends just before)."""
    lo = int(sts.min()) if len(sts) else 0
    span = int(sts.max()) - lo + 1 if len(sts) else 1
    key = gid.astype(np.int64) * span + (sts - lo)  # non-decreasing: groups, then time
    return np.searchsorted(key, gid.astype(np.int64) * span + (sreq - lo), side="left")


def _group_ids(keys: np.ndarray) -> np.ndarray:
    new = np.ones(len(keys), dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    return np.cumsum(new) - 1


def history_index(users: np.ndarray, ts: np.ndarray, length: int,
                  include_ties: bool = False, req_ts: np.ndarray | None = None) -> np.ndarray:
    """(N, L) int64 row index of each row's previous L rows of the same user, -1 = pad.

    Rows must already be in event order (sorted by ts, seq). Most recent first. A row's
    history ends before its request time ``req_ts`` (``request_times``; default its own ts):
    rows of the same request, and rows sharing its timestamp (e.g. the other candidates of
    the request, whose labels are not known yet when it is served), are not history.
    ``include_ties``: every earlier row is history (tie order then counts as time).
    """
    n = len(users)
    order = np.argsort(users, kind="stable")  # per user, event order is kept
    su = users[order]
    starts = np.searchsorted(su, su, side="left")  # first position of each row's user
    if include_ties:
        pos = np.arange(n)
    else:
        req = np.asarray(ts if req_ts is None else req_ts, dtype=np.int64)
        pos = _before(_group_ids(su), np.asarray(ts, np.int64)[order], req[order])
    idx = pos[:, None] - np.arange(1, length + 1)[None, :]  # (N, L) positions in `order`
    valid = idx >= starts[:, None]
    hist_sorted = np.where(valid, order[np.clip(idx, 0, None)], -1)
    out = np.empty_like(hist_sorted)
    out[order] = hist_sorted
    return out


class FeatureTables:
    """Dense arrays for every interaction row, gathered into model batches on demand."""

    def __init__(self, ds: Dataset, cfg: FeatureConfig):
        inter = ds.interactions
        self.tasks = ds.tasks
        self.spec = ds.spec
        self.history_len = cfg.history_len
        self.num_users = ds.num_users
        self.num_items = ds.num_items
        self.user = inter.column(USER).to_numpy().astype(np.int64)
        self.item = inter.column(ITEM).to_numpy().astype(np.int64)
        self.ts = inter.column(TS).to_numpy().astype(np.int64)
        self.surface = inter.column(SURFACE).to_numpy().astype(np.int64)
        self.labels = np.stack([inter.column(t).to_numpy(zero_copy_only=False)
                                .astype(np.float32) for t in ds.tasks], axis=1)  # (N, T)
        # action token of each row as a past event: 1 + sum_k y_k 2^k
        self.action = 1 + (self.labels.astype(np.int64) * (2 ** np.arange(len(ds.tasks)))).sum(1)
        users, items = ds.users, ds.items
        self.user_cat = _int_matrix(users, list(ds.spec.user_categorical))
        self.user_cont = _float_matrix(users, list(ds.spec.user_continuous))
        self.item_cat = _int_matrix(items, list(ds.spec.item_categorical))
        self.item_mh = _multihot(items, list(ds.spec.item_multihot))
        self.item_cont = _float_matrix(items, list(ds.spec.item_continuous))
        self.request_cont = request_matrix(ds)  # (N, n_rq) by interaction row
        # the time each row is served at: its request's (DESIGN.md, one request definition);
        # a dataset with a request log has it on every row, any other is bucketed as the
        # replay buckets it
        self.req_ts = self.ts.copy() if ds.requests is not None else \
            request_times(self.user, self.ts, cfg.request_granularity_s)  # (N,)
        self.hist = history_index(self.user, self.ts, cfg.history_len,
                                  cfg.history_ties, self.req_ts)  # (N, L)

    @property
    def num_rows(self) -> int:
        return len(self.user)

    def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """The model batch for interaction rows ``rows`` (request and candidate keys)."""
        rows = np.asarray(rows, dtype=np.int64)
        u, i = self.user[rows], self.item[rows]
        h = self.hist[rows]  # (B, L)
        pad = h < 0
        hc = np.where(pad, 0, h)
        hist_item = np.where(pad, 0, self.item[hc] + 1)
        hist_action = np.where(pad, 0, self.action[hc])
        hist_surface = np.where(pad, 0, self.surface[hc] + 1)
        age_h = (self.req_ts[rows][:, None] - self.ts[hc]) / 3600.0  # as of the request
        hist_age = np.where(pad, 0.0, np.log1p(np.clip(age_h, 0.0, None))).astype(np.float32)
        hist_item_cat = np.where(pad[..., None], 0, self.item_cat[self.item[hc]] + 1)
        t = torch.from_numpy
        return {
            "user": t(u),
            "surface": t(self.surface[rows]),
            "user_cat": t(self.user_cat[u]),
            "user_cont": t(self.user_cont[u]),
            "hist_item": t(hist_item),
            "hist_action": t(hist_action),
            "hist_surface": t(hist_surface),
            "hist_age": t(hist_age),
            "hist_item_cat": t(np.ascontiguousarray(hist_item_cat)),
            "item": t(i),
            "item_cat": t(self.item_cat[i]),
            "item_mh": t(self.item_mh[i]),
            "item_cont": t(self.item_cont[i]),
        }


def aggregate_embeddings(users: np.ndarray, items: np.ndarray, ts: np.ndarray, z: np.ndarray,
                         window_s: int, include_ties: bool = False,
                         req_ts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Causal aggregated user embedding per row (DESIGN.md step 3, the user slot).

    For row r of user u at request time t (``req_ts``, default r's own ts): the mean of z over
    u's rows with t - window_s <= ts < t, excluding every earlier row of the same item as r.
    Rows must be in event order. ``include_ties``: every earlier row (event order) with
    ts >= t - window_s counts, ties and the same request included.
    Returns (agg (N, D) float32, present (N,) bool). O(N log N), float64 sums.
    """
    n, d = z.shape
    pos = np.arange(n)
    req = np.asarray(ts if req_ts is None else req_ts, dtype=np.int64)

    def window_sums(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        # group rows by `keys`, keep event order inside a group; exclusive prefix sums
        order = np.lexsort((pos,) + tuple(reversed(keys)))
        zs = z[order].astype(np.float64)
        csum = np.vstack([np.zeros((1, d)), np.cumsum(zs, axis=0)])  # (N+1, D)
        gkey = np.stack([k[order] for k in keys], axis=1)
        new = np.ones(n, dtype=bool)
        new[1:] = (gkey[1:] != gkey[:-1]).any(axis=1)
        gstart = np.maximum.accumulate(np.where(new, np.arange(n), 0))
        # first row of the group with ts >= t - window (ts is non-decreasing within a group)
        sts = ts[order]
        lo = np.empty(n, dtype=np.int64)
        # searchsorted per group via an offset trick: shift each group's ts into its own band
        gid = np.cumsum(new) - 1
        band = gid.astype(np.float64) * (float(sts.max() - sts.min()) + 2.0 * window_s + 1.0)
        key_ts = band + (sts - sts.min())
        key_req = band + (req[order] - sts.min())  # each row's request time, same band
        lo[:] = np.searchsorted(key_ts, key_req - window_s, side="left")
        lo = np.maximum(lo, gstart)
        p = np.arange(n) if include_ties else np.searchsorted(key_ts, key_req, side="left")
        lo = np.minimum(lo, p)
        sums = csum[p] - csum[lo]  # rows lo..p-1: earlier rows of the group in the window
        counts = p - lo
        out_s = np.empty_like(sums)
        out_c = np.empty_like(counts)
        out_s[order] = sums
        out_c[order] = counts
        return out_s, out_c

    s_user, c_user = window_sums((users,))
    s_pair, c_pair = window_sums((users, items))
    s = s_user - s_pair
    c = c_user - c_pair
    present = c > 0
    agg = np.zeros((n, d), dtype=np.float32)
    agg[present] = (s[present] / c[present][:, None]).astype(np.float32)
    return agg, present
