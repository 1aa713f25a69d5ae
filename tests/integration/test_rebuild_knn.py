"""The KNN rebuild job on a local Ray: Ray Data embeds every user, the tables are published
twice and a reader sees the new version; a missing artifact directory is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from jobs.rebuild_knn import main, rebuild  # noqa: E402
from solaris.config import (EncoderConfig, FMConfig, KnnConfig,  # noqa: E402
                            SyntheticConfig, config_to_dict)
from solaris.errors import CheckpointError  # noqa: E402
from solaris.knn.tables import current_version, load_current, load_live  # noqa: E402

L = 8
VERSION = "fm-knn-test"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, Path, int, int]:
    """A small synthetic Parquet dir and FM + encoder artifacts (untrained: the job's
    plumbing is under test here; ``solaris train`` writes the same files)."""
    import torch

    from solaris.data.synthetic import generate_to_parquet
    from solaris.models.encoder import PairEncoder
    from solaris.models.fm import FoundationModel
    from solaris.data.schema import FeatureSpec
    from solaris.train.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("knn")
    meta = generate_to_parquet(SyntheticConfig(num_users=150, num_items=200, days=6.0,
                                               target_interactions=3000), root / "data")
    torch.manual_seed(0)
    fm_cfg = FMConfig(emb_dim=8, seq_heads=2, dense_hidden=8, cross_layers=1, shared_dim=16,
                      head_hidden=8, version=VERSION)
    users, items = meta["counts"]["users"], meta["counts"]["items"]
    sizes = {"num_users": users, "num_items": items, "tasks": meta["tasks"], "history_len": L,
             "spec": meta["spec"]}
    fm = FoundationModel(fm_cfg, FeatureSpec.from_dict(meta["spec"]), users, items,
                         tuple(meta["tasks"]), L)
    enc_cfg = EncoderConfig(width=8, hidden=16)
    art = root / "artifacts"
    save_checkpoint(art / "fm.pt", fm, "fm", config_to_dict(fm_cfg), version=VERSION, **sizes)
    save_checkpoint(art / "encoder.pt", PairEncoder(16, enc_cfg), "encoder",
                    config_to_dict(enc_cfg), version=VERSION, in_dim=16)
    return root / "data", art, users, items


@pytest.mark.slow  # two Ray Data shuffles: ~15 s each on a busy 2-core machine
def test_rebuild_twice_reader_sees_the_new_version(ray_local, world, tmp_path):
    data, art, users, items = world
    uri = f"file://{tmp_path}/knn"
    cfg = KnnConfig(k=10, item_k=5, recall_queries=200)
    assert current_version(uri) is None
    import torch

    torch.set_num_threads(3)
    first = rebuild(data, art, uri, cfg, batch_size=64, encoder_cpus=0.5, use_gpu=False,
                    version="v1")
    assert torch.get_num_threads() == 3  # the driver's count is restored after the build
    assert first["user"]["rows"] == users and first["item"]["rows"] == items
    assert first["user"]["recall_at_10"] >= cfg.min_recall
    v, table = load_current(uri)
    assert v == "v1" == current_version(uri, "item")
    assert table.ids.shape == (users, 10)
    assert not (table.ids == np.arange(users)[:, None]).any()  # self excluded
    # an earlier as_of cuts the histories: other embeddings, other neighbours
    as_of = first["as_of"] - 3 * 86400
    second = rebuild(data, art, uri, cfg, as_of=as_of, batch_size=64, encoder_cpus=0.5,
                     use_gpu=False, version="v2")
    assert second["as_of"] == as_of
    v2, table2 = load_current(uri)
    assert v2 == "v2" == current_version(uri) and table2.version == "v2"
    assert not np.array_equal(table2.ids, table.ids)
    _, items_table = load_current(uri, "item")
    assert items_table.ids.shape == (items, 5)
    # cold start through the published index: a held user's own embedding is its nearest
    # (a user with events: one without has the zero vector, alike to none)
    live = load_live(uri)
    assert live.version == "v2" and len(live.ids) == users
    held = live.index.reconstruct_n(0, live.index.ntotal)
    row = int(np.flatnonzero(np.abs(held).sum(1) > 0)[0])
    got, sims = live.query(held[row], 3)
    assert got.shape == (1, 3) and sims[0, 0] == pytest.approx(1.0, abs=1e-5)


def test_a_scheduled_run_on_unchanged_inputs_publishes_nothing(ray_local, world, tmp_path):
    """``--if-changed``: the published pointer keeps the inputs' fingerprint; a second
    trigger on the same data, artifacts and settings builds and publishes nothing, another
    ``--as-of`` (other inputs) does."""
    from solaris.ids import IdMap
    from solaris.knn.provenance import BuiltFrom
    from solaris.knn.tables import published_built_from, published_inputs

    data, art, users, items = world
    uri = f"file://{tmp_path}/knn"
    cfg = KnnConfig(k=10, item_k=5, recall_queries=200)
    kw = dict(batch_size=64, encoder_cpus=0.5, use_gpu=False, if_changed=True)
    first = rebuild(data, art, uri, cfg, version="s1", **kw)
    assert "skipped" not in first and first["inputs"]
    assert published_inputs(uri, "user") == ("s1", first["inputs"])
    assert published_inputs(uri, "item") == ("s1", first["inputs"])
    # both tables record the FM version and the id map (bare model files: the identity)
    built = BuiltFrom(VERSION, IdMap.identity(users, items).digest(), "clicked_items")
    assert first["ids"] == built.ids
    assert published_built_from(uri, "user") == built == published_built_from(uri, "item")
    again = rebuild(data, art, uri, cfg, version="s2", **kw)
    assert again["skipped"] and again["version"] == "s1" and again["inputs"] == first["inputs"]
    assert current_version(uri) == "s1"
    other = rebuild(data, art, uri, cfg, version="s3", as_of=first["as_of"] - 86400, **kw)
    assert "skipped" not in other and other["inputs"] != first["inputs"]
    assert current_version(uri) == "s3"
    # another user vector is another input, and the tables say which they were built with
    tower = KnnConfig(k=10, item_k=5, recall_queries=200, user_vector="request_tower")
    fourth = rebuild(data, art, uri, tower, version="s4", **kw)
    assert "skipped" not in fourth and current_version(uri) == "s4"
    assert published_built_from(uri, "user").user_vector == "request_tower"


@pytest.mark.parametrize("kind", ["clicked_items", "request_tower"])
def test_the_jobs_user_vectors_are_those_built_in_process(ray_local, world, kind):
    """Ray Data's group-by and encoder tasks give each user the vector the in-process path
    gives (``recent_history`` + ``request_inputs`` + ``user_encoder`` over the same events:
    the schedule simulation's and the router's cold start's), for either user vector; a user
    with no event gets the vector of an empty history."""
    import pyarrow.parquet as pq

    from jobs.rebuild_knn import open_data, side_tables, user_embeddings
    from solaris.artifacts import load_models
    from solaris.knn.user_encoder import (events_read, recent_history, request_inputs,
                                          user_encoder)

    data, art, users, _ = world
    fm, _, _ = load_models(art)
    d = open_data(data, art)
    ids, vecs, as_of = user_embeddings(d, fm, None, 1, 64, 0.5, False, 0.5, True, kind, 1000)
    assert np.array_equal(ids, np.arange(users))
    ev = pq.read_table(data / "interactions.parquet").to_pydict()
    tasks = d.meta()["tasks"]
    everyone = np.arange(users)
    n = len(ev["user_id"])
    hist = recent_history(np.r_[ev["user_id"], everyone], np.r_[ev["item_id"], -np.ones(users)],
                          np.r_[ev["ts"], np.zeros(users)], np.r_[ev["seq"], -np.ones(users)],
                          np.r_[ev["surface"], np.zeros(users)],
                          np.r_[np.stack([ev[t] for t in tasks], 1),
                                np.zeros((users, len(tasks)))], as_of,
                          events_read(kind, fm, 1000))
    t = side_tables(d)
    want = user_encoder(kind, fm).encode(request_inputs(hist, as_of, t.item_cat, t.user_cat,
                                                        t.user_cont))
    assert n and np.abs(want).sum() > 0
    np.testing.assert_allclose(vecs, want, atol=1e-5)


def test_a_scheduled_run_rebuilds_tables_that_record_no_fm_version(tmp_path):
    """Tables published without what they were built from are rebuilt by the next
    ``--if-changed`` run even on unchanged inputs, so the app can check them."""
    from jobs.rebuild_knn import up_to_date
    from solaris.knn.provenance import BuiltFrom
    from solaris.knn.tables import build_table, publish

    uri = f"file://{tmp_path}/knn"
    cfg = KnnConfig(k=5, item_k=5, recall_queries=50)
    x = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    for built, version in ((None, "old"), (BuiltFrom(VERSION, "digest"), "new")):
        for kind in ("user", "item"):
            table, live = build_table(kind, np.arange(40), x, 5, cfg, version,
                                      built_from=built)
            publish(uri, table, cfg, live, inputs="fp")
        assert up_to_date(uri, "fp") == (None if built is None else "new")
    assert up_to_date(uri, "other") is None


def test_missing_artifacts_is_a_clear_error(ray_local, world, tmp_path, capsys):
    data, _, _, _ = world
    with pytest.raises(CheckpointError, match="no trained artifacts.*solaris train"):
        rebuild(data, tmp_path / "none", str(tmp_path / "knn"), KnnConfig())
    assert main(["--data", str(data), "--artifacts", str(tmp_path / "none"),
                 "--out", str(tmp_path / "knn")]) == 2
    assert "--train-if-missing" in capsys.readouterr().err


def rekeyed_export(data: Path, art: Path, out: Path) -> tuple[Path, Path]:
    """The world's data as a team's log (``solaris export``'s layout) whose user and item
    ids are strings in an order unlike the codes', and a copy of the artifacts holding the
    matching id map: what a deployment trained on that log has."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from solaris.data.export import export_generic
    from solaris.data.synthetic import load_parquet_dir
    from solaris.ids import IdMap

    ds = load_parquet_dir(data)
    mapping = yaml.safe_load(export_generic(ds, out).read_text())

    def rekey(prefix: str, ids: list) -> dict:
        return {k: f"{prefix}{(k * 7919) % 100003:06d}" for k in ids}

    users = rekey("user-", ds.users.column("raw_id").to_pylist())
    items = rekey("item-", ds.items.column("raw_id").to_pylist())
    for name, col, key in ((mapping["interactions"], "user", users),
                           (mapping["interactions"], "item", items),
                           ("users.parquet", "raw_id", users), ("items.parquet", "raw_id", items)):
        t = pq.read_table(out / name)
        j = t.column_names.index(col)
        t = t.set_column(j, col, pa.array([key[v] for v in t.column(col).to_pylist()]))
        pq.write_table(t, out / name)
    raw_users = [users[v] for v in ds.users.column("raw_id").to_pylist()]
    assert raw_users != sorted(raw_users)  # the codes do not follow the strings' order
    art2 = out / "artifacts"
    shutil.copytree(art, art2)
    IdMap.of(pa.array(raw_users),
             pa.array([items[v] for v in ds.items.column("raw_id").to_pylist()])).save(art2)
    return out / "mapping.yaml", art2


@pytest.mark.slow  # two Ray Data rebuilds
def test_the_job_reads_a_teams_log_through_its_mapping(ray_local, world, tmp_path):
    """``--data mapping.yaml``: the log read by the driver with the artifacts' id map gives
    the very tables the same events give from a ``solaris data`` directory."""
    data, art, users, items = world
    mapping, art2 = rekeyed_export(data, art, tmp_path / "log")
    cfg = KnnConfig(k=10, item_k=5, recall_queries=200)
    a = rebuild(data, art, f"file://{tmp_path}/a", cfg, batch_size=64, encoder_cpus=0.5,
                use_gpu=False, version="v1")
    b = rebuild(mapping, art2, f"file://{tmp_path}/b", cfg, batch_size=64,
                encoder_cpus=0.5, use_gpu=False, version="v1")
    assert b["as_of"] == a["as_of"] and b["user"]["rows"] == users
    for kind in ("user", "item"):
        _, ta = load_current(f"file://{tmp_path}/a", kind)
        _, tb = load_current(f"file://{tmp_path}/b", kind)
        np.testing.assert_array_equal(tb.ids, ta.ids)
        np.testing.assert_allclose(tb.sims, ta.sims, rtol=1e-5, atol=1e-6)
