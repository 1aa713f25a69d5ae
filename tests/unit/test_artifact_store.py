"""Artifacts from shared storage (``solaris.artifact_store``): ``solaris train`` records each
file's sha256 and size; a ``file://`` URI and an S3 bucket (moto's server, a fake S3 on
loopback) resolve to a verified local copy per node; a second resolve is a cache hit; a
corrupt remote file is refused by name, a corrupt cached copy is downloaded again; racing
resolvers make one copy; a local path is read in place."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from solaris import artifact_store as store
from solaris.artifact_store import FILES, ArtifactCache, file_hashes, local_artifacts
from solaris.artifacts import SIDE_KEYS, Artifacts, load_models
from solaris.errors import CheckpointError
from solaris.online.serving import settings_from_args
from tests import tiny


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def flip_byte(path: Path) -> None:
    """Corrupt ``path`` without changing its size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def fake_artifacts(root: Path, hashes: bool = True) -> Path:
    """A small artifact directory ``Artifacts.open`` reads: a manifest, real side tables, an
    id file and a stand-in model file (its bytes are never loaded here)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(root / "side.npz", **{k: rng.integers(0, 5, (4, 2)) for k in SIDE_KEYS})
    (root / "fm.pt").write_bytes(rng.bytes(5000))
    (root / "ids").mkdir()
    (root / "ids" / "users.parquet").write_bytes(rng.bytes(300))
    manifest = {"schema": 2, "version": "v-fake", "tasks": ["click"],
                "vms": {"click": {"file": "fm.pt"}}, "sizes": {"num_users": 4, "num_items": 4},
                "config": {"encoder": {"width": 16}}, "side_tables": "side.npz"}
    if hashes:
        manifest[FILES] = file_hashes(root, ["side.npz", "fm.pt", "ids/users.parquet"])
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


# ---- solaris train's manifest, a file:// URI --------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return tiny.train_tiny(tmp_path_factory.mktemp("shared") / "art")


def test_train_records_every_file_hash_and_size(trained: Path):
    files = Artifacts.open(trained).manifest[FILES]
    on_disk = {p.relative_to(trained).as_posix() for p in trained.rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    assert set(files) == on_disk  # fm, encoder, side tables, ids, both VMs of each task
    assert {"fm.pt", "encoder.pt", "side.npz", "ids/users.parquet", "vm_click.pt"} <= on_disk
    for name, v in files.items():
        assert v == {"sha256": sha(trained / name), "size": (trained / name).stat().st_size}


def test_file_uri_resolves_to_a_verified_copy_that_loads(trained: Path, tmp_path):
    uri = trained.as_uri()  # file:///...: outside the working directory
    node = ArtifactCache(tmp_path / "node-b")
    local = node.local(uri)
    assert local.parent == tmp_path / "node-b" and tree(local) == tree(trained)
    assert node.fetches == 1 and node.downloads == len(Artifacts.open(trained).manifest[FILES])
    art = Artifacts.open(local)
    assert art.version == Artifacts.open(trained).version and art.root == local
    side = Artifacts.open(trained).side_tables()
    assert np.array_equal(art.side_tables().item_cat, side.item_cat)
    assert load_models(local)[2] == art.version
    inode = (local / "fm.pt").stat().st_ino
    assert node.local(uri) == local and node.hits == 1 and node.fetches == 1  # no download
    assert (local / "fm.pt").stat().st_ino == inode


def test_open_and_load_models_take_a_uri(trained: Path, tmp_path, monkeypatch):
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "cache"))
    art = Artifacts.open(trained.as_uri())
    assert art.root.parent == tmp_path / "cache"
    assert load_models(trained.as_uri())[2] == art.version


def test_a_local_path_is_read_in_place(tmp_path, monkeypatch):
    src = fake_artifacts(tmp_path / "art")
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "cache"))
    assert local_artifacts(src) == src and local_artifacts(str(src)) == src
    assert Artifacts.open(src).root == src
    assert not (tmp_path / "cache").exists()  # nothing copied


def test_settings_keep_uris_and_make_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = settings_from_args({"artifacts": "s3://bucket/v1?region=eu-west-1,art"})
    assert s["artifact_dirs"] == ["s3://bucket/v1?region=eu-west-1", str(tmp_path / "art")]


def test_cache_dir_default_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert store.cache_dir() == tmp_path / "solaris" / "remote-artifacts"
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "mine"))
    assert store.cache_dir() == tmp_path / "mine"


def test_credentials_stay_out_of_names():
    assert store.shown("s3://AK:SECRET@bkt/a?scheme=http") == "s3://bkt/a?scheme=http"
    assert store.shown("gs://bkt/a") == "gs://bkt/a"


# ---- checks on the copy (a file:// URI of a temporary directory) ------------------------------
def test_a_corrupt_remote_file_is_refused_by_name(tmp_path):
    src = fake_artifacts(tmp_path / "art")
    want = sha(src / "fm.pt")
    flip_byte(src / "fm.pt")
    with pytest.raises(CheckpointError) as e:
        ArtifactCache(tmp_path / "node").local(src.as_uri())
    msg = str(e.value)
    assert "/fm.pt" in msg and want in msg and sha(src / "fm.pt") in msg
    assert [p.name for p in (tmp_path / "node").iterdir() if not p.name.endswith(".lock")] == []


def test_a_corrupt_cached_copy_is_downloaded_again(tmp_path, caplog):
    src = fake_artifacts(tmp_path / "art")
    node = ArtifactCache(tmp_path / "node")
    local = node.local(src.as_uri())
    flip_byte(local / "ids" / "users.parquet")  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="solaris.artifact_store"):
        assert node.local(src.as_uri()) == local
    assert "ids/users.parquet" in caplog.text
    assert node.fetches == 2 and node.hits == 0 and tree(local) == tree(src)
    (local / "side.npz").unlink()
    assert node.local(src.as_uri()) == local and node.fetches == 3 and tree(local) == tree(src)


def test_a_manifest_without_hashes_is_copied_whole_and_checked_by_size(tmp_path, caplog):
    src = fake_artifacts(tmp_path / "art", hashes=False)
    (src / "extra.bin").write_bytes(b"x" * 10)
    (src / "fm.pt.tmp-0123").write_bytes(b"half")  # a crashed writer's temporary: not copied
    node = ArtifactCache(tmp_path / "node")
    with caplog.at_level(logging.WARNING, logger="solaris.artifact_store"):
        local = node.local(src.as_uri())
    assert "checked by size only" in caplog.text
    assert tree(local) == {k: v for k, v in tree(src).items() if ".tmp-" not in k}
    assert node.local(src.as_uri()) == local and node.hits == 1


def test_a_new_manifest_at_the_same_uri_is_a_new_copy(tmp_path):
    src = fake_artifacts(tmp_path / "art")
    node = ArtifactCache(tmp_path / "node")
    first = node.local(src.as_uri())
    m = json.loads((src / "manifest.json").read_text())
    (src / "manifest.json").write_text(json.dumps({**m, "version": "v-next"}))
    second = node.local(src.as_uri())
    assert second != first and Artifacts.open(second).version == "v-next"
    assert Artifacts.open(first).version == "v-fake"  # a process still reading it is undisturbed


def test_racing_resolvers_make_one_copy(tmp_path):
    src = fake_artifacts(tmp_path / "art")
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "stale.tmp-dead").mkdir()  # not this entry's: left alone
    caches = [ArtifactCache(tmp_path / "node") for _ in range(4)]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda c: c.local(src.as_uri()), caches))
    assert len(set(got)) == 1 and tree(got[0]) == tree(src)
    assert sum(c.fetches for c in caches) == 1 and sum(c.hits for c in caches) == 3
    left = sorted(p.name for p in (tmp_path / "node").iterdir())
    assert left == sorted([got[0].name, f".{got[0].name}.lock", "stale.tmp-dead"])


def test_a_crashed_download_leaves_no_entry_and_is_cleared(tmp_path, monkeypatch):
    src = fake_artifacts(tmp_path / "art")
    node = ArtifactCache(tmp_path / "node")

    def crash(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_download", crash)
    with pytest.raises(KeyboardInterrupt):
        node.local(src.as_uri())
    assert [p.name for p in (tmp_path / "node").iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    assert tree(node.local(src.as_uri())) == tree(src)


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "manifest.json"])
def test_a_file_name_outside_the_directory_is_refused(tmp_path, bad):
    src = fake_artifacts(tmp_path / "art")
    m = json.loads((src / "manifest.json").read_text())
    m[FILES][bad] = {"sha256": "0" * 64, "size": 1}
    (src / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="not a relative path"):
        ArtifactCache(tmp_path / "node").local(src.as_uri())


def test_a_uri_without_a_manifest_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        ArtifactCache(tmp_path / "node").local((tmp_path / "empty").as_uri())


# ---- S3: moto's server on loopback -------------------------------------------------------------
@pytest.fixture(scope="module")
def s3():
    """A fake S3 (moto's server on a free loopback port); yields the URI query that points
    pyarrow at it."""
    server_mod = pytest.importorskip(
        "moto.server", reason="moto[server] not installed (pip install -e '.[dev]')")
    port = tiny.free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        server.stop()


def upload(local: Path, uri: str) -> None:
    """Copy the directory ``local`` to ``uri`` (its bucket created)."""
    fs, path = pafs.FileSystem.from_uri(uri + "&allow_bucket_creation=true")
    fs.create_dir(path.split("/")[0])
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)


def test_s3_artifacts_resolve_on_another_node(trained: Path, s3, tmp_path):
    uri = f"s3://TESTKEY:TESTSECRET@solaris-art/v1?{s3}"
    upload(trained, uri)
    node_b = ArtifactCache(tmp_path / "node-b")
    local = node_b.local(uri)
    assert tree(local) == tree(trained)
    art = Artifacts.open(local)
    assert art.version == Artifacts.open(trained).version
    assert load_models(local)[2] == art.version
    downloads = node_b.downloads
    assert node_b.local(uri) == local and node_b.hits == 1 and node_b.downloads == downloads


def test_s3_corruption_remote_refused_cached_redownloaded(s3, tmp_path):
    src = fake_artifacts(tmp_path / "art")
    uri = f"s3://TESTKEY:TESTSECRET@solaris-art/fake?{s3}"
    upload(src, uri)
    node = ArtifactCache(tmp_path / "node")
    local = node.local(uri)
    flip_byte(local / "fm.pt")
    assert node.local(uri) == local and node.fetches == 2 and tree(local) == tree(src)

    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    flip_byte(bad / "side.npz")
    upload(bad, uri)  # same manifest, a corrupt side.npz
    with pytest.raises(CheckpointError) as e:
        ArtifactCache(tmp_path / "node-c").local(uri)
    msg = str(e.value)
    assert "s3://solaris-art/fake" in msg and "/side.npz" in msg and "TESTSECRET" not in msg
    assert sha(src / "side.npz") in msg and sha(bad / "side.npz") in msg
    assert node.local(uri) == local and node.hits == 1  # node's verified copy still serves
