"""The hostile-client reproduction, as a new user runs the app: ``serve run serve_app:app``,
then plain HTTP calls against it (loopback only, a bounded number).

Serving profile (the default, no tokens set): six probe requests for user 5 with 10
candidates until the FM workers have cached some of them; then a far-future ``now``
(the year 5138), ``mode: inline``, ``features_for``, a ``now`` in ``/feedback``, and
``POST /scales`` with no credential; then the probe again. Reports each call's status and the
cache's entries, expiries and the probe's tiers and ages before and after.

Replay profile (``profile=replay``): requests carry their event time; the same far-future
request is refused beyond ``serve.max_skew_s`` and the cache is as it was.

    python bench/hostile.py --json runs/hostile.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
PROBE = {"user_id": 5, "candidates": list(range(20, 30)), "task": "click"}
FUTURE = 100_000_000_000.0  # the year 5138


class App:
    """``serve run serve_app:build_app`` in its own process group; always stopped."""

    def __init__(self, args: list[str]) -> None:
        self.base = "http://127.0.0.1:8000"  # serve run's port for an import path
        env = dict(os.environ)
        env.pop("SOLARIS_OPERATOR_TOKEN", None)  # as a fresh machine: no credential set
        env.pop("SOLARIS_OPERATOR_TOKEN_FILE", None)
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "serve"), "run", "--address", "local",
             "serve_app:build_app", *args], cwd=ROOT, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> "App":
        deadline = time.monotonic() + 600  # the first run builds the default artifacts
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve run exited with {self.proc.returncode}")
            try:
                if requests.get(self.base + "/healthz", timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        raise SystemExit("the app did not answer /healthz in 600 s")

    def __exit__(self, *exc: Any) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def post(self, path: str, body: dict) -> requests.Response:
        return requests.post(self.base + path, json=body, timeout=30)

    def probe(self, **extra: Any) -> dict:
        r = self.post("/rank", {**PROBE, **extra})
        r.raise_for_status()
        out = r.json()
        return {"tiers": out["tiers"], "ages_s": [round(a, 1) for a in out["ages_s"]]}

    def cache(self) -> dict:
        """Entries and expiries the shards report (through /stats's precompute gauges, which
        are polled every 2 s: wait one poll)."""
        time.sleep(2.5)
        p = requests.get(self.base + "/stats", timeout=30).json()["precompute"]
        spec = p["speculation"]
        return {"entries": p["cache_entries"], "expired": spec["shard_expired"],
                "clock_refused": spec["shard_clock_refused"]}


def warm(app: App, **extra: Any) -> dict:
    """Probe until the FM workers' writes are served (at most 120 s)."""
    deadline = time.monotonic() + 120
    for _ in range(6):
        got = app.probe(**extra)
    while "pair" not in got["tiers"] and time.monotonic() < deadline:
        time.sleep(1)
        got = app.probe(**extra)
    return got


def serving() -> dict:
    with App([]) as app:
        warm(app)
        before = {"cache": app.cache(), "probe": app.probe()}
        calls = {
            "/rank now=1e11": app.post("/rank", {**PROBE, "now": FUTURE}),
            "/rank mode=inline": app.post("/rank", {**PROBE, "mode": "inline"}),
            "/rank features_for": app.post("/rank", {**PROBE, "features_for": [0]}),
            "/feedback now=1e11": app.post("/feedback", {"user_id": 5, "items": [20],
                                                         "labels": [[1, 0]], "now": FUTURE}),
            "/scales, no token": app.post("/scales", {"task": "click", "slot": "pair",
                                                      "tier": "pair", "scale": 0}),
        }
        after = {"probe": app.probe(), "probe_again": app.probe(), "cache": app.cache()}
        return {"calls": {k: {"status": r.status_code,
                              "field": r.json()["detail"][0]["loc"][-1]}
                          for k, r in calls.items()},
                "before": before, "after": after}


def replay() -> dict:
    now = time.time()
    with App(["profile=replay"]) as app:
        warm(app, now=now)
        before = {"cache": app.cache(), "probe": app.probe(now=now + 1)}
        r = app.post("/rank", {**PROBE, "now": FUTURE})
        after = {"probe": app.probe(now=now + 1), "cache": app.cache()}
        return {"calls": {"/rank now=1e11": {"status": r.status_code,
                                             "msg": r.json()["detail"][0]["msg"]}},
                "before": before, "after": after}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    out = {"serving": serving(), "replay": replay()}
    print(f"{'profile':9} {'call':22} {'status':>6}  field / message")
    for prof, res in out.items():
        for call, r in res["calls"].items():
            print(f"{prof:9} {call:22} {r['status']:>6}  {r.get('field') or r.get('msg')}")
    for prof, res in out.items():
        b, a = res["before"], res["after"]
        print(f"{prof}: cache {b['cache']} -> {a['cache']}")
        print(f"{prof}: probe tiers {b['probe']['tiers']} -> {a['probe']['tiers']}")
        print(f"{prof}: probe ages  {b['probe']['ages_s']} -> {a['probe']['ages_s']}")
    if args.json:
        sys.path.insert(0, str(ROOT / "bench"))
        from machine import NO_FM, machine

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**out, "machine": machine(NO_FM)}, indent=1))


if __name__ == "__main__":
    main()
