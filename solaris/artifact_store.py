"""Artifacts from shared storage: a ``pyarrow.fs`` URI turned into a verified local directory.

An artifact location (``solaris.artifacts``) is a local path, read in place, or a URI
(``s3://``, ``gs://``, ``file://``, a shared file system; S3 options ride in the URI's query,
e.g. ``s3://bucket/art?region=eu-west-1&endpoint_override=host:9000&scheme=http``). A URI is
copied once per node into a cache directory (``$SOLARIS_ARTIFACT_CACHE``, default
``~/.cache/solaris/remote-artifacts``), one entry per URI and manifest, and the copy is
checked against the manifest's ``files``: each file's sha256 and size, recorded by
``solaris train`` (``file_hashes``). A cached copy whose files match is used without reading
anything but the remote manifest; one that does not is downloaded again. A download goes to
a temporary directory beside the entry and is renamed into place under a per-entry file lock,
so two processes on one node never see (or write) half a copy. A remote file whose digest
differs from the manifest's is refused with a ``CheckpointError`` naming the file and both
digests. Artifacts written before manifests recorded hashes are copied whole and checked by
size only (a warning says so).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

from solaris.atomic import TMP, filesystem
from solaris.errors import CheckpointError

log = logging.getLogger(__name__)

CACHE_ENV = "SOLARIS_ARTIFACT_CACHE"  # where this node keeps its copies of remote artifacts
FILES = "files"  # the manifest's {relative path: {"sha256": hex, "size": bytes}}
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def is_uri(location: str | Path) -> bool:
    """Whether ``location`` is a URI (copied into the node's cache) rather than a local path
    (read in place)."""
    return "://" in str(location)


def canonical(location: str | Path) -> str:
    """``location`` as every node can read it: a URI unchanged, a local path made absolute."""
    s = str(location)
    return s if is_uri(s) else str(Path(s).resolve())


def shown(uri: str) -> str:
    """``uri`` without the credentials a URI may carry (``s3://KEY:SECRET@bucket``): what
    logs, errors and cache keys use."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _within(name: str, rel: str) -> str:
    """The file ``rel`` of the directory URI ``name`` (its query, if any, kept last)."""
    parts = urlsplit(name)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{rel}"))


def cache_dir() -> Path:
    """This node's cache of remote artifacts: ``$SOLARIS_ARTIFACT_CACHE`` or
    ``~/.cache/solaris/remote-artifacts`` (``$XDG_CACHE_HOME`` respected)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "solaris" / "remote-artifacts"


def sha256_file(path: str | Path) -> tuple[str, int]:
    """(hex sha256, size in bytes) of a local file."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def file_hashes(root: str | Path, names: Iterable[str]) -> dict[str, dict[str, object]]:
    """The manifest's ``files`` entry: sha256 and size of each of ``names`` (paths relative
    to ``root``, with ``/``), in name order."""
    out: dict[str, dict[str, object]] = {}
    for name in sorted(set(names)):
        digest, size = sha256_file(Path(root) / name)
        out[name] = {"sha256": digest, "size": size}
    return out


def local_artifacts(location: str | Path, cache: "ArtifactCache | None" = None) -> Path:
    """The local directory of artifact ``location``: a local path as it is, a URI as this
    node's verified copy (``cache``, default ``ArtifactCache()`` over ``cache_dir()``)."""
    if not is_uri(location):
        return Path(location)
    return (cache or ArtifactCache()).local(str(location))


class ArtifactCache:
    """Verified local copies of remote artifact directories under ``root``; counts what it
    did (``hits``: copies used as they were, ``fetches``: copies downloaded, ``downloads``:
    files downloaded)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir()
        self.hits = 0
        self.fetches = 0
        self.downloads = 0

    def local(self, uri: str) -> Path:
        """This node's copy of the artifact directory at ``uri``, downloaded and checked
        where no cached copy matches the remote manifest."""
        name = shown(uri)
        fs, path = filesystem(uri)
        path = path.rstrip("/")
        raw = _read_manifest(fs, path, name)
        want = _expected(raw, fs, path, name)
        key = hashlib.sha256(f"{name}\n".encode() + raw).hexdigest()[:24]
        entry = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        with _locked(self.root / f".{key}.lock"):
            stale = _mismatch(entry, raw, want)
            if stale is None:
                self.hits += 1
                return entry
            if entry.exists():
                log.warning("%s: the cached copy in %s %s; downloading it again", name, entry,
                            stale)
            self._fetch(fs, path, name, raw, want, entry)
        return entry

    def _fetch(self, fs: pafs.FileSystem, path: str, name: str, raw: bytes,
               want: dict[str, tuple[str | None, int]], entry: Path) -> None:
        """Download every wanted file into a temporary directory, check each, write the
        manifest last, then move the directory over ``entry`` (called under its lock)."""
        for old in self.root.glob(f"{entry.name}{TMP}*"):  # a crashed download's leftovers
            shutil.rmtree(old, ignore_errors=True)
        tmp = self.root / f"{entry.name}{TMP}{uuid.uuid4().hex}"
        aside = self.root / f"{entry.name}.old-{uuid.uuid4().hex}"
        try:
            for rel, (digest, size) in want.items():
                _download(fs, f"{path}/{rel}", tmp / rel, _within(name, rel), digest, size)
                self.downloads += 1
            (tmp / MANIFEST).write_bytes(raw)
            if entry.exists():  # a copy that failed its check: out of the way first
                entry.rename(aside)
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(aside, ignore_errors=True)
        self.fetches += 1
        log.info("%s: %d files copied to %s", name, len(want), entry)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a second process waits, then finds the copy made
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_manifest(fs: pafs.FileSystem, path: str, name: str) -> bytes:
    if fs.get_file_info(f"{path}/{MANIFEST}").type != pafs.FileType.File:
        raise CheckpointError(f"{name}: no {MANIFEST} (train artifacts with `solaris train` "
                              "and copy the whole directory)")
    with fs.open_input_stream(f"{path}/{MANIFEST}") as f:
        return f.read()


def _expected(raw: bytes, fs: pafs.FileSystem, path: str, name: str
              ) -> dict[str, tuple[str | None, int]]:
    """{relative path: (sha256 or None, size)} of the files a copy of ``path`` holds: the
    manifest's ``files``, or (a manifest without them) every file there, by size only."""
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{_within(name, MANIFEST)}: malformed manifest ({e})") from e
    files = manifest.get(FILES) if isinstance(manifest, dict) else None
    if files is None:
        log.warning("%s: the manifest records no file hashes (artifacts written before "
                    "`solaris train` recorded them): the local copy is checked by size only; "
                    "retrain to have it checked by content", name)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = {i.path[len(path) + 1:]: {"size": i.size} for i in infos
                 if i.type == pafs.FileType.File and TMP not in i.base_name}
        files.pop(MANIFEST, None)
    out: dict[str, tuple[str | None, int]] = {}
    try:
        for rel, v in files.items():
            _check_relative(rel, name)
            out[rel] = (str(v["sha256"]) if "sha256" in v else None, int(v["size"]))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{_within(name, MANIFEST)}: malformed {FILES!r} "
                              f"({type(e).__name__}: {e})") from e
    return out


def _check_relative(rel: str, name: str) -> None:
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or rel == MANIFEST:
        raise CheckpointError(f"{_within(name, MANIFEST)}: file {rel!r} in {FILES!r} is not a "
                              "relative path inside the artifact directory")


def _mismatch(entry: Path, raw: bytes, want: dict[str, tuple[str | None, int]]) -> str | None:
    """Why the cached ``entry`` is not a copy of what ``raw`` describes, or None when it is."""
    try:
        if (entry / MANIFEST).read_bytes() != raw:
            return "has another manifest"
    except OSError:
        return "is missing or incomplete"
    for rel, (digest, size) in want.items():
        p = entry / rel
        try:
            if p.stat().st_size != size:
                return f"has {rel} of another size"
            if digest is not None and sha256_file(p)[0] != digest:
                return f"has {rel} with another sha256"
        except OSError:
            return f"lacks {rel}"
    return None


def _download(fs: pafs.FileSystem, src: str, dst: Path, name: str, digest: str | None,
              size: int) -> None:
    """Copy ``src`` to local ``dst``, hashing as it goes; refuse a file unlike the manifest."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    if fs.get_file_info(src).type != pafs.FileType.File:
        raise CheckpointError(f"{name}: missing, the manifest lists it")
    with fs.open_input_stream(src) as f, open(dst, "wb") as out:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
            out.write(chunk)
    found = h.hexdigest()
    if digest is not None and found != digest:
        raise CheckpointError(f"{name}: sha256 {found} ({n} bytes), the manifest records "
                              f"{digest} ({size} bytes): refused (corrupt, or changed after "
                              "training)")
    if n != size:
        raise CheckpointError(f"{name}: {n} bytes, the manifest records {size}: refused")
