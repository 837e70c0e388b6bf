"""The inference endpoint on the real server, called by the real `openai` and `anthropic` packages.

One endpoint for the module over the session's server, with a private capture folder and a loop folder whose
champion the tests move by hand (as promote and rollback do: a row in the ledger's aliases table).
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlcli.server.private import free_port
from rlcli.server.process import group_members
from tests.conftest import run_rlcli

pytestmark = pytest.mark.server

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.fixture(scope="module")
def sampler_path(server):
    """Sampler weights of a LoRA after one step: what a promoted champion would be."""
    import tinker

    from tests import sdk_scenario

    service = tinker.ServiceClient(base_url=server.url, api_key="tml-self-hosted")
    trainer = service.create_lora_training_client(base_model=server.model, rank=2, seed=0).result()
    trainer.forward_backward([sdk_scenario.datum(tinker)], "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result()
    return trainer.save_weights_for_sampler("endpoint-test").result().path


@pytest.fixture(scope="module")
def endpoint(server, tmp_path_factory):
    root = tmp_path_factory.mktemp("endpoint")
    loop = root / "shop"
    traces = root / "logs"
    traces.mkdir()
    run_rlcli("loop", "init", str(loop), "--traces", str(traces), "--base-url", server.url, env=server.env,
              check=True)
    port = free_port()
    capture = root / "capture"
    env = dict(server.env)
    out = run_rlcli("endpoint", "start", "--port", str(port), "--capture", str(capture), "--loops", str(loop),
                    "--max-tokens", "24", env=env)
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip()
    try:
        yield {"url": url, "loop": loop, "capture": capture, "env": env, "root": root}
    finally:
        run_rlcli("endpoint", "stop", env=env)


def openai_client(endpoint):
    import openai

    return openai.OpenAI(base_url=endpoint["url"] + "/v1", api_key="unused", max_retries=0)


def post(url: str, body: object, key: str | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=120) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_openai_tool_conversation_and_stream(endpoint):
    client = openai_client(endpoint)
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="base", messages=history, tools=[WEATHER],
                                                           max_tokens=16, temperature=0)
    answer = raw.parse()
    assert raw.headers["x-rlcli-exchange-id"] == answer.id and answer.model == "base"
    assert raw.headers["x-rlcli-weights"] == "base"
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert 0 < answer.usage.completion_tokens <= 16
    stream = client.chat.completions.with_raw_response.create(
        model="base", messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=8, stream=True,
        stream_options={"include_usage": True})
    assert stream.headers["x-rlcli-exchange-id"].startswith("chatcmpl-")
    chunks = list(stream.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage.completion_tokens <= 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_anthropic_messages_and_stream(endpoint):
    import anthropic

    client = anthropic.Anthropic(base_url=endpoint["url"], api_key="unused", max_retries=0)
    message = client.messages.create(model="base", max_tokens=12, system="Answer with a number.",
                                     messages=[{"role": "user", "content": "What is 2 + 3?"}])
    assert message.id.startswith("msg_") and message.content[0].type == "text"
    assert message.usage.output_tokens <= 12
    with client.messages.stream(model="base", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as s:
        assert "".join(s.text_stream).strip()
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nobody", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"


def test_n_stop_and_bounds_are_honoured(endpoint):
    client = openai_client(endpoint)
    ask = [{"role": "user", "content": "Count from 1 to 9."}]
    three = client.chat.completions.create(model="base", messages=ask, n=3, max_tokens=12, temperature=1.0, seed=1)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert 3 <= three.usage.completion_tokens <= 36  # the three choices' tokens, each at most 12
    ask = [{"role": "user", "content": "What is 2 + 3?"}]  # greedily answered in a sentence
    free = client.chat.completions.create(model="base", messages=ask, max_tokens=24, temperature=0)
    text = free.choices[0].message.content
    assert len(text) > 12, text
    cut_at = text[8:12]  # a stop string the greedy answer is known to contain
    stopped = client.chat.completions.create(model="base", messages=ask, max_tokens=24, temperature=0, stop=[cut_at])
    assert stopped.choices[0].message.content == text[:text.index(cut_at)]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model": "nobody"}, 404, "is not served here"),
    ({"temperature": -3}, 400, "'temperature' must be"),
    ({"max_tokens": 99999}, 400, "over the model's context"),
    ({"n": 0}, 400, "'n' must be"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, ""),
    ({"messages": [{"role": "user", "content": "word " * 2100}], "max_tokens": 8}, 400, "context"),
])
def test_refusals_answer_the_openai_shape_before_sampling(endpoint, body, status, words):
    full = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    code, answer, headers = post(endpoint["url"] + "/v1/chat/completions", full)
    assert code == status and words in answer["error"]["message"], answer
    assert "x-rlcli-exchange-id" not in {k.lower() for k in headers}
    assert "Traceback" not in json.dumps(answer)


def test_status_lines_name_it(endpoint):
    serve = run_rlcli("serve", "status", env=endpoint["env"])
    assert f"endpoint {endpoint['url']}" in serve.stdout, serve.stdout
    own = run_rlcli("endpoint", "status", env=endpoint["env"])
    assert own.returncode == 0 and "champion -> base" in own.stdout and "loop:shop -> " in own.stdout, own.stdout


def test_errors_without_a_route_or_body(endpoint):
    code, answer, _ = post(endpoint["url"] + "/v1/chat/completions", b"{not json")
    assert code == 400 and "valid JSON" in answer["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(endpoint["url"] + "/v1/embeddings", timeout=10)
    assert e.value.code == 404 and "/v1/chat/completions" in json.loads(e.value.read())["error"]["message"]


def test_the_champion_switches_in_place(endpoint, sampler_path):
    from rlcli.loop.ledger import Champion, opened

    client = openai_client(endpoint)
    ask = {"model": "champion", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
    before = client.chat.completions.with_raw_response.create(**ask)
    assert before.headers["x-rlcli-weights"] == "base" and before.headers["x-rlcli-champion-iteration"] == "0"
    listed = {m.id: m for m in client.models.list().data}
    assert {"base", "champion", "loop:shop"} <= set(listed)
    with opened(endpoint["loop"]) as ledger, ledger.transaction() as db:
        ledger.move_alias(db, Champion(1, sampler_path, None), "promoted by the test")
    after = client.chat.completions.with_raw_response.create(**ask)
    assert after.headers["x-rlcli-weights"] == sampler_path and after.headers["x-rlcli-champion-iteration"] == "1"
    assert after.parse().model == "champion"
    with opened(endpoint["loop"]) as ledger, ledger.transaction() as db:
        ledger.move_alias(db, Champion(0), "rolled back by the test")
    assert client.chat.completions.with_raw_response.create(**ask).headers["x-rlcli-weights"] == "base"
    by_path = client.chat.completions.with_raw_response.create(**{**ask, "model": sampler_path})
    assert by_path.headers["x-rlcli-weights"] == sampler_path


def test_a_champion_whose_model_was_unloaded_is_served_from_its_state(endpoint, server):
    """A loop's promoted candidate is a finished training run: its model is unloaded, its sampler weights with it.
    The endpoint serves it again from the state saved under the same name, instead of failing every request."""
    import tinker

    from rlcli.client import unload_models
    from rlcli.loop.ledger import Champion, opened
    from tests import sdk_scenario

    service = tinker.ServiceClient(base_url=server.url, api_key="tml-self-hosted")
    trainer = service.create_lora_training_client(base_model=server.model, rank=2, seed=1).result()
    trainer.forward_backward([sdk_scenario.datum(tinker)], "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result()
    state = trainer.save_state("gone").result().path  # as the loop's trainers save: state and sampler, one name
    path = trainer.save_weights_for_sampler("gone").result().path
    assert not unload_models(server.url, [trainer.model_id])
    with opened(endpoint["loop"]) as ledger, ledger.transaction() as db:
        ledger.move_alias(db, Champion(2, path, state), "promoted by the test")
    try:
        client = openai_client(endpoint)
        ask = {"model": "champion", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
        for _ in range(2):  # the second from the model the first loaded
            served = client.chat.completions.with_raw_response.create(**ask)
            assert served.headers["x-rlcli-weights"] == path and served.headers["x-rlcli-champion-iteration"] == "2"
            assert served.parse().choices[0].message.content is not None
    finally:
        with opened(endpoint["loop"]) as ledger, ledger.transaction() as db:
            ledger.move_alias(db, Champion(0), "rolled back by the test")


def captured(folder, ids: list[str], within: float = 30) -> None:
    """Wait until the store holds these exchanges: the endpoint's exporter sends its queue every second."""
    from rlcli.endpoint import capture

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if set(ids) <= {r["payload"].get("exchange") for r in capture.read_all(folder)}:
            return
        time.sleep(0.2)
    raise AssertionError(f"the capture store did not get {ids} within {within} s")


def test_capture_feedback_and_the_loop_reading_it(endpoint):
    from rlcli.endpoint import capture

    client = openai_client(endpoint)
    asked, rated = (client.chat.completions.create(model="base", messages=[{"role": "user", "content": ask}],
                                                   max_tokens=48, temperature=0)  # whole answers, not truncated
                    for ask in ("Name a colour.", "Name a fruit."))
    captured(endpoint["capture"], [asked.id, rated.id])
    url = endpoint["url"] + "/v1/feedback"
    assert post(url, {"id": rated.id, "rating": 1})[0] == 200
    assert post(url, {"id": asked.id, "edited": "Blue."})[0] == 200
    code, answer, _ = post(url, {"id": "chatcmpl-nothing", "rating": 1})
    assert code == 404 and "was served" in answer["error"]["message"]
    assert post(url, {"id": asked.id, "rating": 7})[0] == 400
    folder = endpoint["capture"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}
    assert modes and all(m & 0o077 == 0 for m in modes.values()), modes
    rows = capture.read_all(folder)
    exchanges = [r["payload"] for r in rows if r["kind"] == capture.EXCHANGE]
    mine = next(e for e in exchanges if e["exchange"] == rated.id)
    assert mine["samples"][0]["tokens"] and len(mine["samples"][0]["logprobs"]) == len(mine["samples"][0]["tokens"])
    assert mine["samples"][0]["prompt_tokens"] and mine["answerer"]["weights"] == "base"
    out = endpoint["root"] / "drained"
    first = capture.drain(folder, out)
    convs = [json.loads(x) for x in first.read_text().splitlines()]
    assert len(convs) == len(exchanges)  # every exchange once, the edited one with its better answer
    by_id = {c["exchange"]: c for c in convs}
    assert by_id[rated.id]["score"] == 1.0
    assert by_id[asked.id]["messages"][-1]["content"] == "Blue."
    from rlcli.loop.data import pairs_beside

    pairs = [json.loads(x) for x in pairs_beside(first).read_text().splitlines()]
    assert pairs == [{"messages": [{"role": "user", "content": "Name a colour."}],
                      "chosen": {"role": "assistant", "content": "Blue."},
                      "rejected": {"role": "assistant", "content": asked.choices[0].message.content},
                      "exchange": asked.id}]
    assert capture.drain(folder, out) is None  # nothing twice
    assert post(url, {"id": rated.id, "rating": -1})[0] == 200  # late feedback: the conversation again, rated
    late = [json.loads(x) for x in capture.drain(folder, out).read_text().splitlines()]
    assert [(c["exchange"], c["score"]) for c in late] == [(rated.id, 0.5)]


def test_a_loop_ingests_the_capture_once(endpoint, server, tmp_path):
    client = openai_client(endpoint)
    sent = [client.chat.completions.create(model="base", messages=[{"role": "user", "content": f"What is {i} + 1?"}],
                                           max_tokens=6).id for i in range(3)]
    captured(endpoint["capture"], sent)
    loop = tmp_path / "served"
    run_rlcli("loop", "init", str(loop), "--traces", f"capture:{endpoint['capture']}", "--train", "sft", "--steps",
              "2", "--base-url", server.url, env=server.env, check=True)
    assert 'format = "messages"' in (loop / "loop.toml").read_text()
    from rlcli.endpoint import capture
    from rlcli.loop import data
    from rlcli.loop.ledger import opened
    from rlcli.loop.settings import read

    with opened(loop) as ledger:
        files = data.new_files(ledger, read(loop), loop)
    served = sum(1 for r in capture.read_all(endpoint["capture"]) if r["kind"] == capture.EXCHANGE)
    lines = sum(len(p.read_text().splitlines()) for p, _ in files)
    assert len(files) == 1 and lines >= served  # every exchange, and the feedback's repeats
    with opened(loop) as ledger:
        assert data.new_files(ledger, read(loop), loop) == files  # drained once; the same file until ingested


def test_endpoint_stop_ends_its_store(endpoint, server, tmp_path):
    port = free_port()
    env = dict(server.env, RLCLI_HOME=str(tmp_path / "home"))
    os.makedirs(tmp_path / "home", mode=0o700)
    out = run_rlcli("endpoint", "start", "--port", str(port), "--base-url", server.url, "--model", server.model,
                    "--name", "other", env=env)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "home" / "endpoints" / "other.json").read_text())
    members = group_members(rec["pid"])
    assert len(members) == 2  # the endpoint and its store daemon, in the endpoint's own group
    assert run_rlcli("endpoint", "stop", "--name", "other", env=env).returncode == 0
    assert group_members(rec["pid"]) == []


def test_weights_whose_model_was_unloaded_are_served_again(endpoint, server):
    """A finished run unloads its model; its saved weights still answer (the endpoint loads the state saved with
    them, once, however many requests wait)."""
    import concurrent.futures

    import tinker

    from rlcli.client import unload_models
    from tests import sdk_scenario

    service = tinker.ServiceClient(base_url=server.url, api_key="tml-self-hosted")
    trainer = service.create_lora_training_client(base_model=server.model, rank=2, seed=1).result()
    trainer.forward_backward([sdk_scenario.datum(tinker)], "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result()
    trainer.save_state("finished").result()
    path = trainer.save_weights_for_sampler("finished").result().path
    assert unload_models(server.url, [trainer.model_id]) == []
    client = openai_client(endpoint)
    client.chat.completions.create(model="base", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    sessions = server_sessions(server)  # the endpoint's own session is open by now
    ask = {"model": path, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: client.chat.completions.with_raw_response.create(**ask), range(4)))
    assert all(a.headers["x-rlcli-weights"] == path for a in answers)
    log = Path(endpoint["env"]["RLCLI_HOME"]) / "endpoints" / "default.log"
    assert log.read_text().count(f"{path}: its model is unloaded") == 1
    # the reload went through the endpoint's session: a client per reload kept a session, its heartbeat and its
    # connections open for the endpoint's life
    assert server_sessions(server) == sessions


def server_sessions(server) -> int:
    import sqlite3

    db = server.home / "servers" / "default" / "tinker.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute("SELECT count(*) FROM sessions").fetchone()[0]


@pytest.mark.slow
def test_feedback_trains_the_next_iteration(endpoint, server, tmp_path):
    """Served answers and their feedback, drained by a loop: a rating is the rl stage's verdict, a correction the
    dpo stage's pair (and the conversation sft and the gate learn from)."""
    client = openai_client(endpoint)
    url = endpoint["url"] + "/v1/feedback"
    served = []
    for i in range(12):
        answer = client.chat.completions.create(model="base", max_tokens=48, temperature=0,
                                                messages=[{"role": "user", "content": f"What is {i} + {i}?"}])
        served.append(answer.id)
        right = str(2 * i) in (answer.choices[0].message.content or "")
        body = {"id": answer.id, "rating": 1} if right else {"id": answer.id, "rating": -1, "edited": str(2 * i)}
        assert post(url, body)[0] == 200
    captured(endpoint["capture"], served)
    loop = tmp_path / "learns"
    run_rlcli("loop", "init", str(loop), "--traces", f"capture:{endpoint['capture']}", "--train", "dpo,rl",
              "--reward", "verdict", "--match", "number", "--steps", "2", "--batch-size", "4", "--group-size", "2",
              "--max-tokens", "8", "--eval-limit", "4", "--base-url", server.url, env=server.env, check=True)
    proc = run_rlcli("loop", "run", str(loop), "--once", env=server.env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from rlcli.loop.ledger import opened

    with opened(loop) as ledger:
        ingest = ledger.stage(1, "ingest")
        kinds = [r["kind"] for r in ledger.runs(1)]
    assert ingest["pairs"] >= 1 and "preference pairs" in proc.stderr, proc.stderr[-2000:]
    assert kinds == ["dpo", "rl"], proc.stderr[-2000:]
