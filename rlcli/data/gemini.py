"""Gemini generateContent records (`-f gemini`) -> conversations. Pure code.

Accepted: a request {contents, systemInstruction, tools}, a response {candidates, promptFeedback},
a streamed response (a list of response chunks, joined), or both side by side under the usual
wrapper keys (request/response as the Batch API writes them, full_request/full_response, body...).
Field names are read in the REST form (camelCase) and in the snake_case that the Python SDK's
model_dump() writes.
- contents[].role: user, model (-> assistant), function (older tool results); none means user;
- parts: text (thought: true -> the `reasoning` field), functionCall -> a tool call,
  functionResponse -> a tool message (its `response` as JSON text); tool results come first in
  their turn. Calls without an id get `call_<n>` and each response takes the oldest open call of
  its name. inlineData/fileData are counted by MIME kind; executableCode/codeExecutionResult
  (the built-in code tool) are counted;
- tools[].functionDeclarations kept (parameters or parametersJsonSchema); built-in tools
  (googleSearch, codeExecution...) counted as `builtin_tool`;
- candidates: the first is the reply (others counted as extra_choice); finishReason MAX_TOKENS
  -> truncated, safety/recitation/blocklist reasons -> blocked; a prompt blocked before any
  candidate -> blocked.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from rlcli.data.messages import Conversation, Message, Skip, conversation, from_parts, role_of, to_json

_REQUEST_KEYS = ("request", "full_request", "body", "request_body", "requestBody", "params")
_RESPONSE_KEYS = ("response", "full_response", "result", "response_body", "responseBody", "output")
_BLOCKED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})
_MEDIA = ("image", "audio", "video")
_PLAIN_ROLES = {"user": "user", "model": "assistant"}


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    value = d.get(camel)
    return d.get(snake) if value is None else value


def _decoded(value: Any) -> Any:
    if type(value) is str and value.startswith(("{", "[")):
        try:
            return orjson.loads(value)
        except ValueError:
            return value
    return value


def _is_response(value: Any) -> bool:
    if type(value) is list:  # a stream: one response chunk per item
        return bool(value) and type(value[0]) is dict and "candidates" in value[0]
    return type(value) is dict and ("candidates" in value or _get(value, "promptFeedback", "prompt_feedback"))


def _split(record: Any) -> tuple[dict[str, Any], Any]:
    if type(record) is not dict:
        raise Skip("unrecognized")
    if record.get("error"):
        raise Skip("error_response")
    request = record if "contents" in record else None
    response = record if _is_response(record) else None
    for key in _REQUEST_KEYS if request is None else ():
        value = _decoded(record.get(key))
        if type(value) is dict and "contents" in value:
            request = value
            break
    for key in _RESPONSE_KEYS if response is None else ():
        value = _decoded(record.get(key))
        if type(value) is dict and value.get("error"):
            raise Skip("error_response")
        if _is_response(value):
            response = value
            break
    if request is None and response is None:
        raise Skip("unrecognized")
    return request or {}, response


def from_gemini(record: Any, parts: Counter[str]) -> Conversation | str:
    """A Gemini generateContent record: a request, a response, or both side by side."""
    try:
        request, response = _split(record)
        calls = _Calls()
        messages = _system(_get(request, "systemInstruction", "system_instruction"), parts)
        contents = request.get("contents", [])
        if isinstance(contents, dict):  # a single Content where a list was expected
            contents = [contents]
        if not isinstance(contents, list):
            raise Skip("bad_message")
        for content in contents:
            if (plain := _plain(content)) is not None:  # one text part: most turns, kept cheap
                messages.append(plain)
            else:
                messages += _content(content, parts, calls, "user")
        if response is not None:
            messages += _content(_candidate(response, parts), parts, calls, "assistant")
        return conversation(messages, _tools(request.get("tools"), parts), parts)
    except Skip as skip:
        return skip.reason


def _system(value: Any, parts: Counter[str]) -> list[Message]:
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, dict) and isinstance(value.get("parts"), list):
        texts = [p["text"] for p in value["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str)]
    elif value is None:
        texts = []
    else:
        raise Skip("bad_message")
    text = "\n".join(t for t in texts if t)
    return [{"role": "system", "content": text}] if text else []


def _candidate(response: Any, parts: Counter[str]) -> dict[str, Any]:
    """The content of the first candidate (a stream's chunks joined), after checking why it ended."""
    chunks = response if isinstance(response, list) else [response]
    joined: list[Any] = []
    reason = None
    for chunk in chunks:
        if not isinstance(chunk, dict):
            raise Skip("bad_message")
        candidates = chunk.get("candidates")
        if not candidates:
            feedback = _get(chunk, "promptFeedback", "prompt_feedback")
            if isinstance(feedback, dict) and _get(feedback, "blockReason", "block_reason"):
                raise Skip("blocked")
            continue
        if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
            raise Skip("bad_message")
        if len(candidates) > 1 and chunk is chunks[-1]:
            parts["extra_choice"] += len(candidates) - 1
        first = candidates[0]
        reason = _get(first, "finishReason", "finish_reason") or reason
        content = first.get("content")
        if isinstance(content, dict) and isinstance(content.get("parts"), list):
            joined += content["parts"]
    reason = reason if isinstance(reason, str) else None
    if reason == "MAX_TOKENS":
        raise Skip("truncated")
    if reason in _BLOCKED:
        raise Skip("blocked")
    if reason == "MALFORMED_FUNCTION_CALL":
        raise Skip("malformed_function_call")
    if not joined:
        raise Skip("no_assistant_reply")
    return {"role": "model", "parts": joined}


class _Calls:
    """Tool call ids of one record: the logged ones, or `call_<n>` matched to responses by name."""

    def __init__(self) -> None:
        self.count = 0
        self.open: dict[str, list[str]] = {}

    def call(self, name: str, given: Any) -> str:
        call_id = given if isinstance(given, str) and given else f"call_{self.count}"
        self.count += 1
        self.open.setdefault(name, []).append(call_id)
        return call_id

    def answer(self, name: str, given: Any) -> str:
        waiting = self.open.get(name, [])
        if isinstance(given, str) and given:
            if given in waiting:
                waiting.remove(given)
            return given
        return waiting.pop(0) if waiting else ""


def _plain(content: Any) -> Message | None:
    """A user or model turn made of one non-empty text part (no thought flag), as a message; else None."""
    raw = content.get("parts") if type(content) is dict else None
    if type(raw) is not list or len(raw) != 1:
        return None
    part, role = raw[0], content.get("role", "user")
    if type(part) is not dict or len(part) != 1 or type(role) is not str or role not in _PLAIN_ROLES:
        return None
    text = part.get("text")
    return {"role": _PLAIN_ROLES[role], "content": text} if type(text) is str and text else None


def _content(content: Any, parts: Counter[str], calls: _Calls, default_role: str) -> list[Message]:
    if not isinstance(content, dict):
        raise Skip("bad_message")
    role = role_of(content.get("role") or default_role)
    raw = content.get("parts", [])
    if not isinstance(raw, list):
        raise Skip("bad_message")
    texts: list[str] = []
    thinking: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[Message] = []
    for part in raw:
        if not isinstance(part, dict):
            raise Skip("bad_message")
        if isinstance(part.get("text"), str):
            (thinking if part.get("thought") else texts).append(part["text"])
        elif (fc := _get(part, "functionCall", "function_call")) is not None:
            if call := _call(fc, calls, parts):
                tool_calls.append(call)
        elif (fr := _get(part, "functionResponse", "function_response")) is not None:
            results.append(_result(fr, calls, parts))
        else:
            parts[_part_kind(part)] += 1
    return from_parts(role, texts, thinking, tool_calls, results, empty_tool_message=False)


def _call(fc: Any, calls: _Calls, parts: Counter[str]) -> dict[str, Any] | None:
    name = fc.get("name") if isinstance(fc, dict) else None
    if not isinstance(name, str) or not name:
        parts["bad_tool_call"] += 1
        return None
    args = fc.get("args")
    args = args if isinstance(args, str) else to_json({} if args is None else args)
    return {"id": calls.call(name, fc.get("id")), "type": "function", "function": {"name": name, "arguments": args}}


def _result(fr: Any, calls: _Calls, parts: Counter[str]) -> Message:
    if not isinstance(fr, dict):
        raise Skip("bad_message")
    name = fr.get("name") if isinstance(fr.get("name"), str) else ""
    response = fr.get("response")
    text = response if isinstance(response, str) else to_json({} if response is None else response)
    tool: Message = {"role": "tool", "tool_call_id": calls.answer(name, fr.get("id")), "content": text}
    if name:
        tool["name"] = name
    return tool


def _part_kind(part: dict[str, Any]) -> str:
    blob = _get(part, "inlineData", "inline_data") or _get(part, "fileData", "file_data")
    if isinstance(blob, dict):
        mime = str(_get(blob, "mimeType", "mime_type") or "")
        return next((kind for kind in _MEDIA if mime.startswith(kind)), "file")
    if _get(part, "executableCode", "executable_code") is not None:
        return "executable_code"
    if _get(part, "codeExecutionResult", "code_execution_result") is not None:
        return "code_execution_result"
    if len(part) == 1 and _get(part, "thoughtSignature", "thought_signature"):
        return "thought_signature"
    return "unknown_part"


def _tools(tools: Any, parts: Counter[str]) -> list[dict[str, Any]]:
    specs = []
    for tool in tools if isinstance(tools, list) else ():
        declared = _get(tool, "functionDeclarations", "function_declarations") if isinstance(tool, dict) else None
        if not isinstance(declared, list):
            parts["builtin_tool" if isinstance(tool, dict) else "bad_tool_definition"] += 1
            continue
        for fn in declared:
            if isinstance(fn, dict) and "parameters" not in fn:
                schema = _get(fn, "parametersJsonSchema", "parameters_json_schema")
                fn = {**fn, "parameters": {} if schema is None else schema}
            specs.append(fn)
    return specs
