"""Input SkyRL's API turns into a 500 that is the client's mistake, answered with one line instead (found by the
fuzzer, benchmarks/fuzz.py; docs/upstream/int64-inputs.md).

- POST /api/v1/retrieve_future calls int() on its `request_id` (a string in the request model): an id that is not a
  decimal integer raised ValueError, and one past SQLite's 64-bit INTEGER raised OverflowError in the query.
- GET /api/v1/training_runs passes `limit` and `offset` (any Python int) to SQLite: past 64 bits, OverflowError.
- POST /api/v1/create_sampling_session files any `model_path` string; GET /api/v1/samplers/{id} then parses it
  (TinkerPath.parse, None for anything but tinker://ID/KIND/NAME) and reads `.primary_id` of None: an
  AttributeError. The tinker client retries a 500, so `rlcli endpoint` asked for model "tinker://x" waited minutes.

Each came back as `500 Internal Server Error`, with a rich traceback of ~60 lines in the server log. The routes are
served again by endpoints that refuse such values with a 422 (SkyRL's answer to a request its models refuse), then
run SkyRL's own handler.

And a cap on request bodies (BodyCap, outermost, so the tenant gate never reads past it either): uvicorn and
Starlette read a body whole, whatever its size, and each 256 MB body the fuzzer sent left the API process ~500 MB
larger for good (630 MB -> 1.4 -> 1.9 -> 2.4 GB over three rounds): a client could grow the server until the machine
ran out. The tinker client sends forward_backward in chunks of ~5 MB (its fwdbwd_max_chunk_bytes_count); MAX_BODY is
far above any request it makes.
"""

import re  # no `from __future__ import annotations`: FastAPI reads the endpoint's annotations as objects

import rlcli_sdk

FUTURE_ROUTE, RUNS_ROUTE = "/api/v1/retrieve_future", "/api/v1/training_runs"
SAMPLING_ROUTE = "/api/v1/create_sampling_session"
# ASCII digits (int() also reads other scripts' digits); 18 of them always fit SQLite's 64-bit INTEGER.
FUTURE_ID = re.compile(r"-?[0-9]{1,18}")
INT64 = (-(2**63), 2**63 - 1)
MAX_BODY = 64 << 20  # bytes; 13x the tinker client's forward_backward chunk


def bad_future_id(request_id: str) -> str | None:
    """Why `request_id` cannot name a future (one line), or None when it can."""
    if FUTURE_ID.fullmatch(request_id):
        return None
    return f"request_id {request_id[:40]!r} is not a future's id: a future id is the decimal integer a request answered"


def install(api) -> None:
    from fastapi import Depends, HTTPException, Query, Request
    from sqlmodel.ext.asyncio.session import AsyncSession

    stock_future, stock_runs = api.retrieve_future, api.list_training_runs
    db = Depends(api.get_session)  # SkyRL's database session, as its routes take it

    async def retrieve_future(request: api.RetrieveFutureRequest, req: Request):
        if problem := bad_future_id(request.request_id):
            raise HTTPException(status_code=422, detail=problem)
        return await stock_future(request, req)

    async def list_training_runs(limit: int = Query(20, ge=INT64[0], le=INT64[1]),
                                 offset: int = Query(0, ge=INT64[0], le=INT64[1]),
                                 session: AsyncSession = db):
        return await stock_runs(limit=limit, offset=offset, session=session)

    stock_sampling = api.create_sampling_session

    async def create_sampling_session(request: api.CreateSamplingSessionRequest, session: AsyncSession = db):
        if request.model_path is not None and api.types.TinkerPath.parse(request.model_path) is None:
            raise HTTPException(status_code=422, detail=f"model_path {request.model_path[:80]!r} is not a tinker "
                                "path: tinker://MODEL_ID/sampler_weights/NAME")
        return await stock_sampling(request, session)

    rlcli_sdk.replace_route(api, SAMPLING_ROUTE, stock_sampling, create_sampling_session,
                            api.CreateSamplingSessionResponse)
    rlcli_sdk.replace_route(api, FUTURE_ROUTE, stock_future, retrieve_future, None)
    rlcli_sdk.replace_route(api, RUNS_ROUTE, stock_runs, list_training_runs, api.TrainingRunsResponse, "GET")


class BodyCap:
    """ASGI middleware: a body over MAX_BODY is a 413. A declared Content-Length over it is refused before a byte is
    read; a chunked body is counted as it arrives, and past the cap the app is told the client left (it stops
    reading), its answer is dropped and the 413 goes out instead."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            return await self.refuse(send)
        seen, over, started = [0], [False], [False]

        async def counted():
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > self.limit:
                over[0] = True
                return {"type": "http.disconnect"}
            return message

        async def guarded(message):
            if over[0]:
                return
            started[0] = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over[0]:
                raise
        if over[0] and not started[0]:
            await self.refuse(send)

    async def refuse(self, send) -> None:
        body = (f'{{"detail": "the request body is over {self.limit >> 20} MB; the tinker client sends '
                f'forward_backward in chunks far below that"}}').encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def install_cap(api) -> None:
    """Last of all the API's middleware: the outermost, before the tenant gate reads a body."""
    api.app.add_middleware(BodyCap)


def describe() -> dict:
    return {"routes": [FUTURE_ROUTE, RUNS_ROUTE, SAMPLING_ROUTE],
            "refuses": "a request_id that is not a decimal integer of at most 18 digits, a limit or offset past 64 "
                       "bits, a sampling session's model_path that is no tinker path (SkyRL: a 500)",
            "max_body_mb": MAX_BODY >> 20}
