"""Seed a running app's history store from a team's log, so the FM workers' first requests
see each user's behaviour instead of an empty history::

    python jobs/seed_history.py --data mapping.yaml --artifacts ARTIFACTS --app-id solaris
    ray job submit --working-dir . -- python jobs/seed_history.py --data mapping.yaml ...

``--data`` is the team's log through its mapping YAML (``solaris.data.generic``; a
``solaris data`` directory works too), read here and coded with the id map of ``ARTIFACTS``
(the newest version the app serves): a user or item the map holds gets its code, one it does
not the provisional code the router gives it. Each user's last ``history.max_events`` events
before ``--until`` (default: after the last logged event) go to the app's cache shards (found
by ``--app-id`` in Serve's namespace), a chunk of whole users at a time, with a progress bar.

Idempotent: a store skips an event it already holds (same user, item and time), so running
the command again adds nothing. Resumable: the chunks sent are recorded in ``--state``
(default ``~/.cache/solaris/seed/<app-id>.json``); a run of the same log, ``--until`` and
chunk size carries on after the last chunk recorded (``--restart`` sends everything again).
Prints one JSON line: events, chunks, seconds, events per second.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("jobs.seed_history")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages
    sys.path.insert(0, str(ROOT))

from solaris import atomic  # noqa: E402
from solaris.config import load_config, parse_overrides  # noqa: E402
from solaris.errors import SolarisError  # noqa: E402


def default_state(app_id: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "solaris" / "seed" / f"{app_id}.json"


def load_log(data: str | Path, ids: Any) -> Any:
    """The log as a Dataset coded with the deployment's map (new ids appended after it)."""
    path = Path(data)
    if path.suffix in (".yaml", ".yml") or (path / "mapping.yaml").is_file():
        from solaris.data.generic import load_generic_yaml

        return load_generic_yaml(path, ids=ids)
    from solaris.data.synthetic import load_parquet_dir

    return load_parquet_dir(path)


def fingerprint(data: str | Path, until: float, chunk_rows: int, events: int) -> str:
    """What a state file belongs to: the log's files (names, sizes, times), ``until``, the
    chunk size and the events chosen."""
    path = Path(data)
    files = sorted(path.parent.iterdir() if path.is_file() else path.iterdir())
    stat = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
    key = json.dumps([str(path.resolve()), stat, until, chunk_rows, events])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def seed(send: Callable[[tuple], int], events: Any, chunk_rows: int, state_path: Path,
         key: str, restart: bool = False, progress: bool = True) -> dict[str, Any]:
    """Send ``events`` (``solaris.seeding.SeedEvents``) chunk by chunk through ``send``,
    recording each chunk done in ``state_path``; carries on after the last chunk recorded
    for the same ``key``. Returns the run's figures."""
    from tqdm import tqdm

    chunks = events.chunks(chunk_rows)
    done = 0
    if not restart and state_path.is_file():
        try:
            st = json.loads(state_path.read_text())
            if st.get("key") == key:
                done = int(st["done"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s: unreadable state; starting over", state_path)
    if done:
        log.info("resuming after chunk %d of %d", done, len(chunks))
    t0 = time.perf_counter()
    sent = 0
    bar = tqdm(total=len(events), initial=sum(c.stop - c.start for c in chunks[:done]),
               unit="events", desc="seeding", disable=not progress or not sys.stderr.isatty(),
               dynamic_ncols=True, mininterval=1.0)
    try:
        for k in range(done, len(chunks)):
            want = chunks[k].stop - chunks[k].start
            took = send(events.arrays(chunks[k]))
            if took != want:  # a shard failed or timed out: not recorded, a rerun resumes
                raise SolarisError(f"chunk {k + 1} of {len(chunks)}: the shards took {took} "
                                   f"of {want} events; run the command again to resume")
            sent += took
            atomic.save_json(state_path, {"key": key, "done": k + 1, "chunks": len(chunks),
                                          "events": len(events)})
            bar.update(chunks[k].stop - chunks[k].start)
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    return {"events": len(events), "chunks": len(chunks), "resumed_after": done,
            "sent": sent, "seconds": round(seconds, 3),
            "events_per_s": round(sent / seconds, 1) if seconds > 0 and sent else 0.0}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the log's mapping YAML (or a `solaris data` "
                   "directory)")
    p.add_argument("--artifacts", required=True,
                   help="the newest artifacts the app serves (their id map codes the log): a "
                   "directory or pyarrow.fs URI")
    p.add_argument("--app-id", default="solaris", help="the app's id (names its cache shards)")
    p.add_argument("--namespace", default="serve",
                   help="Ray namespace of the app's actors (Serve's: serve)")
    p.add_argument("--until", type=float,
                   help="seed the events before this event time (default: all)")
    p.add_argument("--chunk-rows", type=int, default=50_000, help="events per chunk (about)")
    p.add_argument("--state", type=Path, help="progress file (default: "
                   "~/.cache/solaris/seed/<app-id>.json)")
    p.add_argument("--restart", action="store_true", help="send every chunk again")
    p.add_argument("--config", help="the app's YAML config (cache and history sections)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set cache.num_shards=4")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per chunk")
    p.add_argument("--address", help="the app's Ray cluster (default: RAY_ADDRESS, else the "
                   "cluster `ray start` runs on this machine)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from solaris.artifact_store import local_artifacts
        from solaris.artifacts import Artifacts
        from solaris.ids import IdMap
        from solaris.seeding import seed_events

        if args.chunk_rows < 1:
            raise SolarisError(f"--chunk-rows={args.chunk_rows}: must be >= 1")
        cfg = load_config(args.config, parse_overrides(args.set))
        root = local_artifacts(args.artifacts)  # a URI: this node's verified copy
        ids = IdMap.load(root) or Artifacts.open(root).ids()
        ds = load_log(args.data, ids)
        until = float("inf") if args.until is None else float(args.until)
        events = seed_events(ds, ids, until, cfg.history.max_events)
        key = fingerprint(args.data, until, args.chunk_rows, len(events))
    except SolarisError as e:
        print(f"seed_history: error: {e}", file=sys.stderr)
        return 2
    import ray

    from actors import local
    from actors.cache import CacheGroup

    try:
        local.start(address=args.address, verbose=args.verbose, join="require")
    except local.ClusterNotFound as e:
        print(f"seed_history: error: {e}", file=sys.stderr)
        return 2
    try:
        try:
            group = CacheGroup.connect(cfg.cache, args.app_id, namespace=args.namespace)
            group.ping_all()
        except ValueError as e:  # no such actor
            where = ray.get_runtime_context().gcs_address
            print(f"seed_history: error: the Ray cluster at {where} runs no app "
                  f"{args.app_id!r} in namespace {args.namespace!r} ({e}): deploy it there "
                  f"(serve run ... app_id={args.app_id}), or give the --app-id it runs under",
                  file=sys.stderr)
            return 2
        try:
            out = seed(lambda a: group.history.replay_log(*a, timeout_s=args.timeout_s), events,
                       args.chunk_rows, args.state or default_state(args.app_id), key,
                       restart=args.restart)
        except SolarisError as e:
            print(f"seed_history: error: {e}", file=sys.stderr)
            return 1
        print(json.dumps({"app_id": args.app_id, **out}), flush=True)
        return 0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
