"""Benchmark: how alike a user and its KNN neighbours really are, in the synthetic world.

    python bench/neighbour_quality.py RUN_DIR [--profile feed] [--hours 24] [--json OUT]

RUN_DIR is a finished ``solaris replay`` on the synthetic data (its ``replay.json`` and the
user KNN table it built, ``knn/user/*.parquet``; the newest is read). The generator knows
each user's hidden interest on each request's surface; a user's interest at the window start
is the mean of those of its requests in the ``--hours`` before it (users without one are
left out). For the users the table lists: the mean cosine between a user's interest and its
1st / its 10 nearest neighbours', against random other users and against the 10 nearest by
the hidden interests themselves (the best a user encoder could do). Neighbours no better than
random users mean a neighbour's pair embedding tells the VM little about the user's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solaris.config import load_config  # noqa: E402
from solaris.data.synthetic import build  # noqa: E402
from solaris.data.synthetic_stream import iter_events  # noqa: E402
from solaris.data.synthetic_world import EPOCH, unit  # noqa: E402
from solaris.knn.tables import read_table  # noqa: E402


def interests_at(cfg, at: int, hours: float) -> tuple[np.ndarray, np.ndarray]:
    """(U, d) mean unit interest of each user's requests in [at - hours, at), and a (U,) mask
    of the users with one."""
    world = build(cfg)
    n_u, d = world.user_vec0.shape
    total, count = np.zeros((n_u, d)), np.zeros(n_u)
    lo = at - EPOCH - int(hours * 3600)
    for ev in iter_events(world):
        keep = (ev.ts >= lo) & (ev.ts < at - EPOCH)
        np.add.at(total, ev.user[keep], ev.interest[keep])
        np.add.at(count, ev.user[keep], 1.0)
        if ev.ts.min(initial=at) >= at - EPOCH:
            break
    return unit(total), count > 0


def main() -> int:
    import pyarrow.fs as pafs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--profile", default="feed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="data.synthetic overrides the run was made with")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rep = json.loads((args.run / "replay.json").read_text())
    ov = {"data.synthetic.profile": args.profile}
    for s in args.set:
        k, v = s.split("=", 1)
        ov[k] = json.loads(v) if v[:1].isdigit() else v
    cfg = load_config(None, ov).data.synthetic
    path = sorted((args.run / "knn" / "user").glob("*.parquet"))[-1]
    table = read_table(pafs.LocalFileSystem(), str(path), "user")
    interest, has = interests_at(cfg, int(rep["window_start"]), args.hours)
    rows = np.flatnonzero(has[table.ids])
    users = table.ids[rows]
    nbr = table.nbr[rows, :10]
    ok = (nbr >= 0) & has[np.clip(nbr, 0, None)]
    cos = np.einsum("nd,nkd->nk", interest[users], interest[np.clip(nbr, 0, None)])
    rng = np.random.default_rng(0)
    pool = np.flatnonzero(has)
    rand = pool[rng.integers(0, len(pool), size=(len(users), 10))]
    cos_rand = np.einsum("nd,nkd->nk", interest[users], interest[rand])
    sim = interest[pool] @ interest[pool].T
    np.fill_diagonal(sim, -np.inf)
    best = np.sort(sim, axis=1)[:, ::-1][:, :10]
    out = {"run": str(args.run), "table": path.name, "users": int(len(users)),
           "hours": args.hours,
           "cos_nearest": float(cos[:, 0][ok[:, 0]].mean()),
           "cos_top10": float(cos[ok].mean()),
           "cos_random": float(cos_rand.mean()),
           "cos_top10_by_hidden_interest": float(best.mean()),
           "knn_sim_top10": float(table.sims[rows, :10][ok].mean())}
    report(out, args.json)
    return 0


def report(out: dict, path: Path | None) -> None:
    """Print ``out`` as JSON, and write it to ``path`` if given."""
    print(json.dumps(out, indent=2))
    if path:
        path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
