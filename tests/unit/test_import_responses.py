"""OpenAI Responses API records under -f openai: items, instructions, statuses, previous_response_id chains."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.import_cmd import Run
from rlcli.data.importers import from_openai
from rlcli.data.messages import Options, finalize
from rlcli.data.responses import Link

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def one(record):
    parts: Counter[str] = Counter()
    result = from_openai(record, parts)
    if isinstance(result, Link):
        result = {**result.conv, "messages": result.system + result.conv["messages"]}
    if isinstance(result, dict):
        result = finalize(result, Options())
    return result, parts


def out(text, rid="resp_1", **extra):
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {"id": rid, "object": "response", "status": "completed", "output": [message], **extra}


def stream(lines, **flags):
    written: list[bytes] = []
    run = Run(Options(**flags))
    run.stream([json.dumps(r).encode() + b"\n" for r in lines], from_openai, written.append)
    return [json.loads(w) for w in written], run.stats


def test_instructions_become_the_system_message():
    record = {
        "instructions": "You are terse.",
        "input": [{"role": "user", "content": "hi"}],
        "output": out("yo")["output"],
    }
    conv, _ = one(record)
    assert conv["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]


def test_function_call_output_is_kept_with_its_reasoning_and_tools():
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "use the tool"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        ],
    }
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}, {"type": "web_search"}]
    conv, parts = one({"request": {"input": "Weather in Oslo?", "tools": tools}, "response": response})
    reply = conv["messages"][-1]
    assert reply["reasoning"] == "use the tool"
    assert reply["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert [t["function"]["name"] for t in conv["tools"]] == ["get_weather"]
    assert parts == Counter(builtin_tool=1)


def test_tool_output_items_answer_their_call_by_name():
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    conv, _ = one({"input": items, "output": out("ok")["output"]})
    assert conv["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "done", "name": "f"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (out("hi"), "no_input"),  # a response object does not echo its input
        (
            {"input": "x", **out("y"), "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
            "truncated",
        ),
        ({"input": "x", **out("y"), "status": "failed", "error": {"code": "server_error"}}, "error_response"),
        ({"input": "x", "conversation": "conv_1", "output": out("y")["output"]}, "stored_conversation"),
        ({"input": [{"type": "function_call"}], "output": out("y")["output"]}, "no_prompt"),
    ],
)
def test_drop_reasons(record, reason):
    assert one(record)[0] == reason


def test_parts_left_out_are_counted_by_kind():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "u"}]},
        {"type": "item_reference", "id": "msg_0"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
    ]
    _, parts = one({"input": items, "output": out("ok")["output"]})
    assert parts == Counter(image=1, item_reference=1, web_search_call=1, encrypted_reasoning=1)


@pytest.mark.parametrize(
    "record",
    [
        {"input": [{"role": "user", "content": "hi"}], "output": {"role": "assistant", "content": "yo"}},
        {"input": {"messages": [{"role": "user", "content": "hi"}]}, "output": {"role": "assistant", "content": "yo"}},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "choices": [{"message": {"role": "assistant", "content": "yo"}}],
        },
    ],
)
def test_chat_completions_shapes_are_not_taken_for_responses(record):
    conv, _ = one(record)
    assert [m["content"] for m in conv["messages"]] == ["hi", "yo"]


def test_a_chain_is_joined_and_instructions_are_not_inherited():
    first = {"request": {"instructions": "Old rules.", "input": "Hi"}, "response": out("Hello", "r1")}
    second = {
        "request": {"instructions": "New rules.", "previous_response_id": "r1", "input": "Bye"},
        "response": out("Ciao", "r2", previous_response_id="r1"),
    }
    third = {"request": {"previous_response_id": "r2", "input": "Again"}, "response": out("Ciao!", "r3")}
    convs, stats = stream([first, second, third])
    assert [m["content"] for m in convs[1]["messages"]] == ["New rules.", "Hi", "Hello", "Bye", "Ciao"]
    assert [m["content"] for m in convs[2]["messages"]] == ["Hi", "Hello", "Bye", "Ciao", "Again", "Ciao!"]
    assert stats.written == 3 and not stats.dropped


def test_a_continuation_before_its_predecessor_waits_for_it_and_a_missing_one_is_counted():
    later = {"request": {"previous_response_id": "r1", "input": "More"}, "response": out("Sure", "r2")}
    earlier = {"request": {"input": "Start"}, "response": out("Ok", "r1")}
    orphan = {"request": {"previous_response_id": "r_gone", "input": "?"}, "response": out("!", "r9")}
    loop_a = {"request": {"previous_response_id": "rb", "input": "a"}, "response": out("A", "ra")}
    loop_b = {"request": {"previous_response_id": "ra", "input": "b"}, "response": out("B", "rb")}
    convs, stats = stream([later, earlier, orphan, loop_a, loop_b])
    assert [m["content"] for m in convs[-1]["messages"]] == ["Start", "Ok", "More", "Sure"]
    assert stats.written == 2 and stats.dropped == Counter(previous_response_missing=3)


def test_fixture_file_outcomes():
    convs, stats = stream([json.loads(line) for line in (FIXTURES / "responses.jsonl").read_text().splitlines()])
    assert stats.read == 11 and stats.written == 7
    assert stats.dropped == Counter(no_input=2, truncated=1, previous_response_missing=1)
    assert stats.parts == Counter(builtin_tool=1, image=1, item_reference=1)
    joined = convs[2]["messages"]
    assert [m["role"] for m in joined] == ["system", "user", "assistant", "tool", "assistant"]
    assert joined[2]["tool_calls"][0]["id"] == joined[3]["tool_call_id"] == "call_w1"


def test_redaction_and_drop_tools_in_a_chain_leave_the_remembered_history_untouched():
    first = {"request": {"input": "I am jane@corp.com"}, "response": out("Hi Jane", "r1")}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"to": "jane@corp.com"}'}
    second = {"request": {"previous_response_id": "r1", "input": "Mail me"},
              "response": {**out("Sent", "r2"), "output": [call]}}  # fmt: skip
    third = {"request": {"previous_response_id": "r2", "input": [{"type": "function_call_output", "call_id": "c1",
                                                                 "output": "ok"}]},
             "response": out("Done", "r3")}  # fmt: skip
    convs, stats = stream([first, second, third], redact=True, drop_tools=True)
    assert [m["content"] for m in convs[2]["messages"]] == ["I am <EMAIL>", "Hi Jane", "Mail me", "Done"]
    assert stats.redacted == Counter(EMAIL=3)  # once in each written conversation, never twice in one
    convs, _ = stream([first, second, third])
    assert convs[2]["messages"][0]["content"] == "I am jane@corp.com"
    assert convs[2]["messages"][3]["tool_calls"][0]["function"]["arguments"] == '{"to": "jane@corp.com"}'
