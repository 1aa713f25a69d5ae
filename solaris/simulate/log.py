"""The replay's request log: one row per served request with its fixed-size candidate list.

Two sources (``build_request_log``):

* a dataset with a request log (the synthetic generator): its requests of the window, as its
  own retrieval stage emitted them;
* a plain interaction log (MovieLens-100K, generic logs): a user's interactions of one time
  bucket form a request whose labelled candidates are the items rated in it; the other slots
  are filled by a causal retrieval stage that reads only interactions strictly before the
  request (``_Retrieval``).

``log_to_table`` / ``log_from_table`` convert to and from Arrow (list columns, so the log
writes to Parquet as is); ``check_causal`` checks what a causal retrieval implies on a built log.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from solaris.data.schema import ITEM, SURFACE, TS, USER, Dataset
from solaris.errors import ConfigError, DataError
from solaris.data.requests import request_times

log = logging.getLogger(__name__)

DAY_S = 86_400
POP_WINDOW_S = 14 * DAY_S  # trailing window of the retrieval's popularity score
COOC_SPAN = 5  # interactions either side in a user's sequence that count as co-occurring
RECENT_ITEMS = 5  # the user's latest items whose co-occurrences the retrieval scores
ALL_TIME_WEIGHT = 1e-3  # all-time popularity: a tie-breaker under the other two scores
CANDIDATES = "candidates"
_META_KEY = b"solaris.replay"


@dataclass
class RequestLog:
    """Requests of the replay window in event order (ts, then user)."""

    user: np.ndarray  # (R,) int64
    ts: np.ndarray  # (R,) int64 event seconds, non-decreasing
    surface: np.ndarray  # (R,) int32
    candidates: np.ndarray  # (R, C) int64, C fixed for the log, no duplicate within a row
    labels: np.ndarray  # (R, C, T) float32: 0/1 where impressed (labelled), NaN elsewhere
    tasks: tuple[str, ...]

    @property
    def num_requests(self) -> int:
        return int(self.ts.shape[0])

    @property
    def num_candidates(self) -> int:
        return int(self.candidates.shape[1])

    @property
    def labelled(self) -> np.ndarray:
        """(R, C) bool: the candidate was impressed and carries labels."""
        return np.isfinite(self.labels[..., 0])

    def slice(self, rows: slice | np.ndarray | list[int]) -> "RequestLog":
        """The requests ``rows`` (a slice, indices or a boolean mask) as a log of their own."""
        if isinstance(rows, (int, np.integer)):
            rows = [int(rows)]
        return RequestLog(user=self.user[rows], ts=self.ts[rows], surface=self.surface[rows],
                          candidates=self.candidates[rows], labels=self.labels[rows],
                          tasks=self.tasks)

    def validate(self) -> None:
        """Check shapes, dtypes, order and labels; raise DataError naming the field."""

        def bad(name: str, msg: str) -> DataError:
            return DataError(f"request log: field {name!r} {msg}")

        ts = np.asarray(self.ts)
        if ts.ndim != 1:
            raise bad("ts", f"must be 1-D, got shape {ts.shape}")
        r = ts.shape[0]
        for name in ("user", "ts", "surface"):
            a = np.asarray(getattr(self, name))
            if a.shape != (r,):
                raise bad(name, f"has shape {a.shape}, expected ({r},)")
            if a.dtype.kind not in "iu":
                raise bad(name, f"must hold integers, got dtype {a.dtype}")
        cand = np.asarray(self.candidates)
        if cand.ndim != 2 or cand.shape[0] != r or cand.shape[1] < 1:
            raise bad("candidates", f"has shape {cand.shape}, expected ({r}, C) with C >= 1")
        if cand.dtype.kind not in "iu":
            raise bad("candidates", f"must hold integers, got dtype {cand.dtype}")
        if not self.tasks:
            raise bad("tasks", "is empty: a log needs at least one task")
        lab = np.asarray(self.labels)
        want = (r, cand.shape[1], len(self.tasks))
        if lab.shape != want:
            raise bad("labels", f"has shape {lab.shape}, expected {want}")
        if lab.dtype.kind != "f":
            raise bad("labels", f"must hold floats, got dtype {lab.dtype}")
        if r == 0:
            return
        step = np.diff(ts)
        if (step < 0).any():
            i = int(np.flatnonzero(step < 0)[0]) + 1
            raise bad("ts", f"is not non-decreasing: row {i} has ts={ts[i]} after {ts[i - 1]}")
        tie = (step == 0) & (np.diff(np.asarray(self.user)) < 0)
        if tie.any():
            i = int(np.flatnonzero(tie)[0]) + 1
            raise bad("user", f"is not in order within equal ts: row {i} (ts={ts[i]})")
        if (cand < 0).any():
            raise bad("candidates", f"holds a negative item id {int(cand.min())}")
        s = np.sort(cand, axis=1)
        dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if dup.any():
            i = int(np.flatnonzero(dup)[0])
            raise bad("candidates", f"row {i} lists an item twice")
        fin = np.isfinite(lab)
        if (~fin & ~np.isnan(lab)).any():
            raise bad("labels", "holds infinite values")
        if not np.isin(lab[fin], (0.0, 1.0)).all():
            raise bad("labels", "holds values other than 0/1 where labelled")
        if (fin != fin[..., :1]).any():
            raise bad("labels", "is labelled for some tasks and NaN for others on one candidate")


def build_request_log(ds: Dataset, start_ts: int, *, num_candidates: int = 100,
                      granularity_s: float = 3600, seed: int = 0,
                      end_ts: int | None = None) -> RequestLog:
    """The requests of ``ds`` with ``start_ts <= ts (< end_ts)``, in event order.

    Where ``ds.requests`` exists, its requests are taken as they are: candidates as listed
    (every row must hold the same number; ``num_candidates`` is not used) and labels where
    the candidate was impressed.

    Otherwise requests are built from the interactions: a user's rows of one time bucket
    (``floor(ts / granularity_s)``, ``solaris.data.requests``: the offline features
    use the same requests) form a request at the bucket's first ts, on that row's
    surface; its labelled candidates are the items rated in the bucket (first occurrence
    kept, with its row's labels), split into several requests of ``num_candidates`` at the
    same ts where there are more. The remaining slots are filled by a causal retrieval that
    reads only interactions strictly before the request's ts (the whole log before the
    window included) and ranks items by

        cooc_share + recent_share + 1e-3 * all_time_share

    where ``cooc_share`` is the item's share of co-occurrences with the user's 5 latest items
    (two items co-occur when one user interacted with both within 5 positions of each other,
    counted from the later of the two rows), ``recent_share`` its share of the interactions in
    the 14 days before ts and ``all_time_share`` its share of all interactions before ts.
    Excluded: items the user interacted with before ts and the labelled items of the user's
    requests at this ts. Items never seen before ts come last (smallest id first), only when
    the seen ones run out; ties go to the smaller item id. The labelled items are then put at
    random positions (``seed``), so position carries no label information.
    """
    if end_ts is not None and end_ts <= start_ts:
        raise ConfigError(f"end_ts={end_ts!r}: must be after start_ts={start_ts!r}")
    if ds.requests is not None:
        out = _from_requests(ds, start_ts, end_ts)
    else:
        if num_candidates < 1:
            raise ConfigError(f"num_candidates={num_candidates!r}: must be >= 1")
        if not granularity_s >= 1:
            raise ConfigError(f"granularity_s={granularity_s!r}: must be >= 1 (seconds)")
        out = _from_interactions(ds, start_ts, end_ts, int(num_candidates), granularity_s, seed)
    out.validate()
    log.info("%s: request log of %d requests x %d candidates (%d labelled)", ds.name,
             out.num_requests, out.num_candidates, int(out.labelled.sum()))
    return out


def _window(ts: np.ndarray, start_ts: int, end_ts: int | None) -> np.ndarray:
    mask = ts >= start_ts
    if end_ts is not None:
        mask &= ts < end_ts
    return mask


def _fixed_lists(col: pa.ChunkedArray | pa.Array, name: str, width: int | None,
                 rows: int) -> tuple[np.ndarray, int]:
    """Values of a list column as (rows, width); every list must hold ``width`` values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        raise DataError(f"column {name!r}: {arr.null_count} null lists")
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    if rows == 0:
        return np.zeros((0, width or 0)), int(width or 0)
    lo, hi = int(lengths.min()), int(lengths.max())
    if lo != hi or (width is not None and lo != width):
        want = f"{width}" if width is not None else "one length"
        raise DataError(f"column {name!r}: rows hold {lo}..{hi} values; the replay needs {want}")
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(rows, lo), lo


def _from_requests(ds: Dataset, start_ts: int, end_ts: int | None) -> RequestLog:
    req = ds.requests
    rows = np.flatnonzero(_window(req.column(TS).to_numpy(), start_ts, end_ts))
    if not len(rows):
        raise DataError(f"{ds.name}: no requests with {start_ts} <= ts"
                        f"{'' if end_ts is None else f' < {end_ts}'}")
    sub = req.take(pa.array(rows))
    users = sub.column(USER).to_numpy().astype(np.int64)
    ts = sub.column(TS).to_numpy().astype(np.int64)
    order = np.lexsort((sub.column("request_id").to_numpy(), users, ts))
    r = len(rows)
    cand, c = _fixed_lists(sub.column(CANDIDATES), f"requests.{CANDIDATES}", None, r)
    shown, _ = _fixed_lists(sub.column("impressed"), "requests.impressed", c, r)
    labels = np.empty((r, c, len(ds.tasks)), np.float32)
    for j, t in enumerate(ds.tasks):
        y, _ = _fixed_lists(sub.column(f"label_{t}"), f"requests.label_{t}", c, r)
        labels[..., j] = np.where(shown.astype(bool), y, np.nan)
    return RequestLog(user=users[order], ts=ts[order],
                      surface=sub.column(SURFACE).to_numpy().astype(np.int32)[order],
                      candidates=cand.astype(np.int64)[order], labels=labels[order],
                      tasks=tuple(ds.tasks))


class _History:
    """Each user's interactions in event order, read as of a time."""

    def __init__(self, users: np.ndarray, items: np.ndarray, ts: np.ndarray):
        self.order = np.lexsort((np.arange(len(ts)), users))  # by user, then event order
        self.user, self.item, self.ts = users[self.order], items[self.order], ts[self.order]

    def past_items(self, user: int, t: int) -> np.ndarray:
        """The user's items of rows strictly before ``t``, in event order."""
        s0 = int(np.searchsorted(self.user, user, side="left"))
        s1 = int(np.searchsorted(self.user, user, side="right"))
        k = s0 + int(np.searchsorted(self.ts[s0:s1], t, side="left"))
        assert k == s0 or self.ts[k - 1] < t
        return self.item[s0:k]


class _Retrieval:
    """The causal retrieval of ``build_request_log``, queried in event order.

    Popularity is kept as running counts (rows enter when their ts < the request's ts, leave
    the trailing window 14 days later); co-occurrences are a time-stamped sparse matrix (one
    CSR row per source item, entries sorted by the time the pair came to exist), read up to
    the request's ts. Nothing at or after the request's ts is read.
    """

    def __init__(self, users: np.ndarray, items: np.ndarray, ts: np.ndarray, num_items: int):
        self.items, self.ts, self.num_items = items, ts, num_items
        self.history = _History(users, items, ts)
        order = self.history.order
        src, dst, when = [], [], []
        for d in range(1, COOC_SPAN + 1):
            a, b = order[:-d], order[d:]
            keep = (users[a] == users[b]) & (items[a] != items[b])
            a, b = a[keep], b[keep]
            t = ts[b]  # b is the later row: the pair exists from its time on
            src += [items[a], items[b]]
            dst += [items[b], items[a]]
            when += [t, t]
        src = np.concatenate(src) if src else np.zeros(0, np.int64)
        dst = np.concatenate(dst) if dst else np.zeros(0, np.int64)
        when = np.concatenate(when) if when else np.zeros(0, np.int64)
        o = np.lexsort((when, src))
        self.nbr, self.nbr_ts = dst[o], when[o]
        self.indptr = np.searchsorted(src[o], np.arange(num_items + 1), side="left")
        self.pop_all = np.zeros(num_items, np.int64)
        self.pop_recent = np.zeros(num_items, np.int64)
        self._hi = 0  # rows [0, _hi) counted in pop_all
        self._lo = 0  # rows [0, _lo) have left the trailing window
        self._t = None

    def _advance(self, t: int) -> None:
        assert self._t is None or t >= self._t, "requests must come in event order"
        self._t = t
        hi = int(np.searchsorted(self.ts, t, side="left"))
        np.add.at(self.pop_all, self.items[self._hi:hi], 1)
        np.add.at(self.pop_recent, self.items[self._hi:hi], 1)
        self._hi = hi
        lo = min(int(np.searchsorted(self.ts, t - POP_WINDOW_S, side="left")), hi)
        np.add.at(self.pop_recent, self.items[self._lo:lo], -1)
        self._lo = max(self._lo, lo)
        assert hi == 0 or self.ts[hi - 1] < t

    def __call__(self, user: int, t: int, exclude: np.ndarray, m: int) -> np.ndarray:
        """The ``m`` best items for ``user`` at ``t``, best first, none of ``exclude``."""
        self._advance(t)
        past = self.history.past_items(user, t)
        if m == 0:
            return np.zeros(0, np.int64)
        parts = []
        for j in past[-RECENT_ITEMS:]:
            a, b = self.indptr[j], self.indptr[j + 1]
            end = a + int(np.searchsorted(self.nbr_ts[a:b], t, side="left"))
            parts.append(self.nbr[a:end])
        co = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        cooc = np.bincount(co, minlength=self.num_items).astype(np.float64)
        score = (cooc / max(cooc.sum(), 1.0)
                 + self.pop_recent / max(int(self.pop_recent.sum()), 1)
                 + ALL_TIME_WEIGHT * self.pop_all / max(int(self.pop_all.sum()), 1))
        score[self.pop_all == 0] = -1.0  # never seen before t: only when the seen run out
        score[past] = -np.inf
        score[exclude] = -np.inf
        ok = int(np.isfinite(score).sum())
        if ok < m:
            raise DataError(f"retrieval for user {user} at ts={t}: {ok} eligible items, "
                            f"{m} needed; lower num_candidates")
        part = np.argpartition(-score, m - 1)[:m]
        v = score[part].min()
        above = np.flatnonzero(score > v)
        above = above[np.lexsort((above, -score[above]))]
        ties = np.flatnonzero(score == v)[: m - len(above)]
        return np.concatenate([above, ties]).astype(np.int64)


def _from_interactions(ds: Dataset, start_ts: int, end_ts: int | None, c: int,
                       granularity_s: float, seed: int) -> RequestLog:
    inter = ds.interactions
    ts = inter.column(TS).to_numpy().astype(np.int64)
    users = inter.column(USER).to_numpy().astype(np.int64)
    items = inter.column(ITEM).to_numpy().astype(np.int64)
    surf = inter.column(SURFACE).to_numpy().astype(np.int32)
    y = np.stack([inter.column(t).to_numpy(zero_copy_only=False) for t in ds.tasks],
                 1).astype(np.float32)
    hi = len(ts) if end_ts is None else int(np.searchsorted(ts, end_ts, side="left"))
    # one request definition with the offline features (solaris/features.py): a user's rows
    # of one bucket, at the bucket's first ts; a bucket that starts before the window is not
    # part of it
    req = request_times(users[:hi], ts[:hi], int(granularity_s))
    rows = np.flatnonzero(req >= start_ts)
    if len(rows) == 0:
        raise DataError(f"{ds.name}: no interactions with {start_ts} <= ts"
                        f"{'' if end_ts is None else f' < {end_ts}'}")
    o = rows[np.lexsort((rows, req[rows], users[rows]))]  # by user, request, event order
    cut = np.flatnonzero((np.diff(users[o]) != 0) | (np.diff(req[o]) != 0)) + 1
    specs = []  # (ts, user, chunk, labelled rows, surface)
    for g in np.split(o, cut):
        _, first = np.unique(items[g], return_index=True)
        lab = g[np.sort(first)]
        for k in range(0, len(lab), c):
            specs.append((int(req[g[0]]), int(users[g[0]]), k, lab[k:k + c], int(surf[g[0]])))
    specs.sort(key=lambda s: (s[0], s[1], s[2]))
    same_time: dict[tuple[int, int], list[np.ndarray]] = {}
    for s in specs:
        same_time.setdefault((s[0], s[1]), []).append(items[s[3]])

    retrieve = _Retrieval(users[:hi], items[:hi], ts[:hi], ds.num_items)
    rng = np.random.default_rng(seed)
    r = len(specs)
    cand = np.empty((r, c), np.int64)
    labels = np.full((r, c, len(ds.tasks)), np.nan, np.float32)
    for i, (t, u, _, lab, _) in enumerate(specs):
        exclude = np.concatenate(same_time[(t, u)])
        got = retrieve(u, t, exclude, c - len(lab))
        pos = rng.permutation(c)[: len(lab)]  # fixed draws per request: prefixes reproduce
        free = np.ones(c, bool)
        free[pos] = False
        cand[i, pos] = items[lab]
        cand[i, free] = got
        labels[i, pos] = y[lab]
    return RequestLog(user=np.array([s[1] for s in specs], np.int64),
                      ts=np.array([s[0] for s in specs], np.int64),
                      surface=np.array([s[4] for s in specs], np.int32),
                      candidates=cand, labels=labels, tasks=tuple(ds.tasks))


def check_causal(request_log: RequestLog, ds: Dataset) -> None:
    """Check, on a log built from ``ds``'s interactions, what a causal retrieval implies.

    For every request, no retrieved (unlabelled) candidate is an item its user interacted
    with before ts, and an item never seen before ts is retrieved only once every item seen
    before ts (and not excluded) is already in the list. Raises DataError naming the request.
    """
    inter = ds.interactions
    ts = inter.column(TS).to_numpy().astype(np.int64)
    items = inter.column(ITEM).to_numpy().astype(np.int64)
    history = _History(inter.column(USER).to_numpy().astype(np.int64), items, ts)
    first_seen = np.full(ds.num_items, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_seen, items, ts)
    lab = request_log.labelled
    key = np.stack([request_log.ts, request_log.user], 1)
    for i in range(request_log.num_requests):
        t, u = int(request_log.ts[i]), int(request_log.user[i])
        got = request_log.candidates[i][~lab[i]]
        past = history.past_items(u, t)
        if np.isin(got, past).any():
            bad = got[np.isin(got, past)][:5].tolist()
            raise DataError(f"request {i} (user {u}, ts {t}): retrieved items {bad} the user "
                            "had interacted with before ts")
        unseen = got[first_seen[got] >= t]
        if len(unseen):
            same = (key[:, 0] == t) & (key[:, 1] == u)
            mates = request_log.candidates[same][lab[same]]
            seen = np.flatnonzero(first_seen < t)
            left = np.setdiff1d(seen, np.concatenate([request_log.candidates[i], past, mates]))
            if len(left):
                raise DataError(f"request {i} (user {u}, ts {t}): retrieved item "
                                f"{int(unseen[0])}, unseen before ts, while {len(left)} items "
                                "seen before ts were left out")


def log_schema(tasks: tuple[str, ...]) -> pa.Schema:
    """Arrow schema of a request log table (``log_to_table``)."""
    fields = [pa.field(USER, pa.int64(), nullable=False),
              pa.field(TS, pa.int64(), nullable=False),
              pa.field(SURFACE, pa.int32(), nullable=False),
              pa.field(CANDIDATES, pa.list_(pa.int64()), nullable=False)]
    fields += [pa.field(f"label_{t}", pa.list_(pa.float32()), nullable=False) for t in tasks]
    return pa.schema(fields)


def log_to_table(request_log: RequestLog) -> pa.Table:
    """The log as an Arrow table: one row per request, candidates and labels as lists (NaN
    where not labelled); tasks and C ride along in the schema metadata."""
    request_log.validate()
    r, c = request_log.candidates.shape
    if r * c >= 2**31:
        raise DataError(f"request log of {r} x {c} candidates: too large for one table")
    offsets = pa.array(np.arange(r + 1, dtype=np.int64) * c, pa.int32())

    def lists(values: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), typ))

    cols = [pa.array(request_log.user, pa.int64()), pa.array(request_log.ts, pa.int64()),
            pa.array(request_log.surface, pa.int32()),
            lists(request_log.candidates.astype(np.int64), pa.int64())]
    cols += [lists(np.ascontiguousarray(request_log.labels[..., j], np.float32), pa.float32())
             for j in range(len(request_log.tasks))]
    meta = {_META_KEY: json.dumps({"tasks": list(request_log.tasks),
                                   "num_candidates": c}).encode()}
    schema = log_schema(request_log.tasks).with_metadata(meta)
    return pa.Table.from_arrays(cols, schema=schema)


def log_from_table(table: pa.Table) -> RequestLog:
    """Inverse of ``log_to_table`` (also reads a table without its metadata: tasks from the
    ``label_<task>`` columns, C from the lists)."""
    meta = table.schema.metadata or {}
    if _META_KEY in meta:
        info = json.loads(meta[_META_KEY])
        tasks, c = tuple(info["tasks"]), int(info["num_candidates"])
    else:
        tasks = tuple(n[len("label_"):] for n in table.column_names if n.startswith("label_"))
        c = None
    for name in (USER, TS, SURFACE, CANDIDATES, *(f"label_{t}" for t in tasks)):
        if name not in table.column_names:
            raise DataError(f"request log table lacks column {name!r}")
    r = table.num_rows
    cand, c = _fixed_lists(table.column(CANDIDATES), CANDIDATES, c, r)
    labels = np.empty((r, c, len(tasks)), np.float32)
    for j, t in enumerate(tasks):
        labels[..., j], _ = _fixed_lists(table.column(f"label_{t}"), f"label_{t}", c, r)
    out = RequestLog(user=table.column(USER).to_numpy().astype(np.int64),
                     ts=table.column(TS).to_numpy().astype(np.int64),
                     surface=table.column(SURFACE).to_numpy().astype(np.int32),
                     candidates=cand.astype(np.int64), labels=labels, tasks=tasks)
    out.validate()
    return out


def row_index(ds: Dataset, users: np.ndarray, items: np.ndarray, req_ts: np.ndarray,
              within_s: float) -> np.ndarray:
    """For each labelled replay pair (user, item, request time): the interaction row it came
    from -- the first row of that (user, item) at or after the request time and less than
    ``within_s`` later (a synthetic request's rows share its time; a MovieLens request
    gathers a user's ratings of one time bucket). -1 where none."""
    t = ds.interactions
    u = t.column(USER).to_numpy().astype(np.int64)
    i = t.column(ITEM).to_numpy().astype(np.int64)
    ts = t.column(TS).to_numpy().astype(np.int64)
    order = np.lexsort((ts, i, u))
    key = np.stack([u[order], i[order], ts[order]], 1)
    q = np.stack([np.asarray(users, np.int64), np.asarray(items, np.int64),
                  np.asarray(req_ts, np.int64)], 1)
    # lexicographic searchsorted via a structured view
    dt = np.dtype([("u", np.int64), ("i", np.int64), ("t", np.int64)])
    kv = np.ascontiguousarray(key).view(dt).ravel()
    qv = np.ascontiguousarray(q).view(dt).ravel()
    pos = np.searchsorted(kv, qv, side="left")
    ok = pos < len(kv)
    at = np.minimum(pos, len(kv) - 1)
    ok &= (key[at, 0] == q[:, 0]) & (key[at, 1] == q[:, 1]) & (key[at, 2] - q[:, 2] < within_s)
    return np.where(ok, order[at], -1)
