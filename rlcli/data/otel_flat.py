"""Flattened LLM span attributes (OpenLLMetry, OpenInference) and the helpers every span form shares. Pure code.

OpenLLMetry writes PREFIX.N.field (`gen_ai.prompt.0.role`, `gen_ai.completion.0.tool_calls.0.name`,
`llm.request.functions.0.parameters`); OpenInference writes PREFIX.N.message.field
(`llm.input_messages.0.message.role`, `...message.contents.0.message_content.text`,
`...message.tool_calls.0.tool_call.function.arguments`, `llm.tools.0.tool.json_schema`). Both become
OpenAI-shaped messages for rlcli.data.messages. rlcli.data.otel decides which form a span carries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from rlcli.data.messages import Conversation, Message, Skip, conversation, convert_message

_STOPS = {"length": "truncated", "max_tokens": "truncated", "content_filter": "blocked", "error": "error_response"}


def check_end(reason: Any) -> None:
    """Drop a reply that stopped at its length limit (truncated), was filtered (blocked) or failed."""
    if isinstance(reason, list):
        reason = reason[0] if reason else None
    if isinstance(reason, str) and reason.lower() in _STOPS:
        raise Skip(_STOPS[reason.lower()])


def first_reply(replies: list[Any], parts: Counter[str]) -> Any:
    """The first output message; the others were other choices."""
    if len(replies) > 1:
        parts["extra_choice"] += len(replies) - 1
    return replies[0] if replies else None


def maybe_parts(content: Any) -> Any:
    """Content logged as JSON text of a part list stays text unless it really is a part list."""
    if isinstance(content, str) and content.startswith('[{"type"'):
        try:
            return orjson.loads(content)
        except ValueError:
            return content
    return content


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for key, val in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, field = key[len(prefix) :].partition(".")
        if index.isdigit():
            found.setdefault(int(index), {})[_field(field)] = val
    return [found[i] for i in sorted(found)]


def _field(field: str) -> str:
    """OpenInference's nested field names -> OpenLLMetry's.

    message.tool_calls.0.tool_call.function.name -> tool_calls.0.name
    """
    field = field.removeprefix("message.")
    for long, short in (("tool_call.function.", ""), ("tool_call.", ""), ("message_content.", "")):
        field = field.replace(long, short)
    return field


def _flat_message(fields: dict[str, Any], default_role: str) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": fields.get("role") or default_role, "content": maybe_parts(fields.get("content"))}
    contents = _grouped(fields, "contents.")
    if contents and msg["content"] is None:
        msg["content"] = [_content_part(c) for c in contents]
    calls = _grouped(fields, "tool_calls.")
    if calls:
        msg["tool_calls"] = [{"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
                             for c in calls]  # fmt: skip
    if fields.get("tool_call_id") is not None:
        msg["tool_call_id"] = str(fields["tool_call_id"])
    return msg


def _content_part(c: dict[str, Any]) -> dict[str, Any]:
    """An OpenInference content entry as a part: text kept, other kinds (image, audio...) counted by name."""
    kind = c.get("type", "text")
    if kind == "text":
        return {"type": "text", "text": c.get("text", "")}
    return {"type": kind if isinstance(kind, str) else "unknown_part"}


def _grouped(fields: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return _indexed({k: v for k, v in fields.items() if k.startswith(prefix)}, prefix)


def flattened(attrs: dict[str, Any], inputs: str, outputs: str, parts: Counter[str]) -> Conversation:
    messages: list[Message] = []
    for fields in _indexed(attrs, inputs):
        messages += convert_message(_flat_message(fields, "user"), parts)
    reply = first_reply(_indexed(attrs, outputs), parts)
    if reply is not None:
        check_end(reply.get("finish_reason"))
        messages += convert_message(_flat_message(reply, "assistant"), parts)
    return conversation(messages, _flat_tools(attrs, parts), parts)


def _flat_tools(attrs: dict[str, Any], parts: Counter[str]) -> list[Any]:
    tools = []
    for fields in _indexed(attrs, "llm.tools."):  # OpenInference: a JSON schema per tool
        schema = fields.get("tool.json_schema")
        try:
            tools.append(orjson.loads(schema) if isinstance(schema, str) else schema)
        except ValueError:
            parts["bad_tool_definition"] += 1
    for fields in _indexed(attrs, "llm.request.functions."):  # OpenLLMetry
        spec = {k: fields[k] for k in ("name", "description") if k in fields}
        params = fields.get("parameters")
        spec["parameters"] = params if params is not None else {}
        tools.append(spec)
    return tools
