"""Joining OpenAI Responses records along `previous_response_id`, in one pass over the input.

A Responses request may send only its new input and name the response it continues; the server
prepends that response's input and output (and, recursively, its predecessors'). The log holds
each call's own turns, so the whole conversation of a call is the chain of its predecessors' turns
followed by its own. Its `instructions` and `tools` are its own: a continuation does not inherit
them (the API documents that instructions are not carried over).

Memory holds an index of response id -> where its raw line is, and the histories of the latest 64
responses. Where a line is: its offset in the input when the input is a regular file (read back
with pread, which leaves the stream's position alone); otherwise (a pipe, a .gz file) the raw
line of every Responses record that carries an id or continues one is copied to a private spool
file (unlinked at once, like langsmith's). A chain is usually read in order, so the
predecessor's history is nearly always there; an older one is rebuilt by converting its
ancestors' lines again. A record whose predecessor comes later in the file waits, and is joined
after the last line; one whose chain never reaches a record in the file (or loops) is dropped as
`previous_response_missing`. Each record still yields one conversation (the conversation so
far), so a chain of n calls writes n conversations of growing length, as Chat Completions logs do.

Only Links are ever looked up, so an import makes its Chains at its first Link (rlcli.data.import_cmd's
Run.stream): a log without Responses chains never loads this module nor opens a spool.
"""

from __future__ import annotations

import copy
import os
import stat
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rlcli.data.messages import Conversation, Link, Message

_CACHED = 64


class Chains:
    """The index and spool of one import; `add` a Link as it comes, then read the `leftovers`, and `close`."""

    def __init__(self, lines: Iterable[bytes], reconvert: Callable[[bytes], Link], private: bool) -> None:
        self.lines = lines  # the input being read: a regular file's reader stands just past the line last read
        self.source = _regular_file(lines)  # a regular input file's descriptor: lines are read back, not copied
        self.spool = tempfile.TemporaryFile(buffering=1 << 20) if self.source < 0 else None
        self.reconvert = reconvert  # a spooled line -> its Link again
        self.private = private  # finalize will change message dicts in place: hand out copies
        self.index: dict[str, tuple[int, int, str]] = {}  # response id -> (offset, size, previous id)
        self.pending: list[tuple[int, int, int, str, Counter[str]]] = []  # lineno, offset, size, previous, parts
        self.cache: OrderedDict[str, list[Message]] = OrderedDict()  # response id -> its full history
        self.end = 0  # the spool's size; its position is there too unless `moved` (a seek costs a flush)
        self.moved = False

    def _put(self, raw: bytes, at: int) -> tuple[int, int]:
        if self.source >= 0:
            return at, len(raw)
        if self.moved:
            self.spool.seek(self.end)
            self.moved = False
        offset = self.end
        self.spool.write(raw)
        self.end += len(raw)
        return offset, len(raw)

    def _link(self, offset: int, size: int) -> Link:
        if self.source >= 0:
            return self.reconvert(os.pread(self.source, size, offset))
        self.spool.seek(offset)
        self.moved = True
        return self.reconvert(self.spool.read(size))

    def history(self, rid: str) -> list[Message] | None:
        """Every turn up to and including response `rid`; None when the chain leaves the file (or loops)."""
        chain: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        turns: list[Message] = []
        while rid:
            if rid in self.cache:
                turns = list(self.cache[rid])
                break
            entry = self.index.get(rid)
            if entry is None or rid in seen:
                return None
            seen.add(rid)
            chain.append(entry)
            rid = entry[2]
        for offset, size, _ in reversed(chain):
            turns += self._link(offset, size).conv["messages"]
        return turns

    def _remember(self, rid: str, turns: list[Message]) -> None:
        if len(self.cache) >= _CACHED:
            self.cache.popitem(last=False)  # the oldest (a plain dict's first key gets slow to find)
        self.cache[rid] = turns

    def _joined(self, link: Link, turns: list[Message]) -> Conversation:
        messages = link.system + turns
        return {**link.conv, "messages": copy.deepcopy(messages) if self.private else messages}

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()

    def add(self, link: Link, raw: bytes, lineno: int, parts: Counter[str]) -> Conversation | None:
        """The conversation so far for this record (its raw line the one last read), or None when its
        predecessor has not been read yet."""
        at = self.lines.tell() - len(raw) if self.source >= 0 else -1  # type: ignore[attr-defined]
        offset, size = self._put(raw, at)
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
            self._remember(link.response_id, turns)
        return self._joined(link, turns)

    def leftovers(self) -> Iterator[tuple[int, Conversation | None, Counter[str]]]:
        """(line number, conversation or None if its chain is incomplete, its parts) of each waiting record."""
        for lineno, offset, size, previous, parts in self.pending:
            before = self.history(previous)
            if before is None:
                yield lineno, None, parts
                continue
            link = self._link(offset, size)
            yield lineno, self._joined(link, before + link.conv["messages"]), parts


def _regular_file(lines: Any) -> int:
    """The descriptor of `lines` when it is a plain file opened for reading (not gzip), else -1."""
    if type(lines).__name__ != "BufferedReader":
        return -1
    try:
        fd = lines.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else -1
    except (OSError, ValueError):
        return -1
