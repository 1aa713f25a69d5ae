"""KNN tables (DESIGN.md step 7): build, check, publish, read, and the live cold-start index.

Build: embeddings are L2-normalised so inner product is cosine similarity. Below
``KnnConfig.exact_max`` rows the index is exact (``IndexFlatIP``); at or above it an IVF index
(``IndexIVFFlat``, about 4 sqrt(n) lists, k-means on a sample) whose ``nprobe`` is doubled
until recall@10 on one set of random queries reaches ``min_recall + recall_margin``; a second,
fresh set of queries then measures the recall that is reported and checked (tie-aware: a
returned neighbour as similar as the exact 10th counts, so users with identical embeddings
do not fail a build). Each row's neighbours exclude the row itself.

Publish: a versioned Parquet table (``id``, ``nbr`` and ``sim`` as fixed-width lists, nearest
first) and the serialised faiss index go under ``{uri}/{kind}/`` through ``pyarrow.fs``,
each written to a temporary name and moved into place; then the small JSON pointer
``{uri}/{kind}/CURRENT`` is swapped the same way. A reader follows the pointer to an
immutable file, so it sees the old table or the new one, never a partial one; the last
``keep_versions`` versions stay on storage for readers holding an older pointer. A build
whose recall is below ``min_recall`` is refused before anything is written.

Each table records what it was built from (``solaris.knn.provenance.BuiltFrom``: the FM
version and the id map's digest) in its Parquet metadata and its pointer; an app serves only
the tables built from an FM version it serves.

Read: ``current_version(uri)`` reads only the pointer (cheap enough to poll);
``load_current(uri)`` returns the ``solaris.online.enrich.NeighbourTable`` the router's enrichment
consumes; ``load_live(uri)`` the ``LiveIndex`` that answers cold-start queries for users the
table does not hold.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from solaris.atomic import filesystem, save_on
from solaris.cache.snapshot import write_snapshot
from solaris.config import KnnConfig
from solaris.knn.neighbours import NeighbourTable
from solaris.knn.provenance import BuiltFrom
from solaris.errors import DataError, RequestError

log = logging.getLogger(__name__)

FORMAT = 1
POINTER = "CURRENT"
KINDS = ("user", "item")
_META = b"solaris_knn"
Progress = Callable[[int, int], None]  # (rows done, rows in all)


# ---- vectors and indexes -------------------------------------------------------------------------
def normalise(x: np.ndarray) -> np.ndarray:
    """(n, d) float32 C-contiguous copy of ``x`` with unit rows (zero rows stay zero)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] < 1 or x.dtype.kind not in "fiu":
        raise DataError(f"embeddings: expected a numeric (n, d) array, got shape {x.shape} "
                        f"dtype {x.dtype}")
    x = np.array(x, dtype=np.float32, order="C")
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise DataError(f"embeddings: row {bad} holds a non-finite value")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.divide(x, norms, out=x, where=norms > 0)
    return x


def build_index(x: np.ndarray, cfg: KnnConfig) -> faiss.Index:
    """An inner-product index over normalised rows ``x``: exact below ``cfg.exact_max`` rows,
    else IVF (``nprobe`` still to be tuned, see ``tune_nprobe``)."""
    n, d = x.shape
    if n < cfg.exact_max:
        index = faiss.IndexFlatIP(d)
        index.add(x)
        return index
    nlist = cfg.nlist or int(round(4 * math.sqrt(n)))
    nlist = max(1, min(nlist, n // 39))  # k-means needs ~39 points per centroid
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    sample = min(n, cfg.train_per_list * nlist)
    rng = np.random.default_rng(cfg.seed)
    rows = np.sort(rng.choice(n, sample, replace=False)) if sample < n else slice(None)
    index.train(x[rows])
    index.add(x)
    index.nprobe = min(8, nlist, cfg.max_nprobe)
    return index


def index_name(index: faiss.Index) -> str:
    """A short description of ``index``: ``flat_ip`` or ``ivf<nlist>_flat_ip(nprobe=<p>)``."""
    if isinstance(index, faiss.IndexIVF):
        return f"ivf{index.nlist}_flat_ip(nprobe={index.nprobe})"
    if isinstance(index, faiss.IndexFlat):
        return "flat_ip"
    return type(index).__name__


def search(index: faiss.Index, q: np.ndarray, k: int, self_rows: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Rows (m, k) int64 (-1 pad) and cosine similarities (m, k) float32 of the k nearest
    rows to each normalised query; with ``self_rows`` (m,) each query's own row is skipped
    (when the search did not return it, the (k+1)-th result is dropped instead)."""
    if self_rows is None:
        sims, rows = index.search(q, k)
        return rows.astype(np.int64), sims.astype(np.float32)
    sims, rows = index.search(q, k + 1)  # (m, k+1) each
    is_self = rows == np.asarray(self_rows, np.int64)[:, None]  # (m, k+1)
    is_self[~is_self.any(axis=1), -1] = True
    keep = np.argsort(is_self, axis=1, kind="stable")[:, :k]  # (m, k): the others, in order
    return (np.take_along_axis(rows, keep, 1).astype(np.int64),
            np.take_along_axis(sims, keep, 1).astype(np.float32))


def _truth(x: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """(m,) similarity of each query row's exact k-th nearest other row (brute force)."""
    exact = faiss.IndexFlatIP(x.shape[1])
    exact.add(x)
    return search(exact, x[queries], k, queries)[1][:, k - 1]


def _recall(index: faiss.Index, x: np.ndarray, queries: np.ndarray, kth: np.ndarray,
            k: int) -> float:
    """Tie-aware recall@k: a returned row counts when it is as similar as the exact k-th
    (among equally similar rows any choice is right: cold users with equal features tie)."""
    rows, sims = search(index, x[queries], k, queries)
    hits = ((rows >= 0) & (sims >= kth[:, None] - 1e-5)).sum(axis=1)
    return float(np.mean(np.minimum(hits, k) / k))


def recall_at_10(index: faiss.Index, x: np.ndarray, queries: np.ndarray) -> float:
    """Mean share of each query row's 10 nearest other rows (exact search, ties counted as
    equally right) that ``index`` returns in its 10 nearest, self excluded on both sides;
    ``x`` normalised as indexed, ``queries`` row indices."""
    queries = np.asarray(queries, np.int64)
    if queries.ndim != 1 or not len(queries) or queries.min() < 0 or queries.max() >= len(x):
        raise RequestError(f"queries: expected row indices within 0..{len(x) - 1}")
    k = min(10, len(x) - 1)
    if k < 1:
        return 1.0
    return _recall(index, x, queries, _truth(x, queries, k), k)


def _queries(n: int, m: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(n, size=min(n, m), replace=False)


def tune_nprobe(index: faiss.Index, x: np.ndarray, cfg: KnnConfig) -> int:
    """Double an IVF index's ``nprobe`` until recall@10 on ``cfg.recall_queries`` random rows
    reaches ``min_recall + recall_margin`` (or ``max_nprobe`` / every list); returns it."""
    if not isinstance(index, faiss.IndexIVF):
        return 0
    target = min(1.0, cfg.min_recall + cfg.recall_margin)
    q = _queries(len(x), cfg.recall_queries, cfg.seed + 1)  # not the reported check's queries
    k = min(10, len(x) - 1)
    kth = _truth(x, q, k)
    top = min(cfg.max_nprobe, index.nlist)
    while True:
        r = _recall(index, x, q, kth, k)
        log.info("knn: nprobe=%d recall@10=%.4f (target %.3f)", index.nprobe, r, target)
        if r >= target or index.nprobe >= top:
            return index.nprobe
        index.nprobe = min(top, index.nprobe * 2)


def neighbours(index: faiss.Index, x: np.ndarray, k: int, batch: int = 4096,
               progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every row's k nearest other rows: (rows (n, k) int64, -1 pad; sims (n, k) float32)."""
    n = len(x)
    rows = np.full((n, k), -1, np.int64)
    sims = np.zeros((n, k), np.float32)
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        rows[lo:hi], sims[lo:hi] = search(index, x[lo:hi], k, np.arange(lo, hi))
        if progress is not None:
            progress(hi, n)
    return rows, sims


# ---- the built table and the live index ----------------------------------------------------------
def new_version(clock: Callable[[], float] = time.time) -> str:
    """A fresh version name that sorts by build time: ``YYYYmmddTHHMMSSZ-<6 hex>``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock())) + "-" + uuid.uuid4().hex[:6]


class LiveIndex:
    """The faiss index of one build and its row -> id map: neighbours of an embedding that is
    not in the table (a cold-start user), one faiss call per batch of queries."""

    def __init__(self, index: faiss.Index, ids: np.ndarray, version: str) -> None:
        self.index = index
        self.ids = np.asarray(ids, np.int64)  # (n,) id of each index row
        self.version = version
        if len(self.ids) != index.ntotal:
            raise DataError(f"live index {version}: {index.ntotal} rows, {len(self.ids)} ids")

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def query(self, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (m, k) int64, -1 pad; cosine sims (m, k) float32) of the k nearest ids to each
        embedding of ``vecs`` ((m, d), or (d,) for one: then m = 1)."""
        v = np.asarray(vecs)
        v = v[None, :] if v.ndim == 1 else v
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise RequestError(f"vecs: shape {np.shape(vecs)}, this index holds {self.dim}-d "
                               f"embeddings")
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise RequestError(f"k={k!r}: must be an int >= 1")
        rows, sims = search(self.index, normalise(v), int(k))
        ids = np.where(rows >= 0, self.ids[np.clip(rows, 0, None)], -1)
        return ids, np.where(rows >= 0, sims, 0.0).astype(np.float32)

    def to_bytes(self) -> bytes:
        return faiss.serialize_index(self.index).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, ids: np.ndarray, version: str) -> "LiveIndex":
        return cls(faiss.deserialize_index(np.frombuffer(data, np.uint8)), ids, version)


@dataclass(frozen=True)
class KnnTable:
    """One build's neighbour lists, in id space, with what the recall check measured."""

    kind: str  # "user" or "item"
    ids: np.ndarray  # (n,) int64 id of each row, unique, >= 0
    nbr: np.ndarray  # (n, K) int64 neighbour ids, nearest first, -1 pad, self excluded
    sims: np.ndarray  # (n, K) float32 cosine similarity of each neighbour
    version: str
    index: str  # index_name of the index that answered
    recall_at_10: float  # measured on cfg.recall_queries fresh random rows
    built_from: BuiltFrom | None = None  # the FM version and id map; None: not recorded

    def neighbour_table(self) -> NeighbourTable:
        """The dense in-memory table the enrichment consumes: row r = id r (-1 rows for ids
        this build does not hold)."""
        size = int(self.ids.max()) + 1 if len(self.ids) else 0
        ids = np.full((size, self.nbr.shape[1]), -1, np.int64)
        sims = np.zeros((size, self.nbr.shape[1]), np.float32)
        ids[self.ids], sims[self.ids] = self.nbr, self.sims
        return NeighbourTable(ids, sims, self.version)


def build_table(kind: str, ids: np.ndarray, emb: np.ndarray, k: int, cfg: KnnConfig,
                version: str | None = None, progress: Progress | None = None,
                built_from: BuiltFrom | None = None) -> tuple[KnnTable, LiveIndex]:
    """Index ``emb`` (n, d) of ``ids`` (n,), tune and check recall, fill every row's k
    nearest other ids; ``built_from``: the FM version and id map ``emb`` and ``ids`` come
    from, recorded with the table. Refusing a low recall is ``publish``'s job."""
    if kind not in KINDS:
        raise RequestError(f"kind={kind!r}: must be one of {KINDS}")
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or (len(ids) and ids.min() < 0):
        raise DataError(f"{kind} ids: expected non-negative integer ids, shape {ids.shape} "
                        f"dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"{kind} ids: {len(ids) - len(np.unique(ids))} duplicates")
    x = normalise(emb)
    if len(x) != len(ids) or len(x) < 2:
        raise DataError(f"{kind} embeddings: {len(x)} rows for {len(ids)} ids (need >= 2)")
    version = version or new_version()
    t0 = time.perf_counter()
    index = build_index(x, cfg)
    tune_nprobe(index, x, cfg)
    recall = recall_at_10(index, x, _queries(len(x), cfg.recall_queries, cfg.seed))
    log.info("knn %s: %s over %d rows in %.1fs, recall@10=%.4f", kind, index_name(index),
             len(x), time.perf_counter() - t0, recall)
    rows, sims = neighbours(index, x, min(k, len(x) - 1), cfg.search_batch, progress)
    nbr = np.where(rows >= 0, ids[np.clip(rows, 0, None)], -1)
    table = KnnTable(kind, ids, nbr, np.where(rows >= 0, sims, 0.0).astype(np.float32),
                     version, index_name(index), recall, built_from)
    return table, LiveIndex(index, ids, version)


# ---- storage: versioned tables, an atomically swapped pointer ------------------------------------
def _location(uri: str, kind: str) -> tuple[pafs.FileSystem, str]:
    """Filesystem and directory of ``kind``'s tables under ``uri`` (a pyarrow.fs URI or a
    local dir), resolved as ``solaris.cache.snapshot.snapshot_location`` does."""
    if kind not in KINDS:
        raise RequestError(f"kind={kind!r}: must be one of {KINDS}")
    fs, root = filesystem(uri)
    return fs, f"{root.rstrip('/')}/{kind}"


def _arrow(t: KnnTable) -> pa.Table:
    n, k = t.nbr.shape
    meta = {"format": FORMAT, "kind": t.kind, "version": t.version, "k": k, "n": n,
            "index": t.index, "recall_at_10": t.recall_at_10,
            "built_from": t.built_from.to_dict() if t.built_from else None}
    return pa.table({
        "id": pa.array(t.ids),
        "nbr": pa.FixedSizeListArray.from_arrays(pa.array(t.nbr.ravel()), k),
        "sim": pa.FixedSizeListArray.from_arrays(pa.array(t.sims.ravel()), k),
    }).replace_schema_metadata({_META: json.dumps(meta)})


def publish(uri: str, table: KnnTable, cfg: KnnConfig, live: LiveIndex | None = None,
            clock: Callable[[], float] = time.time, inputs: str | None = None) -> str:
    """Write ``table`` (and ``live``'s index) as a new version under ``uri``, then swap the
    pointer to it; returns the version. Raises DataError naming the recall when it is below
    ``cfg.min_recall`` (nothing is written then). ``inputs``: a fingerprint of what the
    table was built from, kept in the pointer (a scheduled rebuild skips a run whose inputs
    are those of the published table: ``published_inputs``)."""
    if not table.recall_at_10 >= cfg.min_recall:
        raise DataError(f"knn {table.kind} {table.version}: recall@10={table.recall_at_10:.4f} "
                        f"< knn.min_recall={cfg.min_recall} ({table.index}); not published")
    fs, root = _location(uri, table.kind)
    fs.create_dir(root, recursive=True)
    name = f"{table.kind}-{table.version}"
    write_snapshot(fs, f"{root}/{name}.parquet", _arrow(table))
    if live is not None:
        data = live.to_bytes()
        save_on(fs, f"{root}/{name}.faiss", lambda f: f.write(data))
    old = _read_pointer(fs, root) or {}
    versions = [table.version] + [v for v in old.get("versions", []) if v != table.version]
    pointer = {"format": FORMAT, "kind": table.kind, "version": table.version,
               "table": f"{name}.parquet", "index": f"{name}.faiss" if live else None,
               "index_name": table.index, "recall_at_10": table.recall_at_10,
               "n": int(len(table.ids)), "k": int(table.nbr.shape[1]),
               "published_at": clock(), "versions": versions[:cfg.keep_versions],
               "inputs": inputs,
               "built_from": table.built_from.to_dict() if table.built_from else None}
    text = json.dumps(pointer, indent=1).encode()
    save_on(fs, f"{root}/{POINTER}", lambda f: f.write(text))
    _prune(fs, root, table.kind, set(pointer["versions"]))
    log.info("knn %s: published %s (%d rows, recall@10=%.4f) under %s", table.kind,
             table.version, len(table.ids), table.recall_at_10, uri)
    return table.version


def _prune(fs: pafs.FileSystem, root: str, kind: str, keep: set[str]) -> None:
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        stem, dot, ext = info.base_name.rpartition(".")
        if (dot and ext in ("parquet", "faiss") and stem.startswith(f"{kind}-")
                and stem[len(kind) + 1:] not in keep):
            try:
                fs.delete_file(info.path)
            except OSError:
                log.warning("knn: could not delete old version file %s", info.path)


def _read_pointer(fs: pafs.FileSystem, root: str) -> dict | None:
    path = f"{root}/{POINTER}"
    try:
        with fs.open_input_stream(path) as f:
            raw = f.readall()
    except FileNotFoundError:
        return None
    try:
        pointer = json.loads(raw)
        if pointer.get("format") != FORMAT or not pointer.get("version"):
            raise ValueError(f"format={pointer.get('format')!r}, version="
                             f"{pointer.get('version')!r}")
    except (ValueError, AttributeError) as e:
        raise DataError(f"{path}: not a KNN pointer of format {FORMAT} ({e})") from e
    return pointer


def _pointer(uri: str, kind: str) -> tuple[pafs.FileSystem, str, dict]:
    fs, root = _location(uri, kind)
    pointer = _read_pointer(fs, root)
    if pointer is None:
        raise DataError(f"{root}/{POINTER}: no {kind} KNN table published under {uri!r}")
    return fs, root, pointer


def published_inputs(uri: str, kind: str = "user") -> tuple[str | None, str | None]:
    """(version, inputs fingerprint) of the table published as ``kind`` under ``uri``
    ((None, None) before the first publish; a fingerprint of None: published without one)."""
    fs, root = _location(uri, kind)
    pointer = _read_pointer(fs, root)
    if pointer is None:
        return None, None
    return str(pointer["version"]), pointer.get("inputs")


def published_built_from(uri: str, kind: str = "user") -> BuiltFrom | None:
    """What the table published as ``kind`` under ``uri`` records it was built from (None
    before the first publish, or for a table published without a record); reads only the
    pointer."""
    fs, root = _location(uri, kind)
    pointer = _read_pointer(fs, root)
    return None if pointer is None else BuiltFrom.from_dict(pointer.get("built_from"))


def current_version(uri: str, kind: str = "user") -> str | None:
    """The published version of ``kind`` under ``uri`` (None before the first publish); reads
    only the small pointer file, so a router can poll it."""
    fs, root = _location(uri, kind)
    pointer = _read_pointer(fs, root)
    return None if pointer is None else str(pointer["version"])


def read_table(fs: pafs.FileSystem, path: str, kind: str) -> KnnTable:
    """The KnnTable stored at ``path``; DataError naming the file on any corruption."""
    try:
        t = pq.read_table(path, filesystem=fs)
    except FileNotFoundError as e:
        raise DataError(f"{path}: KNN table missing") from e
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable KNN table ({e})") from e
    try:
        meta = json.loads((t.schema.metadata or {})[_META])
        if meta.get("format") != FORMAT or meta.get("kind") != kind:
            raise ValueError(f"format={meta.get('format')!r} kind={meta.get('kind')!r}")
        k = int(meta["k"])
        cols = {c: t.column(c).combine_chunks() for c in ("id", "nbr", "sim")}
        for c in ("nbr", "sim"):
            if cols[c].type.list_size != k or cols[c].null_count:
                raise ValueError(f"column {c!r}: type {cols[c].type}, {cols[c].null_count} nulls")
        built_from = BuiltFrom.from_dict(meta.get("built_from"))
        ids = cols["id"].to_numpy().astype(np.int64)
        nbr = cols["nbr"].flatten().to_numpy().astype(np.int64).reshape(len(ids), k)
        sims = cols["sim"].flatten().to_numpy().astype(np.float32).reshape(len(ids), k)
    except (KeyError, ValueError, TypeError, AttributeError, DataError,
            pa.ArrowException) as e:
        raise DataError(f"{path}: malformed KNN table ({e!r})") from e
    if len(ids) and (ids.min() < 0 or len(np.unique(ids)) != len(ids) or nbr.min() < -1):
        raise DataError(f"{path}: ids must be unique and >= 0, neighbours >= -1")
    return KnnTable(kind, ids, nbr, sims, str(meta["version"]), str(meta.get("index", "")),
                    float(meta.get("recall_at_10", float("nan"))), built_from)


def _read_current(uri: str, kind: str, attempts: int = 3
                  ) -> tuple[pafs.FileSystem, str, dict, KnnTable]:
    """The pointer under ``uri`` and the table it names (their versions checked to agree).

    A reader slow enough that ``keep_versions`` newer versions were published between its
    pointer read and its table read finds the table pruned: it reads the pointer again (up
    to ``attempts`` times) rather than fail while a whole newer version is there."""
    for attempt in range(attempts):
        fs, root, pointer = _pointer(uri, kind)
        try:
            table = read_table(fs, f"{root}/{pointer['table']}", kind)
            break
        except DataError:
            if attempt == attempts - 1 or _pointer(uri, kind)[2] == pointer:
                raise  # the pointer did not move: the table is really missing or bad
    if table.version != pointer["version"]:
        raise DataError(f"{root}/{pointer['table']}: holds version {table.version!r}, the "
                        f"pointer names {pointer['version']!r}")
    return fs, root, pointer, table


def load_build(uri: str, kind: str = "user", with_index: bool = True
               ) -> tuple[KnnTable, LiveIndex | None]:
    """(table, live index or None) of the version the pointer under ``uri`` names: one
    pointer read, one table read, so they always match. ``with_index`` False: the faiss
    index is not read (None)."""
    fs, root, pointer, table = _read_current(uri, kind)
    live = None
    if with_index and pointer.get("index"):
        path = f"{root}/{pointer['index']}"
        try:
            with fs.open_input_stream(path) as f:
                live = LiveIndex.from_bytes(f.readall(), table.ids, table.version)
        except (OSError, RuntimeError) as e:  # faiss raises RuntimeError on a corrupt index
            raise DataError(f"{path}: not a readable faiss index ({e})") from e
    return table, live


def load_published(uri: str, kind: str = "user"
                   ) -> tuple[str, NeighbourTable, LiveIndex | None]:
    """(version, NeighbourTable, live index or None) of the version the pointer under
    ``uri`` names (``load_build``)."""
    table, live = load_build(uri, kind)
    return table.version, table.neighbour_table(), live


def load_current(uri: str, kind: str = "user") -> tuple[str, NeighbourTable]:
    """(version, NeighbourTable) of the version the pointer under ``uri`` names."""
    table = _read_current(uri, kind)[3]
    return table.version, table.neighbour_table()


def load_live(uri: str, kind: str = "user") -> LiveIndex:
    """The current version's faiss index (for cold-start queries); DataError if the version
    was published without one."""
    version, _, live = load_published(uri, kind)
    if live is None:
        raise DataError(f"{uri}: {kind} version {version} has no live index")
    return live
