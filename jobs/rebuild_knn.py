"""Ray Data job: recompute user and item embeddings, rebuild the KNN tables, publish them.

DESIGN.md step 7. Run it directly or through the job API (on a cluster or a local
``ray start --head``)::

    python jobs/rebuild_knn.py --data DATA --artifacts ARTIFACTS --out URI [--every SECONDS]
    ray job submit --working-dir . -- python jobs/rebuild_knn.py --data DATA \\
        --artifacts ARTIFACTS --out URI

``DATA`` is a team's log through its mapping YAML (``solaris.data.generic``; the driver
reads it, codes its ids with the artifacts' id map and hands the events to the workers through
the object store), or what ``solaris data`` writes (``generate_to_parquet``: users, items and
interaction Parquet files), a local directory or a ``pyarrow.fs`` URI that every node can
read; ``ARTIFACTS`` a ``solaris train`` directory or a ``pyarrow.fs`` URI of one (copied to the
driver's node and checked, ``solaris.artifact_store``; each rebuild reads the URI's manifest
again, so a republished version is picked up), read by the driver only (the FM travels
to the encoder tasks through the object store); ``--train-if-missing`` trains them from a
local ``DATA`` into a local ``ARTIFACTS`` first. ``URI`` (a ``pyarrow.fs`` URI or a local directory;
``knn.table_uri`` when omitted) receives the tables. One rebuild:

1. Ray Data reads the interaction log and one placeholder row per user (so users without
   events get a row too), groups by user (a sort shuffle: ``SHUFFLE``), and keeps each user's
   last ``history_len`` events before ``--as-of`` (default: just after the last logged event)
   (``solaris.knn.user_encoder.recent_history``; ``knn.user_events`` of them for the default
   user vector, ``history_len`` for the request tower);
2. ``map_batches`` with ``encode_users`` as tasks (at most ``--encoders`` at once, explicit
   ``--batch-size``, one GPU each where the cluster has GPUs) embeds them with the user
   vector ``knn.user_vector`` (``solaris.knn.user_encoder``: the mean FM item vector over the
   user's clicked events by default, or the FM's request tower); each worker process decodes
   the FM once per rebuild and keeps it for the batches it runs after;
3. the driver builds the user index (exact or IVF by size), tunes it, checks recall@10
   against exact search and publishes the table, the faiss index and the pointer swap
   (``solaris.knn.tables``); then the same for the items' FM embeddings. A recall below
   ``knn.min_recall`` is refused (exit 2, the previous version stays current). Each table
   records the FM version and the id map it was built from; an app serving another FM
   version disables it (``solaris.knn.provenance``).

On a schedule, run one rebuild per trigger from something that outlives a driver -- cron
on the head node with one submission id per period (Ray refuses a second job with the same
id), a KubeRay RayJob from a Kubernetes CronJob (``deploy/kuberay/``) -- with
``--if-changed``: a run whose inputs (data, artifacts, knn settings) are those the published
tables were built from publishes nothing, so a retried or doubled trigger is harmless. The
routers export the served table's age (``solaris_knn_table_age_s``; alert
``SolarisKnnTableStale``). ``--every S`` (a loop in this driver, ``--times N`` stops after N)
is for a laptop: if the driver dies, the rebuilds stop with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from solaris.artifact_store import is_uri, local_artifacts, shown
from solaris.atomic import filesystem
from solaris.config import KnnConfig, SolarisConfig, load_config, parse_overrides
from solaris.errors import CheckpointError, ConfigError, DataError, SolarisError

log = logging.getLogger("jobs.rebuild_knn")

EMB = "emb"
INTERACTIONS = "interactions.parquet"
# the group-by's shuffle. Ray Data's default hash shuffle starts its aggregator actors anew for
# every run; the pull-based sort shuffle runs tasks on the cluster's pooled workers. On a
# 300-user log at 2 CPUs (bench/knn_shuffle.py, the two alternating): median 13.8 s against
# 7.5 s, the same embeddings to the bit (each user's history is sorted by ``seq``, the
# embeddings by user id).
SHUFFLE = "sort_shuffle_pull_based"


# ---- inputs ----------------------------------------------------------------------------------------
class DataDir:
    """A ``solaris data`` directory, local or behind a ``pyarrow.fs`` URI (every node of a
    cluster must reach it: Ray Data reads it from the workers)."""

    def __init__(self, uri: str | Path) -> None:
        uri = str(uri)
        self.uri = uri
        self.fs, self.root = filesystem(uri)
        self.root = self.root.rstrip("/")

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def meta(self) -> dict:
        path = self.path("meta.json")
        try:
            with self.fs.open_input_stream(path) as f:
                return json.loads(f.readall())
        except FileNotFoundError as e:
            raise DataError(f"{path}: file missing (write DATA with `solaris data --out DIR`)"
                            ) from e
        except ValueError as e:
            raise DataError(f"{path}: malformed metadata ({e})") from e

    def table(self, name: str) -> pa.Table:
        try:
            return pq.read_table(self.path(name), filesystem=self.fs)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{self.path(name)}: not a readable Parquet file ({e})") from e

    def parquet_meta(self, name: str) -> pq.FileMetaData:
        with self.fs.open_input_file(self.path(name)) as f:
            return pq.ParquetFile(f).metadata

    def num_rows(self) -> int:
        return self.parquet_meta(INTERACTIONS).num_rows

    def last_ts(self, events: Any) -> float:
        return _last_ts(self.parquet_meta(INTERACTIONS), events)

    def side_tables(self) -> Any:
        return side_tables(self)

    def dataset(self, name: str, columns: list[str], num_cpus: float = 1.0) -> Any:
        # the named remote parameter where this Ray has it (``ray_remote_args`` is deprecated
        # and removed in Ray 2.64); older releases take it through ``ray_remote_args``
        named = "num_cpus" in inspect.signature(ray.data.read_parquet).parameters
        cpus = {"num_cpus": num_cpus} if named else {"ray_remote_args": {"num_cpus": num_cpus}}
        return ray.data.read_parquet(self.path(name), filesystem=self.fs, columns=columns,
                                     **cpus)


class MappedLog:
    """A team's own log through its mapping YAML (``solaris.data.generic``), read by the
    driver and coded with the deployment's id map (the artifacts' ``ids/``), so its codes are
    the ones serving translates the wire to; the interactions reach the workers through the
    object store (no shared filesystem needed). The side tables are the artifacts' (what the
    FM trained on) where saved; events of users or items the FM has no row for are left out
    (their neighbours come from the router's cold-start path)."""

    def __init__(self, mapping: str | Path, artifacts: str | Path) -> None:
        from solaris.data.generic import load_generic_yaml
        from solaris.ids import IdMap

        self.uri = str(mapping)
        root = Path(artifacts)
        ids = IdMap.load(root)
        ds = load_generic_yaml(mapping, ids=ids)
        self.tasks = ds.tasks
        self._side = None
        if (root / "side.npz").is_file():
            from solaris.artifacts import load_side_tables

            self._side = load_side_tables(root / "side.npz")
        users = len(self._side.user_cat) if self._side is not None else ds.num_users
        items = len(self._side.item_cat) if self._side is not None else ds.num_items
        inter = ds.interactions
        keep = pc.and_(pc.less(inter.column("user_id"), users),
                               pc.less(inter.column("item_id"), items))
        self.events = inter.filter(keep)
        if self.events.num_rows < inter.num_rows:
            log.info("%s: %d of %d events name users or items the FM has no row for; left "
                     "out", mapping, inter.num_rows - self.events.num_rows, inter.num_rows)
        self._ds = ds

    def meta(self) -> dict:
        return {"tasks": list(self.tasks), "spec": self._ds.spec.to_dict()}

    def num_rows(self) -> int:
        return self.events.num_rows

    def last_ts(self, events: Any) -> float:
        ts = self.events.column("ts")
        return float(pc.max(ts).as_py()) if len(ts) else 0.0

    def dataset(self, name: str, columns: list[str], num_cpus: float = 1.0) -> Any:
        return ray.data.from_arrow(self.events.select(columns))

    def side_tables(self) -> Any:
        from solaris.artifacts import SideTables
        from solaris.config import FeatureConfig
        from solaris.features import FeatureTables

        if self._side is not None:
            return self._side
        return SideTables.from_features(FeatureTables(self._ds, FeatureConfig(history_len=1)))


def open_data(data: str | Path, artifacts: str | Path) -> "DataDir | MappedLog":
    """``--data``: a mapping YAML (a team's log, ``MappedLog``) or a ``solaris data``
    directory / URI (``DataDir``)."""
    text = str(data)
    if text.endswith((".yaml", ".yml")) or (Path(text).is_dir()
                                            and (Path(text) / "mapping.yaml").is_file()):
        return MappedLog(data, artifacts)
    return DataDir(data)


def side_tables(data: DataDir) -> Any:
    """The side-feature tables of ``data``, coded as training coded them (``FeatureTables``
    over the user and item files, without the interaction log)."""
    from solaris.config import FeatureConfig
    from solaris.data.schema import Dataset, FeatureSpec, interaction_schema
    from solaris.features import FeatureTables
    from solaris.artifacts import SideTables

    meta = data.meta()
    tasks = tuple(meta["tasks"])
    ds = Dataset(name="knn", interactions=interaction_schema(tasks).empty_table(),
                 users=data.table("users.parquet"), items=data.table("items.parquet"),
                 tasks=tasks, spec=FeatureSpec.from_dict(meta["spec"]))
    return SideTables.from_features(FeatureTables(ds, FeatureConfig(history_len=1)))


def _has_artifacts(artifacts: Path) -> bool:
    return (artifacts / "fm.pt").is_file() and (artifacts / "encoder.pt").is_file()


def check_artifacts(artifacts: Path) -> None:
    if not _has_artifacts(artifacts):
        raise CheckpointError(
            f"{artifacts}: no trained artifacts (fm.pt, encoder.pt). Train them with "
            f"`solaris train --dataset synthetic --data-dir DATA --out {artifacts}` or pass "
            f"--train-if-missing")


def train_if_missing(cfg: SolarisConfig, data_dir: Path, artifacts: Path) -> None:
    """Train the FM and encoder (``solaris train``) from a local ``data_dir`` when none are
    in ``artifacts``."""
    if _has_artifacts(artifacts):
        return
    from solaris.data.synthetic import load_parquet_dir
    from solaris.train.artifacts import train_artifacts

    log.warning("no artifacts in %s: training FM + encoder from %s first", artifacts, data_dir)
    train_artifacts(cfg, load_parquet_dir(data_dir), artifacts, progress=log.info)


# ---- Ray Data stages --------------------------------------------------------------------------
def histories(g: dict[str, np.ndarray], tasks: tuple[str, ...], as_of: float, length: int
              ) -> dict[str, np.ndarray]:
    """map_groups fn: one user's events -> that user's last ``length`` events before as_of."""
    from solaris.knn.user_encoder import recent_history

    labels = np.stack([g[t] for t in tasks], axis=1)
    return recent_history(g["user_id"], g["item_id"], g["ts"], g["seq"], g["surface"], labels,
                          as_of, length)


# this worker process's user encoder: (the rebuild's models ref and user vector, its encoder,
# side tables); one rebuild's at a time
_ENCODER: tuple[str, Any, Any] | None = None


def encode_users(batch: dict[str, np.ndarray], models: list, as_of: float,
                 threads: int = 1, user_vector: str = "clicked_items") -> dict[str, np.ndarray]:
    """map_batches task: embed a batch of user histories as the ``user_vector``.

    ``models`` is a one-element list holding the object ref of ``(fm, side tables)`` (sent by
    the driver through the object store, so no node needs the artifact files). A worker
    process decodes it once and keeps the encoder for its later batches of the same
    rebuild. Tasks, not an actor pool: Ray Data passes an actor pool's constructor through
    the object store, which Ray reports on the console for every restartable actor, and the
    only way to make them not restartable is a keyword Ray deprecates."""
    global _ENCODER
    import torch

    from solaris.knn.user_encoder import request_inputs, user_encoder

    key = (models[0].hex(), user_vector)
    if _ENCODER is None or _ENCODER[0] != key:
        fm, tables = ray.get(models[0])
        torch.set_num_threads(threads)
        _ENCODER = (key, user_encoder(user_vector, fm,
                                      "cuda" if torch.cuda.is_available() else "cpu"), tables)
    _, encoder, t = _ENCODER
    req = request_inputs(batch, as_of, t.item_cat, t.user_cat, t.user_cont)
    return {"user": batch["user"], EMB: encoder.encode(req)}


def _placeholders(batch: dict[str, np.ndarray], tasks: tuple[str, ...]) -> pa.Table:
    """One event-less row per user (item -1), in the interaction log's schema."""
    from solaris.data.schema import interaction_schema

    n = len(batch["user_id"])
    cols = {"seq": np.full(n, -1, np.int64), "user_id": batch["user_id"].astype(np.int64),
            "item_id": np.full(n, -1, np.int64), "ts": np.zeros(n, np.int64),
            "surface": np.zeros(n, np.int32), **{t: np.zeros(n, np.float32) for t in tasks}}
    return pa.Table.from_pydict(cols, schema=interaction_schema(tasks))


def _last_ts(md: pq.FileMetaData, events: Any) -> float:
    """Latest event time of the log: from the Parquet statistics, else one pass of Ray Data."""
    try:
        j = md.schema.names.index("ts")
        stats = [md.row_group(r).column(j).statistics for r in range(md.num_row_groups)]
        if stats and all(s is not None and s.has_min_max for s in stats):
            return float(max(s.max for s in stats))
    except (ValueError, pa.ArrowException):
        pass
    return float(events.max("ts"))


def user_embeddings(data: "DataDir | MappedLog", fm: Any, as_of: float | None, encoders: int,
                    batch_size: int, encoder_cpus: float, use_gpu: bool,
                    task_cpus: float = 1.0, all_users: bool = True,
                    user_vector: str = "clicked_items", user_events: int = 1000
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    """(user ids (U,), embeddings (U, S), as_of) through the Ray Data pipeline; the read and
    group tasks ask for ``task_cpus`` each (less than 1 to run beside a serving app);
    ``user_vector`` and ``user_events``: ``knn.user_vector`` and ``knn.user_events``.
    ``all_users`` False: only the users with an event before ``as_of`` (as the closed loop's
    in-process arms build their tables), not every user of the user table."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    before = ctx.shuffle_strategy
    ctx.shuffle_strategy = SHUFFLE  # read when the datasets below are built and run
    try:
        return _user_embeddings(data, fm, as_of, encoders, batch_size, encoder_cpus, use_gpu,
                                task_cpus, all_users, user_vector, user_events)
    finally:
        ctx.shuffle_strategy = before


def _user_embeddings(data: "DataDir | MappedLog", fm: Any, as_of: float | None, encoders: int,
                     batch_size: int, encoder_cpus: float, use_gpu: bool, task_cpus: float,
                     all_users: bool, user_vector: str, user_events: int
                     ) -> tuple[np.ndarray, np.ndarray, float]:
    from solaris.knn.user_encoder import events_read

    tasks = tuple(data.meta()["tasks"])
    events = data.dataset(INTERACTIONS, ["seq", "user_id", "item_id", "ts", "surface", *tasks],
                          task_cpus)
    if as_of is None:
        as_of = data.last_ts(events) + 1.0
    tables = data.side_tables()
    if all_users:
        # one event-less row per user (ids are the user table's dense codes 0..n-1), so users
        # without events get an embedding too
        users = np.arange(len(tables.user_cat), dtype=np.int64)
        rows = events.union(ray.data.from_arrow(_placeholders({"user_id": users}, tasks)))
    else:  # a user with no event before as_of gets no row at all
        rows = events.filter(expr=f"ts < {float(as_of)!r}", num_cpus=task_cpus)
    parts = max(2, min(64, data.num_rows() // 500_000 + 1))  # Ray's default 200 is for big clusters
    hist = rows.groupby("user_id", num_partitions=parts).map_groups(
        histories, fn_kwargs={"tasks": tasks, "as_of": as_of,
                              "length": events_read(user_vector, fm, user_events)},
        batch_format="numpy", num_cpus=task_cpus)
    models = ray.put((fm, tables))  # held here until the embeddings are read back
    emb = hist.map_batches(encode_users, fn_kwargs={"models": [models], "as_of": as_of,
                                                    "user_vector": user_vector},
                           batch_size=batch_size, batch_format="numpy",
                           compute=ray.data.TaskPoolStrategy(size=encoders),
                           num_cpus=encoder_cpus, num_gpus=1 if use_gpu else 0)
    ids, vecs = [], []
    for b in emb.iter_batches(batch_size=8192, batch_format="numpy"):
        ids.append(b["user"])
        vecs.append(b[EMB])
    ids, vecs = np.concatenate(ids).astype(np.int64), np.concatenate(vecs).astype(np.float32)
    order = np.argsort(ids)
    return ids[order], vecs[order], as_of


# ---- one rebuild --------------------------------------------------------------------------------
def _bar(desc: str):
    """A progress callback: a tqdm bar on a terminal, a log line per 10% elsewhere (job logs)."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar = tqdm(desc=desc, unit="rows", dynamic_ncols=True, mininterval=1.0, disable=not tty)
    logged = [0]

    def tick(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if not tty and done * 10 // total > logged[0]:
            logged[0] = done * 10 // total
            log.info("%s: %d / %d", desc, done, total)
        if done >= total:
            bar.close()
    return tick


def inputs_fingerprint(data: str | Path, artifacts: str | Path, cfg: KnnConfig,
                       as_of: float | None) -> str:
    """What a rebuild reads, as one sha256: the data's rows, its metadata and its events
    file's size and modification time (a ``solaris data`` directory) or its last event time
    (a team's log), the artifacts' manifest (its file hashes), the knn settings and the
    ``--as-of``. Equal fingerprints build equal tables, so a scheduled run that finds its
    fingerprint already published has nothing to do (``--if-changed``)."""
    import hashlib

    from solaris.artifacts import read_manifest
    from solaris.config import config_to_dict

    local = local_artifacts(artifacts)
    d = open_data(data, local)
    try:
        manifest: Any = read_manifest(local)
    except CheckpointError:  # bare model files: their names, sizes and times
        manifest = sorted((str(p.relative_to(local)), p.stat().st_size, p.stat().st_mtime_ns)
                          for p in Path(local).rglob("*") if p.is_file())
    what: dict[str, Any] = {"rows": d.num_rows(), "meta": d.meta(), "manifest": manifest,
                            "knn": config_to_dict(cfg), "as_of": as_of}
    if isinstance(d, DataDir):
        info = d.fs.get_file_info(d.path(INTERACTIONS))
        what["events"] = [info.size, info.mtime_ns]
    else:
        what["events"] = d.last_ts(None)
    blob = json.dumps(what, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def up_to_date(out_uri: str, fingerprint: str) -> str | None:
    """The published version when both the user and the item tables under ``out_uri`` were
    built from ``fingerprint`` and record their FM version and id map; None when a rebuild
    has work to do (a table without that record is rebuilt so that apps can check it)."""
    from solaris.knn.tables import published_built_from, published_inputs

    (uv, ui), (iv, ii) = published_inputs(out_uri, "user"), published_inputs(out_uri, "item")
    if uv is None or ui != fingerprint or ii != fingerprint:
        return None
    recorded = all(published_built_from(out_uri, k) is not None for k in ("user", "item"))
    return uv if recorded else None


def rebuild(data: str | Path, artifacts: str | Path, out_uri: str, cfg: KnnConfig, *,
            as_of: float | None = None, encoders: int = 1, batch_size: int = 256,
            encoder_cpus: float = 1.0, use_gpu: bool | None = None, task_cpus: float = 1.0,
            version: str | None = None, all_users: bool = True,
            if_changed: bool = False) -> dict:
    """One rebuild against the connected Ray cluster; returns what was published
    (``all_users``: see ``user_embeddings``). The driver embeds and indexes on one torch
    thread; the caller's thread count is restored after. ``if_changed``: nothing is built
    when the published tables were built from the same inputs (``{"skipped": True, ...}``)."""
    fingerprint = inputs_fingerprint(data, artifacts, cfg, as_of)
    if if_changed:
        current = up_to_date(out_uri, fingerprint)
        if current is not None:
            log.info("knn tables %s under %s were built from these inputs: nothing to do",
                     current, out_uri)
            return {"skipped": True, "version": current, "uri": out_uri,
                    "inputs": fingerprint}
    import torch

    threads = torch.get_num_threads()
    try:
        return _rebuild(data, artifacts, out_uri, cfg, as_of=as_of, encoders=encoders,
                        batch_size=batch_size, encoder_cpus=encoder_cpus, use_gpu=use_gpu,
                        task_cpus=task_cpus, version=version, all_users=all_users,
                        inputs=fingerprint)
    finally:
        torch.set_num_threads(threads)


def _rebuild(data: str | Path, artifacts: str | Path, out_uri: str, cfg: KnnConfig, *,
             as_of: float | None, encoders: int, batch_size: int, encoder_cpus: float,
             use_gpu: bool | None, task_cpus: float, version: str | None,
             all_users: bool, inputs: str | None = None) -> dict:
    import torch

    from solaris.knn.provenance import of_artifacts
    from solaris.knn.tables import build_table, new_version, publish
    from solaris.artifacts import load_models
    from solaris.knn.user_encoder import item_embeddings

    t0 = time.perf_counter()
    artifacts = local_artifacts(artifacts)  # a URI: this node's verified copy
    check_artifacts(artifacts)
    torch.set_num_threads(1)
    fm, _enc, fm_version = load_models(artifacts)
    built_from = of_artifacts(artifacts, fm_version)  # recorded with both tables
    if built_from is not None:
        built_from = dataclasses.replace(built_from, user_vector=cfg.user_vector)
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= 1
    version = version or new_version()
    out: dict[str, Any] = {"version": version, "fm_version": fm_version, "uri": out_uri,
                           "inputs": inputs, "ids": built_from.ids if built_from else None}

    t = time.perf_counter()
    users, uvec, as_of = user_embeddings(open_data(data, artifacts), fm, as_of, encoders, batch_size,
                                         encoder_cpus, use_gpu, task_cpus, all_users,
                                         cfg.user_vector, cfg.user_events)
    out["as_of"] = as_of
    out["embed_s"] = round(time.perf_counter() - t, 2)
    log.info("embedded %d users (%d-d) in %.1fs", len(users), uvec.shape[1], out["embed_s"])
    ivec = item_embeddings(fm)  # (num_items, I)
    for kind, ids, vecs, k in (("user", users, uvec, cfg.k),
                               ("item", np.arange(len(ivec)), ivec, cfg.item_k)):
        t = time.perf_counter()
        table, live = build_table(kind, ids, vecs, k, cfg, version, _bar(f"{kind} neighbours"),
                                  built_from)
        publish(out_uri, table, cfg, live, inputs=inputs)
        out[kind] = {"rows": int(len(ids)), "dim": int(vecs.shape[1]), "k": int(table.nbr.shape[1]),
                     "index": table.index, "recall_at_10": round(table.recall_at_10, 4),
                     "seconds": round(time.perf_counter() - t, 2)}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


# ---- command line --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True,
                   help="a team's log: its mapping YAML (read by the driver, coded with the "
                   "artifacts' id map); or a `solaris data` Parquet directory or pyarrow.fs "
                   "URI (all nodes read it)")
    p.add_argument("--artifacts", required=True,
                   help="`solaris train` directory or pyarrow.fs URI of one (read by the "
                   "driver only)")
    p.add_argument("--out", help="pyarrow.fs URI or dir of the tables (default knn.table_uri)")
    p.add_argument("--config", help="YAML config (the knn section is used)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set knn.k=50")
    p.add_argument("--as-of", type=float, help="event time of the histories (default: last + 1)")
    p.add_argument("--encoders", type=int, default=1, help="encoder tasks at once")
    p.add_argument("--batch-size", type=int, default=256, help="users per encoder batch")
    p.add_argument("--encoder-cpus", type=float, default=1.0, help="CPUs per encoder task")
    p.add_argument("--task-cpus", type=float, default=1.0,
                   help="CPUs per read / group task (e.g. 0.25 beside a serving app)")
    p.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto",
                   help="one GPU per encoder task (auto: when the cluster has GPUs up "
                        "when the job starts; on a cluster whose GPU nodes scale from zero, "
                        "yes: asking for them is what makes the autoscaler start one)")
    p.add_argument("--every", type=float, help="rebuild every SECONDS (default: once)")
    p.add_argument("--if-changed", action="store_true",
                   help="build and publish only if the published tables were built from "
                        "other inputs (data, artifacts, knn settings): a scheduled run is "
                        "then idempotent")
    p.add_argument("--times", type=int, help="with --every: stop after N rebuilds")
    p.add_argument("--train-if-missing", action="store_true",
                   help="train FM + encoder from --data when --artifacts has none")
    p.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--num-cpus", type=float, help="CPUs of a Ray started here (local only)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, parse_overrides(args.set))
        out = args.out or cfg.knn.table_uri
        if not out:
            raise ConfigError("--out: no table URI (pass --out or set knn.table_uri)")
        if args.train_if_missing:
            if is_uri(args.artifacts):
                raise ConfigError(f"--artifacts {shown(args.artifacts)}: --train-if-missing "
                                  "trains into a local directory, not a URI")
            train_if_missing(cfg, Path(args.data), Path(args.artifacts))
        check_artifacts(local_artifacts(args.artifacts))
    except SolarisError as e:
        print(f"rebuild_knn: error: {e}", file=sys.stderr)
        return 2
    from actors import local

    local.start(address=args.address, num_cpus=args.num_cpus or None, verbose=args.verbose)
    gpu = {"auto": None, "yes": True, "no": False}[args.gpu]
    done, code = 0, 0
    try:
        while True:
            started = time.monotonic()
            try:
                summary = rebuild(args.data, args.artifacts, out, cfg.knn, as_of=args.as_of,
                                  encoders=args.encoders, batch_size=args.batch_size,
                                  encoder_cpus=args.encoder_cpus, use_gpu=gpu,
                                  task_cpus=args.task_cpus, if_changed=args.if_changed)
                print(json.dumps(summary), flush=True)
                code = 0
            except (SolarisError, pa.ArrowException, OSError) as e:
                log.error("rebuild failed: %s", e)
                print(f"rebuild_knn: error: {e}", file=sys.stderr, flush=True)
                code = 2
            except Exception:  # on a schedule, a failed run (e.g. a lost node) is not the last
                if args.every is None:
                    raise
                log.exception("rebuild failed; next try in %.0f s", args.every)
                code = 1
            done += 1
            if args.every is None or (args.times is not None and done >= args.times):
                return code
            time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
