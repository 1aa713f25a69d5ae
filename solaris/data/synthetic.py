"""The embedded default dataset: a seeded synthetic recommendation log.

``generate`` builds it in memory (up to a few million rows); ``generate_to_parquet`` streams
the same rows to a directory in chunks (10M+ rows never sit in memory at once) and
``load_parquet_dir`` reads such a directory back. Same seed, same config: identical rows.

What the data hides, and why (DESIGN.md, Data): the static world is in ``synthetic_world.py``
(users, items, features), the event-time process in ``synthetic_stream.py`` (drifting
interests, bursty sessions on several surfaces, retrieval, impressions, labels).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from solaris import atomic
from solaris.config import SyntheticConfig
from solaris.data.schema import (ITEM, RAW_ID, USER, Dataset, FeatureSpec, interaction_schema,
                                 request_schema)
from solaris.data.synthetic_stream import TASKS, calibrate, iter_windows
from solaris.data.synthetic_world import World, build_world
from solaris.errors import DataError

log = logging.getLogger(__name__)

NAME = "synthetic"
FORMAT_VERSION = 1
INTERACTIONS, REQUESTS = "interactions.parquet", "requests.parquet"
USERS, ITEMS, META = "users.parquet", "items.parquet", "meta.json"
MAX_BUFFERED_CANDIDATES = 40_000_000  # flush early when the buffered request log holds more


def build(cfg: SyntheticConfig) -> World:
    """The static world of ``cfg`` with its click / conversion biases fitted."""
    return calibrate(build_world(cfg))


def generate(cfg: SyntheticConfig) -> Dataset:
    """The whole dataset in memory (interactions, request log, users, items)."""
    world = build(cfg)
    inters, reqs = [], []
    for inter, req in iter_windows(world):
        inters.append(inter)
        reqs.append(req)
    ds = Dataset(name=NAME, interactions=pa.concat_tables(inters).combine_chunks(),
                 users=world.users, items=world.items, tasks=TASKS, spec=world.spec,
                 requests=pa.concat_tables(reqs).combine_chunks())
    ds.validate()
    log.info("synthetic: %d interactions, %d requests, %d users, %d items",
             ds.interactions.num_rows, ds.requests.num_rows, ds.num_users, ds.num_items)
    return ds


def generate_to_parquet(cfg: SyntheticConfig, out_dir: str | Path,
                        progress: Callable[[int], None] | None = None) -> dict:
    """Stream the dataset to ``out_dir`` in chunks of about ``cfg.chunk_rows`` interactions.

    Writes interactions, requests, users and items Parquet files, then ``meta.json`` last (a
    directory without it is incomplete). ``progress`` gets the interaction rows written so
    far. Returns the metadata written to ``meta.json``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = build(cfg)
    pq.write_table(world.users, out / USERS)
    pq.write_table(world.items, out / ITEMS)
    written = {"interactions": 0, "requests": 0}
    positives = {t: 0.0 for t in TASKS}
    buf_i: list[pa.Table] = []
    buf_r: list[pa.Table] = []
    with pq.ParquetWriter(out / INTERACTIONS, interaction_schema(TASKS)) as w_inter, \
            pq.ParquetWriter(out / REQUESTS, request_schema(TASKS)) as w_req:

        def flush() -> None:
            inter, req = pa.concat_tables(buf_i), pa.concat_tables(buf_r)
            buf_i.clear()
            buf_r.clear()
            w_inter.write_table(inter, row_group_size=cfg.chunk_rows)
            w_req.write_table(req, row_group_size=cfg.chunk_rows)
            written["interactions"] += inter.num_rows
            written["requests"] += req.num_rows
            for t in TASKS:
                positives[t] += float(np.sum(inter.column(t).to_numpy()))
            log.debug("synthetic: %d interactions written", written["interactions"])
            if progress is not None:
                progress(written["interactions"])

        rows = candidates = 0
        for inter, req in iter_windows(world):
            buf_i.append(inter)
            buf_r.append(req)
            rows += inter.num_rows
            candidates += req.num_rows * cfg.candidates_per_request
            # the request log is the big one (a candidate list per request): bound it too
            if rows >= cfg.chunk_rows or candidates >= MAX_BUFFERED_CANDIDATES:
                flush()
                rows = candidates = 0
        if buf_i:
            flush()
    n = max(written["interactions"], 1)
    meta = {
        "format": FORMAT_VERSION,
        "name": NAME,
        "tasks": list(TASKS),
        "spec": world.spec.to_dict(),
        "counts": {**written, "users": world.users.num_rows, "items": world.items.num_rows},
        "rates": {t: positives[t] / n for t in TASKS},
        "config": dataclasses.asdict(cfg),
    }
    atomic.save_text(out / META, json.dumps(meta, indent=2) + "\n")
    log.info("synthetic: wrote %d interactions to %s", written["interactions"], out)
    return meta


def _side_schema(key: str, spec: FeatureSpec, user: bool) -> pa.Schema:
    """Schema of a user or item table under ``spec`` (see schema.py conventions)."""
    fields = [pa.field(key, pa.int64()), pa.field(RAW_ID, pa.int64())]
    cat = spec.user_categorical if user else spec.item_categorical
    fields += [pa.field(c, pa.int64()) for c in cat]
    if not user:
        fields += [pa.field(c, pa.list_(pa.int64())) for c in spec.item_multihot]
    cont = spec.user_continuous if user else spec.item_continuous
    fields += [pa.field(c, pa.float32()) for c in cont]
    return pa.schema(fields)


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    """Read ``path`` and conform it to ``schema``; DataError names the file and column."""
    if not path.is_file():
        raise DataError(f"{path}: file missing")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from e
    cols = []
    for f in schema:
        if f.name not in table.column_names:
            raise DataError(f"{path}: missing column {f.name!r}")
        col = table.column(f.name)
        if col.null_count and not f.nullable:
            raise DataError(f"{path}: column {f.name!r} holds {col.null_count} nulls")
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(f"{path}: column {f.name!r} has type {col.type}, "
                                f"expected {f.type}") from e
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def _check_side(path: Path, table: pa.Table, key: str, cards: dict[str, int]) -> None:
    ids = table.column(key).to_numpy()
    if not np.array_equal(ids, np.arange(len(ids))):
        raise DataError(f"{path}: column {key!r} is not the dense codes 0..{len(ids) - 1}")
    for col, card in cards.items():
        v = table.column(col).combine_chunks()
        if isinstance(v, pa.ListArray):
            v = v.flatten()
        v = v.to_numpy()
        if len(v) and (v.min() < 0 or v.max() >= card):
            raise DataError(f"{path}: column {col!r} holds codes outside 0..{card - 1}")


def load_parquet_dir(path: str | Path) -> Dataset:
    """Read a directory written by ``generate_to_parquet`` back into a Dataset."""
    root = Path(path)
    meta_path = root / META
    if not meta_path.is_file():
        raise DataError(f"{meta_path}: file missing (not a generate_to_parquet directory?)")
    try:
        meta = json.loads(meta_path.read_text())
        tasks = tuple(str(t) for t in meta["tasks"])
        spec = FeatureSpec.from_dict(meta["spec"])
        name = str(meta.get("name", NAME))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{meta_path}: malformed metadata ({e!r})") from e
    users = _read(root / USERS, _side_schema(USER, spec, user=True))
    items = _read(root / ITEMS, _side_schema(ITEM, spec, user=False))
    _check_side(root / USERS, users, USER, spec.user_categorical)
    _check_side(root / ITEMS, items, ITEM, {**spec.item_categorical, **spec.item_multihot})
    inter = _read(root / INTERACTIONS, interaction_schema(tasks)).combine_chunks()
    req = _read(root / REQUESTS, request_schema(tasks)).combine_chunks()
    ds = Dataset(name=name, interactions=inter, users=users, items=items, tasks=tasks,
                 spec=spec, requests=req)
    ds.validate()
    return ds
