"""Fetch MovieLens-100K into a local cache, from the copy inside the ``recbole`` wheel on PyPI.

The data's licence forbids redistribution, so the project never ships it: this module asks
pip for ``recbole==1.2.1`` (no dependencies, nothing installed), unpacks only
``recbole/dataset_example/ml-100k/*`` into ``<cache>/ml-100k`` and returns that directory,
which ``solaris.data.movielens.load_movielens`` reads.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from solaris.errors import DataError

log = logging.getLogger(__name__)

RECBOLE_VERSION = "1.2.1"
_MEMBER_DIR = "recbole/dataset_example/ml-100k/"
_DIR_NAME = "ml-100k"
_MARKER = "ml-100k.inter"


class FetchError(DataError):
    """The data could not be fetched (pip failed, registry unreachable, unexpected wheel)."""


def default_cache_dir() -> Path:
    """``$SOLARIS_CACHE`` if set, else ``~/.cache/solaris``."""
    env = os.environ.get("SOLARIS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "solaris"


def fetch_movielens(cache_dir: str | Path | None = None, *, timeout_s: float = 300.0,
                    python: str = sys.executable) -> Path:
    """Return ``<cache_dir>/ml-100k`` holding ml-100k in RecBole format, downloading it once.

    ``python`` is the interpreter whose pip does the download (a parameter so tests can
    point it at one that fails). Raises FetchError when pip fails or times out.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / _DIR_NAME
    if (target / _MARKER).is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="solaris-fetch-", dir=cache) as tmp:
        wheel = _download_wheel(Path(tmp), timeout_s=timeout_s, python=python)
        staged = Path(tmp) / _DIR_NAME
        extract_ml100k(wheel, staged)
        try:
            staged.rename(target)  # atomic: a reader sees all files or none
        except OSError as exc:
            if not (target / _MARKER).is_file():  # else a concurrent fetch won the race: fine
                raise FetchError(f"{target} exists without {_MARKER}; remove it and retry ({exc})") from exc
    log.info("fetched ml-100k into %s", target)
    return target


def _download_wheel(dest: Path, *, timeout_s: float, python: str) -> Path:
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", f"recbole=={RECBOLE_VERSION}", "-d", str(dest)]
    log.info("downloading recbole==%s with pip (for its ml-100k copy)", RECBOLE_VERSION)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"pip download of recbole=={RECBOLE_VERSION} timed out after {timeout_s:.0f}s "
                         "(package registry unreachable?)") from exc
    except OSError as exc:
        raise FetchError(f"cannot run {python!r} to download recbole=={RECBOLE_VERSION}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-5:])
        raise FetchError(f"pip download of recbole=={RECBOLE_VERSION} failed (exit {proc.returncode}); "
                         f"is the package registry reachable? pip said:\n{tail}")
    wheels = sorted(dest.glob("recbole-*.whl"))
    if not wheels:
        raise FetchError(f"pip reported success but left no recbole wheel in {dest}")
    return wheels[0]


def extract_ml100k(wheel: Path, dest: Path) -> Path:
    """Unpack the files under ``recbole/dataset_example/ml-100k/`` of ``wheel`` into ``dest``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.infolist()
                       if m.filename.startswith(_MEMBER_DIR) and not m.is_dir()
                       and "/" not in m.filename[len(_MEMBER_DIR):]]
            if not any(m.filename.endswith(_MARKER) for m in members):
                raise FetchError(f"{wheel}: no {_MEMBER_DIR}{_MARKER} inside")
            dest.mkdir(parents=True, exist_ok=True)
            for m in members:
                name = m.filename[len(_MEMBER_DIR):]  # plain file name: no path can escape dest
                with zf.open(m) as src, open(dest / name, "wb") as out:
                    shutil.copyfileobj(src, out)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel}: not a valid wheel ({exc})") from exc
    return dest
