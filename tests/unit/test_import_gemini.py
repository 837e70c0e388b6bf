"""Gemini generateContent records (-f gemini): contents/parts, tools, candidates, streams, wrappers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.gemini import from_gemini
from rlcli.data.messages import Options, finalize

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def one(record):
    parts: Counter[str] = Counter()
    result = from_gemini(record, parts)
    if isinstance(result, dict):
        result = finalize(result, Options())
    return result, parts


def user(text):
    return {"role": "user", "parts": [{"text": text}]}


def reply(*parts, reason="STOP"):
    return {"candidates": [{"content": {"role": "model", "parts": list(parts)}, "finishReason": reason}]}


def test_system_instruction_contents_and_candidate():
    record = {
        "request": {"systemInstruction": {"parts": [{"text": "Be brief."}]}, "contents": [user("hi")]},
        "response": reply({"text": "plan", "thought": True}, {"text": "Hello."}),
    }
    conv, _ = one(record)
    assert conv["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello.", "reasoning": "plan"},
    ]


def test_function_calls_and_responses_pair_up_with_or_without_ids():
    contents = [
        user("two lookups"),
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "f", "args": {"x": 1}}},
                {"functionCall": {"name": "g", "args": {}, "id": "g-7"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "g", "id": "g-7", "response": {"ok": True}}},
                {"functionResponse": {"name": "f", "response": {"y": 2}}},
            ],
        },
    ]
    conv, _ = one({"contents": contents, **reply({"text": "done"})})
    call_f, call_g = conv["messages"][1]["tool_calls"]
    assert call_f["id"] == "call_0" and call_f["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert call_g["id"] == "g-7"
    tools = conv["messages"][2:4]
    assert [(t["tool_call_id"], t["name"], t["content"]) for t in tools] == [
        ("g-7", "g", '{"ok":true}'),
        ("call_0", "f", '{"y":2}'),
    ]


def test_snake_case_sdk_dump_and_tool_declarations():
    record = {
        "system_instruction": {"parts": [{"text": "S"}]},
        "contents": [user("q")],
        "tools": [
            {"function_declarations": [{"name": "f", "parameters_json_schema": {"type": "object"}}]},
            {"code_execution": {}},
        ],
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"function_call": {"name": "f", "args": {}}}]},
                "finish_reason": "STOP",
            }
        ],
    }
    conv, parts = one(record)
    assert conv["messages"][0] == {"role": "system", "content": "S"}
    assert conv["messages"][-1]["tool_calls"][0]["function"]["name"] == "f"
    assert conv["tools"] == [{"type": "function", "function": {"name": "f", "parameters": '{"type":"object"}'}}]
    assert parts == Counter(builtin_tool=1)


def test_a_streamed_response_is_joined():
    chunks = [reply({"text": "One, "}, reason=None), reply({"text": "two."})]
    conv, _ = one({"request": {"contents": [user("count")]}, "response": chunks})
    assert conv["messages"][-1] == {"role": "assistant", "content": "One, two."}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"contents": [user("x")], **reply({"text": "y"}, reason="MAX_TOKENS")}, "truncated"),
        ({"contents": [user("x")], **reply({"text": "y"}, reason="SAFETY")}, "blocked"),
        ({"contents": [user("x")], "promptFeedback": {"blockReason": "OTHER"}}, "blocked"),
        ({"contents": [user("x")], "candidates": []}, "no_assistant_reply"),
        ({"request": {"contents": [user("x")]}, "error": {"code": 500}}, "error_response"),
        (
            {"contents": [{"role": "narrator", "parts": [{"text": "x"}]}], **reply({"text": "y"})},
            "unknown_role:narrator",
        ),
        ({"messages": [user("x")]}, "unrecognized"),
    ],
)
def test_drop_reasons(record, reason):
    assert one(record)[0] == reason


def test_media_and_code_parts_are_counted():
    parts_in = [
        {"text": "see"},
        {"inlineData": {"mimeType": "image/jpeg", "data": "AA"}},
        {"fileData": {"mimeType": "application/pdf", "fileUri": "gs://b/f.pdf"}},
    ]
    model = [
        {"executableCode": {"language": "PYTHON", "code": "1+1"}},
        {"codeExecutionResult": {"output": "2"}},
        {"text": "2"},
    ]
    _, parts = one({"contents": [{"role": "user", "parts": parts_in}], **reply(*model)})
    assert parts == Counter(image=1, file=1, executable_code=1, code_execution_result=1)


def test_fixture_file_outcomes():
    outcomes: Counter[str] = Counter()
    for line in (FIXTURES / "gemini.jsonl").read_text().splitlines():
        result, _ = one(json.loads(line))
        outcomes[result if isinstance(result, str) else "written"] += 1
    assert outcomes == Counter(
        written=4, truncated=1, blocked=1, error_response=1, no_assistant_reply=1, unrecognized=1
    )
