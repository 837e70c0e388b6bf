"""Pure converters from logged chat records to training conversations, one per format.

Each `from_<format>(record, parts)` takes one decoded JSON record and a Counter that
collects the parts it had to leave out (images, audio, redacted thinking...), and
returns a conversation or the name of the reason the record cannot be used:

    from_openai(record, parts) -> {"messages": [...], "tools"?: [...]} | "no_assistant_reply" | ...

The record layouts differ (a request, a response, both side by side under wrapper keys
that loggers, proxies and batch files use); the messages inside are converted by
rlcli.data.messages, which also documents the output shape. A LangSmith conversation also
carries `run_id` and `trace_id`, and from_langsmith returns Feedback for feedback records;
import_cmd attaches those as `feedback` and `score`. Nothing here does I/O.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any

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

_PLAIN_ROLES = frozenset({"system", "user", "assistant"})
# Wrapper keys under which loggers, proxies and batch files put the request and the response.
_REQUEST_KEYS = ("request", "input", "inputs", "body", "params", "request_body", "inputBodyJson")
_RESPONSE_KEYS = (
    "response",
    "output",
    "outputs",
    "completion",
    "result",
    "response_body",
    "outputBodyJson",
    "body",
)
_ERROR_KEYS = frozenset({"error", "status", "status_code"})
# Keys that make the request/response search read the record itself as the request or the response.
DROPPED = "dropped"  # {"dropped": REASON}: the messages format counts the line as dropped for REASON
_PAIR_MARKS = frozenset({"messages", "choices", "content"})


@dataclass(frozen=True, slots=True)
class Feedback:
    """A LangSmith feedback record, to be attached to the conversation of its run."""

    run_id: str
    entry: dict[str, Any]


def _guard(convert: Any, record: Any, parts: Counter[str]) -> Conversation | str:
    try:
        return convert(record, parts)
    except Skip as skip:
        return skip.reason


def _maybe_json(value: Any) -> Any:
    """Some loggers store a request or response body as a JSON string."""
    if isinstance(value, str) and value.startswith(("{", "[")):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _find_request(record: dict[str, Any], depth: int = 3) -> dict[str, Any] | None:
    if type(record.get("messages")) is list:
        return record
    for key in _REQUEST_KEYS if depth else ():
        value = record.get(key)
        if type(value) is str:
            value = _maybe_json(value)
        if type(value) is list:  # e.g. an `input` that is the message list itself
            return {"messages": value}
        if type(value) is dict and (found := _find_request(value, depth - 1)) is not None:
            return found
    return None


def _is_response(d: dict[str, Any]) -> bool:
    return "choices" in d or ("content" in d and (d.get("type") == "message" or "stop_reason" in d))


def _check_error(d: dict[str, Any]) -> None:
    if _ERROR_KEYS.isdisjoint(d):  # most records: one lookup per key
        return
    status = d.get("status_code", d.get("status"))
    if d.get("error") or (isinstance(status, int) and status >= 400):
        raise Skip("error_response")


def _find_response(record: dict[str, Any], depth: int = 3) -> Any:
    """The logged reply: a response dict, a bare message, a list of choices, or text; None if absent."""
    if _is_response(record):
        return record
    _check_error(record)  # a wrapper saying the call failed (batch and proxy logs)
    for key in _RESPONSE_KEYS if depth else ():
        value = record.get(key)
        if value is None:
            continue
        if type(value) is dict:
            found = _find_response(value, depth - 1)
            if found is not None:
                return found
            if "role" in value or "lc" in value:
                return value
        elif type(value) in (str, list) and key != "body":
            parsed = _maybe_json(value)
            # A JSON-looking string may also be a plain reply (JSON mode): keep it as text then.
            if type(parsed) is list or (type(parsed) is dict and _is_response(parsed)):
                return parsed
            return value
    return None


def _from_choices(choices: Any, parts: Counter[str]) -> list[Message]:
    if not isinstance(choices, list) or not choices:
        raise Skip("no_assistant_reply")
    if len(choices) > 1:  # n > 1: only the first choice is the reply the user saw
        parts["extra_choice"] += len(choices) - 1
    choice = choices[0]
    if not isinstance(choice, dict):
        raise Skip("bad_message")
    if choice.get("finish_reason") == "length":
        raise Skip("truncated")
    msg = choice.get("message")
    if msg is None and isinstance(choice.get("text"), str):  # legacy completions
        msg = {"role": "assistant", "content": choice["text"]}
    return convert_message(msg, parts, "assistant")


def _reply(response: Any, parts: Counter[str]) -> list[Message]:
    if isinstance(response, str):
        return [{"role": "assistant", "content": response}]
    if isinstance(response, list):
        if response and all(isinstance(c, dict) and "message" in c for c in response):
            return _from_choices(response, parts)
        return [m for item in response for m in convert_message(item, parts, "assistant")]
    if "choices" in response:
        return _from_choices(response["choices"], parts)
    if response.get("stop_reason") == "max_tokens":
        raise Skip("truncated")
    return convert_message(response, parts, "assistant")


def _with_reply(messages: list[Message], reply: list[Message], prefill: bool) -> list[Message]:
    """Append the reply; a request that already ends with it (some loggers do that) keeps one copy."""
    if not reply or not messages or messages[-1]["role"] != "assistant":
        return messages + reply
    last, first = messages[-1], reply[0]
    if prefill:  # Anthropic continues a trailing assistant turn: the reply is its rest
        return messages[:-1] + [{**first, "content": last["content"] + first["content"]}] + reply[1:]
    if last["content"] == first["content"] and last.get("tool_calls") == first.get("tool_calls"):
        return messages + reply[1:]
    return messages + reply


def _convert_all(raw: list[Any], parts: Counter[str]) -> list[Message]:
    out: list[Message] = []
    for msg in raw:
        # Inlined fast path of convert_message for messages already in the output shape: a call per
        # message is a measurable share of an import's time.
        if (type(msg) is dict and len(msg) == 2 and type(text := msg.get("content")) is str and text
                and msg.get("role") in _PLAIN_ROLES):
            out.append(msg)
            continue
        out += convert_message(msg, parts)
    return out


def _system(system: Any, parts: Counter[str]) -> list[Message]:
    text = "\n".join(read_texts(system, parts)) if system else ""
    return [{"role": "system", "content": text}] if text else []


def from_openai(record: Any, parts: Counter[str]) -> Conversation | Link | str:
    """An OpenAI Chat Completions or Responses API log record: a request, a response, or both.

    A Responses record in a previous_response_id chain comes back as a Link (rlcli.data.chains joins it).
    """
    return _guard(_openai, record, parts)


def _request_and_response(record: Any) -> tuple[dict[str, Any], Any]:
    """A logged API record's request ({} when only the response was logged) and response (or None)."""
    if not isinstance(record, dict):
        raise Skip("unrecognized")
    request, response = _find_request(record), _find_response(record)
    if request is None and response is None:
        raise Skip("unrecognized")
    return request or {}, response


def _logged_pair(record: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The request and response of a {"request": {"messages": [...]}, "response": {"choices": [...]}} record, the
    shape most logs have; None for any other (Skip for a failed call). What the Responses check and
    _request_and_response conclude, told in a few lookups: the record holds no key (_PAIR_MARKS) that would make
    them read the record itself as the request or the reply."""
    if type(record) is not dict:
        return None
    request, response = record.get("request"), record.get("response")
    if (type(response) is not dict or "choices" not in response or type(request) is not dict
            or type(request.get("messages")) is not list or not _PAIR_MARKS.isdisjoint(record)):
        return None
    _check_error(record)
    return request, response


@functools.cache
def _responses() -> ModuleType:
    """rlcli.data.responses, imported at the first record that is not a Chat Completions pair: a log of pairs
    never compiles it."""
    from rlcli.data import responses

    return responses


def _openai(record: Any, parts: Counter[str]) -> Conversation | Link:
    if (pair := _logged_pair(record)) is not None:  # the reply is in choices: _reply's dispatch is known
        request = pair[0]
        messages = _convert_all(request["messages"], parts)
        reply = _from_choices(pair[1]["choices"], parts)
    elif (found := _responses().split(record)) is not None:
        return _responses().convert(*found, parts)
    else:
        request, response = _request_and_response(record)
        messages = _convert_all(request.get("messages", []), parts)
        reply = None if response is None else _reply(response, parts)
    if reply is not None:
        messages = _with_reply(messages, reply, prefill=False)
    conv = conversation(messages, request.get("tools") or request.get("functions"), parts)
    if (metadata := request.get("metadata")) is not None:  # most logs: this one lookup, no call
        tagged(conv, tag_of(metadata))
    return conv


def from_anthropic(record: Any, parts: Counter[str]) -> Conversation | str:
    """An Anthropic Messages API record: a request, a response, or both side by side."""
    return _guard(_anthropic, record, parts)


def _anthropic(record: Any, parts: Counter[str]) -> Conversation:
    request, response = _request_and_response(record)
    messages = _system(request.get("system"), parts) + _convert_all(request.get("messages", []), parts)
    if response is not None:
        messages = _with_reply(messages, _reply(response, parts), prefill=True)
    return conversation(messages, request.get("tools"), parts)


def from_messages(record: Any, parts: Counter[str]) -> Conversation | str:
    """Already-shaped data: {"messages": [...]} (or ShareGPT's "conversations"), or a bare list."""
    return _guard(_messages, record, parts)


def _messages(record: Any, parts: Counter[str]) -> Conversation:
    if isinstance(record, dict) and isinstance(record.get(DROPPED), str) and "messages" not in record:
        raise Skip(record[DROPPED])  # a line a converter upstream dropped, for its reason (the endpoint's drain)
    raw, tools = (record, None) if isinstance(record, list) else (None, None)
    if isinstance(record, dict):
        raw = record.get("messages", record.get("conversations"))
        tools = record.get("tools")
    if not isinstance(raw, list):
        raise Skip("unrecognized")
    conv = tagged(conversation(_convert_all(raw, parts), tools, parts), tag_of(record))  # the shape's own `slice`
    score = record.get("score") if isinstance(record, dict) else None
    if isinstance(score, int | float) and not isinstance(score, bool):  # a verdict (the endpoint's ratings)
        conv["score"] = float(score)
    return conv


def from_gemini(record: Any, parts: Counter[str]) -> Conversation | str:
    """A Gemini generateContent record: rlcli.data.gemini reads it, imported at the first call, so that no other
    format's start-up compiles that module."""
    from rlcli.data.gemini import from_gemini as convert

    return convert(record, parts)


def from_langsmith(record: Any, parts: Counter[str]) -> Conversation | Feedback | str:
    """A LangSmith export line: an llm run (-> conversation), another run (dropped), or feedback."""
    if isinstance(record, dict) and "run_id" in record and "key" in record and "run_type" not in record:
        return feedback_of(record)
    return _guard(_langsmith_run, record, parts)


def _langsmith_run(record: Any, parts: Counter[str]) -> Conversation:
    if not isinstance(record, dict) or "run_type" not in record:
        raise Skip("unrecognized")
    if record["run_type"] != "llm":
        raise Skip("non_llm_run")
    inputs, outputs = record.get("inputs"), record.get("outputs")
    if not outputs:
        raise Skip("run_error" if record.get("error") else "no_assistant_reply")
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise Skip("unrecognized")
    messages = _with_reply(_langsmith_prompt(inputs, parts), _langsmith_reply(outputs, parts), prefill=False)
    extra = record.get("extra")
    params = extra.get("invocation_params") if isinstance(extra, dict) else None
    params = params if isinstance(params, dict) else {}
    conv = conversation(messages, params.get("tools") or inputs.get("tools"), parts)
    conv["run_id"] = str(record.get("id") or "")
    tagged(conv, tag_of(extra.get("metadata")) if isinstance(extra, dict) else None)
    if record.get("trace_id"):  # feedback usually scores the whole trace, i.e. its root run
        conv["trace_id"] = str(record["trace_id"])
    return conv


def _langsmith_prompt(inputs: dict[str, Any], parts: Counter[str]) -> list[Message]:
    raw = inputs.get("messages")
    if raw is None and isinstance(inputs.get("prompts"), list):  # completion-style runs: plain strings
        raw = [[{"role": "user", "content": p}] for p in inputs["prompts"]]
    if isinstance(raw, list) and raw and isinstance(raw[0], list):  # one message list per batched prompt
        if len(raw) > 1:
            parts["extra_batch_prompt"] += len(raw) - 1
        raw = raw[0]
    if not isinstance(raw, list):
        raise Skip("unrecognized")
    return _system(inputs.get("system"), parts) + _convert_all(raw, parts)


def _langsmith_reply(outputs: dict[str, Any], parts: Counter[str]) -> list[Message]:
    gens = outputs.get("generations")
    if gens is None:
        response = _find_response(outputs)
        if response is None and ("role" in outputs or "lc" in outputs):
            response = outputs
        if response is None:
            raise Skip("unrecognized")
        return _reply(response, parts)
    if isinstance(gens, list) and gens and isinstance(gens[0], list):
        gens = gens[0]  # the other batches answer the extra prompts counted above
    if not isinstance(gens, list) or not gens or not isinstance(gens[0], dict):
        raise Skip("no_assistant_reply")
    if len(gens) > 1:
        parts["extra_choice"] += len(gens) - 1
    gen = gens[0]
    info = gen.get("generation_info")
    if isinstance(info, dict) and info.get("finish_reason") == "length":
        raise Skip("truncated")
    if gen.get("message") is not None:
        return convert_message(gen["message"], parts, "assistant")
    return [{"role": "assistant", "content": str(gen.get("text") or "")}]


def feedback_of(record: dict[str, Any]) -> Feedback | str:
    """A LangSmith feedback record; scores become floats, other values JSON strings (one Arrow type)."""
    run_id, key = record.get("run_id"), record.get("key")
    if not run_id or not isinstance(key, str):
        return "bad_feedback"
    score = record.get("score")
    entry: dict[str, Any] = {"key": key, "score": float(score) if isinstance(score, (int, float)) else None}
    for name in ("value", "comment", "correction"):
        value = record.get(name)
        if value is not None:
            entry[name] = value if isinstance(value, str) else to_json(value)
    return Feedback(str(run_id), entry)


IMPORTERS = {
    "openai": from_openai,
    "anthropic": from_anthropic,
    "messages": from_messages,
    "langsmith": from_langsmith,
    "gemini": from_gemini,
}


def log_format(record: Any) -> str | None:
    """The `rlcli import -f` format that reads this record into a trainable conversation (or a link of one, or
    LangSmith feedback), None if none does: how a trainer given raw logs names the command that converts them.
    The readers overlap (openai's and anthropic's take each other's request/response pairs, and a wrapped
    {"messages": ...} request is a `messages` record too), so the name follows the record's marks: a LangSmith
    run type, OTLP spans, Gemini contents, then the reply (`choices` or a Responses record: openai)."""
    from rlcli.data import otel
    from rlcli.data.validate import conversation_problem

    def otel_record(record: Any, parts: Counter[str]) -> Any:
        return next((c for s in otel.spans(record) or [] if isinstance(c := otel.from_span(s, parts), dict)), None)

    def read(convert: Any) -> bool:
        try:
            made = convert(record, Counter())
        except Exception:  # noqa: BLE001 - a reader refusing a record of another shape, in any way
            return False
        return isinstance(made, (Link, Feedback)) or (isinstance(made, dict) and conversation_problem(made) is None)

    if not isinstance(record, (dict, list)):
        return None
    if isinstance(record, list) or set(record) <= {"messages", "conversations", "tools"}:  # no API call around it
        return "messages" if read(from_messages) else None
    if isinstance(record, dict) and "run_type" in record:  # LangSmith's runs: only its llm runs convert
        return "langsmith" if read(from_langsmith) or record.get("run_type") != "llm" else None
    for name, convert in (("langsmith", from_langsmith), ("otel", otel_record), ("gemini", from_gemini)):
        if read(convert):
            return name
    if isinstance(record, dict) and read(from_openai):
        reply = _find_response(record)
        anthropic = isinstance(reply, dict) and "choices" not in reply and (
            reply.get("type") == "message" or "stop_reason" in reply)
        request = _find_request(record) or {}
        if _responses().split(record) is None and (anthropic or (reply is None and "system" in request)):
            return "anthropic"
        return "openai"
    return "messages" if read(from_messages) else None
