"""`rlcli synth qa`: {"question", "answer"} problems from traces whose final answer can be checked.

Launch:  rlcli synth qa traces.jsonl -o qa.jsonl          (traces: what `rlcli import` wrote)
         rlcli train rl --dataset qa.jsonl               (graded numeric: numbers as numbers, else text)
         rlcli eval --dataset qa.jsonl

A logged reply gives an answer when it is, or ends in, something a grader can compare: a JSON value,
a number (the whole reply, or what follows its last `=` or "answer is"), or a short one-line string.
The question is the last user message; a problem that needs earlier turns to make sense is skipped,
and so are bad verdicts, questions asked twice with different answers, and copies. Every skip is
counted by reason; each problem keeps its "source" (FILE:LINE) and "trace_id". Pure but for the files.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError
from rlcli.options import Record, option
from rlcli.problems import rewards, traces
from rlcli.problems.heldout import question_key

SHORT_WORDS, SHORT_CHARS = 4, 40  # a short exact string: one line, at most this many words and characters
TAIL_NUMBER = re.compile(r"(?:=|\banswer is|\bresult is|\btotal is)\s*\$?\s*([+-]?\d[\d,]*(?:\.\d+)?)\s*[.!]?\s*$",
                         re.IGNORECASE)
WHOLE_NUMBER = re.compile(r"[+-]?\$?\d[\d,]*(?:\.\d+)?%?")


def checkable_answer(reply: str) -> tuple[str | None, str]:
    """(the answer, its kind) of a logged reply, or (None, why not)."""
    text = reply.strip()
    if not text:
        return None, "empty_reply"
    bare = text.rstrip(".!")
    if WHOLE_NUMBER.fullmatch(bare):
        return bare.replace("$", "").replace(",", "").rstrip("%"), "number"
    value = rewards.parse_json(text)
    if isinstance(value, dict | list) or (value is not rewards.NOT_JSON and not isinstance(value, str)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")), "json"
    if found := TAIL_NUMBER.search(text):
        return found.group(1).replace(",", ""), "number"
    if "\n" not in bare and len(bare) <= SHORT_CHARS and len(bare.split()) <= SHORT_WORDS:
        return bare, "short_text"
    return None, "free_text"


def question_problem(problem: traces.Problem) -> tuple[dict[str, Any] | None, str]:
    if problem.score is not None and problem.score < rewards.GOOD_SCORE:
        return None, "bad_verdict"
    if any(m["role"] in ("assistant", "tool") for m in problem.prompt):
        return None, "needs_earlier_turns"
    answer, kind = checkable_answer(problem.text)
    if answer is None:
        return None, kind
    record = {"question": problem.last_user(), "answer": answer, "source": problem.source}
    if problem.trace_id:
        record["trace_id"] = problem.trace_id
    return record, kind


def synthesize(found: traces.Traces) -> tuple[list[dict[str, Any]], Counter[str], Counter[str]]:
    """(problems, skipped by reason, kept by answer kind)."""
    skipped, kinds = Counter(found.skipped), Counter()
    by_question: dict[str, dict[str, Any]] = {}
    answers: dict[str, set[str]] = {}
    for problem in found.problems:
        record, why = question_problem(problem)
        if record is None:
            skipped[why] += 1
            continue
        key = question_key(record["question"])
        answers.setdefault(key, set()).add(record["answer"])
        if key in by_question:
            skipped["duplicate"] += 1
            continue
        by_question[key] = record
        kinds[why] += 1
    kept = []
    for key, record in by_question.items():
        if len(answers[key]) > 1:  # asked again, answered otherwise: neither copy is a trustworthy gold
            skipped["conflicting_answers"] += 1
            kinds[checkable_answer(record["answer"])[1]] -= 1
        else:
            kept.append(record)
    return kept, skipped, +kinds


@dataclass(frozen=True, kw_only=True)
class QaOptions(Record):
    """`rlcli synth qa`'s options."""

    traces_file: str = option(help="JSONL conversations as `rlcli import` writes them", positional=True)
    output: str | None = option(None, "the problems file to write (JSONL), for `train rl --dataset` and `eval "
                                      "--dataset`", short="-o")
    turn: traces.Turn = traces.TURN("last")

    def problems(self) -> Iterator[str]:
        if not self.output:
            yield "pass -o FILE.jsonl: where to write the problems"


def qa(o: QaOptions) -> int:
    """Extract {"question", "answer"} problems with checkable answers from imported traces."""
    traces_file, output = o.traces_file, str(o.output)
    found = traces.read_traces(traces_file, o.turn)
    problems, skipped, kinds = synthesize(found)
    if not problems:
        why = ", ".join(f"{n} {r}" for r, n in sorted(skipped.items()))
        raise UsageError(f"{traces_file}: no reply has a checkable final answer (skipped: {why}); a number, a "
                         "JSON value or a short one-line answer is needed")
    from rlcli.files import staged_file

    target = Path(os.path.abspath(Path(output).expanduser()))
    with staged_file(target) as f:
        for record in problems:
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
    kept = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    dropped = ", ".join(f"{n} {r}" for r, n in sorted(skipped.items())) or "none"
    print(f"synth qa: {len(found.problems)} replies -> {len(problems)} problems ({kept}) in {output}; "
          f"skipped: {dropped}", file=sys.stderr)
    return 0
