"""Shared test set-up for the app tests: a tiny synthetic world trained in seconds (its
quality is not under test), a free loopback port for Serve's HTTP proxy, and a Ray head
started by ``ray start`` for the tests that run the commands a user runs."""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
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


# artifacts trained in this process, by their seed and overrides: each is trained once and
# copied for every later caller (training is deterministic at one thread count, so a copy is
# what training again would write); removed when the process exits
_TRAINED: dict[str, Path] = {}


def train_tiny(out: Path, seed: int = 0, **overrides: Any) -> Path:
    """Artifacts (``solaris train``) of the tiny world in ``out``, a fresh copy of its own."""
    key = json.dumps([seed, THREADS, overrides], sort_keys=True, default=str)
    if key not in _TRAINED:
        from solaris.config import load_config
        from solaris.data.load import load_dataset
        from solaris.train.artifacts import train_artifacts

        if not _TRAINED:
            atexit.register(shutil.rmtree, _trained_root(), True)
        trained = _trained_root() / str(len(_TRAINED))
        cfg = load_config(None, {**TINY, **overrides})
        train_artifacts(cfg, load_dataset(cfg.data), trained, seed=seed)
        _TRAINED[key] = trained
    shutil.copytree(_TRAINED[key], out, dirs_exist_ok=True)
    return out


def _trained_root() -> Path:
    return Path(tempfile.gettempdir()) / f"solaris-tiny-{os.getpid()}"


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
def local_ray(num_cpus: int = 2, env: dict[str, str] | None = None,
              metrics_port: int | None = None) -> Iterator[str]:
    """A local Ray of this process's own (``num_cpus`` logical CPUs, a small object store, no
    dashboard; the repository and ``env`` in its workers' environment, Prometheus text at
    ``metrics_port`` if given); yields its GCS address (``host:port``, what a job's
    ``--address`` takes) and always shuts it down."""
    import ray

    extra = {} if metrics_port is None else {"_metrics_export_port": metrics_port}
    ctx = ray.init(address="local", num_cpus=num_cpus, object_store_memory=200 * 1024**2,
                   include_dashboard=False, logging_level="warning",
                   runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **(env or {})}}, **extra)
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


@contextmanager
def local_serve(port: int, num_cpus: int = 2, env: dict[str, str] | None = None,
                metrics_port: int | None = None) -> Iterator[str]:
    """``local_ray`` with Serve's proxy on ``port``; yields the base URL and always shuts
    Ray down.

    ``ray.shutdown`` ends a local Ray whole, Serve's controller, replicas and the apps'
    detached actors with it: ``serve.shutdown`` first would only add its graceful replica
    stops (5 of 7 s), and the next ``serve.start`` in this process finds the new cluster's
    controller, not the old one's (Ray drops a client cached from an earlier session)."""
    from ray import serve

    with local_ray(num_cpus, env, metrics_port):
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"


def wait_healthy(base: str, timeout_s: float = 120.0) -> None:
    """Until ``base``'s ``/healthz`` answers 200."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(base + "/healthz", timeout=5).ok:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{base} never answered /healthz in {timeout_s:.0f} s")
        time.sleep(0.5)


@dataclass(frozen=True)
class RayHead:
    address: str  # the GCS address, host:port (what `ray start --address` and RAY_ADDRESS take)
    session_dir: Path  # its session directory (logs under logs/, Serve's under logs/serve/)


@contextmanager
def ray_head(num_cpus: int = 2, port: int | None = None,
             env: dict[str, str] | None = None) -> Iterator[RayHead]:
    """A Ray head started as a user starts one, ``ray start --head --num-cpus N --port P``
    (``port`` default: a free one), in the environment ``env`` (default this process's; its
    workers inherit it, PYTHONPATH included). It becomes the machine's current cluster, the
    one ``ray.init()``, ``serve run`` and ``serve deploy`` find without an address.

    Always stopped afterwards, and only it: every process of its session and their children,
    then the machine's current-cluster file if it still names this head. Never ``ray stop``,
    which stops every Ray on the machine. The dashboard, its agent and the client server get
    free ports so that two heads can run side by side."""
    port = port or free_port()
    if _head_pids(port, None):  # another head's: never to be stopped here
        raise RuntimeError(f"port {port}: a Ray cluster on this machine uses it already")
    ray = Path(sys.executable).with_name("ray")  # this environment's, activated or not
    cmd = [str(ray) if ray.is_file() else "ray", "start", "--head",
           "--num-cpus", str(num_cpus), "--port", str(port),
           "--include-dashboard", "false", "--disable-usage-stats",
           "--dashboard-port", str(free_port()),
           "--dashboard-agent-listen-port", str(free_port()),
           "--ray-client-server-port", str(free_port())]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        gcs = _gcs_args(port)
        if gcs is None:
            raise RuntimeError(f"{' '.join(cmd)}: no GCS server on port {port} after it "
                               f"returned:\n{done.stderr[-3000:]}")
        yield RayHead(f"{gcs['node-ip-address']}:{port}", Path(gcs["session-dir"]))
    finally:
        _stop_head(port)


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process this user can read."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        out[int(d.name)] = (ppid, cmdline)
    return out


def _gcs_args(port: int) -> dict[str, str] | None:
    """The ``--key=value`` arguments of the GCS server listening on ``port``, if one runs."""
    for _, cmdline in _processes().values():
        if "gcs_server" in cmdline and f"--gcs_server_port={port} " in cmdline + " ":
            return dict(re.findall(r"--([\w-]+)=(\S+)", cmdline))
    return None


def _head_pids(port: int, session: str | None) -> set[int]:
    """The head's processes: those naming its session directory or its GCS address, and
    every descendant of those (the raylet's workers name neither)."""
    procs = _processes()
    addr = re.compile(rf"[=:/@][\w.-]*:{port}(?!\d)")
    roots = {pid for pid, (_, cmd) in procs.items()
             if (session and session in cmd) or addr.search(cmd)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    me, pid = set(), os.getpid()
    while pid > 1:  # never this process or its ancestors
        me.add(pid)
        pid = procs.get(pid, (0, ""))[0]
    return found - me


def _stop_head(port: int, grace_s: float = 3.0) -> None:
    """SIGTERM to the head's processes, SIGKILL to those left after ``grace_s`` (the GCS
    server and the autoscaler monitor outlast a SIGTERM by about 10 s)."""
    gcs = _gcs_args(port)
    session = gcs.get("session-dir") if gcs else None
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        deadline = time.monotonic() + wait_s
        while True:
            pids = _head_pids(port, session)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    try:
        from ray._common.utils import get_ray_address_file

        current = Path(get_ray_address_file(None))
    except ImportError:
        current = Path("/tmp/ray/ray_current_cluster")
    try:
        if re.search(rf":{port}$", current.read_text().strip()):
            current.unlink()
    except OSError:
        pass


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
