"""OpenAI Responses API records (POST /v1/responses) -> conversations. Pure code.

`-f openai` reads these beside Chat Completions: `split` recognizes a Responses record by shapes
Chat Completions never has (a typed `output` item list, `object: "response"`, `instructions`,
`previous_response_id`, an `input` that is a string or holds typed items) and returns its request
and response; anything else goes on to the Chat Completions reader unchanged.

Accepted: a request alone, a response object alone (it does not echo its input: dropped as
`no_input`), both side by side under the usual wrapper keys (request/response, body, batch-API
lines), or one merged object {instructions, input, output, ...}.
- `instructions` -> a system message first; `input` a string (one user turn) or items;
- message items (typed or plain {role, content}; input_text/output_text/refusal parts kept,
  input_image/input_file/input_audio counted), `function_call` / `custom_tool_call` -> assistant
  tool calls, `*_call_output` -> tool messages (named after their call), `reasoning` -> the
  `reasoning` field (its text, else its summary; encrypted-only reasoning is counted);
- built-in tool calls (web_search_call, file_search_call, computer_call...) and item_reference are
  counted by type: the server ran them and their results are not in the log;
- `tools`: function and custom tools kept, built-in tools counted as `builtin_tool`.
A record with `previous_response_id` continues an earlier response: the server prepended that
response's input and output, which are not in this record. It comes back as a Link, which
rlcli.data.chains joins to the earlier record when the file holds it. A request that names a
stored `conversation` cannot be completed from the file: `stored_conversation`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from rlcli.data.messages import (
    Conversation,
    Link,
    Message,
    Skip,
    conversation,
    convert_message,
    read_texts,
    tag_of,
    tagged,
    to_json,
)

_REQUEST_KEYS = ("request", "body", "request_body", "params", "inputBodyJson")
_RESPONSE_KEYS = ("response", "response_body", "result", "outputBodyJson")
_CALLS = frozenset({"function_call", "custom_tool_call"})
# Tuples, not sets: `in` compares by equality, so an odd value (a list) cannot raise.
_PLAIN_ROLES = ("user", "assistant", "system")
_TEXT_PARTS = ("input_text", "output_text", "text")
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _dict(value: Any) -> dict[str, Any] | None:
    if type(value) is str and value.startswith("{"):
        try:
            value = orjson.loads(value)
        except ValueError:
            return None
    return value if type(value) is dict else None


def _is_reply(d: dict[str, Any]) -> bool:
    out = d.get("output")
    return d.get("object") == "response" or (type(out) is list and bool(out) and _typed(out[0]))


def _typed(item: Any) -> bool:
    return type(item) is dict and "type" in item


def _is_request(d: dict[str, Any]) -> bool:
    if "messages" in d or "choices" in d:
        return False
    given = d.get("input")
    return (
        "instructions" in d
        or "previous_response_id" in d
        or type(given) is str
        or (type(given) is list and any(_typed(i) for i in given))
    )


def _response_of(record: dict[str, Any]) -> dict[str, Any] | None:
    for key in _RESPONSE_KEYS:
        value = _dict(record.get(key))
        if value is None:
            continue
        status = value.get("status_code")
        if value.get("error") or (isinstance(status, int) and status >= 400):
            raise Skip("error_response")
        body = _dict(value.get("body"))  # a batch-API output line: {status_code, body: response}
        return body if body is not None and "output" not in value else value
    return None


def split(record: Any) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(request, response or None) of a Responses API record; None when it is not one."""
    if type(record) is not dict or "messages" in record or "choices" in record:
        return None
    response = record.get("response")
    if type(response) is dict and "choices" in response:  # a Chat Completions pair: the common case, told fast
        return None
    if _is_reply(record):
        return record, record  # a response object, or request and response merged into one
    if _is_request(record) and "output" not in record:
        return record, None
    response = _response_of(record)
    request = next((r for k in _REQUEST_KEYS if (r := _dict(record.get(k))) is not None), None)
    if response is not None and _is_reply(response):
        return request or {}, response
    if response is None and request is not None and _is_request(request):
        return request, None
    return None


def convert(request: dict[str, Any], response: dict[str, Any] | None, parts: Counter[str]) -> Conversation | Link:
    if request.get("conversation"):
        raise Skip("stored_conversation")
    names: dict[str, str] = {}  # call_id -> tool name, for the tool messages that answer it
    if response is not None:
        _check_status(response)
        if "input" not in request:
            raise Skip("no_input")
    messages = _items(request.get("input"), parts, names)
    if response is not None:
        messages += _items(response.get("output"), parts, names)
    echo = response if response is not None else {}
    instructions = request["instructions"] if "instructions" in request else echo.get("instructions")
    system = _system(instructions, parts)
    tools = _function_tools(request.get("tools") or echo.get("tools"), parts)
    rid = str(echo.get("id") or "") if echo.get("object", "response") == "response" else ""
    previous = request.get("previous_response_id") or echo.get("previous_response_id")
    tag = tag_of(request.get("metadata"))
    if not rid and not previous:
        return tagged(conversation(system + messages, tools, parts), tag)
    return Link(tagged(conversation(messages, tools, parts), tag), system, rid, str(previous or ""))


def _check_status(response: dict[str, Any]) -> None:
    status = response.get("status")
    if response.get("error") or status in ("failed", "cancelled"):
        raise Skip("error_response")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        reason = reason if isinstance(reason, str) else ""
        raise Skip({"max_output_tokens": "truncated", "content_filter": "blocked"}.get(reason, "incomplete"))


def _system(instructions: Any, parts: Counter[str]) -> list[Message]:
    if type(instructions) is str:
        return [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(instructions, list):  # a response may echo instructions as input items
        return [dict(m, role="system") for m in _items(instructions, parts, {}) if m.get("content")]
    text = "\n".join(read_texts(instructions, parts)) if instructions else ""
    return [{"role": "system", "content": text}] if text else []


def _function_tools(tools: Any, parts: Counter[str]) -> list[Any]:
    kept = []
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") not in (None, "function", "custom") and "name" not in tool:
            parts["builtin_tool"] += 1  # web_search, file_search, code_interpreter...: run by the server
        else:
            kept.append(tool)
    return kept


def _items(items: Any, parts: Counter[str], names: dict[str, str]) -> list[Message]:
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise Skip("bad_message")
    out: list[Message] = []
    for item in items:
        if type(item) is not dict:
            raise Skip("bad_message")
        kind = item.get("type")
        kind = kind if isinstance(kind, str) or kind is None else "unknown_item"
        if kind is None or kind == "message":
            # The common shape first, kept cheap: one user/system/assistant text (a string or one text part).
            role, content = item.get("role"), item.get("content")
            if type(content) is list and len(content) == 1 and type(content[0]) is dict:
                part = content[0]
                content = part.get("text") if part.get("type") in _TEXT_PARTS else None
            if type(content) is str and content and role in _PLAIN_ROLES:
                out.append({"role": role, "content": content})
            else:
                out += convert_message(item, parts)
        elif kind in _CALLS:
            out += _call(item, parts, names)
        elif kind in _OUTPUTS:
            out.append(_call_output(item, parts, names))
        elif kind == "reasoning":
            out += _reasoning(item, parts)
        else:  # built-in tool calls and their outputs, item references: not in the log
            parts[kind] += 1
    return out


def _call(item: dict[str, Any], parts: Counter[str], names: dict[str, str]) -> list[Message]:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        parts["bad_tool_call"] += 1
        return []
    call_id = str(item.get("call_id") or item.get("id") or "")
    names[call_id] = name
    if item["type"] == "custom_tool_call":  # free-form input: wrapped so arguments stay a JSON object
        args = to_json({"input": item.get("input")})
    else:
        args = item.get("arguments")
        args = args if isinstance(args, str) else to_json({} if args is None else args)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]}]


def _call_output(item: dict[str, Any], parts: Counter[str], names: dict[str, str]) -> Message:
    call_id = str(item.get("call_id") or "")
    output = item.get("output")
    text = output if isinstance(output, str) else "\n".join(read_texts(output, parts))
    tool: Message = {"role": "tool", "tool_call_id": call_id, "content": text}
    if call_id in names:
        tool["name"] = names[call_id]
    return tool


def _reasoning(item: dict[str, Any], parts: Counter[str]) -> list[Message]:
    texts = _texts(item.get("content")) or _texts(item.get("summary"))
    if texts:
        return [{"role": "assistant", "content": "", "reasoning": "\n\n".join(texts)}]
    if item.get("encrypted_content"):
        parts["encrypted_reasoning"] += 1
    return []


def _texts(value: Any) -> list[str]:
    """Texts of reasoning_text / summary_text parts."""
    if not isinstance(value, list):
        return []
    return [p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]
