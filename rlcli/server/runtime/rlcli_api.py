"""SkyRL's API process as rlcli runs it (a module of functions and a FastAPI app: no class to subclass): the asample
route today's tinker SDKs need (rlcli_sdk), the request path's and the tenant gate's rebindings (the engine command is
the launcher's), and rlcli's routes: GET
CAPABILITIES_ROUTE (the losses served in one forward_backward, what each change does), POST FORGET_ROUTE
(docs/decisions.md, "`serve start`'s readiness probe leaves no training run behind") and POST TAGGED_MODELS_ROUTE
(docs/decisions.md, "A killed loop command's models are found by the tag it recorded first").
"""

from __future__ import annotations

import os
from pathlib import Path

import manifest
import rlcli_decode
import rlcli_guards
import rlcli_lazy_torch
import rlcli_liveness
import rlcli_lora
import rlcli_losses
import rlcli_no_torch
import rlcli_samplers
import rlcli_sdk
import rlcli_tenants
import rlcli_wake
import rlcli_warmup
from shared import (
    CAPABILITIES_ROUTE,
    ENGINE_ROUTE,
    EXTENSIONS_ENV,
    FORGET_ROUTE,
    READINESS_TAG,
    RLCLI,
    TAGGED_MODELS_ROUTE,
    TENANTS,
)


def install(api, features: set[str]) -> None:
    """In this order: what today's tinker SDKs expect (always), the request path and routes (rlcli), the tenant
    gate, the body cap (rlcli; added last, it is the outermost middleware)."""
    rlcli_sdk.install(api)
    if RLCLI in features:
        rlcli_wake.install_api(api)
        rlcli_guards.install(api)

        async def rlcli_capabilities() -> dict:
            return capabilities(api.app.state.engine_config)

        async def rlcli_forget_readiness_models() -> dict:
            return await forget_readiness_models(api.app.state.db_engine)

        async def rlcli_engine_liveness() -> dict:
            return rlcli_liveness.report(Path.cwd())

        api.app.add_api_route(CAPABILITIES_ROUTE, rlcli_capabilities, methods=["GET"])
        api.app.add_api_route(FORGET_ROUTE, rlcli_forget_readiness_models, methods=["POST"])
        api.app.add_api_route(ENGINE_ROUTE, rlcli_engine_liveness, methods=["GET"])
        api.app.add_api_route(TAGGED_MODELS_ROUTE, tagged_models_endpoint(api), methods=["POST"])
        rlcli_liveness.forget(Path.cwd())
    if TENANTS in features:
        rlcli_tenants.install(api)
    if RLCLI in features:
        rlcli_guards.install_cap(api)


def capabilities(engine_config) -> dict:
    """What the capabilities route answers for a server started with this config."""
    from skyrl.tinker import types

    backend = engine_config.backend
    features = [e.strip() for e in os.environ.get(EXTENSIONS_ENV, "").split(",") if e.strip()]
    answer = {"backend": backend, "extension": f"rlcli runtime {manifest.VERSION}", "extensions": features}
    if backend == "jax":
        losses = set(rlcli_losses.STOCK_JAX) | set(types.LOSS_TYPES)
        blocker = rlcli_losses.jax_fused_blocker(engine_config.backend_config)
        if blocker:
            answer["note"] = f"gspo not fused: {blocker}"
        else:
            losses |= set(rlcli_losses.FUSED)
    else:  # fsdp and megatron (SkyRL-Train) serve every Tinker loss; megatron has no critic model
        losses = set(types.SUPPORTED_LOSS_FNS) - ({"ppo_critic"} if backend == "megatron" else set())
    answer["losses"] = sorted(losses)
    answer["rlcli_sdk"] = rlcli_sdk.describe()  # with --no-extensions too
    if backend == "jax" and engine_config.backend_config.get("use_ray"):
        import ray_actors

        answer["ray_actors"] = ray_actors.describe()
    parts = (rlcli_wake, rlcli_guards, rlcli_samplers, rlcli_warmup, rlcli_lora, rlcli_decode, rlcli_no_torch,
             rlcli_lazy_torch, rlcli_liveness)
    if RLCLI in features:
        answer |= {module.__name__: module.describe() for module in parts}
    if TENANTS in features:
        answer["rlcli_tenants"] = rlcli_tenants.describe()
    return answer


LET_GO = ("unloaded", "unloading", "failed")  # model states that hold no LoRA slot (or soon none)


def tagged_models_endpoint(api):
    """POST {"tag"} -> {"tag", "sessions": [ids], "models": [ids]}: the sessions tagged so (TINKER_TAGS) and their
    models that may still hold a slot. A client killed while its model was being created never learned the id
    (SkyRL names it when the request is filed); the tag it recorded before opening any session finds it here."""
    from fastapi import Body

    async def rlcli_tagged_models(tag: str = Body(..., embed=True, min_length=1, max_length=api.ID_MAX_LENGTH)) -> dict:
        from skyrl.tinker.db_models import ModelDB, SessionDB
        from sqlalchemy import String, cast
        from sqlmodel import select
        from sqlmodel.ext.asyncio.session import AsyncSession

        async with AsyncSession(api.app.state.db_engine) as session:
            found = await session.exec(select(SessionDB.session_id, SessionDB.tags)
                                       .where(cast(SessionDB.tags, String).like(f'%"{tag}"%')))
            sessions = sorted(sid for sid, tags in found.all() if tag in (tags or []))
            rows = (await session.exec(select(ModelDB.model_id, ModelDB.status)
                                       .where(ModelDB.session_id.in_(sessions)))).all() if sessions else []
        return {"tag": tag, "sessions": sessions,
                "models": sorted(m for m, status in rows if status not in LET_GO)}

    return rlcli_tagged_models


async def forget_readiness_models(db_engine) -> dict:
    """Delete the rows of the unloaded models of readiness sessions, and those sessions where nothing else refers to
    them. Their futures stay: SQLite gives a new row max(id) + 1, so deleting the newest futures would hand their
    request ids to the next requests (and the tenant gate keys ownership by request id)."""
    from skyrl.tinker.db_models import ModelDB, SamplingSessionDB, SessionDB
    from sqlalchemy import String, cast, delete
    from sqlmodel import select
    from sqlmodel.ext.asyncio.session import AsyncSession

    async with AsyncSession(db_engine) as session:
        tagged = await session.exec(select(SessionDB.session_id, SessionDB.tags)
                                    .where(cast(SessionDB.tags, String).like(f'%"{READINESS_TAG}"%')))
        sessions = [sid for sid, tags in tagged.all() if READINESS_TAG in (tags or [])]
        if not sessions:
            return {"models": 0, "sessions": 0}
        models = list((await session.exec(select(ModelDB.model_id).where(
            ModelDB.session_id.in_(sessions), ModelDB.status == "unloaded"))).all())
        if models:
            await session.exec(delete(ModelDB).where(ModelDB.model_id.in_(models)))
        held = set((await session.exec(select(ModelDB.session_id).where(ModelDB.session_id.in_(sessions)))).all())
        held |= set((await session.exec(select(SamplingSessionDB.session_id)
                                        .where(SamplingSessionDB.session_id.in_(sessions)))).all())
        empty = [sid for sid in sessions if sid not in held]
        if empty:
            await session.exec(delete(SessionDB).where(SessionDB.session_id.in_(empty)))
        await session.commit()
    return {"models": len(models), "sessions": len(empty)}
