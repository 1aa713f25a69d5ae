"""Benchmark: could any user encoder make the user-neighbour tier worth serving?

    python bench/user_neighbours.py quality ARTIFACTS [--json OUT]
    python bench/user_neighbours.py train --table {clicked,oracle} -- TRAIN_ARGS...

``quality``: on the synthetic world ``ARTIFACTS`` was trained on (``solaris train``), at the
start of the replay window, how alike a user's hidden interest is to those of its 10 nearest
users under several user embeddings: the built-in encoder (the FM's user vector from the last
``history_len`` events, id not read), the same with the id embedding, the id embedding
alone, and the mean of the FM's item vectors over the user's last 32 / 128 / all events
(every event, or clicked ones only); beside them random users, the 10 nearest by the hidden
interests themselves (the ceiling), and the mean of the world's *true* item vectors over the
clicked events (what the clicks say at best, with perfect item vectors). Users with a request
in the 24 h before the window are scored (``bench/neighbour_quality.py``'s measure).

``train``: ``solaris train TRAIN_ARGS`` with the user KNN table of the schedule simulation
(the table training's validation curves and guard read) built another way: ``clicked``, the
mean FM item vector over each user's clicked events (all history); ``oracle``, the world's
hidden interests over the 72 h before (no encoder can do better at finding alike users). The
artifacts' manifest then holds the user-neighbour tier's validation curve
(``vms.<task>.scale_curves.user_neighbour``) and guard (``served.guard.user_neighbour``).
Research only: the serving path and the KNN job keep the built-in encoder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from neighbour_quality import interests_at, report  # noqa: E402


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


def _mean_over(vec: np.ndarray, item: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(U, d) mean of ``vec[item]`` over the events where ``mask`` holds (0 where none)."""
    s = (vec[np.where(mask, item, 0)] * mask[..., None]).sum(1)
    return s / np.maximum(mask.sum(1, keepdims=True), 1)


def _clicked(hist: dict) -> tuple[np.ndarray, np.ndarray]:
    v = hist["item"] >= 0
    return v, ((hist["bits"] & 1) > 0) & v  # task 0 (click) is bit 0


def quality(art_dir: Path) -> dict:
    import torch

    from solaris.artifacts import Artifacts
    from solaris.data.split import time_split
    from solaris.data.synthetic import build, generate
    from solaris.features import FeatureTables
    from solaris.knn.user_encoder import UserEncoder, item_embeddings, recent_history
    from solaris.knn.user_encoder import request_inputs

    art = Artifacts.open(art_dir)
    cfg = art.config
    fm = art.fm().eval()
    ds = generate(cfg.data.synthetic)
    t = FeatureTables(ds, cfg.features)
    as_of = float(time_split(ds, cfg.split).cuts[2])
    interest, has = interests_at(cfg.data.synthetic, int(as_of), 24.0)
    seq = np.arange(len(t.ts))
    b = t.ts < as_of

    def hist_of(length: int) -> dict:
        return recent_history(t.user[b], t.item[b], t.ts[b], seq[b], t.surface[b],
                              t.labels[b], as_of, length)

    h = hist_of(fm.history_len)
    users = h["user"]
    req = request_inputs(h, as_of, t.item_cat, t.user_cat, t.user_cont)
    embs = {"built-in encoder (FM user vector, id not read)": UserEncoder(fm).encode(req)}
    with torch.inference_mode():
        bt = {k: torch.as_tensor(v) for k, v in req.items()}
        d = fm.cfg.emb_dim
        uv = fm.request_part(bt)["user_vec"]  # [id, surface, cats..., pooled] x emb_dim
        proj = fm.inter_proj[0].weight[:, :uv.shape[1]].T
        keep = torch.ones(uv.shape[1], dtype=torch.bool)
        keep[d:2 * d] = False  # the surface
        embs["FM user vector with the id"] = (uv[:, keep] @ proj[keep]).numpy()
        embs["FM id embedding alone"] = fm.user_emb(bt["user"]).numpy()
    ivec = item_embeddings(fm)
    true_vec = build(cfg.data.synthetic).item_vec
    longest = int(np.bincount(t.user[b]).max())  # "all": the longest history
    for length, name in ((32, "32"), (128, "128"), (longest, "all")):
        hl = hist_of(length)
        assert np.array_equal(hl["user"], users)
        every, clicked = _clicked(hl)
        embs[f"FM item vectors, mean over the last {name} events"] = \
            _mean_over(ivec, hl["item"], every)
        embs[f"FM item vectors, mean over the clicked of the last {name}"] = \
            _mean_over(ivec, hl["item"], clicked)
        embs[f"true item vectors, mean over the clicked of the last {name}"] = \
            _mean_over(true_vec, hl["item"], clicked)
    rows = np.flatnonzero(has[users])
    interest_u = interest[users[rows]]  # (n, d) unit
    rng = np.random.default_rng(0)
    rand = rng.integers(0, len(rows), size=(len(rows), 10))
    sim = interest_u @ interest_u.T
    np.fill_diagonal(sim, -np.inf)
    out = {"artifacts": str(art_dir), "users": int(len(rows)),
           "random users": float(np.einsum("nd,nkd->nk", interest_u, interest_u[rand]).mean()),
           "10 nearest by hidden interest (ceiling)":
               float(np.sort(sim, axis=1)[:, ::-1][:, :10].mean())}
    for name, e in embs.items():
        z = _unit(np.asarray(e, np.float64)[rows])
        s = z @ z.T
        np.fill_diagonal(s, -np.inf)
        nbr = np.argsort(-s, axis=1)[:, :10]
        out[name] = float(np.einsum("nd,nkd->nk", interest_u, interest_u[nbr]).mean())
    return out


def train(table: str, train_args: list[str]) -> int:
    import solaris.simulate.served as served
    from solaris.cli import main as cli_main
    from solaris.knn.tables import build_table
    from solaris.knn.user_encoder import item_embeddings, recent_history

    def user_table_of(fm, users, items, ts, seq, surfaces, labels, side, as_of, cfg,
                      version="sim"):
        b = np.asarray(ts) < as_of
        if table == "oracle":
            ids = np.unique(np.asarray(users)[b])
            interest, has = interests_at(cfg.data.synthetic, int(as_of), 72.0)
            e = interest[ids].astype(np.float32)
            rng = np.random.default_rng(0)  # a user with no recent request: anywhere
            e[~has[ids]] = rng.standard_normal((int((~has[ids]).sum()), e.shape[1]))
        else:
            h = recent_history(users[b], items[b], ts[b], seq[b], surfaces[b], labels[b],
                               as_of, int(np.bincount(np.asarray(users)[b]).max()))
            ids, ivec = h["user"], item_embeddings(fm)
            every, clicked = _clicked(h)
            e = _mean_over(ivec, h["item"], clicked)
            none = clicked.sum(1) == 0
            e[none] = _mean_over(ivec, h["item"], every)[none]
            # ties (users with the same events) broken apart, deterministically
            e = (e + 1e-6 * np.random.default_rng(0).standard_normal(e.shape)).astype(np.float32)
        user_t, _ = build_table("user", ids, e, cfg.knn.k, cfg.knn, version)
        return user_t.neighbour_table()

    served.user_table_of = user_table_of  # knn_tables_as_of looks it up at call time
    return cli_main(["train", *train_args])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality", help="neighbour quality of several user embeddings")
    q.add_argument("artifacts", type=Path)
    q.add_argument("--json", type=Path)
    tr = sub.add_parser("train", help="solaris train with another user KNN table")
    tr.add_argument("--table", choices=("clicked", "oracle"), required=True)
    tr.add_argument("train_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.cmd == "train":
        rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        return train(args.table, rest)
    report(quality(args.artifacts), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
