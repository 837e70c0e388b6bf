"""`--env tools` without a server: logged calls answer, others are unknown; oracle scores 1, nop 0."""

from __future__ import annotations

import asyncio

import pytest

from rlcli.problems import tools_env, traces
from rlcli.train import renderers
from tests.conftest import REPO

TOOLS = REPO / "tests" / "fixtures" / "traces" / "tools.jsonl"


def problems():
    return traces.read_traces(str(TOOLS), tools_env=True).problems


def test_tool_problems_start_at_the_first_call_and_keep_the_schemas():
    found = traces.read_traces(str(TOOLS), tools_env=True)
    assert [p.trace_id for p in found.problems] == ["t-weather", "t-add", "t-two"]
    assert dict(found.skipped) == {"no_tool_call": 1}  # the chat that called nothing
    weather = found.problems[0]
    assert weather.reply["tool_calls"][0]["function"]["name"] == "get_weather" and len(weather.tools) == 2
    assert [m["role"] for m in weather.after] == ["tool", "assistant"]


@pytest.mark.parametrize(("policy", "want"), [("oracle", 1.0), ("nop", 0.0)])
def test_oracle_scores_one_and_nop_zero(policy, want):
    for problem in problems():
        parts = tools_env.play(problem, policy)
        assert parts["reward/tools"] == want, (problem.source, parts)
    result = tools_env.run_policy(str(TOOLS), policy)
    assert result["reward"] == want and result["problems"] == 3
    assert [r["source"] for r in result["per_problem"]] == ["tools.jsonl:1", "tools.jsonl:2", "tools.jsonl:3"]


def call(name, arguments, i="c"):
    return {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_calls_match_by_name_and_arguments_and_others_are_unknown():
    episode = tools_env.Episode(problems()[1])  # add(a=123, b=456) -> 579
    out, done = episode.respond([call("add", '{"b": 456, "a": 123}'), call("add", '{"a": 1, "b": 2}'),
                                 call("add", "{not json")], "")
    assert not done and out[0]["content"] == "579"  # key order does not matter
    assert out[1]["content"].startswith("unknown call add(") and "malformed call" in out[2]["content"]
    _, done = episode.respond([], "123 + 456 = 579.")
    parts = episode.score()
    assert done and parts["correct"] == 1.0 and parts["precision"] == 0.5 and parts["recall"] == 1.0
    assert parts["malformed"] == 1.0
    assert parts["reward/tools"] == pytest.approx(0.5 + 0.25 * 1.5 - 0.1)


def test_answering_without_calling_earns_only_the_answer():
    episode = tools_env.Episode(problems()[1])
    episode.respond([], "123 + 456 = 579.")
    assert episode.score()["reward/tools"] == pytest.approx(0.5)


def test_the_env_offers_the_tools_and_answers_a_parsed_call(embedded_model):
    from tinker_cookbook import renderers as cookbook_renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlcli.problems.replay import ToolsEnv

    renderers.register_local_tokenizer(embedded_model)
    tokenizer = get_tokenizer(embedded_model)
    renderer = cookbook_renderers.get_renderer(renderers.CHATML_RENDERER, tokenizer=tokenizer)
    env = ToolsEnv(problems()[0], renderer, traces.Spec("x", env="tools"))
    prompt, _ = asyncio.run(env.initial_observation())
    text = tokenizer.decode(prompt.to_ints())
    assert "get_weather" in text and "What's the weather in Oslo?" in text

    def act(reply: str):
        return asyncio.run(env.step(tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)))

    first = act('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert not first.episode_done and first.logs["source"] == "tools.jsonl:1"
    assert "rain" in tokenizer.decode(first.next_observation.to_ints())  # the recorded output came back
    last = act("It is 4 °C and raining in Oslo.")
    assert last.episode_done and last.reward == 1.0 and last.metrics["precision"] == 1.0
