"""runtime/rlcli_sqlite.py on a real server: with RLCLI_SQLITE_INLINE=1 the API's statements run inline, and
its answers are the stock path's.

A server of this module's own with the inline path, compared against the session's server (the same extensions,
SkyRL's aiosqlite path: rlcli_sqlite is opt-in): the same forward gives the same logprobs, a request the engine
fails reports the same error, and an unknown future id is a 404 on both.
"""

from __future__ import annotations

import json
import urllib.error

import pytest

from rlcli.client import request_json, unload_model
from rlcli.server.private import private_server
from tests.conftest import shared_compile_cache, shared_server_venv

pytestmark = pytest.mark.server

TOKENS = list(range(5, 21))


def caps(url: str) -> dict:
    return request_json(f"{url}/api/v1/rlcli/capabilities")


def forward_logprobs(url: str, model: str) -> list[float]:
    import tinker

    client = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model=model, rank=4, seed=0)
    try:
        datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
                             loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)})
        out = client.forward([datum], "cross_entropy").result()
        return out.loss_fn_outputs[0]["logprobs"].tolist()
    finally:
        unload_model(url, client.model_id)


def http_error(url: str, payload: dict) -> tuple[int, str]:
    try:
        answer = request_json(url, payload, timeout=120)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("detail", "")
    raise AssertionError(f"{url} answered {answer}, not an error")


def failed_sample(url: str) -> tuple[int, str]:
    """A sample the API accepts and the engine fails (a base model it does not serve): the future's error."""
    future = request_json(f"{url}/api/v1/asample", {
        "base_model": "no-such-model", "prompt": {"chunks": [{"type": "encoded_text", "tokens": TOKENS[:4]}]},
        "sampling_params": {"max_tokens": 2}})
    return http_error(f"{url}/api/v1/retrieve_future", {"request_id": future["request_id"]})


@pytest.fixture(scope="module")
def inline_server(tmp_path_factory, embedded_model):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RLCLI_SQLITE_INLINE", "1")  # private_server passes this environment to the server
        with private_server(embedded_model, "--slots", "2", venv=shared_server_venv(), timeout=900,
                            home=shared_compile_cache(tmp_path_factory.mktemp("rlcli-inline-home"))) as srv:
            yield srv


def test_the_api_runs_its_sqlite_statements_inline_only_when_asked(server, inline_server, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    assert caps(server.url)["rlcli_sqlite"]["db_path"] == "stock"  # opt-in: the default server is stock
    before = caps(inline_server.url)["rlcli_sqlite"]
    assert before["db_path"] == "inline", before
    forward_logprobs(inline_server.url, inline_server.model)
    after = caps(inline_server.url)["rlcli_sqlite"]
    assert after["statements"] > before["statements"], (before, after)


def test_answers_are_the_stock_path_answers(server, inline_server, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    stock_url = server.url
    ours, stock = forward_logprobs(inline_server.url, server.model), forward_logprobs(stock_url, server.model)
    assert len(ours) == len(stock) == len(TOKENS) - 1
    assert ours == pytest.approx(stock, abs=1e-5)
    ours_error, stock_error = failed_sample(inline_server.url), failed_sample(stock_url)
    assert ours_error == stock_error and ours_error[0] == 400 and "no-such-model" in ours_error[1], ours_error
    unknown = {"request_id": "987654321"}
    assert http_error(f"{inline_server.url}/api/v1/retrieve_future", unknown) == (404, "Future not found")
    assert http_error(f"{stock_url}/api/v1/retrieve_future", unknown) == (404, "Future not found")
