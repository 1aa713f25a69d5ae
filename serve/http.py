"""The HTTP edge of the app: request and answer schemas, the FastAPI app and its problem
answers (a 4xx naming the field; the offending input is never echoed back) and the body-size
limit, which refuses oversized bodies before they are parsed. No Ray import."""

from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, StringConstraints

from solaris.online.scales import PAIR_TIERS

MAX_ID = 2**62  # codes are int64 on every path
# a raw id as the deployment's log holds it (solaris/ids.py translates it): a JSON integer or
# string, never coerced from one to the other (nor from a bool or a float)
RawId = Annotated[StrictInt | Annotated[StrictStr, StringConstraints(min_length=1,
                                                                     max_length=256)],
                  Field(union_mode="left_to_right")]
RETRY_AFTER_S = 2  # what a 503 asks the client to wait


class RankRequest(BaseModel):
    """One ranking request: a user and the candidates an earlier stage retrieved."""

    model_config = ConfigDict(extra="forbid")
    user_id: RawId = Field(description="the user's raw id, as the team's log holds it "
                           "(an integer or a string; unknown users are served)")
    candidates: list[RawId] = Field(min_length=1, description="candidate items' raw ids")
    task: str = Field(min_length=1, max_length=64, description="the VM's task, e.g. click")
    surface: int = Field(0, ge=0, le=1_000_000, description="surface code (feed, search, ...)")
    request_id: str | None = Field(None, max_length=128)
    now: float | None = Field(None, ge=0, allow_inf_nan=False,
                              description="replay profile only: event time in epoch seconds "
                              "(default and in the serving profiles: the server's wall time)")
    features: dict[str, float] | None = Field(
        None, description="the request-time features the deployment's mapping declares "
        "(request_features), name -> raw value; an absent one is served as its training "
        "mean; an undeclared name or a non-finite value is refused (422)")
    mode: Literal["solaris", "vm", "inline"] | None = Field(
        None, description="replay profile only: override the app's mode for this request "
        "(benchmarks, debugging)")
    features_for: list[int] | None = Field(
        None, max_length=1000, description="replay profile only: positions in candidates "
        "whose served SOLARIS inputs (pair and user slot vectors) come back in features")
    reads: Literal["replica", "shards"] | None = Field(
        None, description="replay profile only: answer this request's lookups from the "
        "router's read replica or by a round of cache-shard calls (an A/B of the two paths "
        "in one app; default: serve.cache_reads)")


class RankResponse(BaseModel):
    request_id: str
    task: str
    mode: str
    scores: list[float]
    tiers: list[str]
    ages_s: list[float] = Field(description="per candidate, the event-time age in seconds "
                                "of the embedding served (0 where none), in full: the replay "
                                "re-scores its rows with these ages")
    aggregate: list[bool]
    versions: dict[str, str]
    features: dict[str, list[list[float]]] | None = Field(
        None, description="with features_for: pair and user slot vectors of those positions "
        "(zeros where absent)")


class FeedbackRequest(BaseModel):
    """Labels for items shown to a user (0/1 per task, in the app's task order)."""

    model_config = ConfigDict(extra="forbid")
    user_id: RawId
    items: list[RawId] = Field(min_length=1)
    labels: list[list[int]] = Field(min_length=1, description="(len(items), num_tasks) of 0/1")
    now: float | None = Field(None, ge=0, allow_inf_nan=False,
                              description="replay profile only: event time in epoch seconds")


class ScaleRequest(BaseModel):
    """Change one scale of a residual VM at runtime (``solaris/online/scales.py``)."""

    model_config = ConfigDict(extra="forbid")
    task: str
    version: str | None = Field(None, description="default: the task's active version")
    slot: Literal["pair", "aggregate"]
    tier: Literal[PAIR_TIERS] | None = Field(  # "pair", "user_neighbour", "item_neighbour"
        None, description="the pair slot's tier (required for slot pair)")
    scale: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


def problem(status: int, field: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["body", field], "msg": message}]}, status_code=status,
                        headers=headers)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field; the offending input is not echoed back (it may be huge,
    or NaN, which JSON cannot carry)."""
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse({"detail": detail}, status_code=422)


class BodyLimit:
    """Refuse request bodies past ``serve.max_body_bytes`` before they are parsed (413): by
    their Content-Length, or, sent chunked without one, by counting bytes as they arrive.

    A plain ASGI middleware: Starlette's ``@app.middleware("http")`` runs every request
    through a task group and memory streams, ~0.17 ms more CPU per request
    (``bench/body_limit.py``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = getattr(scope["app"].state, "max_body_bytes", 1_000_000)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            if not length.isdigit():
                text = length.decode("latin-1")[:32]
                await problem(400, "content-length", f"not a number: {text!r}")(
                    scope, receive, send)
            elif int(length) > limit:
                await problem(413, "body", f"{int(length)} bytes; the limit is {limit}")(
                    scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        held, size = [], 0  # no length given: read the body here, up to the limit
        while True:
            msg = await receive()
            held.append(msg)
            if msg["type"] != "http.request":  # the client went away
                break
            size += len(msg.get("body", b""))
            if size > limit:
                await problem(413, "body", f"over {limit} bytes (chunked); the limit is "
                               f"{limit}")(scope, receive, send)
                return
            if not msg.get("more_body", False):
                break

        async def replay() -> dict:
            return held.pop(0) if held else await receive()

        await self.app(scope, replay, send)



def new_api() -> FastAPI:
    """A FastAPI app with the project's problem answers and body limit, no route yet
    (``serve.routes`` adds the routes); each router replica builds its own."""
    app = FastAPI(title="SOLARIS", version="0.1.0",
                  description="Vertical models served with precomputed FM pair embeddings.")
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_middleware(BodyLimit)
    return app
