"""A new team's path, end to end, every step a separate process through the real commands,
as the guides write them (docs/guides/your-own-log.md, your-own-models.md, serving.md):

1. a shop's impression log of its own layout (string ids, a request column, tasks ``view``
   and ``cart``, a categorical item feature and a continuous user feature) and its
   ``mapping.yaml``;
2. its own FM, a two-tower model over a mean-pooled history (``shop_models.py``, beside the
   log, on PYTHONPATH: not one of the repository's packages), selected by import path;
3. ``solaris train --dataset generic --data-dir mapping.yaml --config fm.yaml``;
4. ``ray start --head``, then ``serve run serve.yaml`` (a Serve config file of its own, on a
   port other than 8000) until ``/healthz`` answers;
5. ``/rank`` with the raw ids: a known user gets pair tiers within a minute at the default
   precompute settings; a user and items the log never held are answered, and the new
   user's pairs served within a minute too (the FM says it reads unseen users);
6. ``/feedback``;
7. ``jobs/seed_history.py`` and ``jobs/rebuild_knn.py`` against the running app;
8. ``/healthz`` ok, with the KNN tables the job published loaded.

The cluster and ``serve run`` are always stopped, failing or not; a failure message carries
the tail of the serve log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from tests.tiny import THREADS, free_port, ray_head  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FM_SOURCE = Path(__file__).resolve().parent / "shop_models.py"
BIN = Path(sys.executable).parent  # the environment's console scripts: solaris, ray, serve

# the log: sizes that train in seconds (quality is not under test)
USERS, ITEMS, BRANDS = 240, 160, 8
REQUESTS, CANDIDATES, SHOWN = 700, 10, 6  # candidates per request, the first SHOWN shown
T_END = 1_793_000_000  # the log's last second (October 2026)
DAYS = 14
# small training, as a user shortens a first try on the command line
SMALL = {"features.history_len": 16, "encoder.epochs": 1, "train.fm_epochs": 2,
         "train.vm_epochs": 2, "train.threads": THREADS, "report.vm_lrs": "[0.01]",
         "residual.epochs": 1, "residual.folds": 2}

HEALTH_WAIT_S = 180.0  # serve run: from the command to /healthz answering
PAIR_WAIT_S = 60.0  # the promise: a known user's pairs served within a minute
KNN_WAIT_S = 60.0  # published tables loaded (knn.poll_s is 1 s)
COMMAND_TIMEOUT_S = 300.0  # any one command
HTTP_TIMEOUT_S = 30.0


def write_shop_log(root: Path, seed: int = 0) -> Path:
    """A shop's impression log (``impressions.parquet``: one row per request candidate,
    labels null where not shown), its side tables and their ``mapping.yaml``; returns the
    mapping's path. A user's brand tastes and an item's popularity drive views, carts need a
    view: signal enough that training does not degenerate."""
    rng = np.random.default_rng(seed)
    users = [f"u-{x:06x}" for x in rng.choice(16**6, USERS, replace=False)]
    items = [f"sku-{x:05d}" for x in rng.choice(10**5, ITEMS, replace=False)]
    brand = rng.integers(0, BRANDS, ITEMS)  # (I,)
    taste = rng.normal(0.0, 1.5, (USERS, BRANDS))  # (U, K)
    tenure = rng.gamma(2.0, 200.0, USERS)  # (U,) days
    loyal = (tenure - tenure.mean()) / tenure.std()  # (U,)
    pop = rng.normal(0.0, 0.5, ITEMS)  # (I,)
    ts = np.sort(rng.uniform(T_END - DAYS * 86400, T_END, REQUESTS)).astype(np.int64)
    who = rng.integers(0, USERS, REQUESTS)

    cols: dict[str, list] = {k: [] for k in ("visit", "customer", "sku", "at", "seen",
                                             "viewed", "carted")}
    for r in range(REQUESTS):
        u, cand = who[r], rng.choice(ITEMS, CANDIDATES, replace=False)
        logit = -1.0 + taste[u, brand[cand]] + pop[cand] + 0.3 * loyal[u]  # (C,)
        view = rng.random(CANDIDATES) < 1.0 / (1.0 + np.exp(-logit))
        cart = view & (rng.random(CANDIDATES) < 1.0 / (1.0 + np.exp(2.0 - logit)))
        for c, i in enumerate(cand):
            shown = c < SHOWN
            cols["visit"].append(f"v-{r:05d}")
            cols["customer"].append(users[u])
            cols["sku"].append(items[i])
            cols["at"].append(int(ts[r]))
            cols["seen"].append(int(shown))
            cols["viewed"].append(int(view[c]) if shown else None)
            cols["carted"].append(int(cart[c]) if shown else None)
    log = pa.table({**cols, "at": pa.array(cols["at"], pa.int64()).cast(pa.timestamp("s"))})
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(log, root / "impressions.parquet")
    pq.write_table(pa.table({"customer": users, "tenure_days": tenure}), root / "users.parquet")
    pq.write_table(pa.table({"sku": items, "brand": [f"brand-{chr(97 + b)}" for b in brand]}),
                   root / "items.parquet")
    mapping = root / "mapping.yaml"
    mapping.write_text(
        "interactions: impressions.parquet\n"
        "users: users.parquet\n"
        "items: items.parquet\n"
        "mapping:\n"
        "  user: customer\n"
        "  item: sku\n"
        "  timestamp: at\n"
        "  request: visit\n"
        "  shown: seen\n"
        "  labels: {view: viewed, cart: carted}\n"
        "  user_features: {continuous: [tenure_days]}\n"
        "  item_features: {categorical: [brand]}\n")
    return mapping


def write_serve_config(team: Path, port: int, knn: Path) -> Path:
    """The team's Serve config file (``configs/serve-local.yaml``'s layout, on ``port``) and
    the app's config tree it names (the KNN tables under ``knn``, polled every second)."""
    (team / "app.yaml").write_text(yaml.safe_dump({
        "knn": {"table_uri": f"file://{knn}", "poll_s": 1.0}}))
    path = team / "serve.yaml"
    path.write_text(yaml.safe_dump({
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "shop", "route_prefix": "/", "import_path": "serve_app:build_app",
            "args": {"artifacts": str(team / "artifacts" / "v1"), "app_id": "shop",
                     "config": str(team / "app.yaml"),
                     "vm": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.25}}}}]},
        sort_keys=False))
    return path


def _tail(text: str | bytes | None, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def run_command(cmd: list[str], cwd: Path, env: dict[str, str],
                timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``cmd`` to its end; fails the test naming it, with its output's tail, unless it
    exits 0."""
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`{' '.join(cmd)}` did not finish in {timeout_s:.0f} s\n"
                    f"{_tail(e.stdout)}\n{_tail(e.stderr)}")
    assert done.returncode == 0, (f"`{' '.join(cmd)}` exited {done.returncode}\n"
                                  f"stdout:\n{_tail(done.stdout)}\nstderr:\n{_tail(done.stderr)}")
    return done


class ServeRun:
    """``serve run CONFIG`` in the background, its output in ``log``; ``diagnose`` says
    whether it still runs and shows the log's tail and the errors in Serve's own logs."""

    def __init__(self, config: Path, cwd: Path, env: dict[str, str], log: Path,
                 serve_logs: Path):
        self.log, self.serve_logs = log, serve_logs
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(BIN / "serve"), "run", str(config)], cwd=cwd,
                                         env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def diagnose(self) -> str:
        state = ("running" if self.proc.poll() is None
                 else f"exited {self.proc.returncode}")
        errors = []
        for f in sorted(self.serve_logs.glob("*.log")) if self.serve_logs.is_dir() else ():
            bad = [ln for ln in f.read_text(errors="replace").splitlines()
                   if "ERROR" in ln or "Error" in ln]
            errors += [f"{f.name}: {ln}" for ln in bad[-5:]]
        return (f"serve run {state}; its output's tail:\n{_tail(self.log.read_bytes())}\n"
                f"errors in {self.serve_logs}:\n" + "\n".join(errors[-20:]))

    def stop(self) -> None:
        """Ctrl-C as a user stops it (Serve's app is shut down), then the process group
        killed if it has not gone."""
        for sig, wait_s in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


@contextmanager
def serve_run(config: Path, cwd: Path, env: dict[str, str], log: Path,
              serve_logs: Path) -> Iterator[ServeRun]:
    run = ServeRun(config, cwd, env, log, serve_logs)
    try:
        yield run
    finally:
        run.stop()


def wait_for(what: str, probe: Callable[[], tuple[bool, Any]], timeout_s: float,
             app: ServeRun, interval_s: float = 1.0) -> Any:
    """What ``probe()`` saw the first time it says done; fails naming ``what``, what it saw
    last (or the error) and the serve log, once ``timeout_s`` passes or ``serve run`` has
    exited."""
    deadline = time.monotonic() + timeout_s
    seen: Any = None
    while True:
        try:
            ok, seen = probe()
            if ok:
                return seen
        except (requests.RequestException, ValueError) as e:
            seen = f"{type(e).__name__}: {e}"
        if app.proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s; last seen: {str(seen)[-2000:]}"
                        f"\n{app.diagnose()}")
        time.sleep(interval_s)


def post(base: str, path: str, body: dict) -> requests.Response:
    return requests.post(base + path, json=body, timeout=HTTP_TIMEOUT_S)


def test_a_team_goes_from_its_log_to_a_served_app(tmp_path):
    took: dict[str, float] = {}  # step -> seconds, printed at the end
    clock = [time.monotonic()]

    def done(step: str) -> None:
        now = time.monotonic()
        took[step], clock[0] = round(now - clock[0], 1), now

    team = tmp_path / "shop"
    mapping = write_shop_log(team)
    assert mapping.name == "mapping.yaml"
    shutil.copy(FM_SOURCE, team / "shop_models.py")  # the team's own module, not the repo's
    (team / "fm.yaml").write_text(
        "fm:\n"
        "  cls: shop_models:TwoTowerFM\n"
        "  version: shop-2t-v1\n"
        "  kwargs: {dim: 16, shared_dim: 32}\n")
    env = {**os.environ,
           # the team's module and the repository (serve_app, jobs) for every process; Ray's
           # workers inherit it from `ray start`
           "PYTHONPATH": os.pathsep.join([str(team), str(ROOT)]),
           "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the seed job's progress file
           "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    env.pop("RAY_ADDRESS", None)
    done("log")

    # 1.-3. train with the team's FM, from the team's directory
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
    run_command([str(BIN / "solaris"), "train", "--dataset", "generic", "--data-dir",
                 "mapping.yaml", "--config", "fm.yaml", *sets, "--out", "artifacts/v1"],
                team, env)
    manifest = json.loads((team / "artifacts" / "v1" / "manifest.json").read_text())
    assert manifest["config"]["fm"]["cls"] == "shop_models:TwoTowerFM"
    assert manifest["tasks"] == ["view", "cart"], manifest["tasks"]
    done("train")

    # 4. a cluster as a user starts one, the app deployed onto it by a Serve config file
    port, knn = free_port(), team / "knn"
    serve_config = write_serve_config(team, port, knn)
    base = f"http://127.0.0.1:{port}"
    with ray_head(num_cpus=2, env=env) as head:
        done("ray start")
        with serve_run(serve_config, team, env, tmp_path / "serve.log",
                       head.session_dir / "logs" / "serve") as app:
            health = wait_for("/healthz answering with an FM worker", lambda: _ready(base),
                              HEALTH_WAIT_S, app)
            assert health["tasks"] == ["cart", "view"], health
            done("serve run")

            # 5. a known user gets its pairs within a minute; a new user and unknown items
            known = pq.read_table(team / "impressions.parquet", columns=["customer", "sku"])
            user = known.column("customer")[0].as_py()
            cands = list(dict.fromkeys(known.column("sku").to_pylist()))[:CANDIDATES]
            body = {"user_id": user, "candidates": cands, "task": "view"}
            first = post(base, "/rank", body)
            assert first.status_code == 200, f"{first.status_code} {first.text}\n{app.diagnose()}"
            answer = first.json()
            assert len(answer["scores"]) == len(cands) and answer["mode"] == "solaris", answer
            served = wait_for("a known user's pair tiers",
                              lambda: _with_pairs(post(base, "/rank", body)), PAIR_WAIT_S, app)
            assert served["versions"]["fm"].startswith("shop-2t-v1"), served
            done("pairs served")

            # a user the log never held, with items it never held: answered; the FM reads
            # unseen users (TwoTowerFM.reads_unseen_users), so its pairs are served too (the
            # verifier's top 20% of 12 candidates by VM score is 3: one at least is logged)
            new = {"user_id": "u-never-logged", "candidates": ["sku-new-1", *cands,
                                                                "sku-new-2"], "task": "cart"}
            r = post(base, "/rank", new)
            assert r.status_code == 200, f"{r.status_code} {r.text}"
            scores = r.json()["scores"]
            assert len(scores) == len(new["candidates"]), r.json()
            assert all(0.0 <= s <= 1.0 for s in scores), r.json()
            served = wait_for("a new user's pair tiers",
                              lambda: _with_pairs(post(base, "/rank", new)), PAIR_WAIT_S, app)
            unknown = [served["tiers"][0], served["tiers"][-1]]
            assert unknown == ["none", "none"], served  # no pair of an item the FM lacks
            done("new user's pairs")

            # 6. feedback on what was shown: one 0/1 per task, in the app's task order
            r = post(base, "/feedback", {"user_id": user, "items": cands[:2],
                                         "labels": [[1, 0], [1, 1]]})
            assert r.status_code == 200, f"{r.status_code} {r.text}"

            # 7. the jobs, as the guide writes them, reach the running app
            seeded = run_command([sys.executable, str(ROOT / "jobs" / "seed_history.py"),
                                  "--data", "mapping.yaml", "--artifacts", "artifacts/v1",
                                  "--app-id", "shop"], team, env)
            report = json.loads(seeded.stdout.strip().splitlines()[-1])
            assert report["app_id"] == "shop" and report["resumed_after"] == 0, report
            assert report["sent"] == report["events"] > 0, report  # every event taken by a shard
            done("seed_history")
            built = run_command([sys.executable, str(ROOT / "jobs" / "rebuild_knn.py"),
                                 "--data", "mapping.yaml", "--artifacts", "artifacts/v1",
                                 "--out", f"file://{knn}"], team, env)
            table = json.loads(built.stdout.strip().splitlines()[-1])
            assert table["user"]["rows"] == USERS and table["item"]["rows"] == ITEMS, table
            done("rebuild_knn")

            # 8. ready, with the tables the job published loaded
            health = wait_for("/healthz ok with the KNN tables loaded",
                              lambda: _ok_with_knn(base), KNN_WAIT_S, app)
            assert health["checks"]["knn"]["ok"], health
            # the user and the item tables, each of the version the job published
            assert set(health["knn"].split("|")) == {table["version"]}, health
            r = post(base, "/rank", body)
            assert r.status_code == 200 and r.json()["versions"]["knn"] == health["knn"], r.text
            done("tables loaded")
        done("serve run stopped")
    done("ray stopped")
    print("journey steps (s):", json.dumps(took))


def _health(base: str) -> tuple[int, Any]:
    r = requests.get(base + "/healthz", timeout=HTTP_TIMEOUT_S)
    return r.status_code, r.json()


def _ready(base: str) -> tuple[bool, Any]:
    """Whether /healthz answers 200 with an FM worker in the pool; its answer."""
    code, health = _health(base)
    return code == 200 and health["checks"]["fm_workers"].get("workers", 0) >= 1, health


def _with_pairs(r: requests.Response) -> tuple[bool, Any]:
    """Whether a /rank answer has a candidate served from the pair tier; the answer."""
    assert r.status_code == 200, f"/rank: {r.status_code} {r.text}"
    out = r.json()
    return "pair" in out["tiers"], out


def _ok_with_knn(base: str) -> tuple[bool, Any]:
    """Whether /healthz says ok with KNN tables loaded; its answer."""
    code, health = _health(base)
    return code == 200 and health["status"] == "ok" and bool(health["knn"]), health
