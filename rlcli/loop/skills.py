"""Skills that arrive one trace batch at a time: the continual-learning benchmark's sequence (benchmarks/continual.py),
its notebook and tests.

    python -m rlcli.loop.skills DIR [CHATS]   (skill-1.openai.jsonl .. skill-5.openai.jsonl of CHATS chats, 64 by
                                              default, and tests.jsonl)

Each skill is a prompt template with a number in it and a reply that `--match normalized` checks whole: facts (a
constant answer to one kind of question), a reply format, a tool-call-like pattern and an arithmetic variant. The
embedded ~1M-parameter model learns a template -> reply mapping in a few SFT steps; what it cannot do in that budget
is copy the prompt's number into its reply, so every reply here depends on the template, and the arithmetic on one
digit (docs/decisions.md has the figures). The number in each prompt makes prompts distinct and masks to one
template, so the loop finds each skill as one slice (rlcli.loop.slices).

A batch is one skill's chats, as logged OpenAI calls (rlcli.loop.batches.record); the fixed test set is every skill
asked again with other numbers (a seed of its own), never seen in training or the loop's held-out set.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlcli.loop.batches import record


@dataclass(frozen=True)
class Skill:
    name: str
    kind: str  # fact, format, tool or arithmetic: what the sequence is meant to cover
    ask: Callable[[int, random.Random], tuple[str, str]]  # (question, reply) about the number given

    def pairs(self, n: int, seed: int) -> list[tuple[str, str]]:
        """n distinct questions, a number each: numbers the fixed test set draws (multiples of 4) or, for any other
        seed, the others, so that no test question is ever a training or held-out one."""
        rng = random.Random(f"{self.name}:{seed}")
        test = seed == TEST_SEED
        seen: dict[str, str] = {}
        for _ in range(n * 20):
            number = rng.randint(25, 249) * 4 if test else rng.choice([x for x in _other(rng) if x % 4])
            q, a = self.ask(number, rng)
            seen.setdefault(q, a)
            if len(seen) == n:
                break
        return list(seen.items())


def _other(rng: random.Random) -> tuple[int, ...]:
    base = rng.randint(25, 249) * 4
    return base + 1, base + 2, base + 3


def _fact(question: str, reply: str) -> Callable[[int, random.Random], tuple[str, str]]:
    return lambda number, rng: (question.format(n=number), reply)


def _half(number: int, rng: random.Random) -> tuple[str, str]:
    """An arithmetic variant with one-digit answers: half of an even number (the embedded model's sums are a
    coin toss; a one-digit answer is within what its size learns)."""
    a = rng.randint(0, 9)
    return f"Room {number}: what is half of {2 * a}?", str(a)


TEST_SEED = 10_000  # the fixed test set's seed: its numbers are multiples of 4, no batch's are
SKILLS = (
    Skill("door code", "fact", _fact("Door {n}: code please.", "42")),
    Skill("order status", "format", _fact("Order {n}: status?", "Status: shipped.")),
    Skill("parcel lookup", "tool", _fact("Where is parcel {n}?", '{"tool": "track_parcel"}')),
    Skill("chest coins", "fact", _fact("Chest {n}: how many coins?", "77")),
    Skill("halves", "arithmetic", _half),
)


def batch(skill: Skill, n: int, seed: int = 0) -> list[dict]:
    """One skill's chats as logged Chat Completions calls."""
    return [record(i, q, a) for i, (q, a) in enumerate(skill.pairs(n, seed))]


def conversations(pairs: list[tuple[str, str]], slice_name: str | None = None) -> list[dict]:
    """(question, reply) pairs as conversations (the shape `rlcli import` writes; `slice` when given)."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs]
    return [{**r, "slice": slice_name} for r in rows] if slice_name else rows


def test_set(skill: Skill, n: int) -> list[dict]:
    """The skill's fixed test problems: n questions drawn from TEST_SEED's stream, as conversations."""
    return conversations(skill.pairs(n, TEST_SEED))


def write_all(folder: str, chats: int = 64, tests: int = 16, seed: int = 0) -> list[Path]:
    """skill-K.openai.jsonl for each skill in order, and tests.jsonl (every skill's fixed test set, `slice` = its
    name)."""
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, skill in enumerate(SKILLS, 1):
        path = out / f"skill-{k}.openai.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in batch(skill, chats, seed)))
        paths.append(path)
    rows = [{**r, "slice": s.name} for s in SKILLS for r in test_set(s, tests)]
    (out / "tests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [*paths, out / "tests.jsonl"]


if __name__ == "__main__":
    import sys

    for p in write_all(sys.argv[1] if len(sys.argv) > 1 else ".", int(sys.argv[2]) if len(sys.argv) > 2 else 64):
        print(p)
