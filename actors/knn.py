"""The app's KNN holder: reads each published KNN build once and shares it through the
object store, so router replicas never decode the Parquet tables themselves."""

from __future__ import annotations

import time
from typing import Any, Mapping

import ray

from actors import names
from solaris.config import KnnConfig
from solaris.online.serving import KnnTables, knn_version, load_knn

HOLDER_NUM_CPUS = 0.05


@ray.remote(num_cpus=HOLDER_NUM_CPUS, max_restarts=-1)
class KnnHolder:
    """Polls the published pointer (``knn.poll_s``); on a new version, loads it and puts one
    shareable copy in the object store (``KnnSnapshot.shareable``)."""

    def __init__(self, cfg: KnnConfig) -> None:
        self._tables = KnnTables(cfg, load_knn, knn_version, time.monotonic)
        self._ref: Any = None
        self._version: str | None = None

    def version(self) -> str | None:
        """The current published version (None before the first publish)."""
        snap = self._tables.current()
        if snap is not None and snap.version != self._version:
            self._ref = ray.put(snap.shareable())
            self._version = snap.version
        return self._version

    def snapshot(self) -> list:
        """``[ObjectRef]`` of the current version's shareable snapshot (a list, so the ref
        travels as a ref), or ``[]`` before the first publish."""
        self.version()
        return [] if self._ref is None else [self._ref]


def create_knn_holder(cfg: KnnConfig, app_id: str, detached: bool = False) -> Any:
    """Start (or attach to) the app's holder, named after ``app_id``; ``detached``: it
    outlives the process that starts it."""
    return KnnHolder.options(name=names.knn_holder(app_id), get_if_exists=True,
                             lifetime="detached" if detached else None).remote(cfg)


def holder_tables(cfg: KnnConfig, holder: Any, served: Mapping[str, str] | None = None
                  ) -> KnnTables:
    """A router's ``KnnTables`` over the holder: the pointer check is a call to the holder,
    a swap one ``ray.get`` of the shared snapshot; ``served`` (FM version -> id map digest)
    disables the tables of other FM versions (``KnnTables``)."""
    def probe(uri: str) -> str | None:
        return ray.get(holder.version.remote(), timeout=10)

    def load(uri: str):
        (ref,) = ray.get(holder.snapshot.remote(), timeout=10)
        return ray.get(ref, timeout=30).usable()

    return KnnTables(cfg, load, probe, time.monotonic, served)
