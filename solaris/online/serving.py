"""What the Serve app needs that is not Ray: settings, where the default artifacts live, KNN
tables.

The app builder (``serve_app.py``) has the embedded default trained where it is missing
(``solaris.train.artifacts.ensure_artifacts``), so no replica ever trains anything.
``KnnTables`` holds the published user / item neighbour tables and swaps to a newer
published version when the pointer moves (checked every ``knn.poll_s`` on the wall clock),
without a restart; given the FM versions the app serves, it disables any table built from
another (``solaris.knn.provenance``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from cachetools import LRUCache

from solaris.artifact_store import canonical
from solaris.config import KnnConfig, SolarisConfig, config_to_dict, load_config
from solaris.errors import ConfigError
from solaris.knn.neighbours import KnnSnapshot
from solaris.knn.provenance import Verdict, restrict

log = logging.getLogger(__name__)

ARTIFACTS_ENV = "SOLARIS_ARTIFACTS"  # overrides where the default artifacts live
_SETTING_KEYS = ("config", "artifacts", "mode", "app_id", "precompute", "profile")


def settings_from_args(args: dict[str, Any]) -> dict[str, Any]:
    """The app's settings from ``serve run`` / config-file args (all strings there).

    ``config``: YAML of the config tree; ``artifacts``: artifact dir(s) or ``pyarrow.fs``
    URIs (each node reads its verified copy: ``solaris.artifact_store``), comma-separated,
    oldest version first (later ones are rolled out); ``mode``: solaris | vm | inline;
    ``app_id``: names the app's actors (cache shards, queue, ledger); ``precompute``:
    "false" runs no FM workers; ``profile``: serving | cluster | replay (``serve.profile``).
    Unknown keys are an error that names them.
    """
    unknown = sorted(set(args) - set(_SETTING_KEYS))
    if unknown:
        raise ConfigError(f"app args {unknown}: unknown (known: {', '.join(_SETTING_KEYS)})")
    overrides: dict[str, Any] = {}
    if args.get("mode"):
        overrides["serve.mode"] = str(args["mode"])
    if args.get("profile"):
        overrides["serve.profile"] = str(args["profile"])
    cfg = load_config(args.get("config"), overrides)
    dirs = args.get("artifacts") or cfg.serve.artifacts_dir or ""
    dirs = dirs if isinstance(dirs, list) else [d for d in str(dirs).split(",") if d]
    precompute = str(args.get("precompute", "true")).lower() not in ("false", "0", "no")
    return {"config": args.get("config"), "overrides": overrides,
            "artifact_dirs": [canonical(d) for d in dirs],
            "app_id": str(args.get("app_id") or "solaris"), "precompute": precompute}


# what a VM deployment's options in the app's ``vm`` argument may set (Ray Serve's names)
VM_OPTIONS = ("num_replicas", "max_ongoing_requests", "max_queued_requests",
              "backpressure_config", "autoscaling_config", "ray_actor_options",
              "max_replicas_per_node", "health_check_period_s", "health_check_timeout_s",
              "graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s")


def deployment_options(value: Any, name: str) -> dict[str, Any]:
    """A deployment's Serve options from an app argument: a mapping (a config file's YAML) or
    its JSON text (``serve run ... vm='{"num_replicas": 2}'``); None is no options. Keys
    outside ``VM_OPTIONS`` are an error naming them."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"app arg {name}={value!r}: not a JSON object ({e.msg})") from e
    if not isinstance(value, dict):
        raise ConfigError(f"app arg {name}={value!r}: must be a mapping of Serve deployment "
                          f"options")
    unknown = sorted(set(value) - set(VM_OPTIONS))
    if unknown:
        raise ConfigError(f"app arg {name}: options {unknown} unknown (known: "
                          f"{', '.join(VM_OPTIONS)})")
    return dict(value)


def positive_int(value: Any, name: str) -> int | None:
    """An app argument that is a count: an int, or its text from ``serve run``; None if
    absent."""
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(n) != str(value).strip():
        raise ConfigError(f"app arg {name}={value!r}: must be a positive integer")
    return n


def default_artifacts_dir(cfg: SolarisConfig) -> Path:
    """Where the embedded default's artifacts live: ``$SOLARIS_ARTIFACTS`` or a per-config
    folder under ``~/.cache/solaris/artifacts``."""
    if os.environ.get(ARTIFACTS_ENV):
        return Path(os.environ[ARTIFACTS_ENV])
    key = json.dumps({k: config_to_dict(getattr(cfg, k)) for k in
                      ("data", "split", "features", "fm", "encoder", "vm", "train")},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "solaris" / "artifacts" / f"{cfg.data.dataset}-{digest}"


def knn_version(uri: str) -> str | None:
    """The published user (and item) KNN versions under ``uri``, one string; None before
    the first user publish. Reads only the pointer files."""
    from solaris.knn import tables as knn

    user = knn.current_version(uri, "user")
    if user is None:
        return None
    return f"{user}|{knn.current_version(uri, 'item') or ''}"


def load_knn(uri: str) -> KnnSnapshot:
    """The published tables under ``uri`` (``jobs/rebuild_knn.py``): the user table and
    its live index; the item table where one is published; what each was built from."""
    from solaris.knn import tables as knn

    user, live = knn.load_build(uri, "user")
    if live is None:  # published without an index: no cold-start queries, tables still serve
        log.warning("KNN %s: no live user index; cold-start users get no neighbours",
                    user.version)
    built = {"user": user.built_from}
    items, iv = None, ""
    if knn.current_version(uri, "item") is not None:
        item, _ = knn.load_build(uri, "item", with_index=False)
        iv, items, built["item"] = item.version, item.neighbour_table(), item.built_from
    return KnnSnapshot(f"{user.version}|{iv}", user.neighbour_table(), items, live,
                       {k: b for k, b in built.items() if b is not None})


class ColdStartMemo:
    """Cold-start neighbour queries, memoised by everything a query reads: the KNN version,
    the probe width and the user encoder's inputs (``ENCODER_INPUTS``, byte for byte). A hit
    is exactly the answer a fresh encode and index query would give, so serving with the memo
    is serving without it, minus the encoder's forward and the index query. Users with the
    same features and no history yet (most cold starts) share one entry. A bounded LRU map
    (``cachetools``); ``maxsize`` 0 turns it off. Thread-safe."""

    def __init__(self, maxsize: int):
        if maxsize < 0:
            raise ConfigError(f"cold-start memo size {maxsize}: must be >= 0")
        self._memo: LRUCache | None = LRUCache(maxsize) if maxsize else None
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(version: str, probe: int, req: dict[str, Any]) -> bytes:
        """A digest of the query's inputs (every ``ENCODER_INPUTS`` array's dtype, shape and
        bytes)."""
        from solaris.knn.user_encoder import ENCODER_INPUTS

        h = hashlib.blake2b(digest_size=20)
        h.update(f"{version}|{probe}".encode())
        for name in ENCODER_INPUTS:
            a = np.ascontiguousarray(np.asarray(req[name]))
            h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
        return h.digest()

    def get(self, version: str, probe: int, req: dict[str, Any],
            query: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, sims)`` of one user's query: memoised, or ``query()`` (encode and search),
        kept for the next request with the same inputs."""
        if self._memo is None:
            self.misses += 1
            return query()
        k = self.key(version, probe, req)
        with self._lock:
            hit = self._memo.get(k)
            if hit is not None:
                self.hits += 1
                return hit
        ids, sims = query()
        ids, sims = np.array(ids, copy=True), np.array(sims, copy=True)
        ids.flags.writeable = sims.flags.writeable = False  # shared by every later hit
        with self._lock:
            self.misses += 1
            self._memo[k] = (ids, sims)
        return ids, sims

    def metrics(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses,
                "entries": len(self._memo) if self._memo is not None else 0}


def cold_start_inputs(history: Any, user: int, now: float, surface: int, history_len: int,
                      side: Any) -> dict[str, np.ndarray]:
    """The FM's request inputs of one user as of ``now`` for the cold-start query, from the
    live ``history`` (a ``HistoryProvider``) and the side tables. A user the FM has no row
    for (arrived after it was trained: an appended or provisional code) reads its history
    with zero side features, as the VM reads such a user; the FM's user vectors do not read
    the user id."""
    users, at = np.array([user], np.int64), np.array([now], np.float64)
    surfaces = np.array([surface], np.int64)
    if user < len(side.user_cat):
        return history.batch(users, at, surfaces, history_len, side.item_cat, side.user_cat,
                             side.user_cont)
    from solaris.history import request_inputs

    win = history.fetch(users, at, history_len)
    return request_inputs(win, np.zeros(1, np.int64), at, surfaces, side.item_cat,
                          np.zeros((1, side.user_cat.shape[1]), np.int64),
                          np.zeros((1, side.user_cont.shape[1]), np.float32))


def is_cold(table: Any, user: int) -> bool:
    """Whether ``table`` (a NeighbourTable or None) has no neighbour for ``user``."""
    return table is None or not table.has(user)


class KnnTables:
    """The current published KNN tables; swaps to a newer version when the pointer moves.

    ``loader(uri) -> KnnSnapshot`` and ``probe(uri) -> version`` are injected (the KNN
    module's reader); ``clock`` is the wall clock that paces the polls. ``served`` (FM
    version -> its id map's digest, ``IdMap.digest``): the app's FM versions; each loaded
    version's tables are judged against them (``solaris.knn.provenance.restrict``), a
    disabled table is dropped from the snapshot and said once in the log, and ``verdicts``
    keeps what was decided. None: every table is served (a holder that only shares them).
    """

    def __init__(self, cfg: KnnConfig, loader: Callable[[str], KnnSnapshot],
                 probe: Callable[[str], str | None], clock: Callable[[], float] = time.monotonic,
                 served: Mapping[str, str] | None = None):
        if not cfg.table_uri:
            raise ConfigError("knn.table_uri=None: no published KNN tables to read")
        self.cfg = cfg
        self._loader, self._probe, self._clock = loader, probe, clock
        self._served = dict(served) if served is not None else None
        self.verdicts: list[Verdict] = []  # on each table of the version in use
        self._lock = threading.Lock()
        self._snap: KnnSnapshot | None = None
        self._next_poll = -float("inf")
        self.swaps = 0
        self.errors = 0

    @property
    def version(self) -> str | None:
        return self._snap.version if self._snap else None

    def peek(self) -> KnnSnapshot | None:
        """The tables in use, without polling (an event loop reads these and runs a due
        ``current`` on a thread)."""
        return self._snap

    def due(self) -> bool:
        """Whether ``current`` would poll the published pointer now."""
        return self._clock() >= self._next_poll

    def current(self) -> KnnSnapshot | None:
        """The tables to use now (None before the first publish); polls when due. A failed
        read keeps the tables in use (logged and counted), never raises."""
        now = self._clock()
        if now < self._next_poll:
            return self._snap
        with self._lock:
            if now < self._next_poll:
                return self._snap
            self._next_poll = now + self.cfg.poll_s
            try:
                v = self._probe(self.cfg.table_uri)
                if v is not None and (self._snap is None or v != self._snap.version):
                    snap = self._loader(self.cfg.table_uri)
                    log.info("KNN tables: %s -> %s", self.version, snap.version)
                    if self._served is not None:
                        snap, self.verdicts = restrict(snap, self._served)
                        for verdict in self.verdicts:
                            if verdict.reason:
                                log.warning("KNN tables: %s", verdict.line())
                    self._snap = snap
                    self.swaps += 1
            except Exception:
                self.errors += 1
                log.exception("KNN tables: could not read %s; keeping %s", self.cfg.table_uri,
                              self.version)
        return self._snap


class AfterAnswer:
    """What the router does after answering, buffered across requests: the impressions for
    the history store and the verifier's picks for the precompute queue. ``drain`` hands
    them over as one record list and one array batch per version, so a router makes a call
    per shard and per version every few milliseconds, not four calls per request."""

    def __init__(self, max_requests: int):
        self.max_requests = max_requests
        self._requests = 0
        self._impressions: list[tuple[int, np.ndarray, int, float]] = []
        self._picks: dict[str, list[tuple[int, np.ndarray, np.ndarray, float, int]]] = {}

    def __len__(self) -> int:
        return self._requests

    def _count(self) -> bool:
        self._requests += 1
        return self._requests >= self.max_requests

    def add(self, user: int, items: np.ndarray, surface: int, now: float,
            picks: dict[str, tuple[np.ndarray, np.ndarray]]) -> bool:
        """Buffer one answered request: ``items`` shown (impressions; may be empty) and
        ``picks`` mapping a version to (items, scores) to precompute. True when the buffer
        is full (drain now)."""
        if len(items):
            self._impressions.append((user, items, surface, now))
        for version, (its, scores) in picks.items():
            if len(its):
                self._picks.setdefault(version, []).append((user, its, scores, now, surface))
        return self._count()

    def drain(self) -> tuple[list[tuple[int, np.ndarray, int, float]],
                             dict[str, tuple[np.ndarray, ...]]]:
        """(impression records, {version: (users, items, priorities, nows, surfaces)})."""
        impressions, picks = self._impressions, self._picks
        self._impressions, self._picks, self._requests = [], {}, 0
        batches = {}
        for version, rows in picks.items():
            sizes = [len(r[1]) for r in rows]
            batches[version] = (
                np.repeat(np.array([r[0] for r in rows], np.int64), sizes),
                np.concatenate([r[1] for r in rows]).astype(np.int64),
                np.concatenate([r[2] for r in rows]).astype(np.float64),
                np.repeat(np.array([r[3] for r in rows], np.float64), sizes),
                np.repeat(np.array([r[4] for r in rows], np.int64), sizes))
        return impressions, batches
