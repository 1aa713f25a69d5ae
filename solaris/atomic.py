"""Every file SOLARIS publishes lands whole or not at all: written to a temporary name beside
its path, then moved over it (a rename on one filesystem). A reader, a restarted actor or a
second process sees the old file or the new one, never half of one; a crash mid-write leaves
a stray ``<name>.tmp-<hex>`` that ``remove_stale`` (and ``read_snapshot``) clears.

Paths are local paths or ``pyarrow.fs`` URIs (``s3://``, ``gs://``, ``file://``), so the same
call publishes a KNN table to object storage and a manifest to a local directory.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import IO, Any, Callable

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

TMP = ".tmp-"  # a temporary's name: the target's name + TMP + a random hex


def filesystem(path: str | Path) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` (a URI, or a local path made absolute) and the path in it."""
    s = str(path)
    return pafs.FileSystem.from_uri(s if "://" in s else os.path.abspath(s))


def write_atomic(fs: pafs.FileSystem, path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then move it over ``path`` (the
    temporary is removed if anything fails): readers see the old file or the new, whole."""
    tmp = f"{path}{TMP}{uuid.uuid4().hex}"
    try:
        write(tmp)
        fs.move(tmp, path)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise


def save(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path | str:
    """``write(f)`` into a binary stream that lands at ``path`` whole (parents created).
    Works for anything that writes to a file object: ``np.savez``, ``torch.save``, bytes."""
    fs, p = filesystem(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    save_on(fs, p, write)
    return path


def save_on(fs: pafs.FileSystem, path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """``save`` on an already resolved filesystem ``fs`` and path (its folder exists)."""
    def stream(tmp: str) -> None:
        with fs.open_output_stream(tmp) as f:
            write(f)
    write_atomic(fs, path, stream)


def save_text(path: str | Path, text: str) -> Path | str:
    """``text`` (UTF-8) at ``path``, whole."""
    data = text.encode("utf-8")
    return save(path, lambda f: f.write(data))


def save_json(path: str | Path, obj: Any, **dumps: Any) -> Path | str:
    """``json.dumps(obj, indent=2, **dumps)`` at ``path``, whole."""
    return save_text(path, json.dumps(obj, **{"indent": 2, **dumps}))


def save_figure(path: str | Path, fig: Any, **savefig: Any) -> Path | str:
    """A matplotlib figure at ``path``, whole, in the format its suffix names (png default)."""
    fmt = Path(str(path)).suffix.lstrip(".") or "png"
    return save(path, lambda f: fig.savefig(f, format=fmt, **savefig))


def remove_stale(fs: pafs.FileSystem, path: str) -> None:
    """Remove temporaries a crashed writer of ``path`` left beside it."""
    parent, name = path.rsplit("/", 1)
    try:
        infos = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except OSError:
        return
    for info in infos:
        if info.base_name.startswith(f"{name}{TMP}"):
            try:
                fs.delete_file(info.path)
            except OSError:
                log.warning("could not remove the stale temporary %s", info.path)
