"""What a KNN table was built from, and whether an app may serve it.

A table's neighbours are users (items) coded by one id map and placed by one FM's
embeddings. ``jobs/rebuild_knn.py`` records both with every table it publishes
(``BuiltFrom``: the FM version and a digest of the id map, ``solaris.ids.IdMap.digest``).
An app serves a table only when the table's FM version is one it serves and the id map
digest is that version's: any other table is disabled by name (``judge``, ``restrict``),
said once in the log and in ``/healthz``, and none of its neighbours is served.

A table published without a record (a build by an older SOLARIS, or ``publish`` called
without one) is served with a warning: nothing says it is wrong, and refusing it would turn
off the neighbour tiers of a running deployment until its next rebuild. The warning says
to rebuild; ``jobs/rebuild_knn.py --if-changed`` rebuilds such a table even when its inputs
did not change, so the next scheduled run records what it was built from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from solaris.errors import DataError


@dataclass(frozen=True)
class BuiltFrom:
    """The FM version and id map one KNN table was built from."""

    fm_version: str  # the artifacts' version (manifest ``version``, the FM checkpoint's)
    ids: str  # ``IdMap.digest()`` of the id map the table's ids are codes of
    # the user table's user vector (``knn.user_vector``), which a cold-start query must use
    # too; None: not recorded (a build before there was a choice: the request tower)
    user_vector: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.fm_version, str) or not self.fm_version:
            raise DataError(f"built_from.fm_version={self.fm_version!r}: a non-empty string")
        if not isinstance(self.ids, str) or not self.ids:
            raise DataError(f"built_from.ids={self.ids!r}: a non-empty id map digest")
        if self.user_vector is not None and (not isinstance(self.user_vector, str)
                                             or not self.user_vector):
            raise DataError(f"built_from.user_vector={self.user_vector!r}: a non-empty string")

    def to_dict(self) -> dict[str, str]:
        d = {"fm_version": self.fm_version, "ids": self.ids}
        if self.user_vector is not None:
            d["user_vector"] = self.user_vector
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "BuiltFrom | None":
        """The record stored with a table; None where it holds none (an unrecorded build)."""
        if not d:
            return None
        if not isinstance(d, dict):
            raise DataError(f"built_from={d!r}: expected a mapping with fm_version and ids")
        return cls(d.get("fm_version"), d.get("ids"), d.get("user_vector"))


@dataclass(frozen=True)
class Verdict:
    """Whether one published table is served here, and why not (or what to warn about)."""

    kind: str  # "user" or "item"
    version: str  # the KNN build's version
    served: bool
    reason: str = ""  # why it is disabled; for a served unrecorded table, the warning

    def line(self) -> str:
        """One sentence for the log and ``/healthz``."""
        if not self.reason:
            return f"{self.kind} table {self.version}: served"
        return (f"{self.kind} table {self.version} "
                f"{'served, but' if self.served else 'disabled:'} {self.reason}")


def judge(kind: str, version: str, built_from: BuiltFrom | None,
          served: Mapping[str, str]) -> Verdict:
    """The verdict on a ``kind`` table of build ``version`` recorded as ``built_from``, in an
    app serving the FM versions ``served`` (version -> its id map's digest)."""
    if built_from is None:
        return Verdict(kind, version, True,
                       "it records no FM version or id map (built before tables recorded "
                       "them): rebuild it with jobs/rebuild_knn.py to have it checked")
    known = ", ".join(sorted(served)) or "none"
    if built_from.fm_version not in served:
        return Verdict(kind, version, False,
                       f"built from FM {built_from.fm_version}, this app serves FM {known}; "
                       f"rebuild it from the served artifacts")
    if served[built_from.fm_version] != built_from.ids:
        return Verdict(kind, version, False,
                       f"built from FM {built_from.fm_version} with another id map (digest "
                       f"{built_from.ids[:12]}, the served artifacts' "
                       f"{served[built_from.fm_version][:12]}); rebuild it from the served "
                       f"artifacts")
    return Verdict(kind, version, True)


def restrict(snap: Any, served: Mapping[str, str]) -> tuple[Any, list[Verdict]]:
    """``snap`` (a ``KnnSnapshot``) with every table ``judge`` disables removed -- a disabled
    user table takes its live index with it, as both come from one build -- and the verdict
    on each table it held."""
    verdicts: list[Verdict] = []
    keep: dict[str, Any] = {}
    for kind, attr in (("user", "users"), ("item", "items")):
        table = getattr(snap, attr)
        if table is None:
            continue
        v = judge(kind, table.version, snap.built_from.get(kind), served)
        verdicts.append(v)
        if not v.served:
            keep[attr] = None
            if kind == "user":
                keep["live"] = None
    return (dataclasses.replace(snap, **keep) if keep else snap), verdicts


def of_artifacts(root: Any, fm_version: str) -> BuiltFrom | None:
    """What a table built from the artifact directory ``root`` (local) with its FM of
    ``fm_version`` is built from: that version and the digest of the id map the app serving
    these artifacts codes by (``Artifacts.ids``; a directory holding only the model files:
    its ``ids/`` if saved, else the identity over the FM's sizes). None for an FM that
    names no version (nothing to record)."""
    from pathlib import Path

    from solaris.ids import IdMap

    root = Path(root)
    if (root / "manifest.json").is_file():
        from solaris.artifacts import Artifacts

        art = Artifacts.open(root)
        version = art.version or fm_version
        return BuiltFrom(version, art.ids().digest()) if version else None
    if not fm_version:
        return None
    ids = IdMap.load(root)
    if ids is None:
        from solaris.train.checkpoint import load_checkpoint

        meta = load_checkpoint(root / "fm.pt", "fm")["meta"]
        ids = IdMap.identity(int(meta["num_users"]), int(meta["num_items"]))
    return BuiltFrom(fm_version, ids.digest())
