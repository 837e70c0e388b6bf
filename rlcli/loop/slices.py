"""Which slice each held-out and regression problem belongs to: the skill or kind of request it stands for.

A conversation's slice, in order:
1. the `slice` it carries: `rlcli import` keeps one from an OpenAI request's `metadata`, a LangSmith run's
   metadata, an OpenTelemetry span's `rlcli.slice` attribute, or an already-shaped record's own `slice` field;
2. else its template, the last user message with numbers, quoted text, ids, addresses and links masked
   ("Door 512: code please." -> "Door #: code please."), when at least TEMPLATE_MIN conversations and
   TEMPLATE_SHARE of the batch that brought it share it, or an earlier batch made it a slice;
3. else the trace file and the iteration that brought it ("batch-2.jsonl@2"); a regression conversation, "regression".
Slices are named, not numbered: a held-out problem and a regression problem of one name are one slice. A slice is
decided when its conversation arrives and never changes (the ledger's problems table).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rlcli.problems.traces import text_of

TEMPLATE_MIN = 5  # a template is a slice when this many conversations of one batch share it...
TEMPLATE_SHARE = 0.05  # ...and this share of the batch: a big batch of varied traffic makes few, large slices
LONGEST = 80  # characters of a slice's name: a long template is named by its start
REGRESSION = "regression"
_MASKS = (
    (re.compile(r"https?://\S+|www\.\S+"), "<url>"),
    (re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"), "<email>"),
    (re.compile(r"\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|`[^`\n]{1,200}`|“[^”\n]{1,200}”"), '"…"'),
    (re.compile(r"\b[0-9a-f]{8,}(?:-[0-9a-f]{4,})*\b", re.IGNORECASE), "#"),  # hashes, uuids, hex ids
    (re.compile(r"\d+(?:[.,:/-]\d+)*"), "#"),  # numbers, dates, times, amounts
)


def template(conv: dict[str, Any]) -> str:
    """The last user message, its variable parts masked and whitespace joined, cut to LONGEST characters."""
    text = next((text_of(m) for m in reversed(conv["messages"]) if m["role"] == "user"), "")
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    text = " ".join(text.split())
    return text if len(text) <= LONGEST else text[:LONGEST - 1] + "…"


def tag(conv: dict[str, Any]) -> str | None:
    """The slice the conversation carries (rlcli import's `slice`), cut to LONGEST characters."""
    found = conv.get("slice")
    return " ".join(found.split())[:LONGEST] or None if isinstance(found, str) else None


def assign(convs: Sequence[dict[str, Any]], fallbacks: Sequence[str], known: set[str]) -> list[str]:
    """Each conversation's slice: its tag, its template (shared enough in this batch, or a slice already), else its
    fallback (the file and iteration that brought it, or "regression")."""
    templates = [template(c) for c in convs]
    counts = Counter(templates)
    enough = max(TEMPLATE_MIN, TEMPLATE_SHARE * len(convs))
    return [tag(c) or (t if t and (t in known or counts[t] >= enough) else fallback)
            for c, t, fallback in zip(convs, templates, fallbacks, strict=True)]


def file_slice(path: str, iteration: int) -> str:
    """The fallback slice of a conversation: the file that brought it, at its iteration."""
    return f"{path.rsplit('/', 1)[-1]}@{iteration}"
