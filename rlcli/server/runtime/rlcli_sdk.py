"""What today's tinker SDKs expect of SkyRL's API beyond what SkyRL 0.4.0 sends (docs/decisions.md, "The server
answers tinker 0.25 to 0.38"; docs/upstream/sample-sequence-ids.md). Applied in every server, with --no-extensions
too: without it no SDK from 0.26 on can sample from a SkyRL server.

tinker 0.26 and later give each sampled sequence the id the server fixed when the request was submitted: the POST
/api/v1/asample answer (a future) carries `sample_sequence_ids`, one per requested sample in the order of the final
response's sequences, and the SDK asserts they are there. SkyRL's answer has no such field (its response model drops
anything else), so the route's endpoint is wrapped here: SkyRL's own handler runs, then its future goes out with the
ids. An id is `sample-<request id>-<index>`: the request id is the server's own future id (unique in its database,
kept across restarts), the index the sequence's place in the answer, so a later reference names one sequence.

tinker 0.38 makes a training client from a saved state with one POST /api/v1/load_weights that creates the model too:
no model_id, but the session and the client's model sequence number, from which both sides name the model
`<session id>:train:<model seq id>`; its LoRA is the checkpoint's. SkyRL's route needs a model_id (a 422), so a load
without one is answered here: the model row and its create future, then the load future, in one commit, as SkyRL's
create_model and load_weights would file them; a load with a model_id goes to SkyRL's route unchanged. SkyRL's routes
that name a model in their path (its checkpoints listed, downloaded, deleted) check it against a pattern without ':'
(a 422 for such a model's checkpoints: `rlcli export`, the loop's promote); they are served again with one that also
takes `<session>:train:<seq>`.
"""

import sys  # no `from __future__ import annotations`: FastAPI reads the endpoint's annotations as objects

ROUTE = "/api/v1/asample"
LOAD_ROUTE = "/api/v1/load_weights"
MODEL_IN_PATH = "unique_id"  # the path parameter SkyRL's checkpoint routes name the model by
MODEL_ID_PATTERN = r"^[a-zA-Z0-9_-]+(:train:[0-9]+)?$"  # SkyRL's ID_PATTERN, or the id a load created


def log(message: str) -> None:
    print(f"[rlcli sdk] {message}", file=sys.stderr, flush=True)


def sequence_ids(request_id: str, num_samples: int) -> list[str]:
    """The ids of one sampling request's sequences, in the order its answer lists them."""
    return [f"sample-{request_id}-{index}" for index in range(num_samples)]


def _route(api, path: str, stock, method: str = "POST"):
    """SkyRL's one `method` route at `path`, served by `stock`; SystemExit with one line if SkyRL moved it."""
    from fastapi.routing import APIRoute

    routes = [r for r in api.app.router.routes if isinstance(r, APIRoute) and r.path == path and method in r.methods]
    if [r.endpoint for r in routes] != [stock]:
        raise SystemExit(f"rlcli sdk: SkyRL's {path} route is not served by skyrl.tinker.api.{stock.__name__}: rlcli "
                         "cannot answer today's tinker SDKs; rebuild the server venv with `rlcli serve install`")
    return routes[0]


def replace_route(api, path: str, stock, endpoint, response_model, method: str = "POST") -> None:
    route = _route(api, path, stock, method)
    endpoint.__doc__ = stock.__doc__
    api.app.router.routes.remove(route)
    api.app.router.add_api_route(path, endpoint, methods=[method], response_model=response_model)


def install(api) -> None:
    """Replace the asample and load_weights routes with rlcli's (above); SkyRL's handlers do the work."""
    from fastapi import Depends, Request
    from sqlmodel.ext.asyncio.session import AsyncSession

    db = Depends(api.get_session)  # SkyRL's database session, as its routes take it

    class SampleFuture(api.FutureResponse):
        sample_sequence_ids: list[str]

    async def asample(request: api.SampleRequest, req: Request, session: AsyncSession = db):
        future = await stock_sample(request, req, session)
        return SampleFuture(**future.model_dump(), sample_sequence_ids=sequence_ids(future.request_id,
                                                                                    request.num_samples))

    LoadRequest = load_request_model(api)

    class LoadFuture(api.FutureResponse):
        model_id: str | None = None  # the model a load created (the tenant gate records its owner)

    async def load_weights(request: LoadRequest, req: Request, session: AsyncSession = db):
        if request.model_id is not None:
            legacy = api.LoadWeightsRequest(model_id=request.model_id, path=request.path, optimizer=request.optimizer,
                                            seq_id=request.seq_id, type=request.type)
            return await stock_load(legacy, req, session)
        return await create_by_load(api, request, req, session)

    stock_sample, stock_load = api.asample, api.load_weights
    replace_route(api, ROUTE, stock_sample, asample, SampleFuture)
    replace_route(api, LOAD_ROUTE, stock_load, load_weights, LoadFuture)
    widened = accept_created_model_ids(api)
    log(f"{ROUTE} answers with sample_sequence_ids (tinker >= 0.26 asserts them); {LOAD_ROUTE} creates the model "
        f"it loads when it names a session instead of a model (tinker 0.38's create_training_client_from_state); "
        f"{widened} checkpoint routes take the ids such a load creates")


def accept_created_model_ids(api) -> int:
    """Serve each SkyRL route whose path names a model (`{unique_id}`) by the same endpoint, at the same place in
    the app, with MODEL_ID_PATTERN for that parameter. Returns how many; SystemExit with one line if none is left."""
    from fastapi import Path
    from fastapi.routing import APIRoute

    routes = api.app.router.routes
    found = [i for i, r in enumerate(routes) if isinstance(r, APIRoute) and f"{{{MODEL_IN_PATH}}}" in r.path]
    if not found:
        raise SystemExit(f"rlcli sdk: no SkyRL route names a model by {{{MODEL_IN_PATH}}} any more: rlcli cannot "
                         "serve the checkpoints of a model a load created; rebuild the server venv "
                         "(`rlcli serve install`)")
    for index in found:
        stock = routes[index]
        routes[index] = APIRoute(stock.path, _with_model_pattern(stock.endpoint, Path(
            ..., pattern=MODEL_ID_PATTERN, max_length=api.ID_MAX_LENGTH)), methods=stock.methods, name=stock.name,
            status_code=stock.status_code, response_model=stock.response_model, response_class=stock.response_class)
    return len(found)


def _with_model_pattern(stock, default):
    """`stock` under another signature: its model parameter validated against `default`'s pattern."""
    import functools
    import inspect

    async def endpoint(**kwargs):
        return await stock(**kwargs)

    functools.update_wrapper(endpoint, stock)
    signature = inspect.signature(stock)
    endpoint.__signature__ = signature.replace(parameters=[
        p.replace(default=default) if p.name == MODEL_IN_PATH else p for p in signature.parameters.values()])
    return endpoint


def load_request_model(api):
    """SkyRL's LoadWeightsRequest with tinker 0.38's create-via-load addressing beside the legacy model_id."""
    from typing import Literal

    from pydantic import BaseModel, model_validator

    class LoadRequest(BaseModel):
        model_id: str | None = None
        seq_id: int | None = None
        session_id: str | None = None
        model_seq_id: int | None = None
        base_model: str | None = None
        path: str
        optimizer: bool = True
        optimizer_config: dict | None = None
        type: Literal["load_weights"] | None = None  # SkyRL's: any other string was a 500 when passed on (fuzzer)

        @model_validator(mode="after")
        def one_addressing(self):
            if (self.model_id is None) == (self.session_id is None or self.model_seq_id is None):
                raise ValueError("load_weights names either model_id, or session_id and model_seq_id (a new model "
                                 "loaded from the checkpoint)")
            return self

    return LoadRequest


def created_model_id(session_id: str, model_seq_id: int) -> str:
    """The id tinker 0.38 gives the model a load creates, which the server must use too: the SDK addresses it so."""
    return f"{session_id}:train:{model_seq_id}"


async def create_by_load(api, request, req, session):
    """A new model with the checkpoint's LoRA (and base model), then the load, filed in one commit. A retry of the
    same request finds both and answers the same future (SkyRL's create_future finds the load by its seq_id, 0)."""
    from fastapi import HTTPException
    from skyrl.tinker import types
    from skyrl.tinker.db_models import ModelDB, SessionDB

    optimizer = (request.optimizer_config or {}).get("type", "adamw")
    if optimizer != "adamw":
        raise HTTPException(status_code=400, detail=f"optimizer {optimizer!r} is not served here: SkyRL trains "
                            "with Adam only (optimizer_config type 'adamw')")
    if await session.get(SessionDB, request.session_id) is None:
        raise HTTPException(status_code=404, detail="Session not found")
    path = types.TinkerPath.parse(request.path)
    if not path or path.kind != "weights" or not path.primary_id or not path.secondary_id:
        raise HTTPException(status_code=400, detail="request.path must be in format "
                            "tinker://source_model_id/weights/checkpoint_id")
    source = await api.get_model(session, path.primary_id)
    if request.base_model not in (None, source.base_model):
        raise HTTPException(status_code=400, detail=f"base_model {request.base_model!r} is not the checkpoint's "
                            f"({source.base_model!r}); this server serves only that one")
    await api.validate_checkpoint(req, path.primary_id, path.secondary_id, types.CheckpointType.TRAINING, session)
    model_id = created_model_id(request.session_id, request.model_seq_id)
    lora = types.LoraConfig.model_validate(source.lora_config)
    if await session.get(ModelDB, model_id) is None:
        created = await api.create_future(session=session, request_type=types.RequestType.CREATE_MODEL,
                                          model_id=model_id, request_data=types.CreateModelInput(lora_config=lora))
        session.add(ModelDB(model_id=model_id, base_model=source.base_model, lora_config=lora.model_dump(),
                            status="created", request_id=created, session_id=request.session_id))
    loaded = await api.create_future(session=session, request_type=types.RequestType.LOAD_WEIGHTS,
                                     model_id=model_id, seq_id=0, request_data=types.LoadWeightsInput(
                                         source_model_id=path.primary_id, checkpoint_id=path.secondary_id,
                                         load_optimizer=request.optimizer))
    await session.commit()
    return {"future_id": str(loaded), "status": "pending", "request_id": str(loaded), "model_id": model_id}


def describe() -> dict:
    return {"sample_sequence_ids": f"{ROUTE}'s future carries one id per sample: sample-<request id>-<index>",
            "create_by_load": f"{LOAD_ROUTE} with session_id and model_seq_id creates <session>:train:<seq> from "
                              "the checkpoint, then loads it"}
