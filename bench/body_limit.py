"""What the router's body-limit middleware costs per request, in process.

    python bench/body_limit.py [--json runs/bench_body_limit.json] [--requests 2000]

Drives a FastAPI app with a ``/rank``-shaped endpoint (a pydantic body of 500 candidate ids,
a JSON answer of 500 scores) through its ASGI interface, with no middleware, with the limit
written as Starlette's ``@app.middleware("http")`` (how the router had it), and with
``serve.http.BodyLimit`` (a plain ASGI middleware, how it has it now). Reports the median over
``--repeats`` rounds of the CPU milliseconds per request of each, measured side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve.http import BodyLimit  # noqa: E402

LIMIT = 1_000_000


class _Body(BaseModel):
    user_id: int
    candidates: list[int]


def make_app(kind: str) -> FastAPI:
    app = FastAPI()
    app.state.max_body_bytes = LIMIT
    if kind == "starlette_http_middleware":
        @app.middleware("http")
        async def _limit(request: Request, call_next):
            length = request.headers.get("content-length")
            if length is not None and int(length) > LIMIT:
                return JSONResponse({"detail": "too large"}, status_code=413)
            return await call_next(request)
    elif kind == "asgi_body_limit":
        app.add_middleware(BodyLimit)
    elif kind != "none":
        raise ValueError(f"kind={kind!r}")

    @app.post("/rank")
    async def rank(body: _Body) -> JSONResponse:
        return JSONResponse({"scores": [0.5] * len(body.candidates)})

    return app


async def _cpu_ms_per_request(app: FastAPI, body: bytes, n: int) -> float:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/rank", "raw_path": b"/rank",
             "query_string": b"", "root_path": "", "server": ("bench", 80),
             "client": ("bench", 1),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def one() -> None:
        sent: list[dict] = []
        given = False

        async def receive() -> dict:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # no disconnect while the answer is sent

        async def send(msg: dict) -> None:
            sent.append(msg)

        await app(dict(scope), receive, send)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"status {sent[0]['status']}")

    for _ in range(min(200, n)):
        await one()
    t = time.process_time()
    for _ in range(n):
        await one()
    return (time.process_time() - t) / n * 1000.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--candidates", type=int, default=500)
    args = p.parse_args()
    body = json.dumps({"user_id": 3, "candidates": list(range(args.candidates))}).encode()
    kinds = ("none", "starlette_http_middleware", "asgi_body_limit")
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):  # interleaved rounds
        for k in kinds:
            runs[k].append(asyncio.run(_cpu_ms_per_request(make_app(k), body, args.requests)))
    out = {"cpu_ms_per_request": {k: float(np.median(v)) for k, v in runs.items()},
           "runs": runs, "requests": args.requests, "candidates": args.candidates}
    for k in kinds:
        print(f"{k:<28}{out['cpu_ms_per_request'][k]:.3f} ms CPU per request "
              f"(rounds: {', '.join(f'{x:.3f}' for x in runs[k])})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from machine import NO_FM, machine

        args.json.write_text(json.dumps(out | {"machine": machine(NO_FM)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
