"""OpenTelemetry spans (-f otel): OTLP/JSON decoding, each GenAI form, accounting per span, --join-trace."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data import otel, traces
from rlcli.data.import_cmd import Run
from rlcli.data.messages import Options, finalize

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def kv(key, value):
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, dict):
        return {"key": key, "value": {"kvlistValue": {"values": [kv(k, v) for k, v in value.items()]}}}
    return {"key": key, "value": {"arrayValue": {"values": [kv("", v)["value"] for v in value]}}}


def span(attrs, events=(), trace="t1", end=1):
    return {
        "traceId": trace,
        "spanId": f"s{end}",
        "endTimeUnixNano": str(end),
        "attributes": [kv(k, v) for k, v in attrs.items()],
        "events": list(events),
    }


def export(*spans):
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": list(spans)}]}]}


def convert(s):
    parts: Counter[str] = Counter()
    result = otel.from_span(s, parts)
    return (finalize(result, Options()) if isinstance(result, dict) else result), parts


def stream(lines, join_trace=False, **flags):
    written: list[bytes] = []
    run = Run(Options(**flags))
    traces.stream(run, lines, run.emitter(written.append), join_trace)
    return [json.loads(w) for w in written], run.stats


def text(role, content):
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def test_any_value_decoding():
    attrs = otel.attributes(
        [
            kv("s", "x"),
            kv("i", 7),
            kv("a", ["p", "q"]),
            kv("m", {"k": "v"}),
            {"key": "d", "value": {"doubleValue": 0.5}},
            {"key": "b", "value": {"boolValue": True}},
        ]
    )
    assert attrs == {"s": "x", "i": 7, "a": ["p", "q"], "m": {"k": "v"}, "d": 0.5, "b": True}


def test_current_semconv_json_attributes_with_tools_and_reasoning():
    inputs = [
        text("user", "Weather?"),
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "w", "arguments": {"q": 1}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "result": "sunny"}]},
    ]
    outputs = [
        {
            "role": "assistant",
            "finish_reason": "stop",
            "parts": [{"type": "reasoning", "content": "r"}, {"type": "text", "content": "Sunny."}],
        }
    ]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(inputs),
        "gen_ai.output.messages": json.dumps(outputs),
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be kind."}]),
        "gen_ai.tool.definitions": json.dumps([{"type": "function", "name": "w", "parameters": {}}]),
    }
    conv, _ = convert(span(attrs))
    assert [m["role"] for m in conv["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv["messages"][2]["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"q":1}'}
    assert conv["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert conv["messages"][4] == {"role": "assistant", "content": "Sunny.", "reasoning": "r"}
    assert conv["tools"][0]["function"]["name"] == "w"
    assert (conv["trace_id"], conv["span_id"]) == ("t1", "s1")


def test_messages_on_the_operation_details_event_in_structured_form():
    event = {
        "name": "gen_ai.client.inference.operation.details",
        "attributes": [
            kv("gen_ai.input.messages", [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]),
            kv("gen_ai.output.messages", [{"role": "assistant", "parts": [{"type": "text", "content": "yo"}]}]),
        ],
    }
    conv, _ = convert(span({"gen_ai.operation.name": "chat"}, [event]))
    assert [m["content"] for m in conv["messages"]] == ["hi", "yo"]


def test_older_event_form():
    events = [
        {"name": "gen_ai.system.message", "attributes": [kv("content", "S")]},
        {"name": "gen_ai.user.message", "attributes": [kv("content", "Q"), kv("role", "customer")]},
        {"name": "gen_ai.choice", "attributes": [kv("index", 1), kv("message", {"content": "B"})]},
        {
            "name": "gen_ai.choice",
            "attributes": [kv("index", 0), kv("finish_reason", "stop"), kv("message", {"content": "A"})],
        },
    ]
    conv, parts = convert(span({"gen_ai.operation.name": "chat"}, events))
    assert conv["messages"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
    ]
    assert parts == Counter(extra_choice=1)


def test_openinference_and_openllmetry_flattened_attributes():
    oi = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.contents.0.message_content.type": "text",
        "llm.input_messages.0.message.contents.0.message_content.text": "Find order 7",
        "llm.input_messages.0.message.contents.1.message_content.type": "image",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c9",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"id": 7}',
    }
    conv, parts = convert(span(oi))
    assert conv["messages"][0] == {"role": "user", "content": "Find order 7"}
    assert conv["messages"][1]["tool_calls"] == [
        {"id": "c9", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 7}'}}
    ]
    assert parts == Counter(image=1)
    ll = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "hi",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "yo",
        "llm.request.functions.0.name": "f",
    }
    conv, _ = convert(span(ll))
    assert [m["content"] for m in conv["messages"]] == ["hi", "yo"] and conv["tools"][0]["function"]["name"] == "f"


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"http.method": "GET"}, "non_llm_span"),
        ({"gen_ai.operation.name": "execute_tool"}, "non_llm_span"),
        ({"gen_ai.operation.name": "chat"}, "no_content"),
        ({"openinference.span.kind": "LLM"}, "no_content"),
        ({"gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "te'}, "bad_attribute_json"),
        (
            {
                "gen_ai.input.messages": json.dumps([text("user", "x")]),
                "gen_ai.output.messages": json.dumps([{**text("assistant", "y"), "finish_reason": "length"}]),
            },
            "truncated",
        ),
        ({"gen_ai.input.messages": json.dumps([text("user", "x")])}, "no_assistant_reply"),
    ],
)
def test_drop_reasons(attrs, reason):
    assert convert(span(attrs))[0] == reason


def test_every_span_is_a_record_and_lines_without_spans_are_counted():
    good = span(
        {
            "gen_ai.input.messages": json.dumps([text("user", "x")]),
            "gen_ai.output.messages": json.dumps([text("assistant", "y")]),
        }
    )
    lines = [
        json.dumps(export(good, span({"http.method": "GET"}), good)).encode(),
        b'{"level": "info"}',
        json.dumps(export()).encode(),
    ]
    convs, stats = stream(lines, dedupe=True)
    assert stats.read == 5 and stats.written == 1
    assert stats.dropped == Counter(non_llm_span=1, duplicate=1, unrecognized=1, no_spans=1)


def test_join_trace_keeps_the_last_llm_call_of_each_trace():
    first = span(
        {
            "gen_ai.input.messages": json.dumps([text("user", "a")]),
            "gen_ai.output.messages": json.dumps([text("assistant", "b")]),
        },
        end=5,
    )
    second = span(
        {
            "gen_ai.input.messages": json.dumps([text("user", "a"), text("assistant", "b"), text("user", "c")]),
            "gen_ai.output.messages": json.dumps([text("assistant", "d")]),
        },
        end=9,
    )
    other = span(
        {
            "gen_ai.input.messages": json.dumps([text("user", "z")]),
            "gen_ai.output.messages": json.dumps([text("assistant", "w")]),
        },
        trace="t2",
    )
    lines = [json.dumps(export(second)).encode(), json.dumps(export(first, other)).encode()]
    convs, stats = stream(lines, join_trace=True)
    assert [[m["content"] for m in c["messages"]] for c in convs] == [["a", "b", "c", "d"], ["z", "w"]]
    assert stats.dropped == Counter(earlier_in_trace=1)
    convs, stats = stream(lines)
    assert stats.written == 3


def test_fixture_files():
    convs, stats = stream((FIXTURES / "otel.jsonl").read_bytes().splitlines(keepends=True))
    assert stats.read == 12 and stats.written == 6
    assert stats.dropped == Counter(non_llm_span=2, no_content=1, truncated=1, unrecognized=1, no_spans=1)
    convs, stats = stream((FIXTURES / "otel_pretty.json").read_bytes().splitlines(keepends=True))
    assert stats.read == 1 and [m["role"] for m in convs[0]["messages"]] == ["user", "assistant", "user", "assistant"]
