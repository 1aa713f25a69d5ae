"""Where a SOLARIS request's extra CPU goes, in one process (no Ray, no HTTP): the router's
and the shards' own code per request, by stage, and the VM forward with and without
fixed-size blocks.

    python bench/request_cpu.py [--json runs/bench_request_cpu.json] [--shards 2]
        [--holders N] [--artifacts DIR] [--baseline REV [--rounds 5]]

Stages (500 candidates, every tier looked up, in-process ``PairStore`` shards filled with
400,000 random pairs of all 2,000 users, or with ``--holders N`` of N of them only, the
requests' users among those: random user and item KNN tables): plan and route, encode the shard
queries, the shards' answers with their frames, decode, assemble, pack and encode the VM
request, and the after-answer work (verifier picks, their frame); medians over requests of
the wall time each stage takes, and the frames' sizes. What the actor calls add on top is
``bench/actor_call.py``'s; the whole app is ``bench/serve.py``'s.

With ``--baseline REV``, the stages over the code of commit REV (``git archive``, as
``bench/vm_ab.py`` extracts it) and over this tree's, each in its own process, alternated
over ``--rounds`` rounds (ABBA...), medians per stage and the ratio of the totals per round:
what a change to the request path's own code saved, side by side on one machine. Both arms
run this file's workload (the same stores, requests and timing loop); only the ``solaris``
package they import differs, so REV must have the APIs the stages call.

With ``--artifacts`` (a trained artifact directory), the VM's forward CPU per 500-candidate
request, one thread, blocked (``VM_BLOCK_ROWS``, and 256) against one call, in 7 interleaved
trials (medians; the first trial is a warm-up); and the FM worker's forward CPU per 1,000
pairs, blocked (``precompute.block_requests`` / ``block_pairs``) against one call on the whole
lease, at 10, 50 and 200 candidates per request group.
"""

from __future__ import annotations

import argparse
import json
import runpy
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STAGES = ("plan_route", "encode_queries", "shard_answers", "decode_answers", "assemble",
          "pack_encode", "after_answer")


def _fill(stores: list, ring, users: np.ndarray, items: np.ndarray, d: int, t0: float,
          rng: np.random.Generator) -> None:
    """Random d-wide pairs of (users, items) into the stores that own them."""
    owner = ring.shard_of(users)
    for s, store in enumerate(stores):
        m = owner == s
        store.put(users[m], items[m], rng.normal(size=(int(m.sum()), d)).astype(np.float32),
                  "v", t0)


def _random_knn(rng: np.random.Generator, n: int, k: int = 20):
    """A random neighbour table of n rows (k neighbours, similarities descending)."""
    from solaris.knn.neighbours import NeighbourTable

    return NeighbourTable(rng.integers(0, n, (n, k)), np.sort(rng.random((n, k)))[:, ::-1], "k")


def stages(num_shards: int, requests: int = 300, seed: int = 0,
           holders: int | None = None) -> dict:
    """Median ms per request of each stage (``STAGES``); ``holders``: how many users hold
    the pairs (None: every user), the requests' users among them."""
    import solaris
    from solaris import wire as frames
    from solaris.cache import wire
    from solaris.cache.ring import HashRing
    from solaris.cache.store import PairStore
    from solaris.config import CacheConfig, EnrichConfig, VerifierConfig
    from solaris.online import enrich, verifier
    from solaris.online.scoring import PackedSlots, ScoreRequest, encode_score_request
    from solaris.tiers import Tier

    rng = np.random.default_rng(seed)
    users_n, items_n, c, d, t0 = 2000, 20000, 500, 32, 1.9e9
    cfg = CacheConfig(dim=d)
    ring = HashRing(num_shards)
    stores = [PairStore(cfg) for _ in range(num_shards)]
    if holders is not None and not 1 <= holders <= users_n:
        raise ValueError(f"holders={holders!r}: must be in [1, {users_n}]")
    owners = np.arange(users_n) if holders is None else rng.choice(users_n, holders,
                                                                    replace=False)
    users = rng.integers(0, users_n, 400_000) if holders is None else rng.choice(owners, 400_000)
    items = rng.integers(0, items_n, 400_000)
    _fill(stores, ring, users, items, d, t0, rng)
    uk, ik = _random_knn(rng, users_n), _random_knn(rng, items_n)
    ecfg, vcfg = EnrichConfig(), VerifierConfig()
    reqs = [(int(rng.integers(0, users_n) if holders is None else rng.choice(owners)),
             rng.choice(items_n, c, replace=False))
            for _ in range(requests + 50)]
    times: dict[str, list[float]] = {k: [] for k in STAGES}
    sizes: dict[str, int] = {}
    for n, (u, cands) in enumerate(reqs):
        t = [time.perf_counter()]
        plan = enrich.plan(u, cands, uk, ik, ecfg)
        queries = enrich.route(plan, ring.shard_of, "v", t0 + 1)
        t.append(time.perf_counter())
        sent = {s: wire.encode_query(q) for s, q in queries.items()}
        t.append(time.perf_counter())
        got = {s: wire.encode_answer(stores[s].answer(wire.decode_query(b)))
               for s, b in sent.items()}
        t.append(time.perf_counter())
        answers = {s: wire.decode_answer(b) for s, b in got.items()}
        t.append(time.perf_counter())
        slots = enrich.assemble(plan, answers, d)
        t.append(time.perf_counter())
        payload = encode_score_request("v", ScoreRequest(u, cands, 0, PackedSlots.pack(slots),
                                                         np.ones((2, 4), np.float32)))
        t.append(time.perf_counter())
        base = rng.random(c)
        picks = verifier.choose(base, cands, slots.pair_tier == Tier.PAIR, slots.pair_age_s,
                                np.zeros(c, bool), vcfg, cfg.read_ttl_s)
        frames.encode("picks", (np.full(len(picks), u), cands[picks], base[picks],
                                np.full(len(picks), t0 + 1), np.zeros(len(picks), np.int64),
                                "v"))
        t.append(time.perf_counter())
        if n >= 50:  # the first 50 warm up
            for k, a, b in zip(STAGES, t, t[1:]):
                times[k].append(1e3 * (b - a))
        if n == 50:
            user_shard = plan.user_shard
            sizes = {"query_bytes_user_shard": len(sent[user_shard]),
                     "answer_bytes_user_shard": len(got[user_shard]),
                     "score_request_bytes": len(payload)}
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"shards": num_shards, "requests": requests, "candidates": c, "holders": holders,
            "solaris_dir": str(Path(solaris.__file__).resolve().parent),  # the code measured
            "ms_per_request_median": med, "total_ms": sum(med.values()), **sizes}


REPLICA_STAGES = ("plan_route", "replica_answers", "assemble", "corrections", "after_answer",
                  "answer_json", "shard_writes", "pull_export", "pull_apply")


def replica_floor(num_shards: int, artifacts: str | None, requests: int = 300,
                  writes_per_request: int = 50, requests_per_pull: int = 20,
                  seed: int = 0) -> dict:
    """The CPU a SOLARIS request adds on the read-replica path, stage by stage, in one thread
    of one process (no Ray, no HTTP, no other process on the core): the floor under what the
    serving bench measures across processes. Per request (thread CPU, medians; the amortised
    stages as totals over all requests): plan and route, the mirrors' answers, assemble, the
    corrections (``ResidualHead.served``, with ``artifacts``), the after-answer work
    (verifier picks, buffered), the answer's JSON, and what the request's share of the FM
    writes costs the shards (``writes_per_request`` pairs put, in leases of 10 requests) and
    the pulls (one per shard every ``requests_per_pull`` requests: export and apply)."""
    import torch
    from starlette.responses import JSONResponse

    from solaris.cache.query import Slots  # noqa: F401  (the type the stages pass along)
    from solaris.cache.replica import ReadReplica, decode_changes, encode_changes
    from solaris.cache.ring import HashRing
    from solaris.cache.store import PairStore
    from solaris.config import CacheConfig, EnrichConfig, VerifierConfig
    from solaris.online import enrich, verifier
    from solaris.online.serving import AfterAnswer
    from solaris.tiers import LABELS, Tier

    rng = np.random.default_rng(seed)
    users_n, items_n, c, d, t0 = 2000, 20000, 500, 32, 1.9e9
    cfg = CacheConfig(dim=d, num_shards=num_shards)
    ring = HashRing(num_shards)
    stores = [PairStore(cfg) for _ in range(num_shards)]
    users = rng.integers(0, users_n, 400_000)
    items = rng.integers(0, items_n, 400_000)
    _fill(stores, ring, users, items, d, t0, rng)
    replica = ReadReplica(cfg, stale_s=1e9)
    for s, store in enumerate(stores):
        replica.apply(s, encode_changes(*store.changes("", 0)))
    head = None
    if artifacts:
        from solaris.artifacts import Artifacts
        from solaris.online.scoring import ResidualHead

        art = Artifacts.open(artifacts)
        head = ResidualHead(art, art.tasks[0], cfg.read_ttl_s)
        if head.dim != d:
            raise ValueError(f"artifacts {artifacts}: slot width {head.dim}, the bench's {d}")
    uk, ik = _random_knn(rng, users_n), _random_knn(rng, items_n)
    ecfg, vcfg = EnrichConfig(), VerifierConfig()
    torch.set_num_threads(1)  # as the router's corrections run (a bench process of its own)
    buffer = AfterAnswer(16)
    scales = np.ones((2, 4), np.float32)
    times: dict[str, list[float]] = {k: [] for k in REPLICA_STAGES}
    amortised = {"shard_writes": 0.0, "pull_export": 0.0, "pull_apply": 0.0}
    warm = 50
    for n in range(requests + warm):
        u, cands = int(rng.integers(0, users_n)), rng.choice(items_n, c, replace=False)
        now = t0 + 1 + n
        t = [time.thread_time()]
        plan = enrich.plan(u, cands, uk, ik, ecfg)
        queries = enrich.route(plan, ring.shard_of, "v", now)
        t.append(time.thread_time())
        answers = replica.answers(queries)
        t.append(time.thread_time())
        slots = enrich.assemble(plan, answers, d)
        t.append(time.thread_time())
        base = rng.normal(size=c).astype(np.float32)
        probs = head.served(base, slots, scales, cands)[0] if head is not None else base
        t.append(time.thread_time())
        found = slots.pair_tier == Tier.PAIR
        picks = verifier.choose(base, cands, found, slots.pair_age_s, np.zeros(c, bool), vcfg,
                                cfg.read_ttl_s)
        shown = cands[np.argsort(-probs, kind="stable")[:10]]
        if buffer.add(u, shown, 0, now, {"v": (cands[picks], base[picks])}):
            buffer.drain()
        t.append(time.thread_time())
        JSONResponse({"request_id": "r", "task": "click", "mode": "solaris",
                      "scores": probs.astype(float).tolist(),
                      "tiers": [LABELS[i] for i in slots.pair_tier.tolist()],
                      "ages_s": slots.pair_age_s.tolist(),
                      "aggregate": slots.agg_present.tolist(),
                      "versions": {"fm": "v", "vm": "v", "knn": "k"}, "features": None})
        t.append(time.thread_time())
        if n >= warm:
            for k, a, b in zip(REPLICA_STAGES, t, t[1:]):
                times[k].append(1e3 * (b - a))
        if n % 10 == 9:  # an FM lease of 10 requests' picks lands on the shards
            wu = rng.integers(0, users_n, 10 * writes_per_request)
            wi = rng.integers(0, items_n, len(wu))
            z = rng.normal(size=(len(wu), d)).astype(np.float32)
            w_owner = ring.shard_of(wu)
            c0 = time.thread_time()
            for s, store in enumerate(stores):
                m = w_owner == s
                store.put(wu[m], wi[m], z[m], "v", now)
            if n >= warm:
                amortised["shard_writes"] += time.thread_time() - c0
        if n % requests_per_pull == requests_per_pull - 1:
            for s, store in enumerate(stores):
                c0 = time.thread_time()
                frame = encode_changes(*store.changes(replica.epoch[s], replica.seq[s]))
                c1 = time.thread_time()
                replica.apply(s, frame)
                if n >= warm:
                    amortised["pull_export"] += c1 - c0
                    amortised["pull_apply"] += time.thread_time() - c1
    med = {k: float(np.median(v)) for k, v in times.items() if v}
    for k, v in amortised.items():
        med[k] = 1e3 * v / requests
    _ = decode_changes  # the frame format the pulls above round-trip
    return {"shards": num_shards, "requests": requests, "candidates": c,
            "writes_per_request": writes_per_request, "requests_per_pull": requests_per_pull,
            "corrections_timed": head is not None,
            "cpu_ms_per_request": med, "total_ms": float(sum(med.values())),
            "router_ms": float(sum(v for k, v in med.items()
                                   if k not in ("shard_writes", "pull_export"))),
            "shards_ms": med["shard_writes"] + med["pull_export"]}


# this file's workload, over the ``solaris`` package of ``root`` (first on the path once the
# bench module, which puts its own tree on the path, is loaded by its file path)
_STAGES_CALL = ("import json, runpy, sys; "
                "request_cpu = runpy.run_path({sibling!r})['sibling']('request_cpu'); "
                "sys.path.insert(0, {root!r}); "
                "print(json.dumps(request_cpu.stages({shards}, {requests}, holders={holders})))")


def _stages_in(root: Path, shards: int, requests: int, holders: int | None = None) -> dict:
    """``stages`` over the code of the tree at ``root``, in a fresh process that imports
    that tree's ``solaris``."""
    code = _STAGES_CALL.format(root=str(root), sibling=str(Path(__file__).with_name("sibling.py")),
                               shards=shards, requests=requests, holders=holders)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def baseline_ab(rev: str, shards: int, rounds: int, requests: int = 300,
                holders: int | None = None) -> dict:
    """The stages over commit ``rev``'s code against this tree's, alternated ABBA over
    ``rounds``."""
    with tempfile.TemporaryDirectory(prefix="solaris-request-cpu-") as tmp:
        sha = sibling("vm_ab").extract(rev, Path(tmp))
        runs: dict[str, list[dict]] = {"baseline": [], "current": []}
        for r in tqdm(range(rounds), desc="rounds", unit="round"):
            order = ("baseline", "current") if r % 2 == 0 else ("current", "baseline")
            for arm in order:
                root = Path(tmp) if arm == "baseline" else ROOT
                runs[arm].append(_stages_in(root, shards, requests,
                                            holders)["ms_per_request_median"])
    med = {arm: {k: float(np.median([x[k] for x in v])) for k in STAGES}
           for arm, v in runs.items()}
    ratios = [sum(c.values()) / sum(b.values())
              for b, c in zip(runs["baseline"], runs["current"])]
    return {"baseline": sha, "shards": shards, "rounds": rounds, "requests": requests,
            "holders": holders,
            "ms_per_request_median": med,
            "total_ms": {arm: sum(m.values()) for arm, m in med.items()},
            "ratio_current_to_baseline_per_round": ratios,
            "ratio_current_to_baseline": float(np.median(ratios)), "per_round": runs}


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside, the caller's count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def vm_blocks(artifacts: str, trials: int = 7, requests: int = 40) -> dict:
    from solaris.online.scoring import VM_BLOCK_ROWS, Artifacts, ScoreRequest, VMScorer

    art = Artifacts.open(artifacts)
    task = art.tasks[0]
    arms = {f"blocks_{b}": VMScorer(art, task, art.side_tables(), block_rows=b)
            for b in sorted({VM_BLOCK_ROWS, 256})}
    arms["one_call"] = VMScorer(art, task, art.side_tables(), block_rows=0)
    rng = np.random.default_rng(0)
    reqs = [ScoreRequest(int(rng.integers(art.num_users)),
                         rng.choice(art.num_items, 500, replace=art.num_items < 500), 0, None)
            for _ in range(requests)]
    per: dict[str, list[float]] = {k: [] for k in arms}
    with one_thread():  # the caller's thread count comes back
        for trial in range(trials):
            order = list(arms) if trial % 2 else list(arms)[::-1]
            for name in order:
                c0 = time.thread_time()
                for r in reqs:
                    arms[name].score([r], with_base=True)
                per[name].append(1e3 * (time.thread_time() - c0) / len(reqs))
    med = {k: float(np.median(v[1:])) for k, v in per.items()}
    return {"cpu_ms_per_request_median": med, "per_trial": per,
            "ratio_to_one_call": {k: v / med["one_call"] for k, v in med.items()}}


def fm_blocks(artifacts: str, trials: int = 7, pairs: int = 1024,
              sizes: tuple[int, ...] = (10, 50, 200)) -> dict:
    """The FM worker's forward CPU per 1,000 pairs, one thread: fixed-size blocks (the
    config's ``block_requests`` / ``block_pairs``) against one call on the whole lease (0 / 0),
    on leases of ``pairs`` pairs in request groups of C candidates. Histories are empty and
    padded to ``history_len``, so the cost does not depend on their content."""
    from solaris.config import HistoryConfig, PrecomputeConfig
    from solaris.history import HistoryStore
    from solaris.online.scoring import Artifacts
    from solaris.precompute.pqueue import Group
    from solaris.artifacts import load_models
    from solaris.precompute.worker import PrecomputeWorker

    art = Artifacts.open(artifacts)
    fm, enc, version = load_models(art.root)
    side, hist = art.side_tables(), HistoryStore(HistoryConfig())
    pc = PrecomputeConfig()
    workers = {"blocks": PrecomputeWorker(fm, enc, hist, side, version,
                                          block_requests=pc.block_requests,
                                          block_pairs=pc.block_pairs),
               "one_call": PrecomputeWorker(fm, enc, hist, side, version, block_requests=0,
                                            block_pairs=0)}
    rng = np.random.default_rng(0)
    leases = {c: [Group(int(rng.integers(art.num_users)), 1.9e9, 0, version,
                        rng.choice(art.num_items, c, replace=art.num_items < c), np.zeros(c))
                  for _ in range(max(1, pairs // c))] for c in sizes}
    per: dict[str, list[float]] = {f"{k}_c{c}": [] for k in workers for c in sizes}
    with one_thread():  # the caller's thread count comes back
        for trial in range(trials):
            order = list(workers) if trial % 2 else list(workers)[::-1]
            for c, groups in leases.items():
                n = sum(len(g.items) for g in groups)
                for name in order:
                    c0 = time.thread_time()
                    workers[name].run(groups)
                    per[f"{name}_c{c}"].append(1e6 * (time.thread_time() - c0) / n)
    med = {k: float(np.median(v[1:])) for k, v in per.items()}  # the first trial warms up
    return {"cpu_ms_per_1k_pairs_median": med, "per_trial": per,
            "block_requests": pc.block_requests, "block_pairs": pc.block_pairs,
            "ratio_blocks_to_one_call": {f"c{c}": med[f"blocks_c{c}"] / med[f"one_call_c{c}"]
                                         for c in sizes}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--holders", type=int,
                   help="users holding the pairs, of 2,000 (default: all of them)")
    p.add_argument("--artifacts", help="a trained artifact directory (the VM's blocks)")
    p.add_argument("--baseline", help="a commit whose stages run beside this tree's")
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds of --baseline")
    p.add_argument("--replica-floor", action="store_true",
                   help="the read-replica path's stages (replica_floor) only")
    p.add_argument("--writes-per-request", type=int, default=50,
                   help="FM-written pairs per request the shards take (--replica-floor)")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds={a.rounds}: must be >= 1")
    machine = sibling("machine").machine

    if a.holders is not None and not 1 <= a.holders <= 2000:
        p.error(f"--holders={a.holders}: must be in [1, 2000]")
    if a.replica_floor:
        out = {"machine": machine(None),
               "replica_floor": replica_floor(a.shards, a.artifacts,
                                              writes_per_request=a.writes_per_request)}
        f = out["replica_floor"]
        print("  ".join(f"{k} {v:.3f}" for k, v in f["cpu_ms_per_request"].items()))
        print(f"router {f['router_ms']:.3f} ms, shards {f['shards_ms']:.3f} ms, "
              f"total {f['total_ms']:.3f} ms of CPU per request")
        if a.json:
            from solaris import atomic

            a.json.parent.mkdir(parents=True, exist_ok=True)
            atomic.save_json(a.json, out, indent=1)
        return 0
    out = {"machine": machine(None), "stages": stages(a.shards, holders=a.holders)}
    if a.baseline:
        ab = out["baseline_ab"] = baseline_ab(a.baseline, a.shards, a.rounds,
                                              holders=a.holders)
        for arm in ("baseline", "current"):
            print(f"{arm:<9} " + "  ".join(f"{k} {v:.3f}" for k, v in
                                            ab["ms_per_request_median"][arm].items())
                  + f"  total {ab['total_ms'][arm]:.3f} ms")
        print(f"current / baseline, median over rounds: {ab['ratio_current_to_baseline']:.3f}")
    if a.artifacts:
        out["vm_blocks"] = vm_blocks(a.artifacts)
        out["fm_blocks"] = fm_blocks(a.artifacts)
    print(json.dumps(out, indent=1))
    if a.json:
        from solaris import atomic

        a.json.parent.mkdir(parents=True, exist_ok=True)
        atomic.save_json(a.json, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
