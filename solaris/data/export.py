"""Any loaded dataset written as a generic log (``solaris.data.generic``): the format a team's
own logs come in, and a check that the generic path reads what the native loaders read.

``export_generic(ds, out)`` writes ``out/<name>.parquet`` (an impression log -- one row per
request candidate with request id, shown flag and labels -- where the dataset has requests,
else an interaction log), ``users.parquet``, ``items.parquet`` and ``mapping.yaml``.
``load_generic_yaml(out)`` gives ``ds`` back: the same codes, row order (the ``seq`` column
is the mapping's ``order``), side features (already coded and scaled: the mapping's
``codes`` and ``scaled``), requests and tasks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from solaris import atomic
from solaris.data.schema import ITEM, RAW_ID, SEQ, SURFACE, TS, USER, Dataset
from solaris.errors import DataError

REQUEST, SHOWN = "request_id", "shown"


def _side(table: pa.Table, raw: np.ndarray, categorical: dict[str, int],
          continuous: tuple[str, ...], multihot: dict[str, int]) -> tuple[pa.Table, dict]:
    cols = {RAW_ID: pa.array(raw.tolist())}
    for c in (*categorical, *continuous, *multihot):
        cols[c] = table.column(c)
    feats: dict = {"key": RAW_ID}
    if categorical:
        feats["categorical"] = list(categorical)
    if continuous:
        feats["scaled"] = list(continuous)
    if multihot:
        feats["multihot"] = {c: None for c in multihot}
    codes = {**categorical, **multihot}
    if codes:
        feats["codes"] = {c: int(n) for c, n in codes.items()}
    return pa.table(cols), feats


def _label_col(task: str) -> str:
    return f"label_{task}"


def opaque_ids(raw: np.ndarray, prefix: str) -> np.ndarray:
    """Raw ids as strings ``prefix`` + 12 hex digits of a hash: distinct, stable, and in an
    order unrelated to the raw ids' (a re-key that does not preserve order)."""
    out = np.array([prefix + hashlib.blake2b(str(x).encode(), digest_size=6).hexdigest()
                    for x in raw.tolist()], dtype=object)
    if len(set(out.tolist())) != len(out):
        raise DataError(f"{prefix}: two ids hash alike; export without string ids")
    return out


def export_generic(ds: Dataset, out: str | Path, string_ids: bool = False) -> Path:
    """Write ``ds`` as a generic log directory; returns the path of its ``mapping.yaml``.
    ``string_ids``: the user and item ids as ``opaque_ids`` (the log reads back with the
    same codes: the side tables list ids in code order)."""
    import yaml

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inter = ds.interactions
    user_raw = ds.users.column(RAW_ID).to_numpy(zero_copy_only=False)
    item_raw = ds.items.column(RAW_ID).to_numpy(zero_copy_only=False)
    if string_ids:
        user_raw, item_raw = opaque_ids(user_raw, "user-"), opaque_ids(item_raw, "item-")
    u = inter.column(USER).to_numpy()
    i = inter.column(ITEM).to_numpy()
    ts = inter.column(TS).to_numpy()
    surface = inter.column(SURFACE).to_numpy()
    seq = inter.column(SEQ).to_numpy()
    labels = {t: inter.column(t).to_numpy() for t in ds.tasks}
    mapping: dict = {"user": "user", "item": "item", "timestamp": "ts",
                     "labels": {t: _label_col(t) for t in ds.tasks}, "order": "seq"}
    if ds.spec.num_surfaces > 1:
        mapping["surface"] = "surface"
    if ds.requests is None:
        cols = {"user": user_raw[u], "item": item_raw[i], "ts": ts, "surface": surface,
                "seq": seq.astype(np.int64),
                **{_label_col(t): labels[t] for t in ds.tasks}}
    else:
        cols = _impressions(ds, user_raw, item_raw, u, i, ts, seq)
        mapping["request"], mapping["shown"] = REQUEST, SHOWN
    if ds.spec.num_surfaces == 1:
        cols.pop("surface")
    name = f"{ds.name}.parquet"
    pq.write_table(pa.table(cols), out / name)
    spec = ds.spec
    users, mapping["user_features"] = _side(ds.users, user_raw, spec.user_categorical,
                                            spec.user_continuous, {})
    items, mapping["item_features"] = _side(ds.items, item_raw, spec.item_categorical,
                                            spec.item_continuous, spec.item_multihot)
    pq.write_table(users, out / "users.parquet")
    pq.write_table(items, out / "items.parquet")
    doc = {"interactions": name, "users": "users.parquet", "items": "items.parquet",
           "mapping": mapping}
    path = out / "mapping.yaml"
    atomic.save_text(path, yaml.safe_dump(doc, sort_keys=False))
    return path


def _impressions(ds: Dataset, user_raw: np.ndarray, item_raw: np.ndarray, u: np.ndarray,
                 i: np.ndarray, ts: np.ndarray, seq: np.ndarray) -> dict[str, np.ndarray]:
    """One row per request candidate; a shown row carries its interaction's ``seq``."""
    req = ds.requests
    lengths = pc.list_value_length(req.column("candidates")).to_numpy(zero_copy_only=False)
    rid = np.repeat(req.column("request_id").to_numpy(), lengths)
    ru = np.repeat(req.column(USER).to_numpy(), lengths)
    rts = np.repeat(req.column(TS).to_numpy(), lengths)
    rsurf = np.repeat(req.column(SURFACE).to_numpy(), lengths)
    item = req.column("candidates").combine_chunks().flatten().to_numpy()
    shown = req.column("impressed").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    # each shown candidate's interaction row, by (user, item, ts)
    dt = np.dtype([("u", np.int64), ("i", np.int64), ("t", np.int64)])

    def keys(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.stack([a, b, c], 1).astype(np.int64)).view(dt).ravel()

    k_int = keys(u, i, ts)
    order = np.argsort(k_int, kind="stable")
    k_sorted = k_int[order]
    if len(k_sorted) > 1 and (k_sorted[1:] == k_sorted[:-1]).any():
        raise DataError(f"{ds.name}: two interactions share (user, item, ts): the impression "
                        "log cannot tell them apart")
    k_shown = keys(ru[shown], item[shown], rts[shown])
    pos = np.searchsorted(k_sorted, k_shown)
    ok = (pos < len(k_sorted)) & (k_sorted[np.minimum(pos, len(k_sorted) - 1)] == k_shown)
    if not ok.all() or ok.sum() != len(k_int):
        raise DataError(f"{ds.name}: the requests' shown candidates and the interactions "
                        f"differ ({int(ok.sum())} of {int(shown.sum())} shown found, "
                        f"{len(k_int)} interactions)")
    row = order[pos]
    seq_col = np.full(len(item), -1, np.int64)
    seq_col[shown] = seq[row]
    out = {REQUEST: rid.astype(np.int64), "user": user_raw[ru], "item": item_raw[item],
           "ts": rts.astype(np.int64), "surface": rsurf.astype(np.int64),
           SHOWN: shown.astype(np.int8), "seq": seq_col}
    for t in ds.tasks:
        y = np.full(len(item), np.nan, np.float32)
        y[shown] = ds.interactions.column(t).to_numpy()[row]
        out[_label_col(t)] = y
    return out
