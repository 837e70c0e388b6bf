"""The endpoint's pieces without a server: feedback bodies, request checks, names, capture records, the drain.

The drain runs on a real capture store file (the cookbook's CaptureDB), written here as the endpoint's exporter
writes it; the endpoint against the real server is tests/integration/test_endpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcli.endpoint import app, capture
from rlcli.endpoint.models import Models, UnknownModel, parse_pairs
from rlcli.errors import UsageError
from rlcli.loop.data import pairs_beside


def test_feedback_bodies():
    assert capture.check_feedback({"id": "chatcmpl-1", "rating": 1}) == {"exchange": "chatcmpl-1", "rating": 1}
    assert capture.check_feedback({"id": "m", "edited": "Blue.", "comment": "c"})["edited"] == "Blue."
    for bad, words in [([], "JSON object"), ({"rating": 1}, "'id'"), ({"id": "x"}, "give a 'rating'"),
                       ({"id": "x", "rating": 2}, "from -1"), ({"id": "x", "rating": True}, "from -1"),
                       ({"id": "x", "edited": 3}, "must be a string"), ({"id": "x", "stars": 5}, "unknown")]:
        with pytest.raises(ValueError, match=words):
            capture.check_feedback(bad)


@pytest.mark.parametrize(("api", "body", "words"), [
    ("openai", {"temperature": -0.1}, "temperature"), ("openai", {"temperature": "hot"}, "temperature"),
    ("openai", {"max_tokens": 5000}, "context"), ("openai", {"max_completion_tokens": 4096}, "context"),
    ("openai", {"n": 17}, "'n'"), ("openai", {"n": True}, "'n'"), ("anthropic", {"n": 2}, "'n'"),
])
def test_bodies_refused_before_sampling(api, body, words):
    assert words in app._check_body(api, body, 2048)


def test_bodies_taken():
    assert app._check_body("openai", {"temperature": 2, "max_tokens": 2048, "n": 16}, 2048) is None
    assert app._check_body("openai", {"max_tokens": 99999}, None) is None  # no known context: the server decides


def test_errors_in_each_apis_shape():
    openai = json.loads(app.error("openai", 404, "no", "not_found_error", "model_not_found").body)
    assert openai == {"error": {"message": "no", "type": "not_found_error", "param": None, "code": "model_not_found"}}
    assert json.loads(app.error("anthropic", 400, "bad").body) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert app.api_of("/v1/messages") == "anthropic" and app.api_of("/r/run/x/v1/messages") == "anthropic"
    assert app.api_of("/v1/chat/completions") == "openai" and app.api_of("/v1/models") == "openai"


def _loop(folder: Path, moves: list[tuple[int, str | None]]) -> Path:
    from rlcli.loop.ledger import Champion, opened

    folder.mkdir()
    with opened(folder) as ledger:
        for iteration, path in moves:
            with ledger.transaction() as db:
                ledger.move_alias(db, Champion(iteration, path, path and path + "-state"), "test")
    return folder


def test_names_resolve_per_request(tmp_path):
    shop = _loop(tmp_path / "shop", [])
    models = Models("/m/base", parse_pairs("v1=tinker://r/sampler_weights/a", "--models"), [shop])
    assert models.resolve(None).weights == "base" and models.resolve("/m/base").weights == "base"
    assert models.resolve("v1").weights == "tinker://r/sampler_weights/a"
    assert models.resolve("tinker://q/sampler_weights/b").sampler_path == "tinker://q/sampler_weights/b"
    assert (models.resolve("champion").iteration, models.resolve("loop:shop").weights) == (0, "base")
    from rlcli.loop.ledger import Champion, opened

    with opened(shop) as ledger, ledger.transaction() as db:
        ledger.move_alias(db, Champion(3, "tinker://r/sampler_weights/c", "tinker://r/weights/c"), "promoted")
    now = models.resolve("champion")  # the next request sees the promotion
    assert (now.name, now.iteration, now.sampler_path, now.state_path) == (
        "champion", 3, "tinker://r/sampler_weights/c", "tinker://r/weights/c")
    assert [r["id"] for r in models.listing()] == ["base", "v1", "loop:shop", "champion"]
    with pytest.raises(UnknownModel):
        models.resolve("gpt-4o")


def test_names_refused_at_start(tmp_path):
    with pytest.raises(UsageError, match="not a loop folder"):
        Models("m", {}, [tmp_path])
    with pytest.raises(UsageError, match="tinker://"):
        Models("m", {"v1": "/weights"}, [])
    with pytest.raises(UsageError, match="NAME=tinker"):
        parse_pairs("v1", "--models")


def test_a_captured_exchange_is_redacted_when_asked():
    request = {"messages": [{"role": "user", "content": "mail me at ana@example.com"}]}
    response = {"choices": [{"message": {"role": "assistant", "content": "ok ana@example.com"}}]}
    kept = capture.exchange_record("chatcmpl-1", "openai", request, response, {}, [], redact=False)
    hidden = capture.exchange_record("chatcmpl-1", "openai", request, response, {}, [], redact=True)
    assert "ana@example.com" in json.dumps(kept)
    assert "ana@example.com" not in json.dumps(hidden) and hidden["redacted"] is True
    assert request["messages"][0]["content"].endswith("example.com")  # the request served is not changed


def _store(folder: Path):
    from tinker_cookbook.capture.store.db import CaptureDB

    folder.mkdir(exist_ok=True)
    return CaptureDB(folder / "capture.sqlite")


def _exchange(i: int, answer: str = "Blue.", finish: str = "stop") -> dict:
    request = {"model": "base", "messages": [{"role": "user", "content": f"Question {i}?"}]}
    response = {"id": f"chatcmpl-{i}", "choices": [{"index": 0, "finish_reason": finish,
                                                   "message": {"role": "assistant", "content": answer}}]}
    return capture.exchange_record(f"chatcmpl-{i}", "openai", request, response, {"weights": "base"},
                                   [{"tokens": [1, 2], "logprobs": [-0.1, -0.2]}], redact=False)


def _put(db, *records: dict) -> None:
    db.ingest_annotations([{"event_id": r["event_id"], "run_id": capture.RUN, "kind": r["kind"], "payload": r,
                            "created_at": r["created_at"]} for r in records])


def test_the_drain_counts_every_exchange_once_with_its_feedback(tmp_path):
    store, out = tmp_path / "capture", tmp_path / "loop" / "captured"
    db = _store(store)
    _put(db, _exchange(1), _exchange(2, "Red, gree", "length"), _exchange(3, "7"),
         capture.feedback_record({"exchange": "chatcmpl-1", "rating": 1}, False),
         capture.feedback_record({"exchange": "chatcmpl-3", "edited": "8"}, False))
    first = capture.drain(store, out)
    lines = [json.loads(x) for x in first.read_text().splitlines()]
    assert [(x["exchange"], x.get("score"), x.get("dropped")) for x in lines] == [
        ("chatcmpl-1", 1.0, None), ("chatcmpl-2", None, "truncated"), ("chatcmpl-3", 1.0, None)]
    assert lines[2]["messages"][-1] == {"role": "assistant", "content": "8"}
    pairs = [json.loads(x) for x in pairs_beside(first).read_text().splitlines()]
    assert [(p["chosen"]["content"], p["rejected"]["content"]) for p in pairs] == [("8", "7")]
    assert capture.drain(store, out) is None  # nothing new: nothing written, the cursor stays
    _put(db, capture.feedback_record({"exchange": "chatcmpl-1", "rating": -0.5}, False), _exchange(4))
    second = capture.drain(store, out)
    again = {x["exchange"]: x for x in map(json.loads, second.read_text().splitlines())}
    assert again["chatcmpl-1"]["score"] == pytest.approx((0.25 + 1) / 2)  # both ratings so far, averaged
    assert set(again) == {"chatcmpl-1", "chatcmpl-4"} and "score" not in again["chatcmpl-4"]
    assert oct(out.stat().st_mode & 0o777) == "0o700" and all(p.stat().st_mode & 0o077 == 0 for p in out.iterdir())


def test_the_loop_import_counts_a_dropped_exchange_for_its_reason(tmp_path):
    from rlcli.data.import_cmd import Run, convert
    from rlcli.data.messages import Options

    src = tmp_path / "captured.jsonl"
    src.write_text(json.dumps({"dropped": "truncated", "exchange": "x"}) + "\n" + json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "score": 0.75,
         "exchange": "y"}) + "\n")
    stats = convert(Run(Options(False, False, False, True), skip_bad=True), str(src), "messages",
                    str(tmp_path / "out.jsonl"))
    assert (stats.read, stats.written, dict(stats.dropped)) == (2, 1, {"truncated": 1})
    assert json.loads((tmp_path / "out.jsonl").read_text())["score"] == 0.75


def test_a_reply_rated_bad_is_neither_a_reference_nor_imitated():
    from rlcli.loop.data import rated_bad

    assert [rated_bad(c) for c in ({"score": 0.0}, {"score": 0.25}, {"score": 0.5}, {"score": 1}, {})] == [
        True, True, False, False, False]


def test_the_drain_says_when_there_is_no_store(tmp_path):
    with pytest.raises(UsageError, match="no capture store"):
        capture.drain(tmp_path / "nothing", tmp_path / "out")
