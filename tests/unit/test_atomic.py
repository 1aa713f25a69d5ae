"""Every published file lands whole or not at all (solaris.atomic): the old file survives a
writer that fails half-way, no temporary is left, stale temporaries are cleared, and every
kind of writer the project uses (numpy, torch, JSON, bytes) goes through one helper."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from solaris import atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "deep" / "er" / "manifest.json"
    atomic.save_json(path, {"version": 1})  # parents are created
    assert json.loads(path.read_text()) == {"version": 1}

    def half(f) -> None:
        f.write(b'{"version": 2, "trunc')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.save(path, half)
    assert json.loads(path.read_text()) == {"version": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.json"]
    atomic.save_text(path, '{"version": 3}')
    assert json.loads(path.read_text()) == {"version": 3}


def test_numpy_and_torch_writers_round_trip(tmp_path):
    atomic.save(tmp_path / "a.npz", lambda f: np.savez(f, x=np.arange(4)))
    atomic.save(tmp_path / "b.npz", lambda f: np.savez_compressed(f, x=np.arange(4)))
    lin = torch.nn.Linear(3, 2)
    atomic.save(tmp_path / "c.pt", lambda f: torch.save({"w": lin.state_dict()}, f))
    # np.savez names no ".npz.npz" and leaves nothing beside the three files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz", "c.pt"]
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["x"], np.arange(4))
    np.testing.assert_array_equal(np.load(tmp_path / "b.npz")["x"], np.arange(4))
    got = torch.load(tmp_path / "c.pt", weights_only=True)["w"]
    assert torch.equal(got["weight"], lin.weight.detach())


def test_a_figure_lands_in_the_format_its_suffix_names(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    atomic.save_figure(tmp_path / "a.png", fig, dpi=50)
    atomic.save_figure(tmp_path / "a.svg", fig)
    plt.close(fig)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:500]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]


def test_stale_temporaries_of_a_crashed_writer_are_removed(tmp_path):
    path = tmp_path / "table.parquet"
    path.write_bytes(b"whole")
    (tmp_path / f"table.parquet{atomic.TMP}deadbeef").write_bytes(b"ha")
    (tmp_path / "other.parquet.tmp-x").write_bytes(b"not ours")
    fs, p = atomic.filesystem(path)
    atomic.remove_stale(fs, p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["other.parquet.tmp-x",
                                                          "table.parquet"]
    assert path.read_bytes() == b"whole"
