"""Cache-shard actors and the client that fans a request out to them in one round.

``CacheShard`` wraps one ``solaris.cache.store.PairStore``: it owns the lock that makes the
store safe under the actor's threads, the Parquet snapshots (through ``pyarrow.fs``, so a shard
restarted on another node finds them) and the restore after a restart. ``CacheGroup`` lives in
the caller's process (the router): it creates or attaches to the named shards, places users on
them with the consistent-hash ring, and turns ``solaris.enrich``'s plan into one parallel round
of ``answer`` calls with a deadline (DESIGN.md, "One round of remote calls per request").
A shard that is dead, restarting, failing or late reads as misses; the caller never sees an
exception or waits past the deadline.

Ray is not initialised here: callers call ``ray.init`` (or run inside a Ray job / Serve app).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray.exceptions import RayActorError, RayError

from solaris import enrich
from solaris.cache.query import ShardAnswer, ShardQuery, Slots
from solaris.cache.ring import HashRing
from solaris.cache.store import PairStore
from solaris.config import CacheConfig, EnrichConfig
from solaris.errors import ConfigError, RequestError

log = logging.getLogger(__name__)

SHARD_NUM_CPUS = 0.1  # a shard is mostly idle between calls; the 2-core profile packs several
SHARD_MAX_CONCURRENCY = 4  # answer/put/metrics threads; the store itself is behind one lock


# ---- snapshots ---------------------------------------------------------------------------------
def snapshot_location(uri: str, group_id: str, shard: int, num_shards: int
                      ) -> tuple[pafs.FileSystem, str]:
    """Filesystem and path of one shard's snapshot under ``uri`` (a pyarrow.fs URI or a dir).

    The shard count is part of the name: with another count, users live on other shards.
    """
    if "://" not in uri:
        uri = os.path.abspath(uri)
    fs, root = pafs.FileSystem.from_uri(uri)
    name = f"shard-{shard:03d}-of-{num_shards:03d}.parquet"
    return fs, f"{root.rstrip('/')}/{group_id}/{name}"


def write_snapshot(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write ``table`` to a temporary file beside ``path``, then move it over ``path``.

    A crash mid-write leaves a stray temporary file, never a half-written snapshot.
    """
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, path)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise


def read_snapshot(fs: pafs.FileSystem, path: str) -> pa.Table | None:
    """The snapshot at ``path``, or None when there is none; stray temporaries are removed."""
    parent, name = path.rsplit("/", 1)
    try:
        infos = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except OSError:
        infos = []
    for info in infos:
        if info.base_name.startswith(f"{name}.tmp-"):
            try:
                fs.delete_file(info.path)
            except OSError:
                log.warning("could not remove stale snapshot temp %s", info.path)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    return pq.read_table(path, filesystem=fs)


# ---- the wire format of an answer ---------------------------------------------------------------
PackedAnswer = tuple  # pack_answer's output: ShardAnswer's arrays without its zero rows


def pack_answer(a: ShardAnswer) -> PackedAnswer:
    """Drop the rows a ShardAnswer holds as zeros (pairs not found, aggregates absent).

    A request's own-shard answer covers every candidate and item neighbour (~2,800 keys of
    which ~10% hit): dense it is ~400 KB, past Ray's inline-reply limit (100 KB), so it would
    travel through the object store; packed it is ~80 KB and rides in the reply.
    """
    f, ap = a.pair_found, a.agg_present
    return (f, a.pair_vectors[f], a.pair_age_s[f], ap, a.agg_vectors[ap], a.agg_count,
            a.nbr_item_idx, a.nbr_user_idx, a.nbr_vectors, a.nbr_age_s)


def unpack_answer(p: PackedAnswer, dim: int) -> ShardAnswer:
    """The ShardAnswer ``pack_answer`` packed (zeros back where nothing was found)."""
    f, pv, page, ap, av, ac, ni, nu, nv, nage = p
    pair_vectors = np.zeros((len(f), dim), np.float32)
    pair_vectors[f] = pv
    pair_age = np.zeros(len(f))
    pair_age[f] = page
    agg_vectors = np.zeros((len(ap), dim), np.float32)
    agg_vectors[ap] = av
    return ShardAnswer(pair_found=f, pair_vectors=pair_vectors, pair_age_s=pair_age,
                       agg_vectors=agg_vectors, agg_present=ap, agg_count=ac,
                       nbr_item_idx=ni, nbr_user_idx=nu, nbr_vectors=nv, nbr_age_s=nage)


# ---- the shard actor ---------------------------------------------------------------------------
@ray.remote(num_cpus=SHARD_NUM_CPUS, max_restarts=-1, max_task_retries=0,
            max_concurrency=SHARD_MAX_CONCURRENCY)
class CacheShard:
    """One shard: a PairStore behind a lock, snapshotted to Parquet, restored on (re)start.

    Ray re-runs ``__init__`` after a crash (``max_restarts``): that is where the last snapshot
    is reloaded. Reads are not retried (``max_task_retries=0``): the client reads a failed
    read as misses. Writes are idempotent overwrites and retried a few times.
    """

    def __init__(self, cfg: CacheConfig, shard: int, group_id: str,
                 event_clock: Callable[[], float] | None = None):
        self._cfg = cfg
        self._shard = shard
        self._group_id = group_id
        self._clock = event_clock
        self._lock = threading.Lock()  # the store is not thread-safe; calls run on 4 threads
        self._snap_lock = threading.Lock()  # one snapshot write at a time
        self._changes = 0  # puts and expiries applied; an unchanged store is not re-written
        self._snapshotted_changes = 0
        self._snapshots = 0
        self._snapshot_errors = 0
        self._last_snapshot_s = float("nan")
        self._restored_entries = 0
        with warnings.catch_warnings():  # Ray's property reads a deprecated attribute inside
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self._snap: tuple[pafs.FileSystem, str] | None = None
        if cfg.snapshot_uri:
            self._snap = snapshot_location(cfg.snapshot_uri, group_id, shard, cfg.num_shards)
        self._store = self._restore()
        if self._snap is not None or self._clock is not None:
            threading.Thread(target=self._maintain, name=f"cache-shard-{shard}",
                             daemon=True).start()

    def _restore(self) -> PairStore:
        if self._snap is None:
            return PairStore(self._cfg)
        fs, path = self._snap
        try:
            table = read_snapshot(fs, path)
            if table is None:
                return PairStore(self._cfg)
            store = PairStore.restore(self._cfg, table)
        except Exception:  # a corrupt snapshot must not crash-loop the shard: start empty
            log.exception("shard %d: could not restore %s; starting empty", self._shard, path)
            return PairStore(self._cfg)
        self._restored_entries = table.num_rows
        log.info("shard %d: restored %d entries from %s", self._shard, table.num_rows, path)
        return store

    # -- serving path
    def answer(self, q: ShardQuery) -> PackedAnswer:
        """Everything one request needs from this shard (``PairStore.answer``), packed."""
        with self._lock:
            a = self._store.answer(q)
        return pack_answer(a)

    @ray.method(max_task_retries=2)
    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float, scores: np.ndarray | None = None) -> int:
        """Write pair embeddings of users this shard owns; returns the entries written."""
        with self._lock:
            n = self._store.put(users, items, vectors, version, now, scores)
            self._changes += 1
            return n

    def ping(self) -> bool:
        """A no-op call: liveness and round-trip time."""
        return True

    def metrics(self) -> dict[str, Any]:
        """The store's metrics plus this shard's snapshot and restart bookkeeping."""
        with self._lock:
            m = dict(self._store.metrics())
        m.update(shard=self._shard, group=self._group_id, pid=os.getpid(),
                 restarted=self._restarted,
                 restored_entries=self._restored_entries, snapshots=self._snapshots,
                 snapshot_errors=self._snapshot_errors, last_snapshot_s=self._last_snapshot_s)
        return m

    # -- snapshots
    def snapshot_now(self) -> dict[str, Any]:
        """Write a snapshot now (whatever changed); returns its path, rows and seconds."""
        if self._snap is None:
            return {"path": None, "rows": 0, "seconds": 0.0}
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        assert self._snap is not None
        fs, path = self._snap
        with self._snap_lock:
            t0 = time.monotonic()
            with self._lock:  # copy out under the lock, write outside it
                table = self._store.snapshot()
                changes = self._changes
            try:
                write_snapshot(fs, path, table)
            except Exception:
                self._snapshot_errors += 1
                raise
            self._snapshotted_changes = changes
            self._snapshots += 1
            self._last_snapshot_s = time.monotonic() - t0
        return {"path": path, "rows": table.num_rows, "seconds": self._last_snapshot_s}

    def _maintain(self) -> None:
        """Every ``snapshot_every_s`` wall seconds: expire by the event clock (if one was
        given; the store also expires on every call's ``now``), then snapshot if changed."""
        while True:
            time.sleep(self._cfg.snapshot_every_s)
            try:
                if self._clock is not None:
                    with self._lock:
                        if self._store.expire(self._clock()):
                            self._changes += 1
                if self._snap is not None and self._changes != self._snapshotted_changes:
                    self._snapshot()
            except Exception:
                log.exception("shard %d: background expiry or snapshot failed", self._shard)

    # -- fault injection (tests): explicit points, never timing
    def crash(self) -> None:
        """Kill this worker process at once, as a segfault or OOM kill would."""
        log.warning("shard %d: crash() called, exiting", self._shard)
        os._exit(1)

    def stall(self, seconds: float) -> None:
        """Hold the store lock for ``seconds``: every call behind it is late."""
        with self._lock:
            time.sleep(seconds)


# ---- the client --------------------------------------------------------------------------------
def shard_name(group_id: str, shard: int) -> str:
    """The Ray actor name of one shard; the group id keeps two groups apart."""
    return f"solaris-cache-{group_id}-{shard}"


class CacheGroup:
    """The router's view of a group of cache shards: handles, the ring, one-round lookups.

    Picklable (handles and the ring travel), so a Serve deployment can receive one.
    """

    def __init__(self, cfg: CacheConfig, handles: Sequence[Any], group_id: str):
        if len(handles) != cfg.num_shards:
            raise ConfigError(f"cache.num_shards={cfg.num_shards}: got {len(handles)} shard "
                              "handles")
        self.cfg = cfg
        self.group_id = group_id
        self.shards = list(handles)
        self.ring = HashRing.from_config(cfg)
        self._counts_lock = threading.Lock()
        self._late = np.zeros(cfg.num_shards, np.int64)  # answers past the deadline
        self._failed = np.zeros(cfg.num_shards, np.int64)  # answers that raised (dead shard)
        self._lookups = 0

    @classmethod
    def create(cls, cfg: CacheConfig, group_id: str | None = None, *,
               num_cpus: float = SHARD_NUM_CPUS, max_restarts: int = -1,
               namespace: str | None = None, detached: bool = False,
               event_clock: Callable[[], float] | None = None) -> "CacheGroup":
        """Start (or attach to, if they already run) the ``cfg.num_shards`` named shards.

        ``event_clock`` (e.g. ``time.time`` in production, None in a replay) lets an idle
        shard expire entries between calls; it must be picklable.
        """
        group_id = group_id or uuid.uuid4().hex[:8]
        opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": max_restarts,
                                "get_if_exists": True}
        if namespace is not None:
            opts["namespace"] = namespace
        if detached:
            opts["lifetime"] = "detached"
        handles = [CacheShard.options(name=shard_name(group_id, s), **opts)
                   .remote(cfg, s, group_id, event_clock) for s in range(cfg.num_shards)]
        return cls(cfg, handles, group_id)

    @classmethod
    def connect(cls, cfg: CacheConfig, group_id: str, namespace: str | None = None) -> "CacheGroup":
        """Attach to a running group by name (e.g. from another job or a Serve replica)."""
        handles = [ray.get_actor(shard_name(group_id, s), namespace=namespace)
                   for s in range(cfg.num_shards)]
        return cls(cfg, handles, group_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_counts_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counts_lock = threading.Lock()

    # -- placement
    def shard_of(self, users: np.ndarray) -> np.ndarray:
        """Shard index of each user (consistent hashing: a user's pairs live on one shard)."""
        return self.ring.shard_of(np.asarray(users, dtype=np.int64))

    # -- serving path
    def lookup(self, user: int, candidates: np.ndarray, now: float, version: str,
               user_knn: enrich.NeighbourTable | None, item_knn: enrich.NeighbourTable | None,
               enrich_cfg: EnrichConfig, deadline_ms: float | None = None) -> Slots:
        """The request's two SOLARIS slots from one parallel round of shard calls.

        ``deadline_ms`` (default ``cfg.deadline_ms``) bounds the wait on the monotonic clock;
        shards that are late or fail contribute ``ShardAnswer.empty`` (all misses).
        """
        t0 = time.monotonic()
        budget = (self.cfg.deadline_ms if deadline_ms is None else deadline_ms) / 1000.0
        p = enrich.plan(user, candidates, user_knn, item_knn, enrich_cfg)
        queries = enrich.route(p, self.shard_of, version, now)
        answers = self.answer_all(queries, t0 + budget)
        return enrich.assemble(p, answers, self.cfg.dim)

    def answer_all(self, queries: dict[int, ShardQuery], deadline: float
                   ) -> dict[int, ShardAnswer]:
        """One parallel round: each shard's query at once, waiting until ``deadline``
        (a ``time.monotonic()`` instant); late or failed shards answer empty."""
        shards = list(queries)
        refs = [self.shards[s].answer.remote(queries[s]) for s in shards]
        ready: set = set()
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs),
                               timeout=max(0.0, deadline - time.monotonic()))
            ready = set(done)
        out: dict[int, ShardAnswer] = {}
        late, failed = [], []
        for s, ref in zip(shards, refs):
            if ref not in ready:
                late.append(s)
                out[s] = ShardAnswer.empty(queries[s], self.cfg.dim)
                continue
            try:
                out[s] = unpack_answer(ray.get(ref, timeout=0), self.cfg.dim)
            except RayActorError as exc:  # dead or restarting shard: expected, counted
                log.debug("shard %d unavailable: %s", s, type(exc).__name__)
                failed.append(s)
                out[s] = ShardAnswer.empty(queries[s], self.cfg.dim)
            except RayError as exc:  # an error inside answer: a bug, but still only misses
                log.warning("shard %d answer failed: %s", s, exc)
                failed.append(s)
                out[s] = ShardAnswer.empty(queries[s], self.cfg.dim)
        with self._counts_lock:
            self._lookups += 1
            self._late[late] += 1
            self._failed[failed] += 1
        return out

    def put(self, users: np.ndarray, items: np.ndarray, vectors: np.ndarray, version: str,
            now: float, scores: np.ndarray | None = None, timeout_s: float = 30.0) -> int:
        """Write pairs, one call per shard involved; returns the entries written.

        A shard that fails or does not finish within ``timeout_s`` loses its part (logged):
        its pairs keep reading as missing, so the verifier enqueues them again.
        """
        users = np.asarray(users, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        vectors = np.asarray(vectors)
        if not (len(users) == len(items) == len(vectors)):
            raise RequestError(f"put: users ({len(users)}), items ({len(items)}) and vectors "
                             f"({len(vectors)}) differ in length")
        shard = self.shard_of(users)
        refs = {}
        for s in np.unique(shard):
            m = shard == s
            refs[int(s)] = self.shards[int(s)].put.remote(
                users[m], items[m], vectors[m], version, now, None if scores is None else
                np.asarray(scores)[m])
        return sum(self._gather(refs, timeout_s, "put", 0).values())

    def metrics(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """Per-shard store metrics (``{"up": False}`` for a shard that did not answer) and the
        client's counts of late and failed shard answers."""
        refs = {s: h.metrics.remote() for s, h in enumerate(self.shards)}
        got = self._gather(refs, timeout_s, "metrics", None)
        shards = [dict(got[s], up=True) if got[s] is not None else {"shard": s, "up": False}
                  for s in range(len(self.shards))]
        with self._counts_lock:
            client = {"lookups": self._lookups, "late": self._late.tolist(),
                      "failed": self._failed.tolist()}
        return {"group": self.group_id, "shards": shards, "client": client}

    def ping(self, shard: int = 0, timeout_s: float = 5.0) -> bool:
        """Whether ``shard`` answers a no-op call within ``timeout_s``."""
        return bool(self._gather({shard: self.shards[shard].ping.remote()}, timeout_s, "ping",
                                 False)[shard])

    def ping_all(self, timeout_s: float = 5.0) -> list[bool]:
        """A no-op call to every shard in one parallel round: which answered in time."""
        got = self._gather({s: h.ping.remote() for s, h in enumerate(self.shards)}, timeout_s,
                           "ping", False)
        return [bool(got[s]) for s in range(len(self.shards))]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every shard answers a ping (e.g. after start or a restart)."""
        deadline = time.monotonic() + timeout_s
        pending = set(range(len(self.shards)))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cache shards {sorted(pending)} of group {self.group_id} "
                                   f"not ready after {timeout_s} s")
            got = self._gather({s: self.shards[s].ping.remote() for s in pending},
                               min(left, 5.0), "ping", False, level=logging.DEBUG)
            pending = {s for s, ok in got.items() if not ok}
            if pending:
                time.sleep(0.05)

    def snapshot_now(self, timeout_s: float = 60.0) -> list[dict[str, Any] | None]:
        """Snapshot every shard now; None for a shard that failed."""
        got = self._gather({s: h.snapshot_now.remote() for s, h in enumerate(self.shards)},
                           timeout_s, "snapshot_now", None)
        return [got[s] for s in range(len(self.shards))]

    def shutdown(self) -> None:
        """Kill every shard for good (no restart); their snapshots stay."""
        for h in self.shards:
            try:
                ray.kill(h, no_restart=True)
            except RayError:
                pass

    def _gather(self, refs: dict[int, Any], timeout_s: float, what: str, default: Any,
                level: int = logging.WARNING) -> dict[int, Any]:
        """Each ref's value, or ``default`` where it failed or missed ``timeout_s``."""
        done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready = set(done)
        out = {}
        for s, ref in refs.items():
            if ref not in ready:
                log.log(level, "cache shard %d: %s timed out after %.1f s", s, what, timeout_s)
                out[s] = default
                continue
            try:
                out[s] = ray.get(ref, timeout=0)
            except RayError as exc:
                log.log(level, "cache shard %d: %s failed: %s", s, what, type(exc).__name__)
                out[s] = default
        return out
