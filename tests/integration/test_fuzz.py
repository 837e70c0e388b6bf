"""The fuzzer at a bounded, seeded size (benchmarks/fuzz.py; the full run is `make fuzz`): each HTTP surface from its
own OpenAPI schema with a well-behaved client beside it, one test per hand-made case class, and the findings' fixes.

SkyRL's API is the session's server; the endpoint one started over it. The tenant surface's tests are in
test_secrets.py, on its team server (a --tenants server of their own cost one more start), before the full run
whose files are searched for the keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from benchmarks import fuzz, fuzz_cases
from tests.conftest import run_rlcli

pytestmark = [pytest.mark.server, pytest.mark.slow]

EXAMPLES, SEED = 4, 49  # per operation and mode: ~190 requests on SkyRL's ~32 operations
KEY = {"X-API-Key": "tml-self-hosted"}


def must_hold(result: dict) -> None:
    assert result["findings"] == [], result["findings"]


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> Path:
    """A root with a canary folder: the hostile absolute paths point into it; nothing may change there."""
    root = tmp_path_factory.mktemp("fuzz-root")
    (root / "canary").mkdir()
    (root / "canary" / "keep.txt").write_text("canary\n")
    return root


@pytest.fixture(scope="module")
def model_and_session(server):
    return fuzz_cases.a_model(server.url, "tml-self-hosted")


def test_skyrl_api_from_its_schema_beside_a_training_client(server, watched):
    import schemathesis

    home = Path(server.env["RLCLI_HOME"])
    before = fuzz.tree(watched)
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    tally = fuzz.Tally()
    with fuzz.Beside(fuzz.tinker_step(server.url, server.model, "tml-self-hosted")) as beside:
        fuzz.fuzz_schema(schema, server.url, tally, examples=EXAMPLES, seed=SEED)
    body = tally.body()
    assert body["requests"] > 150 and len(body["per_operation"]) > 25, body
    assert body["findings"] == [], body["findings"]
    assert beside.calls > 0 and beside.failures == [], beside.failures
    assert fuzz.healthy(server.url, "/api/v1/healthz") and fuzz.api_pid(home) is not None
    assert fuzz.tree(watched) == before


def test_malformed_protobuf_for_forward_backward(server, model_and_session):
    result = fuzz_cases.protobuf(server.url, KEY, model_and_session[0])
    must_hold(result)
    assert result["sent"] >= 30 and set(result["statuses"]) <= {"400", "404", "413", "415", "422"}, result


def test_wrong_content_types(server):
    result = fuzz_cases.content_types(server.url, KEY)
    must_hold(result)
    assert result["sent"] == 40


def test_truncated_request_streams(server):
    result = fuzz_cases.truncated(server.url, ["/api/v1/create_session", fuzz_cases.FB, "/api/v1/healthz"], rounds=4)
    must_hold(result)
    assert result["statuses"]["200"] == 1  # the whole request after the truncated ones


def test_hostile_paths_and_unicode_names_write_nothing_outside(server, watched, model_and_session):
    before = fuzz.tree(watched)
    result = fuzz_cases.paths_and_names(server.url, KEY, watched, *model_and_session)
    must_hold(result)
    assert result["futures"] > 0 and fuzz.tree(watched) == before
    names = requests.get(f"{server.url}/api/v1/training_runs/{model_and_session[0]}/checkpoints", timeout=60).text
    assert ".." not in names and "canary" not in names


def test_oversized_bodies_are_refused_and_the_api_does_not_grow(server):
    """Regression: each 256 MB body left SkyRL's API ~500 MB larger; over the cap it is now a 413, unread."""
    pid = fuzz.api_pid(Path(server.env["RLCLI_HOME"]))
    json_h = {**KEY, "Content-Type": "application/json"}
    result = fuzz_cases.big_bodies(server.url, pid, 256, [("/api/v1/create_session", json_h),
                                                         (fuzz_cases.FB, {**KEY, "Content-Type": fuzz_cases.PROTO})])
    must_hold(result)
    assert result["statuses"] == {"413": 2}, result
    assert all(m["rss_peak_growth_mb"] < 64 for m in result["memory"].values()), result["memory"]


def test_two_thousand_connections_opened_and_dropped(server):
    result = fuzz_cases.storm(server.url, 2000, "/api/v1/healthz")
    must_hold(result)
    assert result["statuses"]["opened and dropped"] + result["refused_at_connect"] == 2000
    assert result["statuses"]["200"] == 1


def test_int64_inputs_are_one_line_refusals_not_500s(server):
    """Regression (rlcli_guards, docs/upstream/int64-inputs.md): SkyRL answered these with a 500 and a traceback."""
    for request_id in ("", "abc", "9" * 25):
        r = requests.post(server.url + "/api/v1/retrieve_future", json={"request_id": request_id}, timeout=60)
        assert r.status_code == 422 and "future" in r.json()["detail"], r.text
    for query in ("offset=" + "9" * 25, "limit=" + "9" * 25):
        r = requests.get(f"{server.url}/api/v1/training_runs?{query}", timeout=60)
        assert r.status_code == 422, r.text
    assert requests.get(server.url + "/api/v1/training_runs?limit=2", timeout=60).status_code == 200

    r = requests.post(server.url + "/api/v1/load_weights", timeout=60, json={  # rlcli_sdk's request model: was a 500
        "model_id": "model_x", "path": "tinker://model_x/weights/a", "type": "something else"})
    assert r.status_code == 422, r.text


def test_a_sampling_session_from_no_tinker_path_is_refused_at_once(server, model_and_session):
    """Regression: SkyRL filed it, then its GET /samplers/{id} was a 500 the tinker client retried for minutes (an
    endpoint asked for model "tinker://x" hung)."""
    for path in ("tinker://", "/etc/passwd", "tinker://x/a/b/c"):
        r = requests.post(server.url + "/api/v1/create_sampling_session", timeout=60, json={
            "session_id": model_and_session[1], "sampling_session_seq_id": 1, "model_path": path})
        assert r.status_code == 422 and "tinker path" in r.json()["detail"], r.text


@pytest.fixture(scope="module")
def endpoint_url(server, tmp_path_factory):
    from rlcli.server.private import free_port

    capture = tmp_path_factory.mktemp("fuzz-endpoint") / "capture"
    out = run_rlcli("endpoint", "start", "--port", str(free_port()), "--max-tokens", "4", "--capture", str(capture),
                    env=server.env, check=True, timeout=300)
    try:
        yield out.stdout.strip()
    finally:
        run_rlcli("endpoint", "stop", env=server.env, timeout=120)


def test_endpoint_from_its_schema_beside_the_openai_package(endpoint_url, watched):
    import schemathesis

    schema = schemathesis.openapi.from_dict(json.loads(fuzz.ENDPOINT_SCHEMA.read_text()))
    tally = fuzz.Tally()
    with fuzz.Beside(fuzz.openai_step(endpoint_url, "unused")) as beside:
        fuzz.fuzz_schema(schema, endpoint_url, tally, examples=EXAMPLES, seed=SEED)
    body = tally.body()
    assert body["requests"] >= 30 and body["findings"] == [], body
    assert beside.calls > 0 and beside.failures == [], beside.failures
    assert fuzz.healthy(endpoint_url, "/healthz")


def test_endpoint_hand_made_cases(endpoint_url, watched):
    before = fuzz.tree(watched)
    cases = fuzz_cases.endpoint_cases(endpoint_url, watched, connections=500)
    for name, result in cases.items():
        assert result["findings"] == [], (name, result["findings"])
    assert cases["big_bodies"]["statuses"] == {"413": 2}
    assert fuzz.tree(watched) == before and fuzz.healthy(endpoint_url, "/healthz")
