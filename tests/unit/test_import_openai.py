"""OpenAI Chat Completions records: every layout loggers use, and what each becomes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.importers import from_openai
from rlcli.data.messages import Options, finalize

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def one(record, **flags):
    """(conversation or drop reason, dropped parts) for one record."""
    parts: Counter[str] = Counter()
    result = from_openai(record, parts)
    if isinstance(result, dict):
        result = finalize(result, Options(**flags))
    return result, parts


def response(content, finish="stop", **message):
    choice = {"index": 0, "message": {"role": "assistant", "content": content, **message}, "finish_reason": finish}
    return {"object": "chat.completion", "choices": [choice]}


def test_request_and_response_side_by_side_keeps_the_reply_from_choices():
    record = {"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": response("hello")}
    conv, _ = one(record)
    assert conv["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.mark.parametrize(
    "record",
    [
        {"messages": [{"role": "user", "content": "hi"}], **response("hello")},  # flat {messages, choices}
        {"input": {"messages": [{"role": "user", "content": "hi"}]}, "output": response("hello")},
        {"body": {"messages": [{"role": "user", "content": "hi"}]}, "response": {"body": response("hello")}},
        {"input": [{"role": "user", "content": "hi"}], "output": {"role": "assistant", "content": "hello"}},
        {"request": json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "response": response("hello")},
        {"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": "hello"},
        {
            "input": [{"role": "user", "content": "hi"}],
            "output": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        },
    ],
    ids=["flat", "input-output", "batch-bodies", "braintrust", "json-string", "text-reply", "choice-list"],
)
def test_common_layouts_all_find_the_reply(record):
    conv, _ = one(record)
    assert conv["messages"][-1] == {"role": "assistant", "content": "hello"}


def test_request_alone_without_reply_is_dropped_as_no_assistant_reply():
    assert one({"model": "m", "messages": [{"role": "user", "content": "hi"}]})[0] == "no_assistant_reply"


def test_response_alone_has_no_prompt():
    assert one(response("hello"))[0] == "no_prompt"


def test_logger_that_already_appended_the_reply_keeps_one_copy():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    conv, _ = one({"messages": messages, **response("hello")})
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant"]


def test_roles_developer_becomes_system_and_tools_stay_structured():
    record = {
        "request": {
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            ],
        },
        "response": response("18 degrees"),
    }
    conv, _ = one(record)
    assert [m["role"] for m in conv["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert conv["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
    assert conv["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": "{}"}}]


def test_drop_tools_gives_text_only_and_merges_what_is_left():
    record = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "assistant", "content": "It is 18C."},
            {"role": "user", "content": "thanks"},
            {"role": "user", "content": "bye"},
            {"role": "assistant", "content": "Bye!"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
    }
    conv, _ = one(record, drop_tools=True)
    assert conv == {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "It is 18C."},
            {"role": "user", "content": "thanks\n\nbye"},
            {"role": "assistant", "content": "Bye!"},
        ]
    }


def test_only_a_tool_call_reply_with_drop_tools_has_no_assistant_reply():
    record = {"messages": [{"role": "user", "content": "weather?"}], **response(None, tool_calls=[CALL])}
    assert one(record, drop_tools=True)[0] == "no_assistant_reply"
    assert one(record)[0]["messages"][-1]["tool_calls"] == [CALL]


def test_list_contents_join_text_and_count_images_and_audio():
    record = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                    {"type": "input_audio", "input_audio": {"data": "x"}},
                    {"type": "text", "text": "and listen"},
                ],
            }
        ],
        **response("nice"),
    }
    conv, parts = one(record)
    assert conv["messages"][0] == {"role": "user", "content": "look\nand listen"}
    assert parts == Counter({"image": 1, "audio": 1})


def test_extra_choices_are_counted_not_lost_silently():
    record = {
        "messages": [{"role": "user", "content": "hi"}],
        "choices": [
            {"message": {"role": "assistant", "content": "a"}},
            {"message": {"role": "assistant", "content": "b"}},
        ],
    }
    conv, parts = one(record)
    assert conv["messages"][-1]["content"] == "a" and parts["extra_choice"] == 1


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"messages": [{"role": "user", "content": "x"}], **response("cut", finish="length")}, "truncated"),
        (
            {"request": {"messages": [{"role": "user", "content": "x"}]}, "response": {"error": {"message": "429"}}},
            "error_response",
        ),
        ({"response": {"status_code": 500, "body": {"error": "boom"}}}, "error_response"),
        ({"event": "click"}, "unrecognized"),
        ([1, 2], "unrecognized"),
        ({"messages": [{"role": "wizard", "content": "x"}], **response("y")}, "unknown_role:wizard"),
        ({"messages": ["not a message"], **response("y")}, "bad_message"),
        ({"messages": [{"role": "user", "content": ""}], **response("")}, "empty"),
        ({"messages": [], "choices": []}, "no_assistant_reply"),
    ],
)
def test_drop_reasons(record, reason):
    assert one(record)[0] == reason


def test_refusal_and_reasoning_fields_are_kept():
    record = {
        "messages": [{"role": "user", "content": "x"}],
        **response(None, refusal="I can't help with that.", reasoning_content="policy says no"),
    }
    reply = one(record)[0]["messages"][-1]
    assert reply == {"role": "assistant", "content": "I can't help with that.", "reasoning": "policy says no"}


def test_legacy_function_call_becomes_a_tool_call():
    record = {
        "messages": [{"role": "user", "content": "x"}],
        **response(None, function_call={"name": "f", "arguments": "{}"}),
    }
    calls = one(record)[0]["messages"][-1]["tool_calls"]
    assert calls == [{"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_fixture_file_outcomes():
    outcomes = Counter()
    for line in (FIXTURES / "openai.jsonl").read_text().splitlines():
        result, _ = one(json.loads(line))
        outcomes[result if isinstance(result, str) else "written"] += 1
    assert outcomes == Counter(
        written=6, no_assistant_reply=1, no_prompt=1, error_response=1, truncated=1, unrecognized=1
    )


def test_lines_orjson_refuses_are_read_by_json_and_written():
    """NaN and integers past 64 bits are valid for the json module (and in real logs): the record loop reads
    them with json when orjson refuses, and writes what it keeps."""
    from rlcli.data.import_cmd import Run

    big = 2**70
    lines = [
        b'{"request": {"messages": [{"role": "user", "content": "q"}], "temperature": NaN}, '
        b'"response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]}}\n',
        b'{"request": {"messages": [{"role": "user", "content": "q"}]}, "response": {"choices": [{"message": '
        b'{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": '
        b'{"name": "f", "arguments": {"n": ' + str(big).encode() + b"}}}]}}]}}\n",
    ]
    written: list[bytes] = []
    run = Run()
    run.stream(lines, from_openai, written.append)
    assert run.stats.read == run.stats.written == 2
    assert json.loads(written[0])["messages"][-1] == {"role": "assistant", "content": "a"}
    call = json.loads(written[1])["messages"][-1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"n": big}
