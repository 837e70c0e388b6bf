"""The fuzzer's parts that need no server (benchmarks/fuzz.py): the endpoint's OpenAPI document matches the app's
route table, so the fuzz cannot drift from what the endpoint serves; rlcli_guards' id check; the tally's verdicts."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks import fuzz
from tests.unit.test_warmup_unit import _runtime


class _Renderer:
    def get_stop_sequences(self) -> list[str]:
        return ["<|im_end|>"]


def _routes() -> set[tuple[str, str]]:
    from rlcli.endpoint import app

    built = app.build(app.StopStrings(_Renderer(), None), SimpleNamespace(sampler=None, default_max_tokens=4), "m")
    out = set()
    for route in built.router.routes():
        info = route.resource.get_info()
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD":
            out.add((route.method, path.replace("{address:.+}", "{address}")))
    return out


def test_the_endpoint_schema_names_exactly_the_apps_routes():
    schema = json.loads(fuzz.ENDPOINT_SCHEMA.read_text())
    documented = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    assert documented == _routes()


def test_future_ids_are_decimal_and_fit_64_bits():
    guards = _runtime("rlcli_guards")
    assert guards.bad_future_id("12") is None and guards.bad_future_id("-3") is None
    assert guards.bad_future_id("9" * 18) is None
    for bad in ("", "abc", "9" * 19, "\u0661\u0662", " 1", "1.0"):
        assert guards.bad_future_id(bad), bad


def test_the_tally_finds_500s_tracebacks_and_another_tenants_data():
    t = fuzz.Tally()
    t.judge("a", 422, "no")
    t.judge("a", 500, "Internal Server Error")
    t.judge("b", 503, "Traceback (most recent call last):\n  File")
    t.judge("c", 200, "{}", foreign=True)
    t.judge("d", 200, '{"id": "bob-model"}', secrets=("bob-model",))
    t.judge("e", 404, "bob-model not found", foreign=True, secrets=("bob-model",))
    assert [f["kind"] for f in t.findings] == ["500", "5xx with a traceback", "another tenant's data",
                                               "another tenant's data"]
    assert t.body()["requests"] == 6 and t.body()["statuses"]["200"] == 2


def _through_cap(limit: int, messages: list[dict], headers: list) -> tuple[list[dict], int]:
    """(what the client got, bytes the app read) for a request of `messages` through BodyCap."""
    import asyncio

    guards = _runtime("rlcli_guards")
    sent, read = [], [0]

    async def app(scope, receive, send):  # reads the whole body, as Starlette does, then answers 200
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RuntimeError("client disconnected")
            read[0] += len(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    queue = list(messages)

    async def receive():
        return queue.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(guards.BodyCap(app, limit)({"type": "http", "headers": headers}, receive, send))
    return sent, read[0]


def test_the_body_cap_refuses_a_declared_or_streamed_body_over_it_and_passes_the_rest():
    chunk = {"type": "http.request", "body": b"x" * 10, "more_body": True}
    last = {"type": "http.request", "body": b"x" * 10, "more_body": False}
    sent, read = _through_cap(100, [chunk, last], [(b"content-length", b"20")])
    assert sent[0]["status"] == 200 and read == 20
    sent, read = _through_cap(100, [last], [(b"content-length", b"1000")])
    assert sent[0]["status"] == 413 and read == 0 and b"over" in sent[1]["body"]
    sent, read = _through_cap(100, [chunk] * 20 + [last], [(b"transfer-encoding", b"chunked")])
    assert [m["status"] for m in sent if "status" in m] == [413] and read <= 100


def test_the_endpoint_answers_unrenderable_messages_with_a_400():
    """Regression: a RendererError from the cookbook's chat template was a 500 ("the endpoint failed")."""
    from tinker_cookbook.exceptions import RendererError

    from rlcli.endpoint import app

    answer = app._backend_error("openai", None, RendererError("a tool message needs a tool call before it"))
    assert answer.status == 400 and b"cannot be rendered" in answer.body
