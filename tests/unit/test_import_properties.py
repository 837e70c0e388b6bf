"""Property: every input record is accounted for, whatever the mix of good, bad and odd lines.

read == written + attached feedback + sum(dropped), nothing raises but a UsageError, and every
written line is a conversation `train sl` accepts. And the fast paths of the common shapes agree with
the general code they skip, whatever the record.
"""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlcli.data import importers, otel, traces
from rlcli.data import messages as messages_module
from rlcli.data.import_cmd import Run, langsmith
from rlcli.data.importers import IMPORTERS
from rlcli.data.messages import Options, Skip, convert_message
from rlcli.data.validate import conversation_problem

# Keys and words the importers look for, so that random records reach deep into their code.
KEYS = (
    "role content messages choices message request response type text tool_calls function name arguments id "
    "system run_type inputs outputs generations generation_info run_id key score lc kwargs data tool_use_id "
    "input output body error status_code finish_reason stop_reason prompts from value tool_call_id thinking "
    "refusal additional_kwargs extra invocation_params tools instructions previous_response_id object call_id "
    "contents parts candidates functionCall functionResponse args thought finishReason resourceSpans scopeSpans "
    "spans attributes events"
).split()
WORDS = (
    "user assistant system tool developer human ai model wizard User MODEL Bot text tool_use tool_result thinking "
    "function_call function_call_output reasoning message response input_text output_text STOP MAX_TOKENS "
    "redacted_thinking image_url llm chain message constructor HumanMessage AIMessage length max_tokens stop "
    "a@b.co { ["
).split() + ["sk-" + "x" * 24]

leaf = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=6) | st.sampled_from(WORDS)
odd = st.recursive(
    leaf,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS), kids, max_size=4),
    max_leaves=14,
)

part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "image", "input_audio", "redacted_thinking"])}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=8)}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": st.sampled_from(["t1", "t2"]),
            "name": st.sampled_from(["f", ""]),
            "input": odd,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": st.just("t1"),
            "content": st.text(max_size=8) | st.lists(st.just({"type": "text", "text": "r"})),
        }
    ),
)
call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["c1", "c2", ""]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g"]), "arguments": st.text(max_size=8) | odd}
        ),
    }
)
# Mostly sound messages, so that plenty get written, with odd ones mixed in.
role = st.sampled_from(
    ["user"] * 4 + ["assistant"] * 4 + ["system", "tool", "developer", "human", "ai", "wizard", "User", "MODEL"]
)
message = st.fixed_dictionaries(
    {"role": role, "content": st.text(min_size=1, max_size=12) | st.none() | st.lists(part, max_size=3)},
    optional={
        "tool_calls": st.lists(call, max_size=2),
        "tool_call_id": st.just("c1"),
        "reasoning_content": st.text(max_size=6),
    },
)
messages = st.lists(message, max_size=5)
reply = message.map(lambda m: {**m, "role": "assistant"})
choices = st.lists(
    st.fixed_dictionaries({"message": reply, "finish_reason": st.sampled_from(["stop", "length"])}), max_size=2
)

# OpenAI Responses items and records, with previous_response_id chains among a few ids (loops included).
rid = st.sampled_from(["resp_1", "resp_2", "resp_3"])
item = st.one_of(
    message,
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": st.sampled_from(["c1", "c2"]), "name": st.sampled_from(["f", ""]),
         "arguments": st.text(max_size=6) | odd}
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.just("c1"), "output": st.text(max_size=6) | odd}
    ),
    st.fixed_dictionaries(
        {"type": st.just("reasoning"),
         "summary": st.lists(st.fixed_dictionaries({"type": st.just("summary_text"), "text": st.text(max_size=6)}))}
    ),
    st.fixed_dictionaries(
        {"type": st.just("message"), "role": st.just("assistant"),
         "content": st.lists(st.fixed_dictionaries({"type": st.just("output_text"), "text": st.text(max_size=8)}))}
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search_call", "item_reference", "input_image"])}),
)  # fmt: skip
responses_record = st.builds(
    lambda ins, inp, out, r, prev, status: {
        "request": {"input": inp, "previous_response_id": prev, **({"instructions": ins} if ins else {})},
        "response": {"object": "response", "id": r, "output": out, "status": status},
    },
    st.none() | st.text(max_size=6),
    st.text(max_size=6) | st.lists(item, max_size=4),
    st.lists(item, max_size=3),
    rid,
    st.none() | rid | st.just("resp_gone"),
    st.sampled_from(["completed", "completed", "incomplete", "failed"]),
)
# Gemini contents and records.
gpart = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=8)}, optional={"thought": st.booleans()}),
    st.fixed_dictionaries({"functionCall": st.fixed_dictionaries({"name": st.sampled_from(["f", ""]), "args": odd})}),
    st.fixed_dictionaries({"functionResponse": st.fixed_dictionaries({"name": st.just("f"), "response": odd})}),
    st.fixed_dictionaries({"inlineData": st.fixed_dictionaries({"mimeType": st.sampled_from(["image/png", "x"])})}),
    odd,
)
gcontent = st.fixed_dictionaries(
    {"parts": st.lists(gpart, max_size=3)}, optional={"role": st.sampled_from(["user", "model", "function", "x"])}
)
gemini_record = st.builds(
    lambda s, c, cand, reason: {
        "request": {"contents": c, **({"systemInstruction": {"parts": [{"text": s}]}} if s else {})},
        "response": {"candidates": [{"content": cand, "finishReason": reason}]},
    },
    st.none() | st.text(max_size=6),
    st.lists(gcontent, max_size=4),
    gcontent,
    st.sampled_from(["STOP", "STOP", "MAX_TOKENS", "SAFETY"]),
)
words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10)
user = words.map(lambda t: {"role": "user", "content": t})
good = {
    "openai": st.builds(
        lambda u, a: {
            "request": {"messages": [u]},
            "response": {"choices": [{"message": {"role": "assistant", "content": a}}]},
        },
        user,
        words,
    ),
    "anthropic": st.builds(
        lambda u, a: {
            "request": {"messages": [u]},
            "response": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": a}],
                "stop_reason": "end_turn",
            },
        },
        user,
        words,
    ),
    "messages": st.builds(lambda u, a: {"messages": [u, {"role": "assistant", "content": a}]}, user, words),
    "gemini": st.builds(
        lambda u, a: {
            "contents": [{"role": "user", "parts": [{"text": u["content"]}]}],
            "candidates": [{"content": {"role": "model", "parts": [{"text": a}]}, "finishReason": "STOP"}],
        },
        user,
        words,
    ),
    "langsmith": st.builds(
        lambda i, u, a: {
            "id": i,
            "run_type": "llm",
            "inputs": {"messages": [[u]]},
            "outputs": {"generations": [[{"text": a}]]},
        },
        st.sampled_from(["r1", "r2", "r3"]),
        user,
        words,
    ),
}
plausible = {
    "openai": st.one_of(
        st.builds(lambda m, c: {"messages": m, "choices": c}, messages, choices),
        st.builds(lambda m, c: {"request": {"messages": m}, "response": {"choices": c}}, messages, choices),
        st.builds(lambda m: {"model": "x", "messages": m}, messages),
        responses_record,
    ),
    "anthropic": st.builds(
        lambda s, m, r, stop: {
            "request": {"system": s, "messages": m},
            "response": {"type": "message", "content": r, "stop_reason": stop},
        },
        st.none() | st.text(max_size=6),
        messages,
        st.lists(part, max_size=3),
        st.sampled_from(["end_turn", "max_tokens"]),
    ),
    "messages": st.one_of(messages.map(lambda m: {"messages": m}), messages),
    "gemini": gemini_record,
    "langsmith": st.one_of(
        st.builds(
            lambda i, t, m, c: {"id": i, "run_type": t, "inputs": {"messages": [m]}, "outputs": {"choices": c}},
            st.sampled_from(["r1", "r2"]),
            st.sampled_from(["llm", "chain"]),
            messages,
            choices,
        ),
        st.builds(
            lambda i, s: {"run_id": i, "key": "k", "score": s},
            st.sampled_from(["r1", "r2", "r9"]),
            st.none() | st.floats(0, 1),
        ),
    ),
}


def lines_for(fmt: str):
    record = st.one_of(good[fmt], plausible[fmt], odd)
    line = st.one_of(
        record.map(lambda r: json.dumps(r).encode() + b"\n"),
        st.binary(max_size=12).map(lambda b: b.replace(b"\n", b" ") + b"\n"),  # mostly not JSON
        st.just(b"\n"),
    )
    return st.lists(line, max_size=12)


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_every_record_is_written_or_counted(fmt):
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(lines=lines_for(fmt), drop_tools=st.booleans(), redact=st.booleans(), min_score=st.none() | st.just(0.5))
    def check(lines, drop_tools, redact, min_score):
        out: list[bytes] = []
        run = Run(Options(drop_tools=drop_tools, redact=redact), skip_bad=True)
        if fmt == "langsmith":
            langsmith(run, lines, out.append, min_score)
        else:
            run.stream(lines, IMPORTERS[fmt], out.append)
        stats = run.stats
        assert stats.read == sum(1 for line in lines if not line.isspace())
        assert stats.read == stats.written + stats.attached + stats.dropped.total()
        assert stats.written == len(out)
        for line in out:
            conv = json.loads(line)
            assert conversation_problem(conv) is None, conv
            if drop_tools:
                assert all(m["role"] != "tool" and "tool_calls" not in m for m in conv["messages"])

    check()


# OpenTelemetry: exports of spans in each form the importer reads, with odd values mixed in. A span is a record.
def anyvalue(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [anyvalue(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": anyvalue(x)} for k, x in v.items()]}}
    return {}


EVENT_KEYS = ["content", "message", "index", "finish_reason", "tool_calls", "id"]


def keyvalues(attrs):
    return [{"key": k, "value": anyvalue(v)} for k, v in attrs.items()]


sem_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "content": st.text(max_size=8)}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_call"),
            "id": st.sampled_from(["c1", ""]),
            "name": st.sampled_from(["f", ""]),
            "arguments": odd,
        }
    ),
    st.fixed_dictionaries({"type": st.just("tool_call_response"), "id": st.just("c1"), "response": odd}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "content": st.text(max_size=6)}),
    st.fixed_dictionaries({"type": st.sampled_from(["blob", "uri", "server_tool_call"]), "modality": st.just("image")}),
)
sem_message = st.fixed_dictionaries(
    {"role": role, "parts": st.lists(sem_part, max_size=3)},
    optional={"finish_reason": st.sampled_from(["stop", "length", "content_filter"])},
)
attr_value = st.one_of(
    st.lists(sem_message, max_size=3).map(json.dumps),
    st.lists(sem_message, max_size=3),
    st.sampled_from(["chat", "LLM", "user", "assistant", "[{", "length"]),
    st.text(max_size=8),
    odd,
)
attr_key = st.sampled_from(
    [
        "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.operation.name",
        "gen_ai.tool.definitions", "openinference.span.kind", "llm.input_messages.0.message.role",
        "llm.input_messages.0.message.content", "llm.output_messages.0.message.content",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.content", "gen_ai.completion.0.content", "gen_ai.completion.0.finish_reason", "http.method",
    ]
)  # fmt: skip
event = st.fixed_dictionaries(
    {
        "name": st.sampled_from(
            ["gen_ai.system.message", "gen_ai.user.message", "gen_ai.assistant.message", "gen_ai.tool.message",
             "gen_ai.choice", "gen_ai.client.inference.operation.details", "exception"]
        ),
        "attributes": st.dictionaries(st.sampled_from(EVENT_KEYS), attr_value, max_size=3),
    }
)  # fmt: skip
otel_span = st.builds(
    lambda trace, attrs, events, end: {
        "traceId": trace,
        "spanId": "s",
        "endTimeUnixNano": str(end),
        "attributes": keyvalues(attrs),
        "events": [{**e, "attributes": keyvalues(e["attributes"])} for e in events],
    },
    st.sampled_from(["t1", "t2", ""]),
    st.dictionaries(attr_key, attr_value, max_size=5),
    st.lists(event, max_size=3),
    st.integers(0, 3),
)
otel_export = st.lists(otel_span, max_size=4).map(
    lambda spans: {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    records=st.lists(st.one_of(otel_export, otel_span, odd), max_size=4),
    garbage=st.booleans(),
    join_trace=st.booleans(),
    dedupe=st.booleans(),
)
def test_every_span_is_written_or_counted(records, garbage, join_trace, dedupe):
    lines = [json.dumps(r).encode() + b"\n" for r in records] + ([b"{not json\n"] if garbage else [])
    out: list[bytes] = []
    run = Run(Options(dedupe=dedupe), skip_bad=True)
    traces.stream(run, lines, run.emitter(out.append), join_trace)
    stats = run.stats
    expected = 0
    for line in traces.documents(lines):
        try:
            found = otel.spans(json.loads(line))
        except ValueError:
            found = None
        expected += len(found) if found else 1
    assert stats.read == expected
    assert stats.read == stats.written + stats.dropped.total()
    assert stats.written == len(out)
    for line in out:
        assert conversation_problem(json.loads(line)) is None


# The fast paths agree with the general code they skip: same conversation or reason, same parts, same error.
# Keys (and values) that decide where the general search finds the request and the reply, or a failed call.
marks = st.dictionaries(
    st.sampled_from(["error", "status", "status_code", "content", "stop_reason", "type", "messages", "choices",
                     "request", "response", "input", "output", "role", "model"]),
    st.sampled_from([400, 503, 200, "failed", "message", True, "", None]) | odd,
    max_size=3,
)
pair_record = st.builds(
    lambda extra, request, m, response, c: {**extra, "request": {**request, "messages": m},
                                            "response": {**response, "choices": c}},
    marks, marks, messages, marks, choices | odd,
)  # fmt: skip


def _outcome(convert, record):
    parts: Counter[str] = Counter()
    try:
        return convert(copy.deepcopy(record), parts), parts
    except Exception as e:  # noqa: BLE001 - both paths must fail alike too
        return type(e), None


PAIR = {"request": {"messages": [{"role": "user", "content": "q"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=pair_record)
@example(record={**PAIR, "content": "the reply", "stop_reason": "end_turn"})  # the record itself is a response
@example(record={**PAIR, "type": "message", "content": [{"type": "text", "text": "a"}]})
@example(record={**PAIR, "messages": [{"role": "user", "content": "other"}]})  # the record itself is a request
@example(record={**PAIR, "choices": [{"message": {"role": "assistant", "content": "other"}}]})
@example(record={**PAIR, "status_code": 500})
@example(record={**PAIR, "status": 429, "error": {"message": "rate limited"}})
def test_the_request_response_pair_is_what_the_general_search_finds(record):
    """Where _logged_pair answers, the Responses check says no and the wrapper search finds the same two dicts
    (or the same failed call); the rest of from_openai is one code for both."""
    def found(search):
        try:
            return search(record)
        except Skip as skip:
            return skip.reason

    pair = found(importers._logged_pair)
    if pair is None:
        return
    assert found(importers._responses().split) is None
    searched = found(importers._request_and_response)
    if isinstance(pair, str):
        assert searched == pair == "error_response"
    else:
        assert searched[0] is pair[0] and searched[1] is pair[1] and "choices" in pair[1]  # _reply reads choices


normalized = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "assistant", "tool"]),
     "content": st.sampled_from(["", "a", "b"])},
    optional={"tool_calls": st.just([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
              "reasoning": st.sampled_from(["", "r"])},
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(normalized, max_size=6))
def test_finalize_skips_tidying_only_what_tidying_would_keep_as_it_is(turns):
    """Where _trainable_as_is says yes, _tidy keeps every message and finalize's checks after it pass."""
    if messages_module._trainable_as_is(turns):
        tidied, roles = messages_module._tidy(copy.deepcopy(turns))
        assert tidied == turns and "assistant" in roles and len(roles) > 1


calls_turn = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.sampled_from([None, "", "x"]) | odd,
     "tool_calls": st.lists(call | odd, max_size=3)},
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(msg=calls_turn)
def test_a_tool_call_turn_converts_as_the_general_path_does(msg):
    assert _outcome(convert_message, msg) == _outcome(lambda m, parts: messages_module._convert(m, parts, None), msg)
