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
