"""`rlcli import`: turn production chat logs into training conversations (JSONL).

    rlcli import logs.jsonl -f openai -o train.jsonl
    zcat runs.jsonl.gz | rlcli import - -f langsmith --min-score 0.5 --redact > train.jsonl

Streaming: the input is read line by line and each conversation is written as soon as
it is converted, so memory stays flat on a multi-gigabyte dump. orjson (a dependency of the
tinker client) parses and writes; the json module takes what orjson refuses.

Accounting: every non-blank line (of INPUT and of --feedback) is a record, and every
record ends in exactly one place: written, dropped under a named reason, or (LangSmith
feedback) attached to its run's conversation. The summary on stderr adds up:
read = wrote + attached + dropped. Parts left out of written conversations (images,
audio, extra choices...) are counted by kind. --strict makes any drop an error.

LangSmith feedback applies to a conversation when its run_id is the llm run's id or its
trace_id (apps usually rate the whole trace, i.e. the root run; a trace with several llm
calls gives each of them that rating). Feedback on other runs in between is not followed.
Feedback may come before or after its run in an export, so conversations are
not written as they come: they go to a spool file (private, unlinked at once, on disk
rather than in memory) and are written once the whole input has been read, with their
`feedback` list and mean `score` attached and --min-score applied. Memory then holds
only the feedback records; disk holds one copy of the output. Feedback may also come
from a separate --feedback FILE, read first. This works the same for a file and for
stdin, which cannot be read twice.

-o OUT is written to a private temporary file beside OUT and renamed at the end, so an
error never leaves half a dataset behind.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import orjson

from rlcli.data.importers import IMPORTERS, Feedback, feedback_of, from_langsmith
from rlcli.data.messages import Conversation, Link, Options, finalize
from rlcli.errors import RlcliError, UsageError
from rlcli.files import staged_file
from rlcli.options import Opt, Record, option

if TYPE_CHECKING:
    from rlcli.data.chains import Chains

# run_id -> [(where the feedback record was read, its entry)]
FeedbackTable = dict[str, list[tuple[str, dict[str, Any]]]]
# IMPORTERS' names, then otel (its exports hold many spans: rlcli.data.traces streams them); a unit test
# keeps them equal.
Format = Literal["openai", "anthropic", "messages", "langsmith", "gemini", "otel"]
Write = Callable[[bytes], Any]
# The output's buffer: small enough that a filled buffer is still in the CPU's cache when the kernel copies it
# out (a 1 MiB buffer cost a 100 MB import a third more system time), large enough for few write calls.
_OUT_BUFFER = 1 << 16


def parse_line(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except ValueError:  # orjson refuses NaN and integers past 64 bits, which json accepts
        return json.loads(raw)


def encode(conv: Conversation) -> bytes:
    """One output line."""
    try:
        return orjson.dumps(conv, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # an integer past 64 bits or a lone surrogate: json escapes both
        return json.dumps(conv).encode() + b"\n"


@dataclass
class Stats:
    read: int = 0
    written: int = 0
    attached: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    parts: Counter[str] = field(default_factory=Counter)
    redacted: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        line = f"import: read {self.read}, wrote {self.written}"
        if self.attached:
            line += f", attached {self.attached} feedback"
        line += f", dropped {self.dropped.total()}"
        if self.dropped:
            line += " (" + ", ".join(f"{k}: {n}" for k, n in self.dropped.most_common()) + ")"
        if self.parts:
            line += "; dropped parts: " + ", ".join(f"{k} {n}" for k, n in self.parts.most_common())
        if self.redacted:
            line += "; redacted: " + ", ".join(f"{k} {n}" for k, n in self.redacted.most_common())
        return line


@dataclass
class Run:
    """One import's flags and tallies; converts a stream of lines into written conversations."""

    opts: Options = field(default_factory=Options)
    strict: bool = False
    skip_bad: bool = False
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self.parts: Counter[str] = Counter()  # one Counter, emptied after each record: no allocation
        self.seen: set[bytes] = set()  # digests of kept conversations, for --dedupe
        self.line = b""  # the raw line of the record `records` yielded last (Chains find a Link's line by it)

    def records(self, lines: Iterable[bytes], where: str = "line") -> Iterator[tuple[int, Any]]:
        """(line number, decoded record) for each non-blank line; bad JSON stops or is counted."""
        stats, loads = self.stats, orjson.loads
        for lineno, raw in enumerate(lines, 1):
            if raw.isspace():
                continue
            stats.read += 1
            try:
                record = loads(raw)  # parse_line's first try, without its call: this loop runs once a record
            except ValueError:
                try:
                    record = parse_line(raw)
                except ValueError as e:
                    self._bad_json(f"{where} {lineno}", e)
                    continue
            self.line = raw
            yield lineno, record

    def _bad_json(self, at: str, e: ValueError) -> None:
        if not self.skip_bad:
            detail = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise UsageError(f"{at}: not valid JSON ({detail}); fix the line, or pass --skip-bad to skip it")
        self.drop(at, "bad_json")

    def drop(self, at: str, reason: str) -> None:
        if self.strict:
            raise UsageError(f"{at}: record dropped ({reason}); --strict stops at the first drop")
        self.stats.dropped[reason] += 1

    def _keep_parts(self, lineno: int) -> None:
        parts = self.parts
        if self.strict:
            kind, n = next(iter(parts.items()))
            raise UsageError(f"line {lineno}: {n} {kind} part(s) left out; --strict stops at the first drop")
        self.stats.parts.update(parts)
        parts.clear()

    def convert(self, record: Any, lineno: int, importer: Callable[..., Any]) -> Any:
        """A finalized conversation, a Feedback, or None when the record was dropped (and counted)."""
        try:
            result = importer(record, self.parts)
        except Exception as e:  # a shape no importer foresaw: name the line rather than show a traceback
            raise RlcliError(
                f"line {lineno}: could not convert this record ({type(e).__name__}: {e}); "
                "remove the line and please report its shape"
            ) from e
        return self.finish(result, lineno)

    def finish(self, result: Any, lineno: int) -> Any:
        """Finalize a converted conversation and count its parts, or count the reason it was dropped.

        Anything else (a Feedback, a Link) comes back as it is, its parts still waiting in `parts`.
        """
        if type(result) is dict:
            result = finalize(result, self.opts, self.stats.redacted, self.seen)
            if type(result) is dict:
                if self.parts:
                    self._keep_parts(lineno)
                return result
        if type(result) is str:
            self.parts.clear()  # parts of a dropped record were not left out of anything written
            self.drop(f"line {lineno}", result)
            return None
        return result

    def stream(self, lines: Iterable[bytes], importer: Callable[..., Any], write: Write) -> None:
        """Convert each record and write it; Responses records that continue others (Links, which only
        from_openai returns) are joined first, by Chains made at the first Link."""
        emit = self.emitter(write)
        chains: Chains | None = None
        try:
            for lineno, record in self.records(lines):
                result = self.convert(record, lineno, importer)
                if type(result) is Link:
                    if chains is None:
                        chains = self._chains(lines, importer)
                    result = chains.add(result, self.line, lineno, self.parts)
                    result = None if result is None else self.finish(result, lineno)
                if result is not None:
                    emit(result)
            if chains is not None:
                self._leftovers(chains, emit)
        finally:
            if chains is not None:
                chains.close()

    def _chains(self, lines: Iterable[bytes], importer: Callable[..., Any]) -> Chains:
        from rlcli.data.chains import Chains  # only a log with Responses chains loads it

        def reconvert(raw: bytes) -> Link:
            return importer(parse_line(raw), Counter())  # parts were counted the first time

        opts = self.opts
        return Chains(lines, reconvert, private=opts.redact or opts.drop_tools or opts.drop_thinking)

    def _leftovers(self, chains: Chains, emit: Callable[[Conversation], None]) -> None:
        """The records that waited for a predecessor later in the input: joined now, or dropped."""
        for lineno, conv, parts in chains.leftovers():
            if conv is None:
                self.drop(f"line {lineno}", "previous_response_missing")
                continue
            self.parts.update(parts)
            if (done := self.finish(conv, lineno)) is not None:
                emit(done)

    def emitter(self, write: Write) -> Callable[[Conversation], None]:
        """A function that writes one finished conversation and counts it."""
        stats = self.stats

        def emit(conv: Conversation) -> None:
            write(encode(conv))
            stats.written += 1

        return emit


def _add_feedback(run: Run, table: FeedbackTable, fb: Feedback, at: str) -> None:
    entry = fb.entry
    if run.opts.redact:
        from rlcli.data.redact import redact_json_text

        # value and correction may be JSON text: redact them value by value, like tool arguments
        entry = {
            k: redact_json_text(v, run.stats.redacted) if k != "key" and isinstance(v, str) else v
            for k, v in entry.items()
        }
    table.setdefault(fb.run_id, []).append((at, entry))


def _read_feedback(run: Run, path: str, table: FeedbackTable) -> None:
    with _input(path) as lines:
        for lineno, record in run.records(lines, where="feedback line"):
            result = feedback_of(record) if isinstance(record, dict) else "bad_feedback"
            if isinstance(result, Feedback):
                _add_feedback(run, table, result, f"feedback line {lineno}")
            else:
                run.drop(f"feedback line {lineno}", result)


def _score(entries: list[tuple[str, dict[str, Any]]]) -> float | None:
    scores = [e["score"] for _, e in entries if e["score"] is not None]
    return sum(scores) / len(scores) if scores else None


def langsmith(
    run: Run,
    lines: Iterable[bytes],
    write: Write,
    min_score: float | None = None,
    feedback_path: str | None = None,
) -> None:
    """Convert LangSmith runs; attach feedback from anywhere in the input (see the module docstring)."""
    table: FeedbackTable = {}
    if feedback_path:
        _read_feedback(run, feedback_path, table)
    with tempfile.TemporaryFile() as spool:
        for lineno, record in run.records(lines):
            result = run.convert(record, lineno, from_langsmith)
            if isinstance(result, Feedback):
                _add_feedback(run, table, result, f"line {lineno}")
            elif result is not None:
                spool.write(b"%d\t" % lineno + encode(result))
        spool.seek(0)
        matched = _write_spooled(run, spool, table, write, min_score)
    for run_id, entries in table.items():
        for at, _ in entries if run_id not in matched else ():
            run.drop(at, "feedback_unmatched")
    run.stats.attached += sum(len(table[rid]) for rid in matched)


def _write_spooled(run: Run, spool: IO[bytes], table: FeedbackTable, write: Write, min_score: float | None) -> set[str]:
    matched: set[str] = set()
    for line in spool:
        lineno, _, body = line.partition(b"\t")
        conv = parse_line(body)
        # Feedback on the llm run itself, and on its trace (the root run, where apps put user ratings).
        keys = [k for k in dict.fromkeys((conv.get("run_id"), conv.get("trace_id"))) if k in table]
        entries = [e for k in keys for e in table[k]]
        score = None
        if entries:
            matched.update(keys)
            conv["feedback"] = [entry for _, entry in entries]
            score = _score(entries)
            if score is not None:
                conv["score"] = score
        if min_score is not None and (score is None or score < min_score):
            run.drop(f"line {int(lineno)}", "no_score" if score is None else "below_min_score")
            continue
        write(encode(conv))
        run.stats.written += 1
    return matched


@contextmanager
def _input(path: str) -> Iterator[Iterable[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    if not os.path.isfile(path):
        raise UsageError(f"input {path} is not a file; give a JSONL file (or .jsonl.gz), or - for stdin")
    if path.endswith(".gz"):
        import gzip

        with gzip.open(path, "rb") as f:
            yield f
    else:
        with open(path, "rb", buffering=1 << 20) as f:
            yield f


@contextmanager
def _no_cycle_collector() -> Iterator[None]:
    """Pause Python's cycle collector while streaming.

    Decoded records are trees, so reference counting frees each one as soon as it is
    written; the collector would only rescan every record's fresh containers (~10% of the
    time). Memory stays flat either way.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def _output(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"output folder {folder} does not exist; create it or choose another -o path")
    with staged_file(Path(os.path.abspath(path)), buffering=_OUT_BUFFER) as f:
        yield f


FORMAT = Opt("the records' shape: openai (Chat Completions and Responses), anthropic, gemini, messages, langsmith "
             "or otel (OpenTelemetry spans)", short="-f")
REDACT = Opt("replace emails, phones, API keys, IPs and card numbers with placeholders")
DEDUPE = Opt("drop conversations identical to one already written (counted as duplicate)")


@dataclass(frozen=True, kw_only=True)
class ImportOptions(Record):
    """`rlcli import`'s options."""

    input: str = option(help="JSONL file of logged records (a .gz file is decompressed), or - for stdin",
                        positional=True)
    format: Format = FORMAT("openai")
    output: str = option("-", "file to write the conversations to; - for stdout", short="-o")
    strict: bool = option(False, "make any dropped record or part an error that names its line")
    skip_bad: bool = option(False, "count and skip lines that are not valid JSON instead of stopping")
    redact: bool = REDACT(False)
    drop_tools: bool = option(False, "write text-only conversations (no tool calls, tool results or tool "
                                     "definitions)")
    drop_thinking: bool = option(False, "leave out the assistant's reasoning (thinking) text")
    min_score: float | None = option(None, "langsmith only: keep runs whose mean feedback score is at least this")
    feedback: str | None = option(None, "langsmith only: a JSONL file of feedback records to attach to their runs")
    dedupe: bool = DEDUPE(False)
    join_trace: bool = option(False, "otel only: keep each trace's last LLM call (it holds the conversation so far)")


def import_cmd(o: ImportOptions) -> int:
    """Convert chat logs to training JSONL, one {"messages": [...]} per line; a summary goes to stderr."""
    if o.format != "langsmith" and (o.min_score is not None or o.feedback):
        raise UsageError("--min-score and --feedback apply to LangSmith runs; add -f langsmith or drop them")
    if o.join_trace and o.format != "otel":
        raise UsageError("--join-trace joins OpenTelemetry spans; add -f otel or drop it")
    run = Run(Options(o.drop_tools, o.drop_thinking, o.redact, o.dedupe), o.strict, o.skip_bad)
    try:
        convert(run, o.input, o.format, o.output, o.min_score, o.feedback, o.join_trace)
    except BrokenPipeError:  # `rlcli import ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print(run.stats.summary(), file=sys.stderr)
    return 0


def convert(run: Run, input: str, format: str, output: str, min_score: float | None = None,
            feedback: str | None = None, join_trace: bool = False) -> Stats:
    """One file (or stdin) through `run` into output: what import_cmd does, its tallies returned
    (`rlcli loop` ingests each trace file this way)."""
    importer = None if format == "otel" else IMPORTERS[format]
    with _input(input) as lines, _output(output) as out, _no_cycle_collector():
        if format == "langsmith":
            langsmith(run, lines, out.write, min_score, feedback)
        elif importer is None:
            from rlcli.data import traces  # only -f otel compiles the span readers

            traces.stream(run, lines, run.emitter(out.write), join_trace)
        else:
            run.stream(lines, importer, out.write)
    return run.stats
