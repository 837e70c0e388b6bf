"""Check a conversations file before `train sl` spends time loading a model for it.

    validate_conversations("train.jsonl") -> number of conversations

The first bad line stops the check with a UsageError naming its line number and what
is wrong with it, so a person can open the file at that line; an empty file is an
error too. The shape checked is the one `rlcli import` writes (rlcli.data.messages).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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


def conversation_problem(record: Any) -> str | None:
    """What keeps one decoded line from being a trainable conversation, or None."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return 'expected an object {"messages": [...]}'
    messages = record["messages"]
    if not messages:
        return "the messages list is empty"
    for i, m in enumerate(messages):
        if problem := message_problem(m, i):
            return problem
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant message to train on"
    return None


@contextmanager
def _lines(source: str | os.PathLike[str] | Iterable[str | bytes]) -> Iterator[Iterable[str | bytes]]:
    if not isinstance(source, (str, os.PathLike)):
        yield source
        return
    if not os.path.isfile(source):
        raise UsageError(f"dataset {source} is not a file; give a JSONL file of conversations")
    with open(source, "rb") as f:
        yield f


def validate_conversations(source: str | os.PathLike[str] | Iterable[str | bytes]) -> int:
    """Count the conversations in a JSONL file (or lines); raise UsageError at the first bad line."""
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the dataset"
    count = 0
    with _lines(source) as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                problem = f"not valid JSON ({e})"
            else:
                problem = conversation_problem(record)
            if problem:
                raise UsageError(f"{name} line {lineno}: {problem}; fix it, or rebuild with `rlcli import`")
            count += 1
    if count == 0:
        raise UsageError(f"{name} holds no conversations; make some with `rlcli import LOGS -o FILE`")
    return count


def numbered_json_lines(lines: Iterable[str], source: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank JSONL line; a bad line is one error naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as e:
            raise UsageError(f"{source} line {number}: not valid JSON ({e})") from None
