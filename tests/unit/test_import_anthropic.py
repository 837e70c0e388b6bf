"""Anthropic Messages API records: system, content blocks, tools, thinking."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rlcli.data.importers import from_anthropic
from rlcli.data.messages import Options, finalize

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "rome", "n": 3}}
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "search", "arguments": '{"q":"rome","n":3}'}}


def one(record, **flags):
    parts: Counter[str] = Counter()
    result = from_anthropic(record, parts)
    if isinstance(result, dict):
        result = finalize(result, Options(**flags))
    return result, parts


def reply(*blocks, stop="end_turn"):
    return {"type": "message", "role": "assistant", "content": list(blocks), "stop_reason": stop}


def text(t):
    return {"type": "text", "text": t}


def test_system_string_or_blocks_becomes_the_first_message():
    for system in ("Be kind.", [text("Be"), text("kind.")]):
        record = {
            "request": {"system": system, "messages": [{"role": "user", "content": "hi"}]},
            "response": reply(text("hello")),
        }
        conv, _ = one(record)
        assert conv["messages"][0]["role"] == "system"
        assert conv["messages"][0]["content"] in ("Be kind.", "Be\nkind.")
        assert conv["messages"][-1] == {"role": "assistant", "content": "hello"}


def test_tool_use_thinking_and_text_in_a_reply():
    record = {
        "request": {"messages": [{"role": "user", "content": "find rome"}]},
        "response": reply(
            {"type": "thinking", "thinking": "search it", "signature": "s"},
            text("Searching."),
            TOOL_USE,
            stop="tool_use",
        ),
    }
    conv, _ = one(record)
    assert conv["messages"][-1] == {
        "role": "assistant",
        "content": "Searching.",
        "tool_calls": [CALL],
        "reasoning": "search it",
    }


def test_drop_thinking_removes_reasoning():
    record = {
        "request": {"messages": [{"role": "user", "content": "q"}]},
        "response": reply({"type": "thinking", "thinking": "hmm"}, text("a")),
    }
    assert "reasoning" not in one(record, drop_thinking=True)[0]["messages"][-1]
    thinking_only = {"request": record["request"], "response": reply({"type": "thinking", "thinking": "hmm"})}
    assert one(thinking_only, drop_thinking=True)[0] == "no_assistant_reply"


def test_tool_results_become_tool_messages_before_the_user_text():
    record = {
        "messages": [
            {"role": "user", "content": "find rome"},
            {"role": "assistant", "content": [TOOL_USE]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "AZ123"},
                    text("anything earlier?"),
                ],
            },
            {"role": "assistant", "content": "No."},
        ]
    }
    conv, _ = one(record)
    assert conv["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "AZ123"},
        {"role": "user", "content": "anything earlier?"},
        {"role": "assistant", "content": "No."},
    ]


def test_tool_result_blocks_with_images_keep_text_and_count_the_image():
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "is_error": False,
        "content": [text("chart:"), {"type": "image", "source": {"type": "base64", "data": "x"}}],
    }
    record = {
        "messages": [
            {"role": "user", "content": "plot"},
            {"role": "assistant", "content": [TOOL_USE]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": "Done."},
        ]
    }
    conv, parts = one(record)
    assert conv["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "chart:"}
    assert parts == Counter(image=1)


def test_redacted_thinking_is_dropped_and_counted():
    record = {
        "request": {"messages": [{"role": "user", "content": "q"}]},
        "response": reply({"type": "redacted_thinking", "data": "enc"}, text("a")),
    }
    conv, parts = one(record)
    assert conv["messages"][-1] == {"role": "assistant", "content": "a"} and parts == Counter(redacted_thinking=1)


def test_drop_tools_turns_a_tool_loop_into_plain_text():
    record = {
        "messages": [
            {"role": "user", "content": "find rome"},
            {"role": "assistant", "content": [TOOL_USE]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "AZ123"}]},
            {"role": "assistant", "content": "AZ123 it is."},
        ]
    }
    conv, _ = one(record, drop_tools=True)
    assert conv["messages"] == [
        {"role": "user", "content": "find rome"},
        {"role": "assistant", "content": "AZ123 it is."},
    ]


def test_prefill_is_continued_by_the_response():
    record = {
        "request": {"messages": [{"role": "user", "content": "json please"}, {"role": "assistant", "content": "{"}]},
        "response": reply(text('"a": 1}')),
    }
    assert one(record)[0]["messages"][-1] == {"role": "assistant", "content": '{"a": 1}'}


def test_assistant_text_blocks_are_one_stream_user_blocks_are_lines():
    record = {
        "messages": [
            {"role": "user", "content": [text("doc"), text("question")]},
            {"role": "assistant", "content": [text("The sky is "), text("blue"), text(".")]},
        ]
    }
    conv, _ = one(record)
    assert conv["messages"] == [
        {"role": "user", "content": "doc\nquestion"},
        {"role": "assistant", "content": "The sky is blue."},
    ]


def test_anthropic_tools_become_openai_shaped_definitions():
    tools = [{"name": "search", "description": "web", "input_schema": {"type": "object"}}]
    record = {"request": {"tools": tools, "messages": [{"role": "user", "content": "q"}]}, "response": reply(text("a"))}
    spec = one(record)[0]["tools"]
    assert spec == [
        {"type": "function", "function": {"name": "search", "description": "web", "parameters": '{"type":"object"}'}}
    ]


def test_max_tokens_is_truncated_and_a_lone_response_has_no_prompt():
    request = {"messages": [{"role": "user", "content": "q"}]}
    assert one({"request": request, "response": reply(text("a"), stop="max_tokens")})[0] == "truncated"
    assert one(reply(text("a")))[0] == "no_prompt"


def test_fixture_file_outcomes():
    outcomes = Counter()
    for line in (FIXTURES / "anthropic.jsonl").read_text().splitlines():
        result, _ = one(json.loads(line))
        outcomes[result if isinstance(result, str) else "written"] += 1
    assert outcomes == Counter(written=4, no_prompt=1, truncated=1)
