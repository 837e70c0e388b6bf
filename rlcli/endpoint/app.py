"""The endpoint's aiohttp app: tinker-cookbook's capture proxy (`make_app`) with rlcli's routes and middleware.

The cookbook's handlers do the APIs' work (parse the request, render the prompt, sample, parse the reply,
shape the JSON or the stream). rlcli reaches them only through the proxy's seams: the sampling client and the
renderer it is given (`ProxyDeps`), routes and middleware added to the app it returns, and the capture scope.
- RoutingSampler (the sampling client) answers each request with the weights its `model` named (models.py),
  with the client of the request's key (tenants), records the sampled tokens for the exchange, checks the
  context, and makes client `stop` strings work with renderers that stop on token ids: SkyRL stops on the
  renderer's end token, and the reply is cut at the first client stop afterwards.
- The middleware: the key (401), the model (404 before any sample), `temperature` and `max_tokens` bounds,
  `n` (the cookbook samples one choice: n requests run at once, which the server batches, merged into one
  response), every error in its API's shape with one line and no traceback, the exchange id and answering
  weights as headers, and the exchange's capture record.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rlcli.client import NOT_LOADED
from rlcli.endpoint import capture
from rlcli.endpoint.models import Answerer, Models, UnknownModel
from rlcli.slot_wait import ENDPOINT_WAIT_S, NoFreeSlot, load_state

log = logging.getLogger("rlcli.endpoint")
CHAT_PATHS = ("/v1/chat/completions", "/v1/messages")
MAX_N = 16
HELD = 2  # models the endpoint loads to serve weights whose run's model is gone
HEADER_EXCHANGE, HEADER_MODEL, HEADER_WEIGHTS, HEADER_ITERATION = (
    "x-rlcli-exchange-id", "x-rlcli-model", "x-rlcli-weights", "x-rlcli-champion-iteration")
_EXCHANGE_KEY = "rlcli_exchange"


class ContextOverflow(Exception):
    pass


@dataclass
class Exchange:
    """One request's state, shared by the middleware and the sampler through a contextvar."""

    id: str
    api: str
    answerer: Answerer
    key: str | None
    samples: dict[int, dict[str, Any]] = field(default_factory=dict)


_exchange: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar("rlcli_exchange", default=None)
_choice: contextvars.ContextVar[int] = contextvars.ContextVar("rlcli_choice", default=0)


@dataclass
class _Sequence:
    tokens: list[int]
    stop_reason: str | None
    logprobs: list[float] | None


@dataclass
class _Response:
    sequences: list[_Sequence]


class StopStrings:
    """The renderer the proxy is given: the real one, whose token-id stops it reports as their text, so the proxy
    lets a client add its own stop strings (it refuses them beside token ids). RoutingSampler maps the text back
    to the ids before SkyRL sees them."""

    def __init__(self, renderer: Any, tokenizer: Any):
        self._renderer, self._tokenizer = renderer, tokenizer
        stops = renderer.get_stop_sequences()
        self.ids: dict[str, int] = {}
        if stops and isinstance(stops[0], int):
            self.ids = {tokenizer.decode([t]): t for t in stops}

    def get_stop_sequences(self) -> list[str] | list[int]:
        return list(self.ids) if self.ids else self._renderer.get_stop_sequences()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._renderer, name)


class RoutingSampler:
    """The proxy's sampling client (its protocol: `sample_async(prompt, num_samples, sampling_params)`)."""

    def __init__(self, models: Models, base_url: str, renderer: StopStrings, tokenizer: Any,
                 context: int | None, default_key: str):
        self.models, self.base_url, self.renderer, self.tokenizer = models, base_url, renderer, tokenizer
        self.context, self.default_key = context, default_key
        self._services: dict[str, Any] = {}
        self._services_lock = threading.Lock()  # reloads make theirs in a worker thread
        self._clients: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future] = {}
        self._reloading: dict[tuple[str, str], asyncio.Future] = {}
        self._held: OrderedDict[tuple[str, str], str] = OrderedDict()  # weights reloaded -> the model holding them
        self.slot_wait_s = ENDPOINT_WAIT_S  # a reload's wait for a free LoRA slot: a trainer's end frees one

    async def _once(self, waiting: dict, slot: tuple[str, str], make: Any) -> Any:
        """`make()` once per slot, however many requests wait for it: they all get its result or its error."""
        if slot in waiting:
            return await asyncio.shield(waiting[slot])
        future = asyncio.get_running_loop().create_future()
        waiting[slot] = future
        try:
            made = await make()
            future.set_result(made)
            return made
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiting requests get it, nobody is told it was never read
            raise
        finally:
            del waiting[slot]

    def _service(self, key: str) -> Any:
        """One tinker ServiceClient per key for the endpoint's life, for sampling and reloads alike: each holds a
        session with its heartbeat and its HTTP connections, which a dropped client never gave back (the soak's
        endpoint gained descriptors with every reload while each made a client of its own)."""
        import tinker

        with self._services_lock:
            service = self._services.get(key)
            if service is None:
                service = self._services[key] = tinker.ServiceClient(base_url=self.base_url, api_key=key)
            return service

    async def client(self, answerer: Answerer, key: str | None) -> Any:
        key = key or self.default_key
        slot = (key, answerer.weights)
        if slot in self._clients:
            self._clients.move_to_end(slot)
            return self._clients[slot]

        async def make() -> Any:
            service = self._service(key)
            if answerer.sampler_path:
                made = await service.create_sampling_client(model_path=answerer.sampler_path)
            else:
                made = await service.create_sampling_client(base_model=self.models.base_model)
            self._clients[slot] = made
            while len(self._clients) > 64:
                self._clients.popitem(last=False)
            return made

        return await self._once(self._pending, slot, make)

    async def reload(self, answerer: Answerer, key: str | None, stale: Any) -> Any:
        """Weights whose run's model is unloaded (a finished run frees its slot; SkyRL samples a checkpoint only
        while its model is loaded): their training state loaded into a model the endpoint holds, its weights saved
        for the sampler. Requests waiting on the same weights share one reload; at most HELD such models are kept
        (the least recently used is unloaded: the slots are the trainers' too)."""
        key = key or self.default_key
        slot = (key, answerer.weights)
        if self._clients.get(slot) is not stale:  # another request reloaded them meanwhile
            return await self.client(answerer, key)

        async def make() -> Any:
            made, model_id = await asyncio.to_thread(self._load_state, answerer, key)
            self._clients[slot] = made
            self._held[slot] = model_id
            while len(self._held) > HELD:
                old, old_model = self._held.popitem(last=False)
                self._clients.pop(old, None)
                await asyncio.to_thread(self._unload, old_model, old[0])
            return made

        return await self._once(self._reloading, slot, make)

    def _load_state(self, answerer: Answerer, key: str) -> tuple[Any, str]:
        from rlcli.client import parse_tinker_path

        run, _, name = parse_tinker_path(answerer.sampler_path or "")
        state = answerer.state_path or f"tinker://{run}/weights/{name}"
        log.info("%s: its model is unloaded; loading %s to serve it", answerer.sampler_path, state)
        trainer = load_state(self._service(key), state, self.base_url, self.slot_wait_s)
        return trainer.save_weights_and_get_sampling_client().result(), trainer.model_id

    def _unload(self, model_id: str, key: str) -> None:
        from rlcli.client import request_json

        try:
            request_json(f"{self.base_url}/api/v1/unload_model", {"model_id": model_id}, timeout=10,
                         headers={"X-API-Key": key})
        except OSError as e:  # the server frees it when it stops, or the next unload says why
            log.warning("could not unload %s: %s", model_id, e)

    def unload_all(self) -> None:
        """At shutdown: free the slots of the models the endpoint loaded."""
        for (key, _), model_id in self._held.items():
            self._unload(model_id, key)
        self._held.clear()

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        exchange = _exchange.get()
        if exchange is None:
            raise RuntimeError("a sample outside a request")
        if self.context and prompt.length + (sampling_params.max_tokens or 0) > self.context:
            raise ContextOverflow(f"the prompt is {prompt.length} tokens and max_tokens {sampling_params.max_tokens}: "
                                  f"together over the model's context of {self.context} tokens; shorten the "
                                  "conversation or ask for fewer tokens")
        client_stops: list[str] = []
        stop = sampling_params.stop
        if stop and isinstance(stop[0], str) and self.renderer.ids:
            client_stops = [s for s in stop if s not in self.renderer.ids]
            sampling_params = sampling_params.model_copy(update={"stop": list(self.renderer.ids.values())})
        sampler = await self.client(exchange.answerer, exchange.key)
        try:
            response = await sampler.sample(prompt=prompt, num_samples=num_samples, sampling_params=sampling_params)
        except Exception as e:  # tinker raises its own classes; the server's reason is in the message
            if NOT_LOADED not in str(e) or not exchange.answerer.sampler_path:
                raise
            sampler = await self.reload(exchange.answerer, exchange.key, sampler)
            response = await sampler.sample(prompt=prompt, num_samples=num_samples, sampling_params=sampling_params)
        seqs = [_Sequence(list(s.tokens), s.stop_reason, list(s.logprobs) if s.logprobs else None)
                for s in response.sequences]
        seqs = [self._cut(s, client_stops) for s in seqs]
        exchange.samples[_choice.get()] = {"prompt_tokens": prompt.to_ints(), "tokens": seqs[0].tokens,
                                           "logprobs": seqs[0].logprobs, "stop_reason": seqs[0].stop_reason}
        return _Response(seqs)

    def _cut(self, seq: _Sequence, stops: list[str]) -> _Sequence:
        """The sequence up to and including the token where a client stop string first appears; the proxy
        finds the string in the text and cuts it there."""
        if not stops or not any(s in self.tokenizer.decode(seq.tokens) for s in stops):
            return seq
        for i in range(1, len(seq.tokens) + 1):
            if any(s in self.tokenizer.decode(seq.tokens[:i]) for s in stops):
                return _Sequence(seq.tokens[:i], "stop", seq.logprobs[:i] if seq.logprobs else None)
        return seq


def error(api: str, status: int, message: str, kind: str = "invalid_request_error",
          code: str | None = None) -> web.Response:
    """One error in the API's own shape."""
    if api == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


def api_of(path: str) -> str:
    return "anthropic" if path.rstrip("/").endswith("/v1/messages") else "openai"


def presented_key(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key is None and request.headers.get("Authorization", "").startswith("Bearer "):
        key = request.headers["Authorization"].removeprefix("Bearer ").strip()
    return key or None


@dataclass
class Settings:
    models: Models
    sampler: RoutingSampler
    tenants: Any  # TenantKeys (serving.py): `known(key)`; None: no keys checked
    redact: bool
    sink: Any  # the cookbook's CaptureExporter over the store (None: no capture)
    default_max_tokens: int
    recent: OrderedDict[str, None] = field(default_factory=OrderedDict)  # exchange ids feedback may name


_SETTINGS = web.AppKey("rlcli_settings", Settings)


def _check_body(api: str, body: dict[str, Any], context: int | None) -> str | None:
    """What is wrong with the body's sampling values (None: nothing), before any sample."""
    t = body.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 2):
        return "'temperature' must be a number from 0 to 2"
    for key in ("max_tokens", "max_completion_tokens"):
        m = body.get(key)
        if m is not None and context and isinstance(m, int) and not isinstance(m, bool) and m > context:
            return f"'{key}' {m} is over the model's context of {context} tokens"
    n = body.get("n")
    if n is not None and (api != "openai" or isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N):
        return f"'n' must be a whole number from 1 to {MAX_N}"
    return None


@web.middleware
async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    api = api_of(request.path)
    s = request.app[_SETTINGS]
    try:
        if request.path not in ("/healthz",):
            key = presented_key(request)
            if s.tenants is not None:
                if key is None or not s.tenants.known(key):
                    return error(api, 401, "missing or unknown API key: send a tenant's key (`rlcli tenant add "
                                 "NAME` makes one) as `Authorization: Bearer KEY` or `x-api-key`",
                                 "authentication_error")
            request["rlcli_key"] = key if s.tenants is not None else None
        if request.method != "POST" or not request.path.endswith(CHAT_PATHS):
            return await handler(request)
        return await _chat(request, handler, api, s)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error(api, e.status, f"{request.method} {request.path}: {e.reason}; this endpoint serves POST "
                     "/v1/chat/completions, POST /v1/messages, GET /v1/models and POST /v1/feedback",
                     "not_found_error" if e.status == 404 else "invalid_request_error")
    except ContextOverflow as e:
        return error(api, 400, str(e))
    except Exception as e:  # noqa: BLE001 - every failure becomes one line in the API's shape
        return _backend_error(api, request, e)


def _backend_error(api: str, request: web.Request, e: Exception) -> web.Response:
    import tinker
    from tinker_cookbook.exceptions import RendererError

    if isinstance(e, RendererError):  # messages the model's chat template cannot take (a 500 before: the fuzzer)
        return error(api, 400, f"these messages cannot be rendered for this model: {e}")

    if isinstance(e, tinker.APIConnectionError | ConnectionError):
        return error(api, 503, f"the training server at {request.app[_SETTINGS].sampler.base_url} does not "
                     "answer; start it (`rlcli serve start`) and retry", "api_error")
    if isinstance(e, tinker.NotFoundError):
        return error(api, 404, "these weights are not found on the training server, or this key may not "
                     "sample them", "not_found_error", "model_not_found")
    if isinstance(e, NoFreeSlot):  # the server is full for now: a client may retry later
        return error(api, 503, f"the training server cannot serve these weights now: {e}", "api_error")
    if isinstance(e, tinker.BadRequestError | tinker.UnprocessableEntityError):  # a 422: a model name that is no
        return error(api, 400, f"the training server refused the request: {e}")  # weights' path (a 500 before)
    if isinstance(e, tinker.AuthenticationError | tinker.PermissionDeniedError):
        return error(api, 401, "the training server refused this key", "authentication_error")
    log.exception("request %s failed", request.path)
    return error(api, 500, f"the endpoint failed on this request ({type(e).__name__}); its log has the details",
                 "api_error")


async def _chat(request: web.Request, handler: Any, api: str, s: Settings) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        body = await request.json()
    except ValueError:
        return error(api, 400, "the request body must be valid JSON")
    if not isinstance(body, dict):
        return error(api, 400, "the request body must be a JSON object")
    if problem := _check_body(api, body, s.sampler.context):
        return error(api, 400, problem)
    try:
        answerer = s.models.resolve(body.get("model") if isinstance(body.get("model"), str) else None)
    except UnknownModel as e:
        return error(api, 404, f"model {str(e)!r} is not served here; GET /v1/models lists the names",
                     "not_found_error", "model_not_found")
    exchange = Exchange(capture.new_exchange_id(api), api, answerer, request.get("rlcli_key"))
    request[_EXCHANGE_KEY] = exchange
    token = _exchange.set(exchange)
    from tinker_cookbook.capture import capture as capture_scope

    try:
        with capture_scope(run_id=capture.RUN, exchange=exchange.id, weights=answerer.weights):
            n = body.get("n") or 1
            if n > 1:
                response = await _fan_out(request, handler, body, n)
            else:
                response = await handler(request)
    finally:
        _exchange.reset(token)
    if response.status == 200:
        answer = None
        if isinstance(response, web.Response) and response.body is not None:
            answer = _relabel(response, exchange)
        _record(s, exchange, body, answer, started)
    return response


def _relabel(response: web.Response, exchange: Exchange) -> dict[str, Any]:
    """The non-streamed body names the exchange id (what feedback names) and the model as asked."""
    data = json.loads(response.body)
    data["id"] = exchange.id
    data["model"] = exchange.answerer.name
    response.body = json.dumps(data).encode()
    return data


async def _fan_out(request: web.Request, handler: Any, body: dict[str, Any], n: int) -> web.StreamResponse:
    """n choices: the cookbook's handler n times at once (one choice each, streamed or not: merged here)."""
    one = json.dumps({k: v for k, v in body.items() if k not in ("n", "stream", "stream_options")}).encode()

    async def choice(i: int) -> web.StreamResponse:
        _choice.set(i)
        return await handler(_with_body(request, one))

    answers = await asyncio.gather(*(choice(i) for i in range(n)))
    bad = next((a for a in answers if a.status != 200), None)
    if bad is not None:
        return bad
    datas = [json.loads(a.body) for a in answers]
    merged = dict(datas[0])
    merged["choices"] = [{**d["choices"][0], "index": i} for i, d in enumerate(datas)]
    merged["usage"] = {"prompt_tokens": datas[0]["usage"]["prompt_tokens"],
                       "completion_tokens": sum(d["usage"]["completion_tokens"] for d in datas)}
    merged["usage"]["total_tokens"] = merged["usage"]["prompt_tokens"] + merged["usage"]["completion_tokens"]
    if not body.get("stream"):
        return web.json_response(merged)
    return await _stream_choices(request, merged, bool((body.get("stream_options") or {}).get("include_usage")))


def _with_body(request: web.Request, body: bytes) -> web.Request:
    """A copy of the request whose body is `body`: aiohttp keeps a read body in `_read_bytes` (a clone
    refuses to be made while it is set, so it is set aside for the clone)."""
    kept, request._read_bytes = request._read_bytes, None
    try:
        clone = request.clone()
    finally:
        request._read_bytes = kept
    clone._read_bytes = body
    return clone


async def _stream_choices(request: web.Request, merged: dict[str, Any], usage: bool) -> web.StreamResponse:
    base = {k: merged[k] for k in ("id", "object", "created", "model") if k in merged}
    base["object"] = "chat.completion.chunk"
    chunks = []
    for c in merged["choices"]:
        msg, i = c["message"], c["index"]
        chunks.append({"index": i, "delta": {"role": "assistant", "content": msg.get("content") or ""},
                       "finish_reason": None})
        if msg.get("tool_calls"):
            chunks.append({"index": i, "delta": {"tool_calls": [{"index": j, **t} for j, t in
                                                                enumerate(msg["tool_calls"])]},
                           "finish_reason": None})
        chunks.append({"index": i, "delta": {}, "finish_reason": c["finish_reason"]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for c in chunks:
        await resp.write(f"data: {json.dumps({**base, 'choices': [c]})}\n\n".encode())
    if usage:
        await resp.write(f"data: {json.dumps({**base, 'choices': [], 'usage': merged['usage']})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _record(s: Settings, exchange: Exchange, body: dict[str, Any], answer: dict[str, Any] | None,
            started: float) -> None:
    """The exchange into the capture store's queue (the exporter sends it from its own thread). answer: the
    non-streamed body; a streamed one is rebuilt from the sampled tokens."""
    s.recent[exchange.id] = None
    while len(s.recent) > 100_000:
        s.recent.popitem(last=False)
    if s.sink is None:
        return
    if answer is None:
        answer = _rebuilt(exchange, s.sampler.renderer)
    a = exchange.answerer
    record = capture.exchange_record(
        exchange.id, exchange.api, body, answer,
        {"name": a.name, "weights": a.weights, "iteration": a.iteration},
        [exchange.samples[i] for i in sorted(exchange.samples)], s.redact)
    record["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
    s.sink.enqueue(record)


def _rebuilt(exchange: Exchange, renderer: Any) -> dict[str, Any]:
    """A streamed answer in its API's non-streamed shape, from the sampled tokens (the stream itself is
    written by the cookbook's handler and not kept)."""
    messages = []
    for i in sorted(exchange.samples):
        message, _ = renderer.parse_response(exchange.samples[i]["tokens"])
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                "arguments": c.function.arguments}}
                 for c in message.get("tool_calls") or []]
        messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
    if exchange.api == "anthropic":
        m = messages[0] if messages else {"content": ""}
        blocks = [{"type": "text", "text": m["content"]}]
        blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                    "input": _json_or_raw(c["function"]["arguments"])} for c in m.get("tool_calls", [])]
        return {"id": exchange.id, "type": "message", "role": "assistant", "content": blocks, "streamed": True}
    return {"id": exchange.id, "object": "chat.completion", "streamed": True,
            "choices": [{"index": i, "message": m} for i, m in enumerate(messages)]}


def _json_or_raw(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"_raw_arguments": text}


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Every chat response, streamed ones too, names its exchange and the weights that answered."""
    exchange = request.get(_EXCHANGE_KEY)
    if exchange is None or response.status != 200:  # a refusal served nothing
        return
    a = exchange.answerer
    response.headers[HEADER_EXCHANGE] = exchange.id
    response.headers[HEADER_MODEL] = a.name
    response.headers[HEADER_WEIGHTS] = a.weights
    if a.iteration is not None:
        response.headers[HEADER_ITERATION] = str(a.iteration)


async def list_models(request: web.Request) -> web.Response:
    s = request.app[_SETTINGS]
    rows = await asyncio.to_thread(s.models.listing)
    return web.json_response({"object": "list", "data": [
        {"id": r["id"], "object": "model", "created": 0, "owned_by": "rlcli", "weights": r["weights"],
         **({"champion_iteration": r["iteration"]} if r.get("iteration") is not None else {})} for r in rows]})


async def feedback(request: web.Request) -> web.Response:
    s = request.app[_SETTINGS]
    try:
        body = await request.json()
        fb = capture.check_feedback(body)
    except ValueError as e:
        return error("openai", 400, str(e) if not str(e).startswith("Expecting") else "the body must be JSON")
    if fb["exchange"] not in s.recent:
        return error("openai", 404, f"no response {fb['exchange']!r} was served by this endpoint (feedback names "
                     "the response's id or its x-rlcli-exchange-id header)", "not_found_error")
    if s.sink is None:
        return error("openai", 409, "this endpoint records nothing (--no-record): feedback has nowhere to go")
    record = capture.feedback_record(fb, s.redact)
    s.sink.enqueue(record)
    await asyncio.to_thread(s.sink.force_flush, 10.0)  # stored before the answer says so
    return web.json_response({"id": record["event_id"], "exchange": fb["exchange"], "stored": True})


def build(deps_renderer: StopStrings, settings: Settings, model_label: str) -> web.Application:
    from tinker_cookbook.capture.proxy.app import ProxyDeps, make_app

    deps = ProxyDeps(renderer=deps_renderer, sampling_client=settings.sampler, model_label=model_label,
                     default_max_tokens=settings.default_max_tokens)
    app = make_app(deps, auth_token=None)
    app.middlewares.append(middleware)
    app[_SETTINGS] = settings
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/feedback", feedback)
    app.on_response_prepare.append(on_prepare)
    return app
