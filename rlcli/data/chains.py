"""Joining OpenAI Responses records along `previous_response_id`, in one pass over the input.

A Responses request may send only its new input and name the response it continues; the server
prepends that response's input and output (and, recursively, its predecessors'). The log holds
each call's own turns, so the whole conversation of a call is the chain of its predecessors' turns
followed by its own. Its `instructions` and `tools` are its own: a continuation does not inherit
them (the API documents that instructions are not carried over).

Every Responses record that carries an id or continues one is written to a private spool file
(unlinked at once, like langsmith's); memory holds only an index of response id -> spool offset
and the encoded histories of the latest 64 responses (a chain is usually read in order, so the
predecessor is nearly always there and a long chain costs one spool read per call, not one per
ancestor). A record whose predecessor comes later in the file waits, and is joined after the
last line; one whose chain never reaches a record in the file is dropped as
`previous_response_missing`. Each record still yields one conversation (the conversation so far),
so a chain of n calls writes n conversations of growing length, as Chat Completions logs do.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from typing import IO, Any

import orjson

from rlcli.data.messages import Conversation, Message, to_json
from rlcli.data.responses import Link

_CACHED = 64


class Chains:
    """The index and spool of one import; `add` a Link as it comes, then read the `leftovers`."""

    def __init__(self, spool: IO[bytes]) -> None:
        self.spool = spool
        self.index: dict[str, tuple[int, int, str]] = {}  # response id -> (offset, size, previous id)
        self.pending: list[tuple[int, int, int, str, Counter[str]]] = []  # lineno, offset, size, previous, parts
        self.cache: dict[str, bytes] = {}  # response id -> its full history, encoded (newest last)

    def _put(self, link: Link) -> tuple[int, int]:
        data = to_json({"m": link.conv["messages"], "s": link.system, "t": link.conv.get("tools")}).encode()
        self.spool.seek(0, 2)
        offset = self.spool.tell()
        self.spool.write(data)
        return offset, len(data)

    def _get(self, offset: int, size: int) -> dict[str, Any]:
        self.spool.seek(offset)
        return orjson.loads(self.spool.read(size))

    def history(self, rid: str) -> list[Message] | None:
        """Every turn up to and including response `rid`; None when the chain leaves the file (or loops)."""
        chain: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        turns: list[Message] = []
        while rid:
            if rid in self.cache:
                turns = orjson.loads(self.cache[rid])
                break
            entry = self.index.get(rid)
            if entry is None or rid in seen:
                return None
            seen.add(rid)
            chain.append(entry)
            rid = entry[2]
        for offset, size, _ in reversed(chain):
            turns += self._get(offset, size)["m"]
        return turns

    def _remember(self, rid: str, turns: list[Message]) -> None:
        if len(self.cache) >= _CACHED:
            del self.cache[next(iter(self.cache))]
        self.cache[rid] = to_json(turns).encode()

    def add(self, link: Link, lineno: int, parts: Counter[str]) -> Conversation | None:
        """The conversation so far for this record, or None when its predecessor has not been read yet."""
        offset, size = self._put(link)
        if link.response_id:
            self.index[link.response_id] = (offset, size, link.previous_id)
        own = link.conv["messages"]
        if not link.previous_id:
            turns = own
        else:
            before = self.history(link.previous_id)
            if before is None:  # perhaps later in the file: try again after the last line
                self.pending.append((lineno, offset, size, link.previous_id, Counter(parts)))
                parts.clear()
                return None
            turns = before + own
        if link.response_id:
            self._remember(link.response_id, turns)  # encoded now: finalize may change the dicts
        return {**link.conv, "messages": link.system + turns}

    def leftovers(self) -> Iterable[tuple[int, Conversation | None, Counter[str]]]:
        """(line number, conversation or None if its chain is incomplete, its parts) of each waiting record."""
        for lineno, offset, size, previous, parts in self.pending:
            before = self.history(previous)
            if before is None:
                yield lineno, None, parts
                continue
            entry = self._get(offset, size)
            conv: Conversation = {"messages": entry["s"] + before + entry["m"]}
            if entry["t"]:
                conv["tools"] = entry["t"]
            yield lineno, conv, parts


def stream(
    run: Any, lines: Iterable[bytes], importer: Callable[..., Any], emit: Callable[[Conversation], None]
) -> None:
    """Run.stream for records that may be Links: join them, then finish and emit every conversation."""
    with tempfile.TemporaryFile() as spool:
        chains = Chains(spool)
        for lineno, record in run.records(lines):
            result = run.convert(record, lineno, importer)
            if type(result) is Link:
                result = chains.add(result, lineno, run.parts)
                result = None if result is None else run.finish(result, lineno)
            if result is not None:
                emit(result)
        for lineno, conv, parts in chains.leftovers():
            if conv is None:
                run.drop(f"line {lineno}", "previous_response_missing")
                continue
            run.parts.update(parts)
            if (done := run.finish(conv, lineno)) is not None:
                emit(done)
