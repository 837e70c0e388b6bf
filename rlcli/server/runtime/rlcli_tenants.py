"""API keys and isolation between tenants (`serve start --tenants`): `install` wraps SkyRL's whole ASGI app. Every
request but PUBLIC needs a key from TENANTS_FILE_ENV (SHA-256 hashes, reread when the file changes); the ids a
tenant's requests create are its own (tenant_owners.py), another's answer 404; quotas answer 429; weight_decay > 0
is refused (docs/decisions.md, "Tenants"). `fair_pick` is the engine's round-robin (rlcli_engine.FairEngine).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from shared import (
    FORGET_ROUTE,
    INTERNAL_TENANT,
    OWNERS_FILE,
    TAGGED_MODELS_ROUTE,
    TENANTS_FILE_ENV,
    TENANTS_INTERNAL_ENV,
)
from tenant_owners import Owners

PUBLIC = {("GET", "/api/v1/healthz")}  # the only requests answered without a key
# Server-wide controls, no tenant's business: 404 (as unknown paths) to every key but the internal one: SkyRL's
# torch profiler, and rlcli's clean-up of its readiness probes.
ADMIN = {"/start_profiling", "/stop_profiling", "/profiling_status", FORGET_ROUTE,
         TAGGED_MODELS_ROUTE}  # it lists sessions by tag, whoever made them
ID_FIELDS = ("session_id", "model_id", "sampling_session_id", "request_id", "sampler_id")
RETRY_AFTER_S = 2
# Routes that queue work for the engine (a future each): what max_queued counts and limits.
QUEUED_ROUTES = {f"/api/v1/{r}" for r in ("create_model", "unload_model", "forward_backward", "forward", "optim_step",
                                           "load_weights", "save_weights", "save_weights_for_sampler", "asample")}
_state = {"checked": 0, "refused": 0, "hidden": 0, "throttled": 0}


def log(message: str) -> None:
    print(f"[rlcli tenants] {message}", file=sys.stderr, flush=True)


class Keys:
    """The tenants file, reread when its mtime or size changes (one stat per request)."""

    def __init__(self, path: Path, internal_hash: str | None):
        self.path, self.internal = path, internal_hash
        self.stamp: tuple | None = None
        self.by_hash: dict[str, tuple[str, dict]] = {}

    def tenant(self, key: str | None) -> tuple[str, dict] | None:
        if not key:
            return None
        digest = hashlib.sha256(key.encode()).hexdigest()
        if self.internal and hmac.compare_digest(digest, self.internal):
            return INTERNAL_TENANT, {}
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            self.by_hash, self.stamp = {}, None  # no file: nobody but the internal key
            return None
        if stamp != self.stamp:
            try:
                tenants = json.loads(self.path.read_text())["tenants"]
                self.by_hash = {t["key_sha256"]: (name, t) for name, t in tenants.items()}
            except (OSError, ValueError, KeyError, TypeError) as e:
                log(f"cannot read {self.path} ({e}); refusing every key until it is fixed")
                self.by_hash = {}
            self.stamp = stamp
        return self.by_hash.get(digest)


def _named_ids(path: str, body: dict | None) -> list[str]:
    """Every id and tinker://MODEL_ID/... model a request names, in its path or its JSON body."""
    found = []
    parts = path.strip("/").split("/")
    if len(parts) >= 4 and parts[:2] == ["api", "v1"] and parts[2] in ("training_runs", "models", "samplers"):
        found.append(parts[3])
    if isinstance(body, dict):
        for field in ID_FIELDS:
            if isinstance(body.get(field), (str, int)):
                found.append(str(body[field]))
        for value in body.values():
            if isinstance(value, str) and value.startswith("tinker://") and (model := value[9:].split("/", 1)[0]):
                found.append(model)
    return found


class TenantGate:
    """ASGI middleware around SkyRL's app: key check, ownership, quotas."""

    def __init__(self, app, keys: Keys, owners: Owners):
        self.app, self.keys, self.owners = app, keys, owners

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if (method, path) in PUBLIC:
            return await self.app(scope, receive, send)
        _state["checked"] += 1
        headers = dict(scope["headers"])
        key = headers.get(b"x-api-key", b"").decode(errors="replace")
        if not key and headers.get(b"authorization", b"").lower().startswith(b"bearer "):
            key = headers[b"authorization"][7:].decode(errors="replace").strip()
        found = self.keys.tenant(key)
        if found is None:
            _state["refused"] += 1
            return await _answer(send, 401, {"detail": "a valid API key is required (X-API-Key or TINKER_API_KEY; "
                                                       "`rlcli tenant add NAME` makes one)"})
        tenant, quota = found
        parts, message = [], {"more_body": True}
        while message.get("more_body"):  # joined once: `+=` per message copied the body so far each time
            message = await receive()
            parts.append(message.get("body", b""))
        raw = b"".join(parts)
        body = _parse_body(path, headers, raw)
        if body is _UNREADABLE:  # fail closed: a body the gate cannot read could name anyone's ids
            return await _answer(send, 422, {"detail": "request body is neither JSON nor a forward_backward proto"})
        if _creates_model(path, body) and quota.get("max_models") and "app" in scope:  # a load creates one too
            await self._forget_unloaded(scope["app"], tenant)
        refusal = self._refusal(tenant, quota, path, body)
        if refusal is not None:
            status, detail, extra = refusal
            return await _answer(send, status, {"detail": detail}, extra)
        if method == "GET" and path == "/api/v1/training_runs":
            return await self._listing(scope, send, tenant)
        read = [{"type": "http.request", "body": raw, "more_body": False}]

        async def replay():  # the body the gate read, then whatever comes (a disconnect)
            return read.pop() if read else await receive()

        status_box, chunks = [0], []

        async def capture(message):
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._settle(tenant, path, body, status_box[0], b"".join(chunks))
            await send(message)

        await self.app(scope, replay, capture)

    async def _forget_unloaded(self, app, tenant: str) -> None:
        """Models SkyRL unloaded itself (a session that stopped its heartbeat) no longer count as held."""
        held = sorted(self.owners.models.get(tenant, ()))
        engine = getattr(app.state, "db_engine", None)
        if not held or engine is None:
            return
        from skyrl.tinker.db_models import ModelDB
        from sqlmodel import select
        from sqlmodel.ext.asyncio.session import AsyncSession

        query = select(ModelDB.model_id, ModelDB.status).where(ModelDB.model_id.in_(held))
        try:
            async with AsyncSession(engine) as session:
                rows = (await session.exec(query)).all()
        except Exception as e:  # the count stays as the gate knows it; the quota errs on the strict side
            log(f"could not read model states ({type(e).__name__}: {e})")
            return
        live = {model_id for model_id, status in rows if status not in ("unloaded", "unloading")}
        for model_id in set(held) - live:
            self.owners.record("unload", model_id, tenant)

    def _refusal(self, tenant: str, quota: dict, path: str, body) -> tuple | None:
        if tenant == INTERNAL_TENANT:
            return None
        if path in ADMIN:
            return 404, "Not Found", None
        for ident in _named_ids(path, body):
            if self.owners.owner.get(ident) != tenant:
                _state["hidden"] += 1
                return 404, _not_found(path), None
        if path == "/api/v1/optim_step" and isinstance(body, dict):
            decay = (body.get("adam_params") or {}).get("weight_decay") or 0
            if decay > 0:
                return 400, ("weight_decay > 0 is refused on a shared server: SkyRL's optimizer decays every "
                             "LoRA slot on any model's step, so it would shrink other tenants' models; use "
                             "weight_decay 0"), None
        held = len(self.owners.models.get(tenant, ()))
        if _creates_model(path, body) and quota.get("max_models") and held >= quota["max_models"]:
            _state["throttled"] += 1
            return 429, (f"tenant {tenant!r} holds {held} models, its limit; unload one first "
                         "(`rlcli tenant add` sets --max-models)"), [(b"retry-after", str(RETRY_AFTER_S).encode())]
        waiting = self.owners.queued.get(tenant, set())
        if quota.get("max_queued") and len(waiting) >= quota["max_queued"] and path in QUEUED_ROUTES:
            _state["throttled"] += 1
            return 429, (f"tenant {tenant!r} has {len(waiting)} requests waiting, its limit; retrieve results "
                         "first"), [(b"retry-after", str(RETRY_AFTER_S).encode())]
        return None

    def _settle(self, tenant: str, path: str, body, status: int, raw: bytes) -> None:
        """After SkyRL answered: a future that is done (any answer but 408, pending) leaves the queue count;
        ids a successful request created become the tenant's."""
        owners = self.owners
        if path == "/api/v1/retrieve_future" and isinstance(body, dict):
            if status != 408:
                with owners.lock:
                    owners.queued.get(tenant, set()).discard(str(body.get("request_id")))
            # save_weights_for_sampler's result names the sampling session SkyRL made for the caller's model
            if status == 200 and b'"sampling_session_id"' in raw:
                with contextlib.suppress(ValueError, AttributeError):
                    made = json.loads(raw).get("sampling_session_id")
                    if made and str(made) not in owners.owner:
                        owners.record("sampling", str(made), tenant)
            return
        try:
            answer = json.loads(raw) if status == 200 else None
        except ValueError:
            return
        if not isinstance(answer, dict):
            return
        if path == "/api/v1/unload_model" and isinstance(body, dict):
            owners.record("unload", str(body.get("model_id")), tenant)
        for field, kind in (("session_id", "session"), ("model_id", "model"),
                            ("sampling_session_id", "sampling"), ("request_id", "future")):
            ident = answer.get(field)
            if ident is None or (kind == "model" and not _creates_model(path, body)):
                continue
            if kind in ("session", "sampling") and not path.startswith("/api/v1/create_"):
                continue
            owners.record(kind, str(ident), tenant)
            if kind == "future":
                with owners.lock:
                    owners.queued.setdefault(tenant, set()).add(str(ident))

    async def _listing(self, scope, send, tenant: str):
        """The training-run listing, filtered to the caller's runs and paginated after the filter."""
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        try:
            offset, limit = int(query.get("offset", 0) or 0), int(query.get("limit", 20) or 20)
        except ValueError:  # int() of the query: a 500 before (benchmarks/fuzz.py)
            return await _answer(send, 422, {"detail": "offset and limit must be whole numbers"})
        inner = dict(scope, query_string=urlencode({"offset": 0, "limit": 10**9}).encode())
        start, chunks = {}, []

        async def collect(message):
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                chunks.append(message.get("body", b""))

        async def empty():
            return {"type": "http.request", "body": b"", "more_body": False}

        await self.app(inner, empty, collect)
        answer = json.loads(b"".join(chunks) or b"{}")
        runs = answer.get("training_runs") or []
        if tenant != INTERNAL_TENANT:
            runs = [r for r in runs if self.owners.owner.get(r.get("training_run_id")) == tenant]
        answer["training_runs"] = runs[offset:offset + limit]
        answer["cursor"] = {"offset": offset, "limit": limit, "total_count": len(runs)}
        await _answer(send, start.get("status", 200), answer)


_UNREADABLE = object()
PROTO_ROUTES = {"/api/v1/forward_backward"}  # the tinker SDK sends these as protobuf (SkyRL decodes them)


def _parse_body(path: str, headers: dict, raw: bytes):
    """The request's body as a dict (JSON, or the forward_backward proto as SkyRL reads it), None when empty."""
    if not raw:
        return None
    content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
    if path in PROTO_ROUTES and content_type == b"application/x-protobuf":
        from skyrl.tinker.proto_serialization import parse_forward_backward_request

        try:
            if headers.get(b"content-encoding", b"").strip().lower() == b"zstd":
                import zstandard

                raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
            return parse_forward_backward_request(raw)[0]
        except Exception:
            return _UNREADABLE
    try:
        return json.loads(raw)
    except ValueError:
        return _UNREADABLE


def _creates_model(path: str, body) -> bool:
    """create_model, or tinker 0.38's load that names a session instead of a model (rlcli_sdk.create_by_load)."""
    return path == "/api/v1/create_model" or (path == "/api/v1/load_weights" and isinstance(body, dict)
                                               and body.get("model_id") is None and body.get("session_id") is not None)


def _not_found(path: str) -> str:
    """SkyRL's own 404 words for what the route looks up, so a foreign id reads exactly like an absent one."""
    if "retrieve_future" in path:
        return "Future not found"
    if "session" in path and "sampling" not in path:
        return "Session not found"
    if "sampler" in path:
        return "Sampler not found"
    return "Model not found"


async def _answer(send, status: int, payload: dict, extra_headers=None) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


def describe() -> dict:
    """What the capabilities route says about this extension (tenants, not keys)."""
    from skyrl.tinker import api

    routes = sorted(f"{','.join(sorted(getattr(r, 'methods', None) or ['*']))} {r.path}" for r in api.app.routes)
    return {"public": sorted(f"{m} {p}" for m, p in PUBLIC), "checked": "every other request", "routes": routes,
            **_state}


def install(api) -> None:
    """Wrap SkyRL's app in the gate (API process)."""
    file = os.environ.get(TENANTS_FILE_ENV)
    if not file:
        raise RuntimeError(f"rlcli tenants: {TENANTS_FILE_ENV} is not set; `rlcli serve start --tenants` sets it")
    keys = Keys(Path(file), os.environ.get(TENANTS_INTERNAL_ENV) or None)
    api.app.add_middleware(TenantGate, keys=keys, owners=Owners(Path.cwd() / OWNERS_FILE))
    log(f"every request but {sorted(p for _m, p in PUBLIC)} needs a tenant key from {file}")


def fair_pick(candidates: list[tuple], tenant_of, served: dict, take: int = 1) -> tuple[list[tuple], dict[str, int]]:
    """What one engine pass takes of candidates (request_id, model_id, ...) in id order: with several tenants pending,
    each gives at most `take` of its earliest (order within a model kept), the one served longest ago first. Returns
    those and, per model, the smallest request id left for later; updates `served` (tenant -> its last pass)."""
    lanes: dict[str, list[tuple]] = {}
    for item in candidates:
        lanes.setdefault(tenant_of(item[1]), []).append(item)
    if len(lanes) <= 1:
        return list(candidates), {}
    turn = served.get("", 0) + 1
    served[""] = turn  # the pass counter lives under a name no tenant has
    chosen, later = [], {}
    for tenant in sorted(lanes, key=lambda t: (served.get(t, 0), lanes[t][0][0])):
        chosen += lanes[tenant][:take]
        served[tenant] = turn
        for request_id, model_id, *_ in lanes[tenant][take:]:
            later[model_id] = min(later.get(model_id, request_id), request_id)
    return chosen, later
