"""The synthetic generator: determinism, schema, request-log consistency, streaming, signal."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import defaultdict, deque

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from solaris.config import SyntheticConfig
from solaris.data.schema import Dataset, interaction_schema, request_schema
from solaris.data.synthetic import generate, generate_to_parquet, load_parquet_dir
from solaris.data.synthetic_world import DAY, EPOCH, build_world
from solaris.errors import ConfigError, DataError

TASKS = ("click", "conversion")


def small_cfg(**kw) -> SyntheticConfig:
    base = dict(num_users=200, num_items=300, days=8.0, target_interactions=6000)
    base.update(kw)
    return SyntheticConfig(**base)


@pytest.fixture(scope="module")
def cfg() -> SyntheticConfig:
    return small_cfg()


@pytest.fixture(scope="module")
def ds(cfg) -> Dataset:
    return generate(cfg)


def _same_table(a: pa.Table, b: pa.Table) -> bool:
    """Table equality where NaN equals NaN (label lists hold NaN for unimpressed candidates)."""
    if not a.schema.equals(b.schema):
        return False
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        if pa.types.is_list(x.type) and pa.types.is_floating(x.type.value_type):
            if not (x.offsets.equals(y.offsets) and np.array_equal(
                    x.values.to_numpy(), y.values.to_numpy(), equal_nan=True)):
                return False
        elif not x.equals(y):
            return False
    return True


def _tables_equal(a: Dataset, b: Dataset) -> bool:
    return all(_same_table(getattr(a, t), getattr(b, t))
               for t in ("interactions", "requests", "users", "items"))


def test_a_memoryless_retrieval_is_the_classic_generator():
    """retrieval_memory_h=0 draws nothing extra: the classic world byte for byte, whatever
    profile the config was started from."""
    a = generate(small_cfg(days=4.0, target_interactions=3000))
    b = generate(small_cfg(days=4.0, target_interactions=3000, profile="feed",
                           retrieval_memory_h=0.0, burst_shape=0.5))
    assert _tables_equal(a, b)


def test_same_seed_same_data_other_seed_differs(cfg, ds):
    assert _tables_equal(ds, generate(cfg))
    other = generate(dataclasses.replace(cfg, seed=cfg.seed + 1))
    assert not ds.interactions.equals(other.interactions)
    assert not ds.items.equals(other.items)


def test_validates_with_exact_schemas(cfg, ds):
    ds.validate()
    assert ds.name == "synthetic" and ds.tasks == TASKS
    assert ds.interactions.schema.equals(interaction_schema(TASKS))
    assert ds.requests.schema.equals(request_schema(TASKS))
    spec = ds.spec
    assert spec.num_surfaces == cfg.num_surfaces
    assert spec.item_categorical == {"category": cfg.num_categories}
    assert spec.item_multihot == {"tags": cfg.num_tags}
    assert ds.num_users == cfg.num_users and ds.num_items == cfg.num_items
    for table, key in ((ds.users, "user_id"), (ds.items, "item_id")):
        np.testing.assert_array_equal(table.column(key).to_numpy(), np.arange(table.num_rows))
        assert table.schema.field("raw_id").type == pa.int64()
    for col, card in {**spec.user_categorical, **spec.item_categorical}.items():
        table = ds.users if col in spec.user_categorical else ds.items
        assert table.schema.field(col).type == pa.int64()
        v = table.column(col).to_numpy()
        assert v.min() >= 0 and v.max() < card
    for col in (*spec.user_continuous, *spec.item_continuous):
        table = ds.users if col in spec.user_continuous else ds.items
        assert table.schema.field(col).type == pa.float32()
        assert abs(float(np.mean(table.column(col).to_numpy()))) < 0.1  # standardised
    tags = ds.items.column("tags").to_pylist()
    assert ds.items.schema.field("tags").type == pa.list_(pa.int64())
    assert all(1 <= len(t) <= 4 and len(set(t)) == len(t) for t in tags)
    assert all(0 <= x < cfg.num_tags for t in tags for x in t)
    ts = ds.interactions.column("ts").to_numpy()
    assert ts.min() >= EPOCH
    np.testing.assert_array_equal(ds.interactions.column("seq").to_numpy(),
                                  np.arange(ds.interactions.num_rows))
    np.testing.assert_array_equal(ds.requests.column("request_id").to_numpy(),
                                  np.arange(ds.requests.num_rows))
    assert np.all(np.diff(ds.requests.column("ts").to_numpy()) >= 0)
    assert len(np.unique(ds.interactions.column("surface").to_numpy())) == cfg.num_surfaces


def test_interactions_are_the_impressed_candidates_of_the_request_log(cfg, ds):
    req, inter = ds.requests, ds.interactions
    n, c, m = req.num_rows, cfg.candidates_per_request, cfg.impressions_per_request
    cand = np.stack(req.column("candidates").to_numpy(zero_copy_only=False))  # (R, C)
    shown = np.stack(req.column("impressed").to_numpy(zero_copy_only=False))  # (R, C)
    assert cand.shape == (n, c) and 100 <= c <= 500
    assert all(len(np.unique(row)) == c for row in cand)
    assert (shown.sum(1) == m).all()
    assert inter.num_rows == n * m  # every impressed candidate is one labelled row
    items = inter.column("item_id").to_numpy().reshape(n, m)
    for col in ("user_id", "ts", "surface"):
        per_row = inter.column(col).to_numpy().reshape(n, m)
        np.testing.assert_array_equal(per_row, np.repeat(req.column(col).to_numpy()[:, None], m, 1))
    np.testing.assert_array_equal(np.sort(items, 1), np.sort(cand[shown].reshape(n, m), 1))
    for t in TASKS:
        lab = np.stack(req.column(f"label_{t}").to_numpy(zero_copy_only=False))  # (R, C)
        assert np.isnan(lab[~shown]).all() and not np.isnan(lab[shown]).any()
        y = inter.column(t).to_numpy().reshape(n, m)
        by_item = {(r, i): v for r in range(n) for i, v in zip(cand[r][shown[r]], lab[r][shown[r]])}
        assert all(by_item[(r, items[r, j])] == y[r, j] for r in range(n) for j in range(m))


def test_base_rates_and_conversion_needs_click():
    full = generate(SyntheticConfig())  # the default config: also checks it stays fast
    click = full.interactions.column("click").to_numpy()
    conv = full.interactions.column("conversion").to_numpy()
    assert (conv <= click).all()
    cfg = SyntheticConfig()
    # realised rates sit near the configured ones (session intent lifts clicks a little)
    assert cfg.click_rate - 0.03 <= click.mean() <= cfg.click_rate + 0.05
    assert 0.5 * cfg.conversion_rate <= conv.mean() <= 1.5 * cfg.conversion_rate
    assert 0.5 * 60_000 < full.interactions.num_rows < 1.5 * 60_000


def test_late_users_have_no_rows_in_the_first_half(cfg, ds):
    world = build_world(cfg)
    half = EPOCH + int(round(cfg.days * DAY)) // 2
    late = world.user_arrival >= half - EPOCH
    assert 0.5 * cfg.late_user_share < late.mean() < 1.5 * cfg.late_user_share
    users = ds.interactions.column("user_id").to_numpy()
    ts = ds.interactions.column("ts").to_numpy()
    assert ts[late[users]].min() >= half
    assert not late[users[ts < half]].any()
    assert late[users].any()  # they do show up later: cold users of a time split


def test_sessions_are_bursty(ds):
    req = ds.requests
    users, ts = req.column("user_id").to_numpy(), req.column("ts").to_numpy()
    order = np.lexsort((ts, users))
    same = users[order][1:] == users[order][:-1]
    gaps = np.diff(ts[order])[same]
    assert (gaps < 20 * 60).mean() > 0.4  # requests minutes apart inside sessions
    assert (gaps > 6 * 3600).mean() > 0.05  # and long pauses between sessions


def test_parquet_stream_round_trip(tmp_path, cfg, ds):
    seen: list[int] = []
    meta = generate_to_parquet(dataclasses.replace(cfg, chunk_rows=1000), tmp_path, seen.append)
    assert seen == sorted(seen) and seen[-1] == ds.interactions.num_rows and len(seen) > 1
    assert pq.ParquetFile(tmp_path / "interactions.parquet").num_row_groups > 1
    assert meta["counts"]["interactions"] == ds.interactions.num_rows
    assert meta["counts"]["requests"] == ds.requests.num_rows
    assert json.loads((tmp_path / "meta.json").read_text())["spec"] == ds.spec.to_dict()
    back = load_parquet_dir(tmp_path)
    assert back.spec == ds.spec and back.tasks == ds.tasks
    assert _tables_equal(back, ds)  # chunking changes nothing (chunk_rows aside)
    again = tmp_path / "again"
    generate_to_parquet(dataclasses.replace(cfg, chunk_rows=1000), again)
    for name in ("interactions.parquet", "requests.parquet", "users.parquet", "items.parquet",
                 "meta.json"):
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()  # byte-identical


def test_malformed_parquet_dir_names_file_and_column(tmp_path, cfg):
    generate_to_parquet(cfg, tmp_path)
    path = tmp_path / "interactions.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["surface"]), path)
    with pytest.raises(DataError, match=r"interactions\.parquet.*'surface'"):
        load_parquet_dir(tmp_path)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(DataError, match=r"meta\.json"):
        load_parquet_dir(tmp_path)


def test_config_rejects_catalogue_smaller_than_candidate_list():
    with pytest.raises(ConfigError, match="num_items"):
        SyntheticConfig(num_items=120, candidates_per_request=150)
    with pytest.raises(ConfigError, match="conversion_rate"):
        SyntheticConfig(click_rate=0.1, conversion_rate=0.2)


# ---- the signal: recent behaviour predicts clicks beyond what static ids learn ----

def _features(ds: Dataset, k: int = 10, session_s: int = 1800) -> tuple[np.ndarray, ...]:
    """Per row, as of the previous requests: static-id features and recent-click features."""
    it = ds.interactions
    u, i = it.column("user_id").to_numpy(), it.column("item_id").to_numpy()
    ts, y = it.column("ts").to_numpy(), it.column("click").to_numpy()
    surface = it.column("surface").to_numpy()
    cat = ds.items.column("category").to_numpy()
    n = len(u)
    start = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (ts[1:] != ts[:-1])])
    end = np.r_[start[1:], n]
    recent: dict[int, deque] = defaultdict(lambda: deque(maxlen=k))
    u_clk, u_n = np.zeros(ds.num_users), np.zeros(ds.num_users)
    i_clk, i_n = np.zeros(ds.num_items), np.zeros(ds.num_items)
    static = np.zeros((n, 4))  # user CTR, item CTR, item log-count, surface
    seq = np.zeros((n, 2))  # share of last-k clicks in the category, same-session click there
    for a, b in zip(start, end):
        user, rows = u[a], slice(a, b)
        static[rows] = np.c_[np.full(b - a, (u_clk[user] + 1.5) / (u_n[user] + 10)),
                             (i_clk[i[rows]] + 1.5) / (i_n[i[rows]] + 10),
                             np.log1p(i_n[i[rows]]), np.full(b - a, surface[a])]
        if recent[user]:
            h_ts, h_cat = map(np.array, zip(*recent[user]))
            match = cat[i[rows]][:, None] == h_cat[None, :]
            seq[rows, 0] = match.mean(1)
            seq[rows, 1] = (match & (h_ts >= ts[a] - session_s)[None, :]).any(1)
        u_clk[user] += y[rows].sum()
        u_n[user] += b - a
        i_clk[i[rows]] += y[rows]
        i_n[i[rows]] += 1
        recent[user].extend((ts[r], cat[i[r]]) for r in range(a, b) if y[r])
    return static, seq, y, ts


def _test_log_loss(x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    """Logistic regression (Newton steps, small L2) fitted on ``train``, log loss on ``test``."""
    x = np.c_[np.ones(len(x)), x]
    mu, sd = x[train].mean(0), x[train].std(0)
    mu[0], sd[0] = 0.0, 1.0
    x = (x - mu) / np.where(sd > 0, sd, 1.0)
    w = np.zeros(x.shape[1])
    xt, yt = x[train], y[train]
    for _ in range(25):
        p = 1.0 / (1.0 + np.exp(-xt @ w))
        grad = xt.T @ (p - yt) / len(yt) + 1e-3 * w
        hess = (xt.T * (p * (1 - p))) @ xt / len(yt) + 1e-3 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    p = np.clip(1.0 / (1.0 + np.exp(-x[test] @ w)), 1e-7, 1 - 1e-7)
    return float(-np.mean(y[test] * np.log(p) + (1 - y[test]) * np.log(1 - p)))


@functools.lru_cache(maxsize=4)
def _signal_ds(**kw) -> Dataset:
    return generate(SyntheticConfig(num_users=600, num_items=400, days=20.0,
                                    target_interactions=30_000, **kw))


def _gains(**kw) -> tuple[float, float]:
    """(log-loss gain of a frozen per-user category profile, gain of recent clicks) over ids."""
    ds = _signal_ds(**kw)
    static, seq, y, ts = _features(ds)
    q0, q1 = np.quantile(ts, [0.4, 0.7])
    train, test = np.flatnonzero((ts >= q0) & (ts < q1)), np.flatnonzero(ts >= q1)
    # what a static user id learns: its category click profile up to the training period
    u = ds.interactions.column("user_id").to_numpy()
    cat = ds.items.column("category").to_numpy()[ds.interactions.column("item_id").to_numpy()]
    prof = np.zeros((ds.num_users, ds.spec.item_categorical["category"]))
    early = (ts < q0) & (y > 0)
    np.add.at(prof, (u[early], cat[early]), 1.0)
    prof /= np.maximum(prof.sum(1, keepdims=True), 1.0)
    base = _test_log_loss(static, y, train, test)
    with_profile = _test_log_loss(np.c_[static, prof[u, cat]], y, train, test)
    with_recent = _test_log_loss(np.c_[static, seq], y, train, test)
    return base - with_profile, base - with_recent


def test_recent_behaviour_beats_static_ids():
    # a statistic of generated data (numpy draws, exact on any machine) and a Newton fit;
    # measured with 1 and 2 BLAS threads alike: recent 0.0462, profile -0.0010, far past the
    # bounds below (bench-free: nothing here trains with torch)
    profile_gain, recent_gain = _gains()
    assert recent_gain > 0.003  # nats per row on later rows: ~1.5% of the log loss
    assert recent_gain > profile_gain + 0.002


def test_signal_test_fails_without_the_signal():
    _, recent_gain = _gains(affinity=0.0, session_intent=0.0)
    assert recent_gain < 0.002  # measured 0.00017 with 1 and 2 BLAS threads


def _early_late_profile_similarity(ds: Dataset) -> float:
    """Mean cosine between each active user's category click counts, first vs second half."""
    it = ds.interactions
    clicked = it.column("click").to_numpy() > 0
    users = it.column("user_id").to_numpy()[clicked]
    cats = ds.items.column("category").to_numpy()[it.column("item_id").to_numpy()[clicked]]
    k = ds.spec.item_categorical["category"]
    sims = []
    for u in np.unique(users):
        c = cats[users == u]  # this user's clicks in time order
        if len(c) >= 20:
            half = len(c) // 2
            a, b = np.bincount(c[:half], minlength=k), np.bincount(c[half:], minlength=k)
            sims.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert len(sims) >= 30
    return float(np.mean(sims))


def test_interests_drift():
    # what a user clicks changes over time (measured ~0.70-0.75 vs ~0.88-0.93 without drift)
    drifting = _early_late_profile_similarity(_signal_ds())
    assert drifting < _early_late_profile_similarity(_signal_ds(drift=0.0)) - 0.1
