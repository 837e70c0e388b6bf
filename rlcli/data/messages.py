"""The normalized message shape, and the steps every importer shares.

`convert_message` turns one logged message (OpenAI, Anthropic, LangChain-serialized or
ShareGPT) into normalized messages; `finalize` applies the user's flags (drop tools,
drop thinking, redact) to a whole conversation, removes empty turns, merges
consecutive same-role turns and checks that something trainable is left. Pure code.

The shape is what tinker-cookbook's renderers read (through rlcli.train.sl_data) and what its own
FromConversationFileBuilder loads:
- every message has `role` (system|user|assistant|tool) and `content`, always a str.
  `developer` becomes `system` (renderers know system; gpt-oss maps it back itself);
  LangChain (human, ai) and ShareGPT (from/value, gpt) names are mapped.
- assistant messages may carry `tool_calls` [{id, type: "function", function: {name,
  arguments: JSON str}}] and `reasoning` (the thinking text); tool messages carry
  `tool_call_id` and, where known, `name`.
- a conversation may carry `tools` [{type: "function", function: {name, description?,
  parameters}}] where `parameters` is a JSON *string*, like tool call arguments:
  FromConversationFileBuilder loads rows with datasets.Dataset.from_list, which needs one
  Arrow schema for every row and fails when two tools' schemas differ in a field's type.
- a conversation may carry `slice`: the skill or kind of request it stands for, as the log tagged it
  (`tag_of`: OpenAI request metadata, LangSmith run metadata, an OpenTelemetry span attribute);
  `rlcli loop` scores held-out problems per slice.

Text parts of one message are joined with a newline, except an assistant's, which are
pieces of one generated stream (Anthropic splits cited text into blocks) and are
concatenated as they are.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson  # a tinker dependency: always there

Conversation = dict[str, Any]
Message = dict[str, Any]

ROLES = {
    "system": "system", "developer": "system", "instruction": "system", "instructions": "system",
    "user": "user", "human": "user", "customer": "user",
    "assistant": "assistant", "ai": "assistant", "model": "assistant", "gpt": "assistant", "bot": "assistant",
    "chatbot": "assistant", "agent": "assistant",
    "tool": "tool", "function": "tool", "ipython": "tool", "observation": "tool",
}  # fmt: skip
# ROLES is matched as written first (the common case costs one lookup), then without case or spaces.
# The last item of a LangChain-serialized message's `id` names its class.
_LANGCHAIN_ROLES = {
    "HumanMessage": "user", "AIMessage": "assistant", "SystemMessage": "system",
    "ToolMessage": "tool", "FunctionMessage": "tool", "ChatMessage": "",
}  # fmt: skip
_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
# Fields that make an assistant message more than text when they hold something (_plain).
_NOT_PLAIN = frozenset({"tool_calls", "function_call", "audio", "reasoning_content", "reasoning"})
_PART_KINDS = {"image_url": "image", "input_image": "image", "input_audio": "audio", "input_file": "file"}


class Skip(Exception):
    """Raised anywhere inside a conversion to drop the whole record under a named reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Options:
    drop_tools: bool = False
    drop_thinking: bool = False
    redact: bool = False
    dedupe: bool = False


def to_json(value: Any) -> str:
    """Compact JSON text, the form tool call arguments take."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers past 64 bits: json handles them
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class Link:
    """A Responses record in a previous_response_id chain (rlcli.data.responses makes it, rlcli.data.chains joins it):
    its own turns, apart from its instructions.

    A continuation inherits the earlier turns but not the earlier instructions or tools, so the
    system messages (`system`) are kept apart from the turns (`conv`) until the chain is joined.
    """

    conv: Conversation
    system: list[Message]
    response_id: str
    previous_id: str


@dataclass(slots=True)
class _Content:
    texts: list[str]
    calls: list[dict[str, Any]]
    results: list[Message]
    thinking: list[str]


def _read_content(content: Any, parts: Counter[str]) -> _Content:
    """Sort a message's content (str, or OpenAI parts / Anthropic blocks) into what we keep."""
    got = _Content([], [], [], [])
    if content is None:
        return got
    if isinstance(content, str):
        got.texts.append(content)
        return got
    if isinstance(content, dict):  # a single block where a list was expected
        content = [content]
    if not isinstance(content, list):
        raise Skip("bad_message")
    for block in content:
        if isinstance(block, str):
            got.texts.append(block)
        elif not isinstance(block, dict):
            raise Skip("bad_message")
        else:
            _read_block(block, got, parts)
    return got


def read_texts(content: Any, parts: Counter[str]) -> list[str]:
    """The text pieces of a content value (a system prompt, a tool result); other parts are counted."""
    return _read_content(content, parts).texts


def _read_block(block: dict[str, Any], got: _Content, parts: Counter[str]) -> None:
    kind = block.get("type")
    if not isinstance(kind, str):
        parts["unknown_part"] += 1
    elif kind in _TEXT_TYPES and isinstance(block.get("text"), str):
        got.texts.append(block["text"])
    elif kind == "refusal" and isinstance(block.get("refusal"), str):
        got.texts.append(block["refusal"])
    elif kind in ("tool_use", "tool_call"):
        call = _tool_call(block, parts)
        if call:
            got.calls.append(call)
    elif kind == "tool_result":
        texts = read_texts(block.get("content"), parts)
        call_id = str(block.get("tool_use_id") or "")
        got.results.append({"role": "tool", "tool_call_id": call_id, "content": "\n".join(texts)})
    elif kind in ("thinking", "reasoning"):
        text = block.get(kind)
        if isinstance(text, str) and text:
            got.thinking.append(text)
    else:
        parts[_PART_KINDS.get(kind, kind)] += 1


def _tool_call(call: Any, parts: Counter[str]) -> dict[str, Any] | None:
    """An OpenAI, Anthropic (tool_use) or LangChain tool call in OpenAI's shape."""
    fn = call.get("function") if isinstance(call, dict) else None
    fn = fn if isinstance(fn, dict) else call
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        parts["bad_tool_call"] += 1
        return None
    args = fn.get("arguments", fn.get("input", fn.get("args")))
    if not isinstance(args, str):
        args = to_json({} if args is None else args)
    call_id = str(call.get("id") or "")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def role_of(raw: Any) -> str:
    """One of the four roles for a logged role name (any case, common aliases); else the record is dropped
    under `unknown_role:<name>`, so the summary says which names were not understood."""
    if isinstance(raw, str):
        role = ROLES.get(raw) or ROLES.get(raw.strip().lower())
        if role:
            return role
        name = re.sub(r"[^\w.-]", "?", raw.strip())[:24] or "?"
        raise Skip(f"unknown_role:{name}")
    raise Skip("unknown_role")


def _unwrap_langchain(msg: dict[str, Any]) -> dict[str, Any]:
    """{lc, type: constructor, id: [..., Class], kwargs} or {type, data} -> a plain dict with a role."""
    if msg.get("lc") and isinstance(msg.get("kwargs"), dict):
        ids = msg.get("id")
        cls = ids[-1] if isinstance(ids, list) and ids and isinstance(ids[-1], str) else ""
        role = _LANGCHAIN_ROLES.get(cls.removesuffix("Chunk"))
        fields = msg["kwargs"]
    elif isinstance(msg.get("data"), dict) and "role" not in msg:
        role, fields = msg.get("type"), msg["data"]
        role = "" if role == "chat" else role  # a ChatMessage names its role in data
    else:
        return msg
    if role is None:
        raise Skip("unknown_role")
    return {**fields, "role": role or fields.get("role")}


def _plain(msg: dict[str, Any]) -> bool:
    """An assistant message with nothing but text (OpenAI logs its unused fields as null)."""
    return _NOT_PLAIN.isdisjoint(msg) or not (
        msg.get("tool_calls") or msg.get("function_call") or msg.get("audio")
        or msg.get("reasoning_content") or msg.get("reasoning")
    )  # fmt: skip


def convert_message(msg: Any, parts: Counter[str], default_role: str | None = None) -> list[Message]:
    """One logged message -> normalized messages (a user turn holding tool results yields tool messages)."""
    if type(msg) is dict:  # the common shapes first, kept cheap: most of an import's time is spent here
        role, content = msg.get("role"), msg.get("content")
        if type(content) is str and (
            role == "user" or role == "system" or (role == "assistant" and content and _plain(msg))
        ):
            # A message already in the output shape is reused as it is (each record is parsed afresh).
            return [msg] if len(msg) == 2 else [{"role": role, "content": content}]
        if role == "tool" and type(content) is str and type(msg.get("tool_call_id")) is str and len(msg) == 3:
            return [msg]
        if (role == "assistant" and (content is None or content == "") and len(msg) == 3
                and type(listed := msg.get("tool_calls")) is list):  # OpenAI's tool-call turn: its calls alone
            return [_calls_turn(listed, parts)]
    return _convert(msg, parts, default_role)


def _convert(msg: Any, parts: Counter[str], default_role: str | None) -> list[Message]:
    if not isinstance(msg, dict):
        raise Skip("bad_message")
    if "lc" in msg or "data" in msg:
        msg = _unwrap_langchain(msg)
    raw_role = msg.get("role") or msg.get("from")
    if raw_role is None:  # LangChain's flattened {type: human, content} form; else the caller's default
        kind = msg.get("type")
        raw_role = kind if isinstance(kind, str) and kind in ROLES else default_role
    role = role_of(raw_role)
    content = msg["content"] if "content" in msg else msg.get("value")
    got = _read_content(content, parts)
    if role == "assistant":
        return [_assistant(msg, got, parts)]
    if role == "tool":
        call_id = str(msg.get("tool_call_id") or "")
        tool = {"role": "tool", "tool_call_id": call_id, "content": "\n".join(got.texts)}
        if isinstance(msg.get("name"), str):
            tool["name"] = msg["name"]
        return [tool]
    out = got.results  # tool results first: the Messages API requires them at the head of a user turn
    text = "\n".join(got.texts)
    if text or not out:
        out.append({"role": role, "content": text})
    return out


def _assistant(msg: dict[str, Any], got: _Content, parts: Counter[str]) -> Message:
    text = "".join(got.texts)
    if not text and isinstance(msg.get("refusal"), str):
        text = msg["refusal"]
    out: Message = {"role": "assistant", "content": text}
    extra = msg.get("additional_kwargs")
    extra = extra if isinstance(extra, dict) else {}
    calls = _unique(got.calls + _listed_calls(msg, extra, parts))
    if calls:
        out["tool_calls"] = calls
    listed = (msg.get("reasoning_content"), msg.get("reasoning"), extra.get("reasoning_content"))
    thinking = got.thinking + [r for r in listed if isinstance(r, str) and r]
    if thinking:
        out["reasoning"] = "\n\n".join(thinking)
    if msg.get("audio"):
        parts["audio"] += 1
    return out


def _calls_turn(listed: list[Any], parts: Counter[str]) -> Message:
    """An assistant turn that holds nothing but a list of tool calls, as _assistant writes it."""
    out: Message = {"role": "assistant", "content": ""}
    if calls := _unique(_calls(listed, parts)):
        out["tool_calls"] = calls
    return out


def _calls(listed: list[Any], parts: Counter[str]) -> list[dict[str, Any]]:
    return [call for raw in listed if (call := _tool_call(raw, parts))]


def _unique(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop repeated call ids: LangChain lists Anthropic tool_use blocks again in tool_calls."""
    seen: set[str] = set()
    out = []
    for call in calls:
        if call["id"] and call["id"] in seen:
            continue
        seen.add(call["id"])
        out.append(call)
    return out


def _listed_calls(msg: dict[str, Any], extra: dict[str, Any], parts: Counter[str]) -> list[dict[str, Any]]:
    listed = msg.get("tool_calls") or extra.get("tool_calls") or []
    if not isinstance(listed, list):
        raise Skip("bad_message")
    calls = _calls(listed, parts)
    legacy = msg.get("function_call") or extra.get("function_call")  # pre-tools OpenAI function calling
    if isinstance(legacy, dict) and (call := _tool_call({"function": legacy}, parts)):
        calls.append(call)
    if isinstance(msg.get("invalid_tool_calls"), list) and msg["invalid_tool_calls"]:
        parts["invalid_tool_call"] += len(msg["invalid_tool_calls"])
    return calls


def tool_specs(tools: Any, parts: Counter[str]) -> list[dict[str, Any]]:
    """OpenAI, legacy `functions` and Anthropic tool definitions in OpenAI's shape."""
    specs = []
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        fn = fn if isinstance(fn, dict) else tool
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            parts["bad_tool_definition"] += 1
            continue
        spec: dict[str, Any] = {"name": fn["name"]}
        if isinstance(fn.get("description"), str):
            spec["description"] = fn["description"]
        params = fn.get("parameters", fn.get("input_schema", {}))
        spec["parameters"] = params if isinstance(params, str) else to_json(params)
        specs.append({"type": "function", "function": spec})
    return specs


def conversation(messages: list[Message], tools: Any, parts: Counter[str]) -> Conversation:
    """A conversation dict; `tools` only when there are tool definitions."""
    conv: Conversation = {"messages": messages}
    if tools and (specs := tool_specs(tools, parts)):
        conv["tools"] = specs
    return conv


SLICE = "slice"  # the metadata key (and the conversation's field) that names a record's slice
SLICE_ATTRIBUTE = "rlcli.slice"  # the OpenTelemetry span attribute that does


def slice_tag(value: Any) -> str | None:
    """A slice's name as a log gives it: a string that is not blank, its first 200 characters; else None."""
    return value[:200] if type(value) is str and value.strip() else None


def tag_of(metadata: Any) -> str | None:
    """The slice a log's metadata names (its `slice` value), or None: one lookup."""
    return slice_tag(metadata.get(SLICE)) if type(metadata) is dict else None


def tagged(conv: Conversation, tag: str | None) -> Conversation:
    if tag:
        conv[SLICE] = tag
    return conv


def finalize(
    conv: Conversation, opts: Options, redactions: Counter[str] | None = None, seen: set[bytes] | None = None
) -> Conversation | str:
    """Apply --drop-tools/--drop-thinking/--redact, drop empty turns, merge same-role neighbours, check.

    With opts.dedupe, `seen` holds a digest of every conversation kept so far (messages and tools, after
    the steps above and before redaction, which could make two different texts equal): a repeat is
    "duplicate". Ids an importer attaches (run_id, trace_id...) are not part of the digest.
    """
    messages = conv["messages"]
    if opts.drop_tools:
        conv.pop("tools", None)
        messages = [m for m in messages if m["role"] != "tool"]
        for m in messages:
            m.pop("tool_calls", None)
    if opts.drop_thinking:
        for m in messages:
            m.pop("reasoning", None)
    if not _trainable_as_is(messages):
        messages, roles = _tidy(messages)
        if not messages:
            return "empty"
        if "assistant" not in roles:
            return "no_assistant_reply"
        if len(roles) == 1:  # a reply with no prompt would teach the model to say it unprompted
            return "no_prompt"
    conv["messages"] = messages
    if opts.dedupe and seen is not None:
        digest = _digest([messages, conv.get("tools")])
        if digest in seen:
            return "duplicate"
        seen.add(digest)
    if opts.redact:
        from rlcli.data.redact import redact_messages  # only paid for when asked

        redact_messages(messages, redactions)
    return conv


def _digest(value: Any) -> bytes:
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # a lone surrogate or a huge integer: json takes both
        text = json.dumps(value, sort_keys=True).encode()
    import hashlib  # only --dedupe pays for loading OpenSSL

    return hashlib.blake2b(text, digest_size=16).digest()


def _trainable_as_is(messages: list[Message]) -> bool:
    """Whether _tidy would keep every message as it is and the checks after it pass: no turn it drops (empty, not
    a tool result, no calls or reasoning), no neighbours it joins (one role twice, tool results aside), and the
    assistant's reply last after a prompt. Most conversations are, and this loop costs half of _tidy's."""
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        return False
    last = None
    for m in messages:
        role = m["role"]
        if role == last or not m["content"]:  # the rare turns, told apart in one test
            kept = role == "tool" or m["content"] or m.get("tool_calls") or m.get("reasoning")
            if role == last != "tool" or not kept:
                return False
        last = role
    return True


def _tidy(messages: list[Message]) -> tuple[list[Message], set[str]]:
    """Drop empty turns and join consecutive same-role ones (chat templates expect alternation).

    An empty tool result stays: it is a real answer, and dropping it would orphan its call;
    consecutive tool results stay apart for the same reason. Returns the roles left too.
    """
    out: list[Message] = []
    roles: set[str] = set()
    last = None
    for m in messages:
        role = m["role"]
        if role == last or not m["content"]:  # the rare turns, told apart in one test
            if role != "tool" and not m["content"] and not m.get("tool_calls") and not m.get("reasoning"):
                continue
            if role == last and role != "tool":
                out[-1] = _join(out[-1], m)
                continue
        out.append(m)
        roles.add(role)
        last = role
    return out, roles


def _join(prev: Message, m: Message) -> Message:
    joined = {**prev, "content": "\n\n".join(t for t in (prev["content"], m["content"]) if t)}
    if "tool_calls" in m:
        joined["tool_calls"] = prev.get("tool_calls", []) + m["tool_calls"]
    if "reasoning" in m:
        joined["reasoning"] = "\n\n".join(t for t in (prev.get("reasoning"), m["reasoning"]) if t)
    return joined


def from_parts(role: str, texts: list[str], thinking: list[str], calls: list[Any], results: list[Message],
               empty_tool_message: bool = True) -> list[Message]:
    """The messages of one logged turn whose parts were sorted into text, thinking, tool calls and tool
    results (Gemini's parts, OTel's message parts): the results first, then the turn itself; an assistant
    turn always (its calls and reasoning ride on it), another only with text or when nothing else is left."""
    if role == "assistant":
        out: Message = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        if thinking:
            out["reasoning"] = "\n\n".join(thinking)
        return results + [out]
    text = "\n".join(texts)
    if role == "tool" and not text and not empty_tool_message:
        return results
    return results + ([{"role": role, "content": text}] if text or not results else [])
