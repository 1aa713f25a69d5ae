"""Benchmark: the FM worker's forward on a GPU against the CPU -- pairs/s, and whether the
two devices give the same pair embeddings.

    python bench/precompute_gpu.py --json runs/bench_precompute_gpu.json [--trials 5]
        [--pairs 16000] [--lease-pairs 256 1024 4096] [--cpu-threads 1 all]
        [--artifacts DIR] [--no-production] [--devices cpu,cuda] [--blocks 32:256 0:0]

What a GPU FM worker actor runs (``actors/precompute.py`` puts ``PrecomputeWorker`` on
``cuda`` when Ray gives it a GPU), measured in one process, without Ray: per lease,
``PrecomputeWorker.run`` reads the lease's histories (numpy, on the CPU), moves the request
and candidate batches to the device, runs the FM's request part once per request and the
candidate part plus the encoder in fixed-size blocks (``precompute.block_requests`` /
``block_pairs``), and copies the vectors back. The timing is the driver's wall clock around
all the leases of ``--pairs`` pairs (the copy back synchronises the device).

Settings, interleaved per trial (the order rotating), medians over trials:

- ``cpu<N>``: the CPU with N torch threads (1: ``precompute.threads``' default, one worker's
  share of a small machine; ``all``: every core of this machine);
- ``cuda``: the GPU with the shipped fixed blocks (32 requests, 256 pairs);
- ``cuda_<R>x<P>``: the GPU with blocks of R requests and P pairs (``--blocks R:P ...``);
- ``cuda_whole``: the GPU with one call per lease (``--blocks 0:0``), what fixed blocks cost
  there.

Agreement (same leases, every device): the largest absolute difference of a vector entry
between the CPU and the GPU, against the largest entry and the int8 codec's step
(``cache.int8``: max |z| / 127), and the smallest cosine. Lease invariance: the first
request's vectors computed alone and inside a full lease, per device (the fixed blocks exist
so that these are equal). The user encoder the KNN job runs on a GPU when it has one
(``jobs/rebuild_knn.py``) is compared the same way.

Two FM shapes: the default config and a production-shaped one reading a 128-event history
(as ``bench/precompute.py``). ``--artifacts DIR``: reuse (or keep) the trained artifacts
under ``DIR/default`` and ``DIR/production``; otherwise each is trained for one epoch on
the default synthetic data (speed is measured, not quality).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the other benches, by file path: bench/ never goes on sys.path (bench/sibling.py)
sibling = runpy.run_path(str(Path(__file__).with_name("sibling.py")))["sibling"]
_precompute = sibling("precompute")  # this folder's bench
CANDIDATES, build, leases_of = _precompute.CANDIDATES, _precompute.build, _precompute.leases_of


def parse_threads(values: list[str]) -> list[int]:
    """``--cpu-threads`` values: positive counts, or ``all`` (this machine's cores)."""
    out = []
    for v in values:
        n = (os.cpu_count() or 1) if v == "all" else (int(v) if v.isdigit() else 0)
        if n < 1:
            raise SystemExit(f"--cpu-threads {v!r}: must be a positive count or 'all'")
        out.append(n)
    return sorted(set(out))


def parse_blocks(values: list[str]) -> list[tuple[int, int]]:
    """``--blocks`` values ``REQUESTS:PAIRS`` (``0:0``: one call per lease)."""
    out = []
    for v in values:
        parts = v.split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--blocks {v!r}: must be REQUESTS:PAIRS, e.g. 32:256 (0:0: none)")
        out.append((int(parts[0]), int(parts[1])))
    return out


def settings(devices: list[str], threads: list[int], blocks: list[tuple[int, int]]
             ) -> list[tuple[str, str, int, tuple[int, int]]]:
    """(name, torch device, threads, (block_requests, block_pairs)) per measured setting:
    the CPU with the shipped blocks, the GPU with each of ``blocks``."""
    from solaris.config import PrecomputeConfig

    shipped = (PrecomputeConfig.block_requests, PrecomputeConfig.block_pairs)
    out = []
    for d in devices:
        if d == "cpu":
            out += [(f"cpu{n}", "cpu", n, shipped) for n in threads]
        elif d == "cuda":
            out += [("cuda" if b == shipped else "cuda_whole" if b == (0, 0)
                     else f"cuda_{b[0]}x{b[1]}", "cuda", 0, b) for b in blocks]
        else:
            raise SystemExit(f"--devices {d!r}: must be cpu or cuda")
    return out


def workers(w: dict, work: Path, sets: list) -> dict:
    """One ``PrecomputeWorker`` per setting, each on its own copy of the models."""
    from solaris.artifacts import load_models
    from solaris.precompute.worker import PrecomputeWorker, describe_device

    out = {}
    for name, dev, _, (b_req, b_pairs) in sets:
        fm, enc, version = load_models(work)
        out[name] = PrecomputeWorker(fm, enc, w["history"], w["tables"], version, dev,
                                     block_requests=b_req, block_pairs=b_pairs)
    return {"workers": out, "version": version,
            "devices": {n: describe_device(p.device) for n, p in out.items()}}


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """How far vectors ``b`` (N, d) are from the reference ``a``."""
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    top = float(np.abs(a).max()) if a.size else 0.0
    cos = np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1),
                                         1e-12)
    return {"max_abs_diff": diff, "max_abs_entry": top,
            "diff_over_int8_step": diff / (top / 127.0) if top else 0.0,
            "min_cosine": float(cos.min()) if len(cos) else 1.0,
            "bit_identical": bool(np.array_equal(a, b))}


def check_agreement(w: dict, ws: dict, sets: list, lease_pairs: int) -> dict:
    """CPU (the first setting) against every other setting on the same leases, and each
    setting's lease invariance."""
    import torch

    ref = sets[0][0]
    out: dict = {"reference": ref, "vectors": {}, "lease_invariance": {}}
    for c in CANDIDATES:
        lease = leases_of(w, ws["version"], c, lease_pairs, lease_pairs, seed=7 + c)[0]
        got = {}
        for name, _, n, _ in sets:
            if n:
                torch.set_num_threads(n)
            p = ws["workers"][name]
            u, i, z, _ = p.run(lease)
            got[name] = (u, i, z)
            alone = p.run(lease[:1])[2]
            out["lease_invariance"].setdefault(name, {})[str(c)] = agreement(
                z[:len(alone)], alone)
        for name, (u, i, _) in got.items():  # every setting returns the lease's pair order
            if not (np.array_equal(got[ref][0], u) and np.array_equal(got[ref][1], i)):
                raise SystemExit(f"{name}: pairs in another order than {ref}'s")
        out["vectors"][str(c)] = {name: agreement(got[ref][2], z)
                                  for name, (_, _, z) in got.items() if name != ref}
    return out


def check_user_encoder(w: dict, work: Path, sets: list) -> dict:
    """The KNN job's user encoder on every device against the CPU, on 512 users."""
    import torch

    from solaris.knn.user_encoder import UserEncoder
    from solaris.artifacts import load_models

    rng = np.random.default_rng(3)
    users = rng.choice(w["num_users"], min(512, w["num_users"]), replace=False)
    req = w["history"].batch(users, np.full(len(users), w["t0"]), np.zeros(len(users), np.int64),
                             w["cfg"].features.history_len, w["tables"].item_cat,
                             w["tables"].user_cat, w["tables"].user_cont)
    devs = sorted({dev for _, dev, _, _ in sets}, key=lambda d: d != "cpu")
    vec = {}
    for dev in devs:
        torch.set_num_threads(sets[0][2] or 1)
        vec[dev] = UserEncoder(load_models(work)[0], dev).encode(req)
    return {dev: agreement(vec[devs[0]], v) for dev, v in vec.items() if dev != devs[0]}


def measure(w: dict, ws: dict, sets: list, trials: int, pairs: int,
            lease_sizes: list[int]) -> dict:
    """Per lease size, C and setting: pairs/s (wall) and pairs per FM-second, per trial."""
    import torch

    wall: dict = {str(lp): {str(c): {s[0]: [] for s in sets} for c in CANDIDATES}
                  for lp in lease_sizes}
    fm = {lp: {c: {n: [] for n in d} for c, d in v.items()} for lp, v in wall.items()}
    for trial in range(-1, trials):  # trial -1 warms up (kernels, allocator)
        for lp in lease_sizes:
            for c in CANDIDATES:
                leases = leases_of(w, ws["version"], c, pairs, lp, seed=1000 * max(trial, 0) + c)
                n_pairs = sum(len(g.items) for lease in leases for g in lease)
                k = (trial + 1) % len(sets)
                for name, _, n, _ in sets[k:] + sets[:k]:
                    if n:
                        torch.set_num_threads(n)
                    run = ws["workers"][name].run
                    t0, fm_s = time.perf_counter(), 0.0
                    for lease in leases:
                        fm_s += run(lease)[3]
                    if trial >= 0:
                        wall[str(lp)][str(c)][name].append(n_pairs / (time.perf_counter() - t0))
                        fm[str(lp)][str(c)][name].append(n_pairs / fm_s)
    med = {lp: {c: {n: float(np.median(v)) for n, v in d.items()} for c, d in by_c.items()}
           for lp, by_c in wall.items()}
    return {"pairs_per_s": med,
            "pairs_per_fm_s": {lp: {c: {n: float(np.median(v)) for n, v in d.items()}
                                    for c, d in by_c.items()} for lp, by_c in fm.items()},
            "trials_pairs_per_s": wall}


def one_shape(work: Path, shape: dict | None, sets: list, args) -> dict:
    import torch

    torch.set_num_threads(sets[0][2] or 1)
    w = build(work, shape)
    ws = workers(w, work, sets)
    m = measure(w, ws, sets, args.trials, args.pairs, args.lease_pairs)
    cpu = [s[0] for s in sets if s[1] == "cpu"]
    gpu = [s[0] for s in sets if s[1] == "cuda"]
    ratio = {lp: {c: {g: d[g] / d[cpu[0]] for g in gpu + cpu[1:]} for c, d in by_c.items()}
             for lp, by_c in m["pairs_per_s"].items()} if cpu else {}
    return {"history_len": w["cfg"].features.history_len, "version": ws["version"],
            "train_s": w["train_s"], "devices": ws["devices"], **m,
            f"speedup_over_{cpu[0]}" if cpu else "speedup": ratio,
            "agreement": check_agreement(w, ws, sets, args.lease_pairs[-1]),
            "user_encoder_agreement": check_user_encoder(w, work, sets)}


def table(r: dict) -> str:
    lines = []
    for key in ("default", "production_shaped"):
        if key not in r:
            continue
        s = r[key]
        lines.append(f"{key} (history_len {s['history_len']}): pairs/s, median of "
                     f"{r['trials']} trials")
        names = list(next(iter(next(iter(s["pairs_per_s"].values())).values())))
        wd = max(12, *(len(n) + 2 for n in names))
        lines.append("  lease   C  " + "".join(f"{n:>{wd}}" for n in names))
        for lp, by_c in s["pairs_per_s"].items():
            for c, d in by_c.items():
                lines.append(f"  {lp:>5} {c:>3}  " + "".join(f"{d[n]:>{wd},.0f}" for n in names))
        for c, d in s["agreement"]["vectors"].items():
            for n, a in d.items():
                lines.append(f"  C={c} {n} vs {s['agreement']['reference']}: max |diff| "
                             f"{a['max_abs_diff']:.2e} ({a['diff_over_int8_step']:.4f} of an "
                             f"int8 step), min cosine {a['min_cosine']:.7f}")
        for n, by_c in s["agreement"]["lease_invariance"].items():
            same = all(a["bit_identical"] for a in by_c.values())
            worst = max(a["max_abs_diff"] for a in by_c.values())
            lines.append(f"  lease invariance {n}: bit-identical {same} (max |diff| {worst:.2e})")
        for dev, a in s["user_encoder_agreement"].items():
            lines.append(f"  user encoder {dev} vs cpu: max |diff| {a['max_abs_diff']:.2e}, "
                         f"min cosine {a['min_cosine']:.7f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where to write the numbers")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=16000, help="pairs per trial and setting")
    ap.add_argument("--lease-pairs", type=int, nargs="+", default=[256, 1024, 4096],
                    help="pairs per lease (the last one is also the agreement check's)")
    ap.add_argument("--cpu-threads", nargs="+", default=["1", "all"],
                    help="torch threads of the CPU settings (counts, or 'all')")
    ap.add_argument("--devices", default="cpu,cuda", help="comma-separated: cpu, cuda")
    ap.add_argument("--blocks", nargs="+", default=["32:256", "0:0"],
                    help="the GPU's block sizes, REQUESTS:PAIRS each (32:256 is shipped; 0:0 "
                         "one call per lease)")
    ap.add_argument("--artifacts", type=Path, default=None,
                    help="keep or reuse trained artifacts under DIR/default, DIR/production")
    ap.add_argument("--history-len", type=int, default=128,
                    help="history length of the production-shaped FM")
    ap.add_argument("--no-production", action="store_true",
                    help="measure the default shape only")
    args = ap.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if args.trials < 1 or args.pairs < max(CANDIDATES) or min(args.lease_pairs) < 1:
        raise SystemExit(f"--trials {args.trials} / --pairs {args.pairs} / --lease-pairs "
                         f"{args.lease_pairs}: need >= 1 trial, >= {max(CANDIDATES)} pairs, "
                         "leases >= 1 pair")
    sets = settings(devices, parse_threads(args.cpu_threads), parse_blocks(args.blocks))
    import torch

    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("--devices includes cuda, but torch sees no GPU here "
                         f"(torch {torch.__version__}); run with --devices cpu")
    t0 = time.perf_counter()
    r: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.artifacts or Path(tmp)
        r["default"] = one_shape(root / "default", None, sets, args)
        if not args.no_production:
            r["production_shaped"] = one_shape(
                root / "production", {"features.history_len": args.history_len}, sets, args)
    r.update(trials=args.trials, pairs_per_trial=args.pairs, lease_pairs=args.lease_pairs,
             settings=[{"name": n, "device": d, "threads": t, "block_requests": b[0],
                        "block_pairs": b[1]} for n, d, t, b in sets],
             wall_s=time.perf_counter() - t0)
    machine = sibling("machine").machine
    r["machine"] = machine({d for s in r.values() if isinstance(s, dict) and "devices" in s
                            for d in s["devices"].values()})
    print(table(r))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
