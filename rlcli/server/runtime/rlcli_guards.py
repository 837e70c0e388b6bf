"""Input SkyRL's API turns into a 500 that is the client's mistake, answered with one line instead (found by the
fuzzer, benchmarks/fuzz.py; docs/upstream/int64-inputs.md).

- POST /api/v1/retrieve_future calls int() on its `request_id` (a string in the request model): an id that is not a
  decimal integer raised ValueError, and one past SQLite's 64-bit INTEGER raised OverflowError in the query.
- GET /api/v1/training_runs passes `limit` and `offset` (any Python int) to SQLite: past 64 bits, OverflowError.

Each came back as `500 Internal Server Error`, with a rich traceback of ~60 lines in the server log. Both routes are
served again by endpoints that refuse such values with a 422 (SkyRL's answer to a request its models refuse), then
run SkyRL's own handler.
"""

import re  # no `from __future__ import annotations`: FastAPI reads the endpoint's annotations as objects

import rlcli_sdk

FUTURE_ROUTE, RUNS_ROUTE = "/api/v1/retrieve_future", "/api/v1/training_runs"
# ASCII digits (int() also reads other scripts' digits); 18 of them always fit SQLite's 64-bit INTEGER.
FUTURE_ID = re.compile(r"-?[0-9]{1,18}")
INT64 = (-(2**63), 2**63 - 1)


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

    rlcli_sdk.replace_route(api, FUTURE_ROUTE, stock_future, retrieve_future, None)
    rlcli_sdk.replace_route(api, RUNS_ROUTE, stock_runs, list_training_runs, api.TrainingRunsResponse, "GET")


def describe() -> dict:
    return {"routes": [FUTURE_ROUTE, RUNS_ROUTE],
            "refuses": "a request_id that is not a decimal integer of at most 18 digits, a limit or offset past 64 "
                       "bits (SkyRL: a 500)"}
