"""Streaming OpenTelemetry exports for `rlcli import -f otel`: one record per span, --join-trace.

Input is one OTLP/JSON export per line (what the collector's file exporter writes), or one JSON
document spread over many lines (a pretty-printed export): when the first non-blank line is not
JSON on its own and does not end like a complete object, the whole input is read as one
document (held in memory, which such files are small enough for).

Accounting counts spans: every span of every export is one record (written, or dropped as
non_llm_span, no_content...); a line that holds no export is one record too (`unrecognized`),
and an export without spans is one (`no_spans`).

--join-trace keeps, of each trace, the LLM span that ended last (a chat's later call holds the
conversation so far); the trace's other LLM spans are dropped as `earlier_in_trace`. Converted
spans wait in a private spool file (unlinked at once) and memory holds one small entry per trace;
they are finalized (redacted, deduplicated, counted) only once chosen.
"""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from rlcli.data import otel
from rlcli.data.messages import Conversation, to_json


def documents(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The input's lines, or the whole input as one line when it is one multi-line JSON document."""
    it = iter(lines)
    for first in it:
        if first.isspace():
            continue
        stripped = first.strip()
        if stripped.endswith((b"}", b"]")) or not stripped.startswith((b"{", b"[")):
            return itertools.chain([first], it)
        try:
            orjson.loads(stripped)
        except ValueError:
            return iter([b" ".join(line.rstrip(b"\r\n") for line in itertools.chain([first], it)) + b"\n"])
        return itertools.chain([first], it)
    return iter(())


def _spans(run: Any, lines: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    """(line number, span) for every span; lines that hold no spans are dropped and counted here."""
    for lineno, record in run.records(documents(lines)):
        found = otel.spans(record)
        if not found:
            run.drop(f"line {lineno}", "unrecognized" if found is None else "no_spans")
            continue
        run.stats.read += len(found) - 1  # the line was counted once; each span is a record
        for span in found:
            yield lineno, span


def stream(run: Any, lines: Iterable[bytes], emit: Callable[[Conversation], None], join_trace: bool = False) -> None:
    if not join_trace:
        for lineno, span in _spans(run, lines):
            if (conv := run.convert(span, lineno, otel.from_span)) is not None:
                emit(conv)
        return
    with tempfile.TemporaryFile() as spool:
        last: dict[str, tuple[tuple[int, int], int, int, int]] = {}  # trace -> (order key, lineno, offset, size)
        for seq, (lineno, span) in enumerate(_spans(run, lines)):
            result = otel.from_span(span, run.parts)
            if type(result) is str:
                run.finish(result, lineno)  # dropped now: counted under its reason
                continue
            trace = otel.ids(span)[0] or f"#{seq}"  # a span without a trace id is a trace of its own
            data = to_json({"c": result, "p": run.parts}).encode()
            run.parts.clear()
            offset = spool.seek(0, 2)
            spool.write(data)
            key = (otel.end_time(span), seq)
            if trace in last:
                earlier = min(last[trace], (key, lineno, offset, len(data)))
                run.drop(f"line {earlier[1]}", "earlier_in_trace")
                if earlier[0] == key:
                    continue
            last[trace] = (key, lineno, offset, len(data))
        for _, lineno, offset, size in last.values():
            spool.seek(offset)
            entry = orjson.loads(spool.read(size))
            run.parts.update(Counter(entry["p"]))
            if (conv := run.finish(entry["c"], lineno)) is not None:
                emit(conv)
