"""The replay's request log: both builders, the causal retrieval, validation, Parquet."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from solaris.config import SyntheticConfig
from solaris.data.schema import Dataset, FeatureSpec, interaction_schema, request_schema
from solaris.data.synthetic import generate
from solaris.errors import DataError
from solaris.simulate.log import (RequestLog, build_request_log, check_causal, log_from_table,
                                log_to_table)

H = 3600
DAY = 86_400


def _dataset(rows, num_users, num_items, tasks=("like", "love"), requests=None) -> Dataset:
    """rows: (user, item, ts, surface, labels) in any order; sorted by ts (stable) here."""
    rows = sorted(rows, key=lambda r: r[2])
    n = len(rows)
    cols = {"seq": np.arange(n, dtype=np.int64),
            "user_id": np.array([r[0] for r in rows], np.int64),
            "item_id": np.array([r[1] for r in rows], np.int64),
            "ts": np.array([r[2] for r in rows], np.int64),
            "surface": np.array([r[3] for r in rows], np.int32)}
    for j, t in enumerate(tasks):
        cols[t] = np.array([r[4][j] for r in rows], np.float32)
    inter = pa.Table.from_pydict(cols, schema=interaction_schema(tasks))
    users = pa.table({"user_id": pa.array(np.arange(num_users), pa.int64()),
                      "raw_id": pa.array([str(u) for u in range(num_users)])})
    items = pa.table({"item_id": pa.array(np.arange(num_items), pa.int64()),
                      "raw_id": pa.array([str(i) for i in range(num_items)])})
    ds = Dataset(name="tiny", interactions=inter, users=users, items=items, tasks=tasks,
                 spec=FeatureSpec(num_surfaces=2), requests=requests)
    ds.validate()
    return ds


def _random_dataset(seed=0, num_users=30, num_items=60, n=2000, days=20) -> Dataset:
    rng = np.random.default_rng(seed)
    pop = rng.zipf(1.5, num_items).astype(float)
    p = pop / pop.sum()
    rows = [(int(rng.integers(num_users)), int(rng.choice(num_items, p=p)),
             int(rng.integers(days * DAY)), int(rng.integers(2)),
             (float(rng.integers(2)), 0.0)) for _ in range(n)]
    return _dataset(rows, num_users, num_items)


def _assert_well_formed(lg: RequestLog, c: int) -> None:
    lg.validate()
    assert lg.candidates.shape == (lg.num_requests, c)
    assert all(len(set(row)) == c for row in lg.candidates.tolist())
    assert (np.diff(lg.ts) >= 0).all()


# ------------------------------------------------------------ built from interactions
T0 = 40 * DAY  # the window's start (a multiple of the hour)
HIST = [  # history before the window: (user, item, ts, surface, (like, love))
    (1, 1, 10 * DAY, 0, (1.0, 0.0)), (1, 2, 10 * DAY + 60, 0, (1.0, 0.0)),
    (2, 1, 11 * DAY, 0, (0.0, 0.0)), (2, 2, 11 * DAY + 60, 0, (1.0, 1.0)),
    *[(3 + k, 7, 12 * DAY + k, 0, (1.0, 0.0)) for k in range(5)],  # 7: popular, long ago
    (3, 8, T0 - 2 * DAY, 0, (1.0, 0.0)), (4, 8, T0 - DAY, 0, (0.0, 0.0)),  # 8: popular lately
    (0, 1, T0 - 3 * DAY, 0, (1.0, 1.0)),  # user 0's past: item 1
]


def test_requests_are_a_users_ratings_of_one_time_bucket():
    rows = HIST + [
        (0, 3, T0 + 5, 1, (1.0, 0.0)), (0, 4, T0 + 100, 0, (0.0, 0.0)),
        (0, 3, T0 + 200, 0, (0.0, 0.0)),  # a repeat in the bucket: the first row is kept
        (5, 4, T0 + 50, 0, (1.0, 1.0)),
        (0, 5, T0 + H + 10, 0, (1.0, 0.0)),  # the next hour: another request
    ]
    ds = _dataset(rows, num_users=8, num_items=12)
    lg = build_request_log(ds, T0, num_candidates=4)
    _assert_well_formed(lg, 4)
    assert lg.tasks == ("like", "love")
    assert lg.ts.tolist() == [T0 + 5, T0 + 50, T0 + H + 10]
    assert lg.user.tolist() == [0, 5, 0]
    assert lg.surface.tolist() == [1, 0, 0]  # the surface of the request's first row
    labelled = {r: dict(zip(lg.candidates[r][lg.labelled[r]].tolist(),
                            map(tuple, lg.labels[r][lg.labelled[r]].tolist())))
                for r in range(3)}
    assert labelled == {0: {3: (1.0, 0.0), 4: (0.0, 0.0)}, 1: {4: (1.0, 1.0)}, 2: {5: (1.0, 0.0)}}
    assert np.isnan(lg.labels[~lg.labelled]).all()
    # the window's end is exclusive
    assert build_request_log(ds, T0, num_candidates=4, end_ts=T0 + H).num_requests == 2
    check_causal(lg, ds)


def test_retrieval_ranks_cooccurring_and_recently_popular_items_and_skips_the_past():
    ds = _dataset(HIST + [(0, 3, T0 + 5, 0, (1.0, 0.0))], num_users=8, num_items=12)
    lg = build_request_log(ds, T0, num_candidates=3)
    # user 0's last item is 1; users 1 and 2 went 1 -> 2: item 2 co-occurs; item 8 holds all
    # the last 14 days' interactions; item 7 is popular but old; item 1 is the user's past
    assert set(lg.candidates[0].tolist()) == {3, 2, 8}
    lg = build_request_log(ds, T0, num_candidates=4)
    assert set(lg.candidates[0].tolist()) == {3, 2, 8, 7}
    # once the items seen before ts run out, unseen ones fill in, smallest id first
    lg = build_request_log(ds, T0, num_candidates=6)
    assert set(lg.candidates[0].tolist()) == {3, 2, 8, 7, 0, 4}
    check_causal(lg, ds)
    with pytest.raises(DataError, match="eligible items"):
        build_request_log(ds, T0, num_candidates=12)  # 12 items, one in the user's past


def test_more_ratings_than_slots_split_into_requests_at_one_ts():
    rows = HIST + [(0, i, T0 + 10 * i, 0, (float(i % 2), 0.0)) for i in (3, 4, 5, 6, 9)]
    ds = _dataset(rows, num_users=8, num_items=12)
    lg = build_request_log(ds, T0, num_candidates=2)
    _assert_well_formed(lg, 2)
    assert lg.ts.tolist() == [T0 + 30] * 3
    assert lg.labelled.sum(axis=1).tolist() == [2, 2, 1]
    group = {3, 4, 5, 6, 9}
    assert set(lg.candidates[lg.labelled].tolist()) == group
    # no chunk retrieves an item the bucket rated (it would be an unlabelled rated item)
    assert not set(lg.candidates[~lg.labelled].tolist()) & group
    for r in range(3):
        for item, y in zip(lg.candidates[r], lg.labels[r, :, 0]):
            if np.isfinite(y):
                assert y == float(item % 2)


def _rows(ds: Dataset) -> list:
    cols = [ds.interactions.column(c).to_pylist()
            for c in ("user_id", "item_id", "ts", "surface", "like", "love")]
    return [(u, i, t, s, (a, b)) for u, i, t, s, a, b in zip(*cols)]


def test_an_item_first_seen_after_ts_is_never_retrieved_before_it():
    base = _random_dataset()
    late = int(base.interactions.column("ts").to_numpy().max()) - 2 * DAY
    # item 59 first appears at ts=late, then 20 users take it within minutes: a future hit
    rows = [r for r in _rows(base) if r[1] != 59]
    rows += [(u, 59, late + 60 * u, 0, (1.0, 0.0)) for u in range(20)]
    ds = _dataset(rows, 30, 60)
    lg = build_request_log(ds, DAY, num_candidates=20)
    _assert_well_formed(lg, 20)
    before = lg.ts <= late
    assert before.sum() > 50
    at = lg.candidates == 59
    assert not (at & ~lg.labelled)[before].any()  # never retrieved before it was seen
    assert (at & lg.labelled).any()  # it does arrive, as a labelled item
    assert (at & ~lg.labelled)[~before].any()  # and is retrieved once it is popular
    check_causal(lg, ds)


def test_a_prefix_of_the_log_does_not_depend_on_later_rows():
    ds = _random_dataset(seed=1)
    cut = 12 * DAY  # a multiple of the bucket: no request straddles it
    n_cut = int(np.searchsorted(ds.interactions.column("ts").to_numpy(), cut))
    early = Dataset(name="early", interactions=ds.interactions.slice(0, n_cut), users=ds.users,
                    items=ds.items, tasks=ds.tasks, spec=ds.spec)
    full = build_request_log(ds, 3 * DAY, num_candidates=15, seed=4)
    part = build_request_log(early, 3 * DAY, num_candidates=15, seed=4)
    k = part.num_requests
    assert 0 < k < full.num_requests and (full.ts[k:] >= cut).all()
    head = full.slice(slice(0, k))
    assert np.array_equal(head.candidates, part.candidates)
    assert np.array_equal(head.labels, part.labels, equal_nan=True)
    assert np.array_equal(head.user, part.user) and np.array_equal(head.ts, part.ts)
    same = build_request_log(ds, 3 * DAY, num_candidates=15, seed=4, end_ts=cut)
    assert np.array_equal(same.candidates, part.candidates)
    # labelled items sit at random positions: another seed moves them
    other = build_request_log(early, 3 * DAY, num_candidates=15, seed=5)
    assert not np.array_equal(other.labelled, part.labelled)


def test_check_causal_catches_a_retrieved_past_item():
    ds = _dataset(HIST + [(0, 3, T0 + 5, 0, (1.0, 0.0))], num_users=8, num_items=12)
    lg = build_request_log(ds, T0, num_candidates=4)
    bad = lg.slice(slice(None))
    bad.candidates = lg.candidates.copy()
    bad.candidates[0, np.flatnonzero(~lg.labelled[0])[0]] = 1  # user 0 rated item 1 before
    with pytest.raises(DataError, match="request 0 .*interacted with before ts"):
        check_causal(bad, ds)


# ------------------------------------------------------------ from a request log
def _requests(rows, tasks=("like", "love")) -> pa.Table:
    """rows: (request_id, user, ts, surface, candidates, impressed, labels per task)."""
    cols = {"request_id": [r[0] for r in rows], "user_id": [r[1] for r in rows],
            "ts": [r[2] for r in rows], "surface": [r[3] for r in rows],
            "candidates": [r[4] for r in rows], "impressed": [r[5] for r in rows]}
    for j, t in enumerate(tasks):
        cols[f"label_{t}"] = [r[6][j] for r in rows]
    return pa.Table.from_pydict(cols, schema=request_schema(tasks))


NAN = float("nan")
REQ = [
    (0, 1, 50, 0, [4, 5, 6], [True, False, False], ([1.0, NAN, NAN], [0.0, NAN, NAN])),
    (1, 2, 100, 1, [1, 2, 3], [False, True, True], ([NAN, 0.0, 1.0], [NAN, 0.0, 1.0])),
    (2, 0, 100, 0, [3, 2, 9], [True, False, False], ([1.0, NAN, NAN], [1.0, NAN, NAN])),
    (3, 1, 300, 0, [7, 8, 0], [False, False, True], ([NAN, NAN, 0.0], [NAN, NAN, 0.0])),
]


def test_a_request_log_is_taken_as_given():
    ds = _dataset([(0, 1, 10, 0, (1.0, 0.0))], 3, 10, requests=_requests(REQ))
    lg = build_request_log(ds, 100, num_candidates=50)  # num_candidates plays no part
    _assert_well_formed(lg, 3)
    assert lg.ts.tolist() == [100, 100, 300] and lg.user.tolist() == [0, 2, 1]  # (ts, user)
    assert lg.candidates.tolist() == [[3, 2, 9], [1, 2, 3], [7, 8, 0]]
    assert lg.surface.tolist() == [0, 1, 0]
    assert lg.labelled.tolist() == [[True, False, False], [False, True, True],
                                    [False, False, True]]
    assert lg.labels[1, 2].tolist() == [1.0, 1.0] and lg.labels[0, 0].tolist() == [1.0, 1.0]
    assert build_request_log(ds, 0, end_ts=100).num_requests == 1
    with pytest.raises(DataError, match="no requests"):
        build_request_log(ds, 1000)


def test_a_request_log_with_ragged_candidate_lists_is_refused():
    rows = REQ[:2] + [(9, 0, 200, 0, [1, 2], [True, False], ([1.0, NAN], [0.0, NAN]))]
    ds = _dataset([(0, 1, 10, 0, (1.0, 0.0))], 3, 10, requests=_requests(rows))
    with pytest.raises(DataError, match="candidates.*2..3"):
        build_request_log(ds, 0)


def test_the_synthetic_generators_log():
    ds = generate(SyntheticConfig(num_users=60, num_items=150, days=3.0,
                                  target_interactions=1500))
    lg = build_request_log(ds, 86_400)
    _assert_well_formed(lg, 100)
    req = ds.requests
    in_window = (req.column("ts").to_numpy() >= 86_400).sum()
    assert lg.num_requests == in_window
    shown = sum(sum(x) for x, t in zip(req.column("impressed").to_pylist(),
                                        req.column("ts").to_pylist()) if t >= 86_400)
    assert int(lg.labelled.sum()) == shown


# ------------------------------------------------------------ validation and round trip
def _small_log() -> RequestLog:
    ds = _dataset([(0, 1, 10, 0, (1.0, 0.0))], 3, 10, requests=_requests(REQ))
    return build_request_log(ds, 0)


def test_validate_names_the_bad_field():
    lg = _small_log()
    bad = lg.slice(slice(None))
    bad.candidates = lg.candidates.copy()
    bad.candidates[1, 1] = bad.candidates[1, 0]
    with pytest.raises(DataError, match="'candidates' row 1 lists an item twice"):
        bad.validate()
    bad = lg.slice(np.array([1, 0]))
    with pytest.raises(DataError, match="'ts'"):
        bad.validate()
    bad = lg.slice(slice(None))
    bad.labels = lg.labels.copy()
    bad.labels[0, 0, 1] = np.nan  # labelled for one task only
    with pytest.raises(DataError, match="'labels'"):
        bad.validate()
    bad.labels = lg.labels[..., :1]
    with pytest.raises(DataError, match="'labels' has shape"):
        bad.validate()


def test_parquet_round_trip(tmp_path):
    lg = build_request_log(_random_dataset(seed=2), 5 * DAY, num_candidates=12)
    pq.write_table(log_to_table(lg), tmp_path / "log.parquet")
    back = log_from_table(pq.read_table(tmp_path / "log.parquet"))
    assert back.tasks == lg.tasks
    for name in ("user", "ts", "surface", "candidates"):
        a, b = getattr(lg, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert back.labels.dtype == np.float32
    assert np.array_equal(back.labels, lg.labels, equal_nan=True)
    # without its metadata the table still reads (tasks from the label columns)
    bare = log_to_table(lg).replace_schema_metadata(None)
    assert log_from_table(bare).tasks == ("like", "love")
    with pytest.raises(DataError, match="lacks column 'candidates'"):
        log_from_table(log_to_table(lg).drop_columns(["candidates"]))


def test_offline_rows_and_replayed_requests_share_one_request_time():
    """The offline features and the replay map rows to requests the same way: every labelled
    candidate's request ts is its interaction row's ``FeatureTables.req_ts``, and the row's
    history holds only rows strictly before it (none of its own request)."""
    from solaris.config import FeatureConfig
    from solaris.features import FeatureTables

    ds = _random_dataset(seed=4, n=3000, days=3)  # dense: many users rate twice in 300 s
    g = 300
    tables = FeatureTables(ds, FeatureConfig(history_len=6, request_granularity_s=g))
    start = int(tables.ts[len(tables.ts) // 2])
    lg = build_request_log(ds, start, num_candidates=12, granularity_s=g)
    ts = tables.ts
    seen = 0
    for r in range(lg.num_requests):
        for c in np.flatnonzero(lg.labelled[r]):
            item, user = lg.candidates[r, c], lg.user[r]
            rows = np.flatnonzero((tables.user == user) & (tables.item == item)
                                  & (ts >= lg.ts[r]) & (ts < lg.ts[r] + g))
            row = rows[0]
            assert tables.req_ts[row] == lg.ts[r]
            h = tables.hist[row]
            assert (ts[h[h >= 0]] < lg.ts[r]).all()
            seen += 1
    assert seen > 100
    # some requests gather several ratings at different seconds: the definition matters here
    assert (tables.req_ts < tables.ts).sum() > 20
