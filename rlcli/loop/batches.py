"""Deterministic trace batches for the loop's tests, notebook and first try: logged OpenAI chats.

    python -m rlcli.loop.batches DIR      (writes batch-1.openai.jsonl .. batch-3.openai.jsonl, regression.jsonl)

Every batch mixes one-digit sums (a quarter: a skill the embedded model already has, answered bare) with a
skill of its own: batch 1 teaches "the code for door N" (always 42), batch 2 a new skill ("the coins in chest N":
always 77), batch 3 more of both. Each batch also holds two records an importer must drop and count (a
chat without a reply, a reply cut at its length limit). 96 chats a batch by default: at `heldout_share` 0.25 batch 2
brings 11 held-out chests, enough for the per-slice gate to show a gain (it needs 7 to improve; at 64 chats it
brought exactly 7, at 32 chats and a fifth held out 3). The regression set: other sums, fixed at `loop init`
(or, write_skill_regression, batch 1's skill asked again: what a later iteration must not forget).
Every answer is a number: score them with `--match number`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SKILLS = {1: ("Door {n}: code please.", "42"),
          2: ("Chest {n}: how many coins?", "77")}


def _sum_chat(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"What is {a} + {b}?", str(a + b)


def chats(batch: int, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (question, answer) pairs of one batch: a quarter sums, the rest its skill (batch 3: both skills)."""
    rng = random.Random(seed * 1000 + batch)
    out = []
    for i in range(n):
        if i % 4 == 0:
            out.append(_sum_chat(rng))
        else:
            skill = SKILLS[batch] if batch in SKILLS else SKILLS[1 + i % 2]
            out.append((skill[0].format(n=rng.randint(100, 999)), skill[1]))
    return out


def record(i: int, question: str, answer: str) -> dict[str, Any]:
    """One logged Chat Completions call, in the request/response layout `rlcli import -f openai` reads."""
    messages = [{"role": "user", "content": question}]
    choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
    return {"request": {"model": "prod-model", "messages": messages},
            "response": {"id": f"chatcmpl-{i}", "choices": [choice]}}


def write_batch(path: Path, batch: int, n: int = 96, seed: int = 0) -> Path:
    lines = [record(i, q, a) for i, (q, a) in enumerate(chats(batch, n, seed))]
    lines.append({"model": "prod-model", "messages": [{"role": "user", "content": "hello?"}]})  # no reply
    lines.append({"request": {"model": "prod-model", "messages": [{"role": "user", "content": "What is 1 + 1?"}]},
                  "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "2"},
                                            "finish_reason": "length"}]}})  # cut short
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def write_regression(path: Path, n: int = 8, seed: int = 0) -> Path:
    """Sums in other words, as conversations (the shape `rlcli import` writes)."""
    rng = random.Random(seed + 7)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                  {"role": "assistant", "content": str(a + b)}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_skill_regression(path: Path, batch: int = 1, n: int = 16, seed: int = 0) -> Path:
    """A batch's skill asked again (other numbers), as conversations: a regression set that guards what an
    earlier iteration taught (batch 1: the door code), for a loop whose later iterations may forget it."""
    rng = random.Random(seed + 99)
    question, answer = SKILLS[batch]
    rows = [{"messages": [{"role": "user", "content": question.format(n=rng.randint(100, 999))},
                          {"role": "assistant", "content": answer}]} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_all(folder: str, n: int = 96, seed: int = 0) -> list[Path]:
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    return [*(write_batch(out / f"batch-{b}.openai.jsonl", b, n, seed) for b in (1, 2, 3)),
            write_regression(out / "regression.jsonl", seed=seed)]


if __name__ == "__main__":
    import sys

    for p in write_all(sys.argv[1] if len(sys.argv) > 1 else "."):
        print(p)
