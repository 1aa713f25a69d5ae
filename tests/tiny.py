"""Shared test set-up for the app tests: a tiny synthetic world trained in seconds (its
quality is not under test), and a free loopback port for Serve's HTTP proxy."""

from __future__ import annotations

import os
import random
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]

# torch intra-op threads for every model the tests train (``train.threads``, and the suite-wide
# default set in tests/conftest.py). Another count changes how reductions split, which perturbs
# training floats the way another processor does: run the suite with SOLARIS_TEST_THREADS=2 to
# check that no test leans on one run's last bits.
THREADS = int(os.environ.get("SOLARIS_TEST_THREADS", "1"))
if THREADS < 1:
    raise ValueError(f"SOLARIS_TEST_THREADS={THREADS}: must be >= 1")

TINY = {
    "data.synthetic.num_users": 300, "data.synthetic.num_items": 200,
    "data.synthetic.days": 10.0, "data.synthetic.target_interactions": 8000,
    "fm.emb_dim": 16, "fm.shared_dim": 64, "fm.head_hidden": 32,
    "features.history_len": 16, "encoder.width": 16, "encoder.epochs": 1,
    "train.fm_epochs": 1, "train.vm_epochs": 1, "train.threads": THREADS,
    "report.vm_lrs": [1e-2], "residual.epochs": 1, "residual.folds": 2,
}

# a larger tiny world: users whose histories outgrow the history ring, more requests per user
WORLD_400 = {
    "data.synthetic.num_users": 400, "data.synthetic.num_items": 300,
    "data.synthetic.days": 12.0, "data.synthetic.target_interactions": 16000,
}


def train_tiny(out: Path, seed: int = 0, **overrides: Any) -> Path:
    """Artifacts (``solaris train``) of the tiny world in ``out``."""
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.train.artifacts import train_artifacts

    cfg = load_config(None, {**TINY, **overrides})
    train_artifacts(cfg, load_dataset(cfg.data), out, seed=seed)
    return out


def free_port() -> int:
    """A free loopback port between Ray's worker ports (10002-19999 by default) and the
    kernel's ephemeral range: a port-0 bind would hand out an ephemeral port, which the
    processes a local Ray starts before Serve binds it can take for their own connections."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(low, 20001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every try taken: whatever the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_serve(port: int, num_cpus: int = 2) -> Iterator[str]:
    """A local Ray (2 logical CPUs, a small object store) with Serve's proxy on ``port``;
    yields the base URL and always shuts Serve and Ray down."""
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=num_cpus, object_store_memory=200 * 1024**2,
             include_dashboard=False, logging_level="warning",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def request_log(rows: list) -> Any:
    """A validated ``RequestLog`` from rows (user, ts, candidates, labelled mask or None = all
    labelled), given in (ts, user) order; labels are 1.0 where labelled."""
    import numpy as np

    from solaris.simulate.log import RequestLog

    c = len(rows[0][2])
    lab = np.array([[True] * c if r[3] is None else r[3] for r in rows], bool)
    labels = np.where(lab, 1.0, np.nan).astype(np.float32)[..., None]
    lg = RequestLog(user=np.array([r[0] for r in rows], np.int64),
                    ts=np.array([r[1] for r in rows], np.int64),
                    surface=np.zeros(len(rows), np.int32),
                    candidates=np.array([r[2] for r in rows], np.int64), labels=labels,
                    tasks=("click",))
    lg.validate()
    return lg


def tiny_movielens(root: Path, users: int = 80, items: int = 200, seed: int = 0) -> Path:
    """A MovieLens-shaped directory (RecBole atomic files) of made-up ratings: users rate in
    bursts of a few items minutes apart over 40 days, ratings from a planted taste model.
    Not MovieLens' data (which may not be redistributed), only its format."""
    import numpy as np

    rng = np.random.default_rng(seed)
    taste_u, taste_i = rng.normal(0, 1, (users, 3)), rng.normal(0, 1, (items, 3))
    pop = rng.dirichlet(np.full(items, 0.5))
    rows = []
    for u in range(users):
        t = int(rng.integers(0, 10 * 86400))
        seen: set[int] = set()
        while t < 40 * 86400 and len(seen) < items - 130:  # retrieval finds 100 unseen
            for _ in range(int(rng.integers(1, 5))):  # a burst of ratings
                i = int(rng.choice(items, p=pop))
                if i in seen:
                    continue
                seen.add(i)
                z = taste_u[u] @ taste_i[i] + rng.normal(0, 0.5)
                rating = int(np.clip(np.round(3.2 + 0.9 * z), 1, 5))
                rows.append((u + 1, i + 1, rating, 880_000_000 + t))
                t += int(rng.integers(20, 400))
            t += int(rng.integers(3600, 4 * 86400))
    root.mkdir(parents=True, exist_ok=True)
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    inter += [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in rows]
    user = ["user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token"]
    user += [f"{u + 1}\t{20 + u % 40}\t{'MF'[u % 2]}\tother\t{10000 + u}" for u in range(users)]
    item = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"]
    item += [f"{i + 1}\tFilm {i + 1}\t{1950 + i % 50}\t{['Drama', 'Comedy', 'Action'][i % 3]}"
             for i in range(items)]
    for ext, lines in (("inter", inter), ("user", user), ("item", item)):
        (root / f"ml-100k.{ext}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
