"""Benchmark: the pair cache on issue 3's pinned workload, in process and through shard actors.

    python bench/cache.py --json runs/bench_cache.json [--data-dir DIR] [--skip-tr]

Workload: 256 candidates per request, d = 32, 4 shards, 1M entries (one store in process,
spread over the shards for the Ray path), 40% of candidates the user's own fresh pair, up to
100 stored user neighbours per user of which the 10 nearest are probed, item neighbours and
the aggregate on. Users live in communities sharing an item pool, so the user- and
item-neighbour tiers both find pairs.

Phases, one after the other so that none disturbs another's numbers:
1. the ring's move fraction (8 -> 9 shards, 200k users) and the codecs' payload bytes;
2. memory: one fresh subprocess per codec fills one store with 1M entries; the headline
   total is the store's live heap (tracemalloc: slabs, hash index, sums, dicts), with the
   process's RSS growth beside it;
3. latency: per request, in-process enrichment, the one-round Ray lookup, a no-op ping to one
   shard and a no-op to all four, in rotating order on one local Ray (2 CPUs); medians over
   all requests; ray == inproc is checked bit for bit on every request. Then, outside the
   timed loop, 300 more lookups broken into steps (client: plan, submit, wait, assemble;
   each shard: time inside ``answer``) show where a round's time goes; ``ray.shutdown()``;
4. the user-neighbour step alone, in process: the store's hash probes vs an item -> users
   index built once (``neighbour_step``), on the pinned workload and with 10x the holders per
   item;
5. int8 vs fp32 (``bench/int8_transfer.py``): a teacher and vm_pair_100 trained once on
   MovieLens-100K (seed 0, the report's validation grid), scored on the same test rows with
   fp32 z and int8-decoded z; the change of the calibrated transfer ratio (Platt fitted on
   validation).

Prints one table with each target's pass/fail, writes every number as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("bench.cache")

DIM = 32
SHARDS = 4
CANDIDATES = 256
OWN_SHARE = 0.40  # share of a request's candidates that are the user's own fresh pairs
PAIRS_PER_USER = 125  # >= 40% of 256, so a request can hold 102 own pairs
COMMUNITY_USERS = 200  # users sharing one item pool (user neighbours come from here)
POOL_ITEMS = 2000  # items per community pool
USER_NEIGHBOURS = 100  # stored per user; EnrichConfig.user_knn_probe = 10 are probed
ITEM_NEIGHBOURS = 10
VERSION = "fm1+enc32"
NOW = 1_000_000.0
FILL_CHUNKS = 20
WRITE_SPAN_S = 3.5 * 3600  # every write within the 4 h read TTL at NOW
PHASE_REQUESTS = 300  # lookups of the per-step breakdown that follows the timed loop


# ---- workload ----------------------------------------------------------------------------------
class Workload:
    """Users in communities; each holds ``PAIRS_PER_USER`` items of its community's pool."""

    def __init__(self, entries: int, seed: int = 0, community_users: int = COMMUNITY_USERS
                 ) -> None:
        self.cu = cu = community_users  # users sharing a pool: holders per item ~ cu / 16
        self.users = entries // PAIRS_PER_USER
        self.entries = self.users * PAIRS_PER_USER
        self.communities = max(1, self.users // cu)
        rng = np.random.default_rng(seed)
        held = np.empty((self.users, PAIRS_PER_USER), np.int64)  # item ids each user holds
        for c in range(self.communities):
            lo, hi = c * cu, min(self.users, (c + 1) * cu)
            if c == self.communities - 1:
                hi = self.users
            pick = rng.random((hi - lo, POOL_ITEMS)).argsort(axis=1)[:, :PAIRS_PER_USER]
            held[lo:hi] = c * POOL_ITEMS + pick
        self.held = held
        self.items = self.communities * POOL_ITEMS
        self.community = np.minimum(np.arange(self.users) // cu,
                                    self.communities - 1)
        self.seed = seed

    def user_knn(self):
        """(users, 100) neighbours from the user's community, nearest first."""
        from solaris.knn.neighbours import NeighbourTable

        rng = np.random.default_rng(self.seed + 1)
        ids = np.empty((self.users, USER_NEIGHBOURS), np.int64)
        for u in range(self.users):
            c = self.community[u]
            end = self.users if c == self.communities - 1 else (c + 1) * self.cu
            members = np.arange(c * self.cu, end)
            members = members[members != u]
            ids[u] = rng.choice(members, size=USER_NEIGHBOURS, replace=False)
        sims = np.sort(rng.uniform(0.2, 0.95, size=ids.shape), axis=1)[:, ::-1]
        return NeighbourTable(ids, sims.astype(np.float32), "knn-bench")

    def item_knn(self):
        """(items, 10) neighbours from the item's pool."""
        from solaris.knn.neighbours import NeighbourTable

        rng = np.random.default_rng(self.seed + 2)
        it = np.arange(self.items)
        base = (it // POOL_ITEMS) * POOL_ITEMS
        ids = base[:, None] + (it[:, None] % POOL_ITEMS
                               + rng.integers(1, POOL_ITEMS, size=(self.items, ITEM_NEIGHBOURS))
                               ) % POOL_ITEMS
        sims = np.sort(rng.uniform(0.2, 0.95, size=ids.shape), axis=1)[:, ::-1]
        return NeighbourTable(ids, sims.astype(np.float32), "knn-bench")

    def chunks(self):
        """(users, items, vectors, now) write batches in event-time order."""
        rng = np.random.default_rng(self.seed + 3)
        order = rng.permutation(self.entries)
        for k, part in enumerate(np.array_split(order, FILL_CHUNKS)):
            u = part // PAIRS_PER_USER
            i = self.held[u, part % PAIRS_PER_USER]
            vec = rng.normal(size=(len(part), DIM)).astype(np.float32)
            now = NOW - WRITE_SPAN_S * (1 - (k + 1) / FILL_CHUNKS)
            yield u, i, vec, now

    def requests(self, n: int, seed: int) -> list[tuple[int, np.ndarray]]:
        """``n`` (user, 256 candidates): 40% held by the user, the rest from its pool."""
        rng = np.random.default_rng(seed)
        own = int(round(OWN_SHARE * CANDIDATES))
        out = []
        for u in rng.integers(0, self.users, size=n):
            c = self.community[u]
            mine = rng.choice(self.held[u], size=own, replace=False)
            rest = np.setdiff1d(c * POOL_ITEMS + np.arange(POOL_ITEMS), self.held[u])
            other = rng.choice(rest, size=CANDIDATES - own, replace=False)
            out.append((int(u), rng.permutation(np.concatenate([mine, other]))))
        return out


def cache_cfg(codec: str = "fp32", capacity: int = 1_000_000, shards: int = SHARDS):
    from solaris.config import CacheConfig

    return CacheConfig(dim=DIM, codec=codec, capacity=capacity, num_shards=shards,
                       snapshot_uri=None)


# ---- phase 1: ring and payload -----------------------------------------------------------------
def move_fraction(users: int = 200_000) -> float:
    """Share of users whose shard changes when the ring grows from 8 to 9 shards."""
    from solaris.cache.ring import HashRing

    u = np.arange(users, dtype=np.int64)
    vn = cache_cfg().virtual_nodes
    return float(np.mean(HashRing(8, vn).shard_of(u) != HashRing(9, vn).shard_of(u)))


def payload_bytes() -> dict[str, int]:
    """Bytes of one encoded vector (int8: codes plus its scale)."""
    from solaris.cache.codec import Codec

    x = np.random.default_rng(0).normal(size=(1000, DIM)).astype(np.float32)
    return {c: int(Codec(c, DIM).encode(x).nbytes // len(x)) for c in ("fp32", "fp16", "int8")}


# ---- phase 2: latency ---------------------------------------------------------------------------
def latency(entries: int, n_requests: int, warmup: int, num_cpus: int = 2) -> dict:
    """Interleaved per request: enrich_local, CacheGroup.lookup, a ping to one shard."""
    import ray

    from actors.cache import CacheGroup
    from solaris.tiers import LABELS as TIER_NAMES
    from solaris.cache.store import PairStore
    from solaris.config import EnrichConfig
    from solaris.online.enrich import enrich_local

    w = Workload(entries)
    uk, ik = w.user_knn(), w.item_knn()
    ecfg = EnrichConfig(user_knn_probe=10, item_knn_probe=10, item_tier=True, aggregate=True)
    cfg = cache_cfg(capacity=max(entries, 1024))
    ray.init(address="local", num_cpus=num_cpus, object_store_memory=200 * 1024**2,
             include_dashboard=False,
             logging_level="warning")
    try:
        group = CacheGroup.create(cfg, group_id="bench")
        group.wait_ready()
        store = PairStore(cfg)
        t0 = time.perf_counter()
        for u, i, vec, now in w.chunks():
            store.put(u, i, vec, VERSION, now)
            group.put(u, i, vec, VERSION, now)
        fill_s = time.perf_counter() - t0
        shard_entries = [m.get("entries") for m in group.metrics()["shards"]]
        log.info("filled %d entries in %.1f s (shards: %s)", store.live, fill_s, shard_entries)
        reqs = w.requests(warmup + n_requests, seed=7)
        t_in, t_ray, t_ping, t_fan = [], [], [], []
        tiers = np.zeros(len(TIER_NAMES), np.int64)
        agg, same = 0, 0
        for k, (user, cands) in enumerate(reqs):
            timings = {}
            for step in np.roll(np.arange(4), k % 4):  # rotate the order: no position bias
                t = time.perf_counter()
                if step == 0:
                    local = enrich_local(store, user, cands, NOW, VERSION, uk, ik, ecfg)
                elif step == 1:
                    remote = group.lookup(user, cands, NOW, VERSION, uk, ik, ecfg)
                elif step == 2:
                    group.health.ping(0)
                else:
                    group.ping_all()
                timings[step] = (time.perf_counter() - t) * 1e3
            if k < warmup:
                continue
            t_in.append(timings[0])
            t_ray.append(timings[1])
            t_ping.append(timings[2])
            t_fan.append(timings[3])
            tiers += np.bincount(local.pair_tier, minlength=len(TIER_NAMES))
            agg += int(local.agg_present.sum())
            same += all(np.array_equal(getattr(local, f), getattr(remote, f))
                        for f in local.__dataclass_fields__)  # bit for bit
        client = group.metrics()["client"]
        phases = round_phases(group, reqs[warmup:warmup + PHASE_REQUESTS], uk, ik, ecfg)
        group.shutdown()
    finally:
        ray.shutdown()
    total = tiers.sum()
    pct = lambda a, q: float(np.percentile(a, q))  # noqa: E731
    return {
        "inproc_ms_p50_256": pct(t_in, 50), "ray_ms_p50_256": pct(t_ray, 50),
        "noop_rtt_ms_p50": pct(t_ping, 50),
        "noop_fanout_ms_p50": pct(t_fan, 50),  # a no-op to all 4 shards in one round
        "inproc_ms_p99_256": pct(t_in, 99), "ray_ms_p99_256": pct(t_ray, 99),
        "noop_rtt_ms_p99": pct(t_ping, 99),
        "requests": n_requests, "warmup": warmup, "entries": int(store.live),
        "shard_entries": shard_entries, "fill_s": round(fill_s, 1),
        "tier_share": {n: float(tiers[i] / total) for i, n in enumerate(TIER_NAMES)},
        "agg_share": agg / total,
        "ray_equals_inproc_share": same / n_requests,
        "deadline_ms": cfg.deadline_ms, "late_answers": client["late"],
        "failed_answers": client["failed"], "round_phases": phases,
    }


def round_phases(group, reqs, uk, ik, ecfg) -> dict:
    """Where a lookup round's time goes, after the timed loop (not part of its numbers):
    client-side medians of each step, and each shard's mean time inside ``answer`` (thread
    CPU and wall) for queries with the user's part and for neighbour probes only."""
    def answers() -> dict:
        out: dict = {}
        for m in group.metrics()["shards"]:
            for kind, a in m.get("answers", {}).items():
                o = out.setdefault(kind, [0, 0.0, 0.0])
                o[0], o[1], o[2] = o[0] + a["calls"], o[1] + a["cpu_s"], o[2] + a["wall_s"]
        return out

    before = answers()
    steps: dict[str, list[float]] = {}
    for user, cands in reqs:
        ph: dict[str, float] = {}
        t = time.perf_counter()
        group.lookup(user, cands, NOW, VERSION, uk, ik, ecfg, phases=ph)
        ph["total"] = time.perf_counter() - t
        for k, v in ph.items():
            steps.setdefault(k, []).append(v * 1e3)
    after = answers()
    shard = {}
    for kind, (n, cpu, wall) in after.items():
        n0, cpu0, wall0 = before.get(kind, (0, 0.0, 0.0))
        if n > n0:
            shard[kind] = {"calls_per_lookup": (n - n0) / len(reqs),
                           "cpu_ms_mean": (cpu - cpu0) / (n - n0) * 1e3,
                           "wall_ms_mean": (wall - wall0) / (n - n0) * 1e3}
    return {"requests": len(reqs),
            "client_ms_p50": {k: float(np.median(v)) for k, v in steps.items()},
            "shard_answer": shard}


# ---- phase 3a: memory (run in a fresh subprocess per codec) -------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_probe(codec: str, entries: int) -> dict:
    """Fill one store with ``entries`` entries; real memory growth per entry."""
    import tracemalloc

    from solaris.cache.store import PairStore

    w = Workload(entries)
    warm = PairStore(cache_cfg(codec, capacity=2048))  # first-use imports and caches
    for u, i, vec, now in Workload(2000).chunks():
        warm.put(u, i, vec, VERSION, now)
    del warm
    chunks = list(w.chunks())  # inputs exist before the baseline: not counted
    gc.collect()
    rss0 = _rss_bytes()
    tracemalloc.start()
    store = PairStore(cache_cfg(codec, capacity=w.entries))
    for u, i, vec, now in chunks:
        store.put(u, i, vec, VERSION, now)
    gc.collect()
    traced, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = _rss_bytes() - rss0
    trimmed = rss
    try:  # what the allocator still holds from the fill's transients (slab growth)
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = _rss_bytes() - rss0
    except OSError:
        pass
    m = store.metrics()
    n = m["entries"]
    return {"codec": codec, "entries": n, "rss_bytes_per_entry": rss / n,
            "rss_after_malloc_trim_per_entry": trimmed / n,
            "tracemalloc_bytes_per_entry": traced / n, "tracemalloc_peak_per_entry": peak / n,
            "accounted_bytes_per_entry": m["total_bytes"] / n}


def memory(entries: int) -> dict[str, dict]:
    out = {}
    for codec in ("fp32", "fp16", "int8"):
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-probe",
                            codec, "--entries", str(entries)], capture_output=True, text=True,
                           timeout=600, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"memory probe {codec} failed:\n{r.stderr[-2000:]}")
        out[codec] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


# ---- phase 3b: the user-neighbour step, hash probes vs an item -> users index ------------------
def neighbour_step(entries: int, n_requests: int, probe: int = 10,
                   community_users: int = COMMUNITY_USERS) -> dict:
    """The user-neighbour tier's question -- which of the user's ``probe`` nearest
    neighbours hold a fresh pair of which still-open candidate -- answered two ways on the
    same in-process store and requests, in rotating order:

    * ``probe``: ``PairStore.holders`` (what the shards run): one vectorised lookup of the
      (neighbour, item) keys in the store's hash index, vectors and ages included;
    * ``postings``: an item -> holders index (CSR: items sorted, users and slots per item) built
      once from the store's live entries -- the best case of such an index, with no upkeep on
      writes and expiry -- intersected with the neighbours by one vectorised ``isin`` over the
      candidates' postings, then the hits' vectors read by slot.

    Both must find the same hits (checked per request). Reported: medians per request, the
    index's build seconds and bytes per entry (not counted in the store's own bytes)."""
    from solaris.cache.answer import _vectors
    from solaris.cache.slab import gather
    from solaris.cache.store import PairStore

    w = Workload(entries, community_users=community_users)
    store = PairStore(cache_cfg(capacity=max(entries, 1024)))
    for u, i, vec, now in w.chunks():
        store.put(u, i, vec, VERSION, now)
    uk = w.user_knn()
    t0 = time.perf_counter()
    meta = store.table.meta
    slots = np.flatnonzero(meta["vid"] == store.version_id(VERSION))
    users, items = meta["user"][slots], meta["item"][slots]
    order = np.lexsort((users, items))
    post_users = users[order].astype(np.int32)
    post_slots = slots[order].astype(np.int32)
    offsets = np.zeros(w.items + 1, np.int64)
    np.cumsum(np.bincount(items, minlength=w.items), out=offsets[1:])
    build_s = time.perf_counter() - t0
    index_bytes = post_users.nbytes + post_slots.nbytes + offsets.nbytes
    ttl = store.cfg.read_ttl_s

    def by_postings(open_items: np.ndarray, nbrs: np.ndarray):
        starts, ends = offsets[open_items], offsets[open_items + 1]
        lens = ends - starts
        row = np.repeat(np.arange(len(open_items)), lens)
        pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens) \
            + np.repeat(starts, lens)
        holders = post_users[pos]
        hit = np.isin(holders, nbrs)
        row, who, slot = row[hit], holders[hit], post_slots[pos[hit]]
        age = NOW - gather(store.table.meta, slot)["written"]
        fresh = age <= ttl
        row, who, slot, age = row[fresh], who[fresh], slot[fresh], age[fresh]
        col = np.searchsorted(np.sort(nbrs), who)
        col = np.argsort(nbrs)[col]  # the neighbour's position in the probe order
        k = np.lexsort((col, row))
        return row[k], col[k], _vectors(store, slot[k]), age[k]

    t_probe, t_post, same = [], [], 0
    for n, (user, cands) in enumerate(w.requests(n_requests, seed=11)):
        open_items = cands[~np.isin(cands, w.held[user])]  # candidates without an own pair
        nbrs, _ = uk.nearest(user, probe)
        res = {}
        for step in ((0, 1) if n % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            res[step] = (store.holders(open_items, nbrs, VERSION, NOW) if step == 0
                         else by_postings(open_items, nbrs))
            (t_probe if step == 0 else t_post).append((time.perf_counter() - t) * 1e3)
        a, b = res[0], res[1]
        same += (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                 and np.array_equal(a[2], b[2]))
    return {"probe_ms_p50": float(np.median(t_probe)),
            "postings_ms_p50": float(np.median(t_post)),
            "postings_build_s": round(build_s, 2),
            "postings_bytes_per_entry": index_bytes / store.live,
            "same_hits_share": same / n_requests, "requests": n_requests,
            "neighbours_probed": probe,
            "holders_per_item_mean": float(np.mean(np.diff(offsets)))}


# ---- report -------------------------------------------------------------------------------------
def rows(r: dict) -> list[tuple[str, str, str, str, bool | None]]:
    """(metric, value, detail, target, passed or None) for the table and the JSON checks."""
    out: list[tuple[str, str, str, str, bool | None]] = []
    lat = r.get("latency")
    if lat:
        inp, ray_ms, rtt = lat["inproc_ms_p50_256"], lat["ray_ms_p50_256"], lat["noop_rtt_ms_p50"]
        out += [("inproc_ms_p50_256", f"{inp:.3f}", f"p99 {lat['inproc_ms_p99_256']:.3f}",
                 "<= 1.0", inp <= 1.0),
                ("ray_ms_p50_256", f"{ray_ms:.3f}", f"p99 {lat['ray_ms_p99_256']:.3f}",
                 f"<= inproc + 2 x rtt = {inp + 2 * rtt:.3f}", ray_ms <= inp + 2 * rtt),
                ("noop_rtt_ms_p50", f"{rtt:.3f}", f"p99 {lat['noop_rtt_ms_p99']:.3f}", "", None),
                ("noop_fanout4_ms_p50", f"{lat['noop_fanout_ms_p50']:.3f}", "ping all 4 shards",
                 "", None)]
    pay = r["payload_bytes_per_entry"]
    out.append(("payload_bytes fp32/16/8", f"{pay['fp32']}/{pay['fp16']}/{pay['int8']}", "",
                f"int8 <= 0.3 x fp32 = {0.3 * pay['fp32']:.1f}", pay["int8"] <= 0.3 * pay["fp32"]))
    tot, rss = r.get("total_bytes_per_entry"), r.get("total_bytes_per_entry_rss")
    if tot and rss:
        for label, t in (("total_bytes (live)", tot), ("total_bytes (RSS growth)", rss)):
            out.append((f"{label} fp32", f"{t['fp32']:.1f}", f"fp16 {t['fp16']:.1f}", "<= 300",
                        t["fp32"] <= 300))
            out.append((f"{label} int8", f"{t['int8']:.1f}", f"{t['int8'] / t['fp32']:.3f} x fp32",
                        f"<= 0.6 x fp32 = {0.6 * t['fp32']:.1f}", t["int8"] <= 0.6 * t["fp32"]))
    mf = r["move_fraction_8_to_9"]
    out.append(("move_fraction_8_to_9", f"{mf:.4f}", "ideal 1/9 = 0.1111", "<= 0.15", mf <= 0.15))
    d = r.get("int8_tr_delta")
    if d is not None:
        tr = r["transfer"]["tr_cal"]
        out.append(("int8_tr_delta", f"{d:+.5f}", f"TR fp32 {tr['fp32']:.4f}", "|.| <= 0.02",
                    abs(d) <= 0.02))
    return out


def table(r: dict) -> str:
    lines = [f"{'metric':<30}{'value':>12}  {'detail':<20}{'target':<34}"]
    for name, value, detail, target, passed in rows(r):
        mark = "" if passed is None else ("PASS" if passed else "FAIL")
        lines.append(f"{name:<30}{value:>12}  {detail:<20}{target:<34}{mark}")
    for name, x in (r.get("user_neighbour_step") or {}).items():
        lines.append(f"user-neighbour step ({name}: {x['holders_per_item_mean']:.1f} holders per "
                     f"item, {x['neighbours_probed']} neighbours): hash probes "
                     f"{x['probe_ms_p50']:.3f} ms, item -> users index {x['postings_ms_p50']:.3f}"
                     f" ms (+{x['postings_bytes_per_entry']:.1f} B per entry, no upkeep counted);"
                     f" same hits on {x['same_hits_share']:.3f} of requests")
    lat = r.get("latency")
    if lat:
        ts = " ".join(f"{k} {v:.2f}" for k, v in lat["tier_share"].items())
        lines.append(f"workload: {lat['entries']} entries over {len(lat['shard_entries'])} shards, "
                     f"{lat['requests']} requests x {CANDIDATES} candidates; tiers: {ts}; "
                     f"aggregate {lat['agg_share']:.2f}")
        lines.append(f"ray == inproc (bit for bit) on {lat['ray_equals_inproc_share']:.3f} of "
                     f"requests; late answers per shard {lat['late_answers']} "
                     f"(deadline {lat['deadline_ms']:.0f} ms)")
        ph = lat.get("round_phases")
        if ph:
            c = ph["client_ms_p50"]
            lines.append("ray round, client p50 ms: " + ", ".join(
                f"{k} {c[k]:.3f}" for k in ("plan", "submit", "wait", "assemble", "total")
                if k in c))
            lines.append("ray round, inside answer (mean ms cpu/wall): " + ", ".join(
                f"{k} x{a['calls_per_lookup']:.2f} {a['cpu_ms_mean']:.3f}/{a['wall_ms_mean']:.3f}"
                for k, a in ph["shard_answer"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="where to write the numbers")
    ap.add_argument("--data-dir", help="MovieLens-100K directory (default: fetch into the cache)")
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the TR check")
    ap.add_argument("--skip-tr", action="store_true", help="leave out the MovieLens TR check")
    ap.add_argument("--num-cpus", type=int, default=2,
                    help="logical CPUs of the local Ray (2: the 2-core profile)")
    ap.add_argument("--memory-probe", choices=("fp32", "fp16", "int8"), help=argparse.SUPPRESS)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    if args.memory_probe:  # internal: one fresh process per codec
        print(json.dumps(memory_probe(args.memory_probe, args.entries)))
        return 0
    if args.json is None:
        ap.error("--json is required")
    t0 = time.perf_counter()
    r: dict = {"workload": {"entries": args.entries, "candidates": CANDIDATES, "dim": DIM,
                            "shards": SHARDS, "own_pair_share": OWN_SHARE,
                            "user_neighbours_stored": USER_NEIGHBOURS, "user_knn_probe": 10,
                            "item_knn_probe": ITEM_NEIGHBOURS}}
    r["move_fraction_8_to_9"] = move_fraction()
    r["payload_bytes_per_entry"] = payload_bytes()
    log.info("memory phase")
    mem = memory(args.entries)
    r["memory"] = mem
    # live heap bytes of the store (tracemalloc; slabs, index, sums, dicts): deterministic.
    # RSS growth is kept beside it: it also counts the allocator's retained transients and
    # numpy's huge pages, and moves with what else the machine is doing.
    r["total_bytes_per_entry"] = {c: m["tracemalloc_bytes_per_entry"] for c, m in mem.items()}
    r["total_bytes_per_entry_rss"] = {c: m["rss_bytes_per_entry"] for c, m in mem.items()}
    log.info("latency phase")
    r["latency"] = latency(args.entries, args.requests, args.warmup, args.num_cpus)
    for k in ("inproc_ms_p50_256", "ray_ms_p50_256", "noop_rtt_ms_p50"):
        r[k] = r["latency"][k]
    log.info("user-neighbour step: hash probes vs an item -> users index")
    r["user_neighbour_step"] = {
        name: neighbour_step(args.entries, min(args.requests, 1000), community_users=cu)
        for name, cu in (("pinned", COMMUNITY_USERS), ("holders_x10", 10 * COMMUNITY_USERS))}
    r["int8_tr_delta"] = None
    if not args.skip_tr:  # its own process: torch threads and memory go away with it
        log.info("transfer-ratio phase (MovieLens-100K)")
        from int8_transfer import int8_transfer  # bench/ is the script's folder

        with mp.get_context("spawn").Pool(1) as pool:
            r["transfer"] = pool.apply(int8_transfer, (args.data_dir, args.threads))
        r["int8_tr_delta"] = r["transfer"]["int8_tr_delta"]
    r["checks"] = {f"{name} {target}": passed for name, _, _, target, passed in rows(r)
                   if passed is not None}
    r["num_cpus"] = args.num_cpus
    from machine import IN_PROCESS, NO_FM, machine

    r["machine"] = machine(IN_PROCESS if "transfer" in r else NO_FM)
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    print(table(r))
    print(f"bench/cache.py wall time: {r['wall_s']:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2, allow_nan=False, default=float))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
