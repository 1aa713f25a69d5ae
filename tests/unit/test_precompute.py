"""FM worker step: the shared path equals the plain per-pair forward and the offline model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from solaris.config import EncoderConfig, FeatureConfig, FMConfig, HistoryConfig, PrecomputeConfig, \
    QueueConfig, SyntheticConfig
from solaris.data.synthetic import generate
from solaris.errors import RequestError
from solaris.features import FeatureTables
from solaris.history import HistoryStore
from solaris.models.encoder import PairEncoder
from solaris.models.fm import FoundationModel
from solaris.precompute.pqueue import Group, PrecomputeQueue
from solaris.precompute.worker import (PrecomputeWorker, WindowHistory, describe_device,
                                       device_sizes)

L = 8
V = "fm-test"


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    ds = generate(SyntheticConfig(num_users=200, num_items=300, days=8.0,
                                  target_interactions=6000))
    ft = FeatureTables(ds, FeatureConfig(history_len=L))
    fm = FoundationModel(FMConfig(emb_dim=8, seq_heads=2, dense_hidden=8, cross_layers=2,
                                  shared_dim=16, head_hidden=8, dropout=0.1, version=V),
                         ds.spec, ds.num_users, ds.num_items, ds.tasks, L)
    enc = PairEncoder(16, EncoderConfig(width=8, hidden=16))
    hs = HistoryStore(HistoryConfig(max_events=int(np.bincount(ft.user).max()), max_users=500))
    for r in range(ft.num_rows):  # every event: `now` alone cuts each request's history
        hs.record_impressions(int(ft.user[r]), ft.item[r:r + 1], ft.surface[r:r + 1],
                              float(ft.ts[r]))
        hs.record_labels(int(ft.user[r]), ft.item[r:r + 1], ft.labels[r:r + 1],
                         float(ft.ts[r]), ts=ft.ts[r:r + 1].astype(float))
    worker = PrecomputeWorker(fm, enc, hs, ft, version=V)
    return ft, worker


def _leased_groups(ft: FeatureTables, n_groups: int = 12, seed: int = 0) -> list[Group]:
    """Request groups of assorted sizes through the real queue (one user has no history)."""
    rng = np.random.default_rng(seed)
    q = PrecomputeQueue(QueueConfig(capacity=10_000), clock=lambda: 0.0)
    rows = rng.choice(ft.num_rows, n_groups, replace=False)
    for j, r in enumerate(rows):
        size = int(rng.integers(1, 40))
        items = rng.choice(ft.num_items, size, replace=False)
        now = float(ft.ts[r]) if j else 0.0  # now=0: nothing before it, empty history
        q.put(np.full(size, ft.user[r]), items, rng.random(size), now, int(ft.surface[r]), V)
    lease = q.lease(10_000)
    assert len(lease.groups) == n_groups
    return lease.groups


def test_shared_path_equals_naive_per_pair_forward(world):
    ft, worker = world
    groups = _leased_groups(ft)
    u1, i1, z1, s1 = worker.run(groups)
    u2, i2, z2, s2 = worker.run_naive(groups)
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(i1, i2)
    assert z1.dtype == np.float32 and z1.shape == (sum(len(g.items) for g in groups), 8)
    np.testing.assert_allclose(z1, z2, atol=1e-5, rtol=0)
    assert s1 >= 0 and s2 >= 0
    exp_users = np.concatenate([np.full(len(g.items), g.user) for g in groups])
    np.testing.assert_array_equal(u1, exp_users)


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_a_pair_embedding_does_not_depend_on_what_else_its_lease_holds(world, seed):
    """Leases are made by timing (which requests were queued, how many workers share the
    queue). Each group computed alone, in the whole lease and in a shuffled lease gives the
    same vectors, bit for bit: the forward runs in fixed-size blocks."""
    ft, worker = world
    groups = _leased_groups(ft, n_groups=30, seed=seed)
    _, _, z, _ = worker.run(groups)
    starts = np.cumsum([0] + [len(g.items) for g in groups])
    for j, g in enumerate(groups):
        np.testing.assert_array_equal(worker.run([g])[2], z[starts[j]:starts[j + 1]])
    perm = np.random.default_rng(seed).permutation(len(groups))
    _, _, zp, _ = worker.run([groups[j] for j in perm])
    at = np.cumsum([0] + [len(groups[j].items) for j in perm])
    for pos, j in enumerate(perm.tolist()):
        np.testing.assert_array_equal(zp[at[pos]:at[pos + 1]], z[starts[j]:starts[j + 1]])
    whole = PrecomputeWorker(worker.fm, worker.encoder, worker.history, ft, version=V,
                             block_requests=0, block_pairs=0)  # one call on the whole lease
    np.testing.assert_allclose(whole.run(groups)[2], z, atol=1e-6, rtol=0)


def test_a_lease_history_time_reads_every_group_as_of_it(world):
    """``read_at`` (``Lease.read_at``): the same bits as each group made at that time, in
    the shared and in the per-pair forward; the request times still give other vectors."""
    ft, worker = world
    groups = _leased_groups(ft, n_groups=10, seed=2)
    at = float(ft.ts.max()) + 60.0
    moved = [dataclasses.replace(g, now=at) for g in groups]
    np.testing.assert_array_equal(worker.run(groups, read_at=at)[2], worker.run(moved)[2])
    np.testing.assert_array_equal(worker.run_naive(groups, read_at=at)[2],
                                  worker.run_naive(moved)[2])
    assert not np.allclose(worker.run(groups)[2], worker.run(moved)[2], atol=1e-3)
    np.testing.assert_array_equal(PrecomputeWorker.history_times(groups, None),
                                  [g.now for g in groups])


def test_the_gpu_block_sizes_keep_a_pair_embedding_independent_of_its_lease(world):
    """A GPU worker's larger fixed blocks (``device_sizes``) keep the property above; here on
    the CPU, the same code path (bench/precompute_gpu.py checks it on a GPU)."""
    ft, worker = world
    b_req, b_pairs, _ = device_sizes(PrecomputeConfig(), "cuda")
    big = PrecomputeWorker(worker.fm, worker.encoder, worker.history, ft, version=V,
                           block_requests=b_req, block_pairs=b_pairs)
    groups = _leased_groups(ft, n_groups=30, seed=3)
    _, _, z, _ = big.run(groups)
    starts = np.cumsum([0] + [len(g.items) for g in groups])
    for j in (0, 7, 29):
        np.testing.assert_array_equal(big.run([groups[j]])[2], z[starts[j]:starts[j + 1]])
    np.testing.assert_allclose(worker.run(groups)[2], z, atol=1e-6, rtol=0)


def test_a_gpu_worker_uses_its_own_block_and_lease_sizes():
    cfg = PrecomputeConfig(block_requests=8, block_pairs=64, gpu_block_requests=256,
                           gpu_block_pairs=2048, gpu_lease_pairs=1024)
    assert device_sizes(cfg, "cpu") == (8, 64, None)  # None: the queue's default lease
    assert device_sizes(cfg, torch.device("cuda:1")) == (256, 2048, 1024)
    d = PrecomputeConfig()
    assert device_sizes(d, "cuda")[1] > d.block_pairs  # the shipped GPU blocks are larger


def test_window_history_equals_the_store(world):
    """The live wiring (raw windows fetched, inputs built in the worker) computes what the
    in-process store computes."""
    ft, worker = world
    groups = _leased_groups(ft, seed=2)
    live = PrecomputeWorker(worker.fm, worker.encoder, WindowHistory(worker.history.window),
                            ft, version=V)
    u1, i1, z1, _ = worker.run(groups)
    u2, i2, z2, _ = live.run(groups)
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(z1, z2)


def test_window_history_uses_a_prefetch_only_for_the_same_rows(world):
    ft, worker = world
    hs = worker.history
    calls = {"fetch": 0, "start": 0}

    def fetch(users, now, L):
        calls["fetch"] += 1
        return hs.window(users, now, L)

    def start(users, now, L):
        calls["start"] += 1
        win = hs.window(users, now, L)  # read now: later events are not seen
        return lambda: win
    wh = WindowHistory(fetch, start)
    users, now = ft.user[:5], ft.ts[:5].astype(np.float64) + 1.0
    args = (ft.surface[:5], L, ft.item_cat, ft.user_cat, ft.user_cont)
    wh.prefetch(users, now, L)
    a = wh.batch(users, now, *args)
    assert calls == {"fetch": 0, "start": 1}
    b = wh.batch(users, now, *args)  # used up: read afresh
    assert calls == {"fetch": 1, "start": 1}
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    wh.prefetch(users, now, L)
    wh.batch(users[:4], now[:4], ft.surface[:4], *args[1:])  # other rows: not the prefetch
    assert calls == {"fetch": 2, "start": 2}
    for _ in range(10):  # unused prefetches (failed leases) do not pile up
        wh.prefetch(users, now + np.random.rand(5), L)
    assert len(wh._ahead) <= 4


def test_request_part_runs_once_per_group(world):
    ft, worker = world
    groups = _leased_groups(ft, n_groups=5, seed=1)
    rows_seen: list[int] = []
    original = worker.fm.request_part

    def counting(req):
        rows_seen.append(int(req["user"].shape[0]))
        return original(req)
    worker.fm.request_part = counting
    try:
        worker.run(groups)
        # one call: a row per group, padded to the fixed block (``solaris.models.blocks``)
        assert rows_seen == [worker.block_requests] and worker.block_requests >= 5
        rows_seen.clear()
        PrecomputeWorker(worker.fm, worker.encoder, worker.history, ft, version=V,
                         block_requests=0).run(groups)
        assert rows_seen == [5]  # unblocked: exactly one row per group
        rows_seen.clear()
        worker.run_naive(groups)
        assert rows_seen == [sum(len(g.items) for g in groups)]  # one row per pair
    finally:
        del worker.fm.request_part


def test_worker_computes_what_the_offline_model_computes(world):
    """A logged request re-run through history store + worker equals the FM and encoder on
    FeatureTables' rows of that request (the batch contract end to end)."""
    ft, worker = world
    key = np.stack([ft.user, ft.ts], 1)
    _, start, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    groups, rows = [], []
    for s, c in zip(start[counts >= 3][:10], counts[counts >= 3][:10]):
        r = np.arange(s, s + c)
        if len(np.unique(ft.item[r])) < c:
            continue
        groups.append(Group(int(ft.user[s]), float(ft.ts[s]), int(ft.surface[s]), V,
                            ft.item[r], np.ones(c)))
        rows.append(r)
    assert len(groups) >= 5
    _, _, z, _ = worker.run(groups)
    with torch.inference_mode():
        want = worker.encoder.encode(worker.fm.shared_layer(ft.batch(np.concatenate(rows))))
    np.testing.assert_allclose(z, want.numpy(), atol=1e-5, rtol=0)


def test_empty_and_wrong_version(world):
    ft, worker = world
    u, i, z, s = worker.run([])
    assert len(u) == len(i) == 0 and z.shape == (0, 8) and s == 0.0
    bad = Group(0, 1.0, 0, "other", np.array([1]), np.array([0.5]))
    with pytest.raises(RequestError, match="other"):
        worker.run([bad])
    bad = Group(0, 1.0, 0, V, np.array([10_000]), np.array([0.5]))
    with pytest.raises(RequestError, match="items outside"):
        worker.run_naive([bad])


def test_config_errors_name_the_field():
    from solaris.config import ConfigError, PrecomputeConfig
    with pytest.raises(ConfigError, match="precompute.device='tpu'"):
        PrecomputeConfig(device="tpu")
    with pytest.raises(ConfigError, match="precompute.max_workers=1"):
        PrecomputeConfig(workers=2, max_workers=1)
    with pytest.raises(ConfigError, match="precompute.gpu_block_pairs=-1"):
        PrecomputeConfig(gpu_block_pairs=-1)
    with pytest.raises(ConfigError, match="precompute.gpu_lease_pairs=0"):
        PrecomputeConfig(gpu_lease_pairs=0)


def test_the_device_says_which_gpu_not_only_that_there_is_one(monkeypatch):
    assert describe_device("cpu") == describe_device(torch.device("cpu")) == "cpu"
    # a machine without a GPU: the CUDA queries are stood in for, the naming is what is tested
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Test GPU {i}")
    assert describe_device("cuda") == "cuda:1 (Test GPU 1)"  # the current one
    assert describe_device("cuda:0") == "cuda:0 (Test GPU 0)"
