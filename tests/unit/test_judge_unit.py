"""`--reward judge` against a small OpenAI-compatible judge server on loopback: parsing, cache, failures,
redaction, and what a group of ReplayEnvs gets."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from rlcli.problems import judge, rewards, traces
from tests.conftest import REPO

DEMO = REPO / "tests" / "fixtures" / "traces" / "demo.jsonl"


class JudgeServer:
    """Answers /v1/chat/completions with `answer(request text)`; records every request."""

    def __init__(self, answer):
        self.answer, self.requests = answer, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                reply = outer.answer(body["messages"][0]["content"])
                if reply is None:
                    self.send_response(500)
                    self.end_headers()
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()  # shutdown waits a poll

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def ranker(text: str) -> str:
    """Scores a reply 1 when it holds the reference's last number, else 0.2: a judge that reads."""
    reference = text.split("Reference reply (logged):\n", 1)[1].split("\n", 1)[0]
    want = str(rewards.last_number(reference))
    replies = text.split("<reply id=")[1:]
    scores = [1.0 if want in r.split("</reply>")[0].split(">", 1)[1] else 0.2 for r in replies]
    return f"Thinking it over.\n{json.dumps({'scores': scores})}"


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    servers = []

    def make(answer=ranker):
        srv = JudgeServer(answer)
        servers.append(srv)
        settings = {"kind": "openai", "url": srv.url, "model": "judge-1"}
        return srv, judge.Judge.from_settings(settings, home=tmp_path)

    yield make
    for srv in servers:
        srv.close()


def problem():
    return traces.read_traces(str(DEMO)).problems[0]  # What is 13 + 14? -> 13 + 14 = 27.


def group(replies):
    p = problem()
    return [SimpleNamespace(problem=p, reply=r) for r in replies]


def test_the_judge_ranks_a_group_and_its_answers_are_cached(served):
    srv, j = served()
    rewards_G = asyncio.run(j.group_rewards(group(["It is 27.", "It is 28.", "", "What is 13 + 14?"])))
    assert [r for r, _ in rewards_G] == [1.0, 0.2, 0.0, 0.0]  # empty and echo earn nothing, whatever it says
    assert rewards_G[1][1] == {"judge/failed": 0.0, "reward/judge": 0.2}
    assert len(srv.requests) == 1 and srv.requests[0]["path"] == "/v1/chat/completions"
    body = srv.requests[0]["body"]
    assert body["model"] == "judge-1" and body["temperature"] == 0 and srv.requests[0]["auth"] is None
    asyncio.run(j.group_rewards(group(["It is 27.", "It is 28.", "", "What is 13 + 14?"])))
    assert len(srv.requests) == 1 and j.counts == {"asked": 1, "cached": 1, "failed": 0}  # asked once


def test_the_cache_survives_a_new_judge(served, tmp_path):
    srv, first = served()
    replies = ["27", "26"]
    asyncio.run(first.group_rewards(group(replies)))
    again = judge.Judge.from_settings({"kind": "openai", "url": srv.url, "model": "judge-1"}, home=tmp_path)
    asyncio.run(again.group_rewards(group(replies)))
    assert len(srv.requests) == 1 and again.counts["cached"] == 1
    other = judge.Judge.from_settings({"kind": "openai", "url": srv.url, "model": "judge-2"}, home=tmp_path)
    asyncio.run(other.group_rewards(group(replies)))  # another judge model: asked anew
    assert len(srv.requests) == 2
    cached = list((tmp_path / "judge-cache").iterdir())
    assert len(cached) == 2 and all(p.stat().st_mode & 0o077 == 0 for p in cached)  # private: user text


@pytest.mark.parametrize("answer", [
    lambda text: None,  # HTTP 500
    lambda text: "I like them all.",  # no JSON
    lambda text: '{"scores": [1.0]}',  # wrong count
    lambda text: '{"scores": [1.5, 0]}',  # out of range
])
def test_a_failed_judgment_is_counted_and_gives_no_advantage(served, answer):
    _, j = served(answer)
    rewards_G = asyncio.run(j.group_rewards(group(["27", "26"])))
    assert rewards_G == [(0.0, {"judge/failed": 1.0})] * 2 and j.counts["failed"] == 1
    asyncio.run(j.group_rewards(group(["27", "26"])))
    assert j.counts["failed"] == 2  # a failure is not cached: the next run asks again


def test_an_unreachable_judge_is_a_counted_failure(tmp_path):
    j = judge.Judge.from_settings({"kind": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"}, home=tmp_path)
    assert j.scores(problem().prompt, "27", ["27"], []) is None and j.counts["failed"] == 1


def test_the_request_is_versioned_and_redacted(served):
    srv, j = served()
    p = problem()
    j.scores(p.prompt, "Mail me at jane.doe@example.com", ["call +1 415 555 0100", "27"], [])
    text = srv.requests[0]["body"]["messages"][0]["content"]
    assert "jane.doe@example.com" not in text and "415 555 0100" not in text and "<EMAIL>" in text
    assert "What is 13 + 14?" in text and 'Answer with one JSON object' in text
    assert judge.TEMPLATE_VERSION == "v1" and "{reference}" in judge.template("v1")


def test_parse_scores_takes_the_last_json_object():
    assert judge.parse_scores('first {"scores": [0, 1]} then {"scores": [1, 0.5]}', 2) == [1.0, 0.5]
    assert judge.parse_scores('{"scores": [true, 0]}', 2) is None
    assert judge.parse_scores("no json", 1) is None
