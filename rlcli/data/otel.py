"""OpenTelemetry spans of LLM calls (`-f otel`) -> conversations. Pure code.

`spans(record)` lists the spans of one OTLP/JSON export (resourceSpans -> scopeSpans -> spans, as
the collector's file exporter and OTLP/HTTP JSON write it), of a list of exports, or a single span
object (OTLP or the SDK console exporter's flat form). `from_span(span, parts)` converts one span:
attributes are OTLP KeyValue lists (AnyValue decoded: stringValue, intValue, arrayValue,
kvlistValue...) or flat dicts. The conversation comes from the first of these a span carries:
1. the GenAI semantic conventions' current form: `gen_ai.input.messages`, `gen_ai.output.messages`,
   `gen_ai.system_instructions`, `gen_ai.tool.definitions` (JSON text or structured), on the span
   or on its `gen_ai.client.inference.operation.details` event; parts text, tool_call,
   tool_call_response, reasoning kept, blob/file/uri counted by modality, server tool calls counted;
2. their older event form: `gen_ai.system.message`, `gen_ai.user.message`,
   `gen_ai.assistant.message`, `gen_ai.tool.message` and `gen_ai.choice` events (payload in the
   event's body or attributes), and the oldest `gen_ai.content.prompt`/`completion` events;
3. OpenLLMetry's flattened attributes (`gen_ai.prompt.N.role`, `gen_ai.completion.N.content`,
   `...tool_calls.K.name`, `llm.request.functions.N.*`; read in rlcli.data.otel_flat, as is 4);
4. OpenInference's (Arize Phoenix) flattened attributes (`llm.input_messages.N.message.role`,
   `...message.contents.K.message_content.text`, `...message.tool_calls.K.tool_call.function.name`,
   `llm.output_messages.N...`, `llm.tools.N.tool.json_schema`).
An LLM span (gen_ai.operation.name chat/text_completion/generate_content, OpenInference kind LLM)
without any of them was recorded with content capture off: `no_content`. Other spans (HTTP,
tools, agents, embeddings) are `non_llm_span`. An attribute whose JSON does not parse (SDKs cut
long attribute values) is `bad_attribute_json`. The first output message is the reply (others
are counted as extra_choice); finish reason length -> truncated, content_filter -> blocked.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from rlcli.data.messages import (
    SLICE_ATTRIBUTE,
    Conversation,
    Message,
    Skip,
    conversation,
    convert_message,
    from_parts,
    role_of,
    slice_tag,
    tagged,
    to_json,
)
from rlcli.data.otel_flat import check_end, first_reply, flattened, maybe_parts

_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})
_ROLE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_PLAIN_ROLES = ("user", "assistant", "system")  # a tuple: `in` compares by equality, so odd values cannot raise
_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_PREFIXES = ("gen_ai.", "llm.", "openinference.")


def value(v: Any) -> Any:
    """An OTLP AnyValue as plain JSON (flat attribute values pass through)."""
    if type(v) is not dict:
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:  # int64 travels as a JSON string in OTLP/JSON
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return v["intValue"]
    for key in ("doubleValue", "boolValue", "bytesValue"):
        if key in v:
            return v[key]
    if "arrayValue" in v:
        values = v["arrayValue"].get("values") if isinstance(v["arrayValue"], dict) else None
        return [value(x) for x in values or ()]
    if "kvlistValue" in v:
        kvs = v["kvlistValue"].get("values") if isinstance(v["kvlistValue"], dict) else None
        return attributes(kvs)
    return v if v else None


def attributes(attrs: Any) -> dict[str, Any]:
    """OTLP KeyValue list (or a flat dict) -> a flat dict of plain values."""
    if type(attrs) is not list:
        return attrs if type(attrs) is dict else {}
    out = {}
    for a in attrs:
        if type(a) is dict and type(key := a.get("key")) is str:
            v = a.get("value")
            out[key] = v["stringValue"] if type(v) is dict and "stringValue" in v else value(v)  # strings: most
    return out


def spans(record: Any) -> list[Any] | None:
    """The spans of an export (or list of exports), a bare span as a list of one, or None."""
    if type(record) is list:
        found = [spans(r) for r in record]
        return None if any(f is None for f in found) else [s for f in found for s in f or ()]
    if type(record) is not dict:
        return None
    resources = record.get("resourceSpans", record.get("resource_spans"))
    if resources is None:
        is_span = "attributes" in record and any(k in record for k in ("spanId", "span_id", "context", "name"))
        return [record] if is_span else None
    out: list[Any] = []
    for resource in resources if type(resources) is list else ():
        scopes = (
            resource.get("scopeSpans", resource.get("instrumentationLibrarySpans")) if type(resource) is dict else None
        )
        for scope in scopes if type(scopes) is list else ():
            found = scope.get("spans") if type(scope) is dict else None
            out += found if type(found) is list else ()
    return out


def ids(span: Any) -> tuple[str, str]:
    """(trace id, span id) of an OTLP span or a console-exporter one."""
    if type(span) is not dict:
        return "", ""
    context = span.get("context") if type(span.get("context")) is dict else span
    trace = context.get("traceId", context.get("trace_id"))
    sid = context.get("spanId", context.get("span_id"))
    return str(trace or ""), str(sid or "")


def end_time(span: Any) -> int:
    raw = span.get("endTimeUnixNano", span.get("startTimeUnixNano", 0)) if type(span) is dict else 0
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


def _json(v: Any) -> Any:
    if type(v) is str:
        try:
            return orjson.loads(v)
        except ValueError:
            raise Skip("bad_attribute_json") from None
    return v


def from_span(span: Any, parts: Counter[str]) -> Conversation | str:
    """One span -> its LLM call's conversation, or the reason it has none."""
    if type(span) is dict and not span.get("events") and type(attrs := span.get("attributes")) is list:
        # An HTTP, database... span (most of a trace) is told from its raw attribute keys, undecoded.
        if not any(type(a) is dict and str(a.get("key")).startswith(_PREFIXES) for a in attrs):
            return "non_llm_span"
    try:
        conv = _convert(span, parts)
    except Skip as skip:
        return skip.reason
    trace, sid = span.get("traceId"), span.get("spanId")
    if trace is None:  # the console exporter's form, or snake_case
        trace, sid = ids(span)
    if trace:
        conv["trace_id"] = str(trace)
    if sid:
        conv["span_id"] = str(sid)
    return conv


def _convert(span: Any, parts: Counter[str]) -> Conversation:
    if type(span) is not dict:
        raise Skip("unrecognized")
    attrs = attributes(span.get("attributes"))
    events = span.get("events")
    if not events or type(events) is not list:
        events = []
        if not any(key.startswith(_PREFIXES) for key in attrs):  # an HTTP, database... span: told fast
            raise Skip("non_llm_span")
    for event in events:
        if type(event) is dict and event.get("name") == _DETAILS_EVENT:
            attrs = {**attributes(event.get("attributes")), **attrs}
    conv = _by_convention(attrs, events, parts)
    if (tag := attrs.get(SLICE_ATTRIBUTE)) is not None:
        tagged(conv, slice_tag(tag))
    return conv


def _by_convention(attrs: dict[str, Any], events: list[Any], parts: Counter[str]) -> Conversation:
    """The conversation as the span's instrumentation wrote it (the conventions below, newest first)."""
    if "gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs:
        return _semconv(attrs, parts)
    if any(type(e) is dict and str(e.get("name", "")).startswith("gen_ai.") for e in events):
        return _events(events, attrs, parts)
    if "gen_ai.prompt.0.role" in attrs or "gen_ai.completion.0.role" in attrs or "gen_ai.prompt.0.content" in attrs:
        return flattened(attrs, "gen_ai.prompt.", "gen_ai.completion.", parts)
    if any(key.startswith(("llm.input_messages.", "llm.output_messages.")) for key in attrs):
        return flattened(attrs, "llm.input_messages.", "llm.output_messages.", parts)
    operation = attrs.get("gen_ai.operation.name")
    if (isinstance(operation, str) and operation in _LLM_OPERATIONS) or attrs.get("openinference.span.kind") == "LLM":
        raise Skip("no_content")
    raise Skip("non_llm_span")


# 1. The current semantic conventions: messages made of typed parts.


def _semconv(attrs: dict[str, Any], parts: Counter[str]) -> Conversation:
    inputs = _json(attrs.get("gen_ai.input.messages")) or []
    outputs = _json(attrs.get("gen_ai.output.messages")) or []
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise Skip("bad_message")
    messages = _system_parts(_json(attrs.get("gen_ai.system_instructions")), parts)
    for m in inputs:
        if (text := _only_text(m)) is not None:  # most messages: one text part, kept cheap
            messages.append({"role": m["role"], "content": text})
        else:
            messages += _part_message(m, parts, "user")
    reply = first_reply(outputs, parts)
    if reply is not None:
        check_end(reply.get("finish_reason") if isinstance(reply, dict) else None)
        messages += _part_message(reply, parts, "assistant")
    else:
        check_end(attrs.get("gen_ai.response.finish_reasons"))
    return conversation(messages, _json(attrs.get("gen_ai.tool.definitions")), parts)


def _system_parts(value: Any, parts: Counter[str]) -> list[Message]:
    if value is None:
        return []
    if type(value) is list and len(value) == 1 and type(value[0]) is dict and value[0].get("type") == "text":
        text = value[0].get("content")  # one text part: the common case
        if type(text) is str:
            return [{"role": "system", "content": text}] if text else []
    items = value if isinstance(value, list) else [value]
    texts = [t for t in (_part_text(p, parts) for p in items) if t]
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _part_text(part: Any, parts: Counter[str]) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("content"), str):
        return part["content"]
    parts[_kind(part)] += 1
    return ""


def _kind(part: Any) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        return "unknown_part"
    if part["type"] in ("blob", "file", "uri"):
        modality = part.get("modality")
        return modality if modality in ("image", "audio", "video") else "file"
    return part["type"]


def _only_text(m: Any) -> str | None:
    """The text of a user/system/assistant message made of one non-empty text part, else None."""
    raw = m.get("parts") if type(m) is dict else None
    if type(raw) is not list or len(raw) != 1 or m.get("role") not in _PLAIN_ROLES:
        return None
    part = raw[0]
    if type(part) is not dict or part.get("type") != "text":
        return None
    text = part.get("content")
    return text if type(text) is str and text else None


def _part_message(m: Any, parts: Counter[str], default_role: str) -> list[Message]:
    if not isinstance(m, dict):
        raise Skip("bad_message")
    if "parts" not in m:  # some instrumentations log provider-shaped messages here
        return convert_message(m, parts, default_role)
    if (text := _only_text(m)) is not None:
        return [{"role": m["role"], "content": text}]
    raw, role = m["parts"], role_of(m.get("role") or default_role)
    raw = raw if isinstance(raw, list) else [raw]
    texts, thinking, calls, results = [], [], [], []
    for part in raw:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "tool_call" and isinstance(part.get("name"), str) and part["name"]:
            args = part.get("arguments")
            args = args if isinstance(args, str) else to_json({} if args is None else args)
            call_id = str(part.get("id") or "").strip()
            calls.append({"id": call_id, "type": "function", "function": {"name": part["name"], "arguments": args}})
        elif kind == "tool_call_response":
            response = part.get("response", part.get("result"))
            text = response if isinstance(response, str) else to_json(response)
            results.append({"role": "tool", "tool_call_id": str(part.get("id") or "").strip(), "content": text})
        elif kind == "reasoning" and isinstance(part.get("content"), str):
            thinking.append(part["content"])
        elif text := _part_text(part, parts):
            texts.append(text)
    return from_parts(role, texts, thinking, calls, results)


# 2. The older event form: one event per message, and one per choice.


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    body = value(event.get("body"))
    return body if isinstance(body, dict) else attributes(event.get("attributes"))


def _events(events: list[Any], attrs: dict[str, Any], parts: Counter[str]) -> Conversation:
    messages: list[Message] = []
    choices: list[Any] = []
    for event in events:
        name = event.get("name") if type(event) is dict else None
        if not isinstance(name, str):
            continue
        if name in _ROLE_EVENTS:
            p = _payload(event)
            msg = {"role": p.get("role") or _ROLE_EVENTS[name], "content": maybe_parts(p.get("content"))}
            if p.get("tool_calls"):
                msg["tool_calls"] = _json(p["tool_calls"])
            if p.get("id") is not None:
                msg["tool_call_id"] = str(p["id"])
            messages += convert_message(msg, parts)
        elif name == "gen_ai.choice":
            choices.append(_payload(event))
        elif name == "gen_ai.content.prompt":
            prompt = _json(_payload(event).get("gen_ai.prompt")) or []
            for m in prompt if isinstance(prompt, list) else [prompt]:
                messages += convert_message(m, parts, "user")
        elif name == "gen_ai.content.completion":
            completion = _json(_payload(event).get("gen_ai.completion")) or []
            choices += completion if isinstance(completion, list) else [completion]
    choices.sort(key=lambda c: c.get("index", 0) if isinstance(c, dict) and isinstance(c.get("index"), int) else 0)
    choice = first_reply(choices, parts)
    if isinstance(choice, dict):
        check_end(choice.get("finish_reason"))
        message = _json(choice.get("message", choice))
        if isinstance(message, dict):
            message = {**message, "content": maybe_parts(message.get("content"))}
        messages += convert_message(message, parts, "assistant")
    return conversation(messages, _json(attrs.get("gen_ai.tool.definitions")), parts)
