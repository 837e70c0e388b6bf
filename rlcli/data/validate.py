"""What a conversation line must hold before `train sl` spends time loading a model for it.

`conversation_problem` says what is wrong with one record (or nothing); `numbered_json_lines` reads a JSONL
file's lines with their numbers, so the first bad line stops a command with a UsageError naming it and a
person can open the file there. The shape checked is the one `rlcli import` writes (rlcli.data.messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from rlcli.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")


def message_problem(m: Any, i: int) -> str | None:
    if not isinstance(m, dict):
        return f"message {i} is not an object"
    if m.get("role") not in ROLES:
        return f"message {i} has role {m.get('role')!r}; expected one of {', '.join(ROLES)}"
    if not isinstance(m.get("content"), (str, list)):
        return f"message {i} has no content (a string, or a list of parts)"
    calls = m.get("tool_calls", [])
    if not isinstance(calls, list) or not all(_call_ok(c) for c in calls):
        return f"message {i} has a tool call without a function name and JSON-string arguments"
    return None


def _call_ok(call: Any) -> bool:
    fn = call.get("function") if isinstance(call, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)


def messages_problem(messages: list[Any], empty: str) -> str | None:
    """What is wrong with a list of messages (`empty` when there are none), or None."""
    if not messages:
        return empty
    return next(filter(None, (message_problem(m, i) for i, m in enumerate(messages))), None)


def conversation_problem(record: Any) -> str | None:
    """What keeps one decoded line from being a trainable conversation, or None."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return 'expected an object {"messages": [...]}'
    messages = record["messages"]
    if problem := messages_problem(messages, "the messages list is empty"):
        return problem
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant message to train on"
    return None


def numbered_json_lines(lines: Iterable[str], source: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank JSONL line; a bad line is one error naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as e:
            raise UsageError(f"{source} line {number}: not valid JSON ({e})") from None
