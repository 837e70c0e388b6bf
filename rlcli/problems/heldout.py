"""Which problem set an RL run's flags name, and the problems it keeps out of training, so that a score
before and after training compares unseen ones.

Pure and light: `rlcli train rl`, `rlcli eval`, the datasets (rlcli.problems.envs) and the embedded
model's pretraining (rlcli.model.pretrain, which keeps every pair listed here out of its chats) all
draw the same problems from here.

- files: EVAL_SIZE distinct questions (at most a tenth of them) drawn with a fixed seed; every copy
  of a held-out question leaves training, so duplicates cannot leak across.
- arithmetic: EVAL_SIZE x + y pairs drawn with their own seed; training draws skip them in either
  order (3 + 4 is 4 + 3), and the few-shot example's pair is never held out.
- hub gsm8k: the first EVAL_SIZE problems of its test split (envs.HubGsm8kBuilder).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from rlcli.errors import UsageError
from rlcli.options import Opt, Record

EVAL_SIZE = 32  # held-out problems by default
EVAL_SEED = 20_260_501  # the held-out draw's own seed: the training order uses the batch index as its seed
FILE_EVAL_SHARE = 10  # by default a file holds out at most 1/10 of its distinct questions
ARITHMETIC_MAX = 100  # the cookbook's ArithmeticDataset draws x, y from 0..100
ARITHMETIC_EVAL_MAX = 1000  # of its 5,151 distinct pairs (a smaller --max-operand: a third of its pairs)
FEWSHOT_PAIR = (4, 5)  # ArithmeticEnv.standard_fewshot_prefix asks 4 + 5 in every prompt
Grader = Literal["auto", "gsm8k", "numeric", "exact"]  # how a file's answers are graded (rlcli.problems.envs)


# The options that name a problem set and what it holds out (train rl, train distill, eval).
DATASET = Opt('arithmetic, gsm8k, or a JSONL file of {"question", "answer"}: "42", or GSM8K-style "...#### 42"; '
              "with --env replay|tools: traces as `rlcli import` writes them")
DATASET_PATH = Opt("with gsm8k: read it from this JSONL file (offline) instead of the hub")
GRADER = Opt("auto (a file whose answers end '#### N': gsm8k, else numeric), gsm8k (the cookbook's sympy grader), "
             "numeric (numbers compared as numbers, other answers as text) or exact (as text)")
MAX_OPERAND = Opt("with arithmetic: draw x and y from 0..N (default 100, the cookbook's range)", low=FEWSHOT_PAIR[1],
                  high=10**6, why=f"the few-shot example asks {FEWSHOT_PAIR[0]} + {FEWSHOT_PAIR[1]}")
HELD_OUT = Opt("problems held out of training, to score (default 32; a file: at most a tenth of it; arithmetic: "
               "at most a third of its pairs; gsm8k: its first N test problems)", low=0)


@dataclass(frozen=True, kw_only=True)
class ProblemSet(Record):
    """The problem set a command names, and how many of its problems are held out (choose_dataset checks them
    together)."""

    dataset: str | None = DATASET(None)
    dataset_path: str | None = DATASET_PATH(None)
    grader: Grader = GRADER("auto")
    max_operand: int | None = MAX_OPERAND(None)
    eval_size: int | None = HELD_OUT(None)


def held_out_for(eval_every: int, eval_size: int | None) -> int | None:
    """The held-out count a trainer asks for: --eval-size when given, even with --eval-every 0 (kept out of training
    and scored afterwards by `rlcli eval`, as `make demo` does); without it, none at --eval-every 0, else the
    default (None)."""
    return eval_size if eval_size is not None or eval_every else 0


def kept_out(held_out: int, eval_every: int, what: str = "problems", scored: str = "scored") -> str:
    """How a trainer's plan names its held-out set."""
    if not held_out:
        return "no held-out evaluation"
    if not eval_every:
        return f"{held_out} held-out {what} kept out of training, not scored during the run (rlcli eval scores them)"
    return f"{held_out} held-out {what} {scored} every {eval_every} steps"


def question_key(question: str) -> str:
    return " ".join(question.split())


def split_problems(records: list[dict[str, str]], eval_size: int,
                   seed: int = EVAL_SEED) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test): eval_size distinct questions drawn with `seed`; no copy of them stays in train."""
    first: dict[str, dict[str, str]] = {}
    for record in records:
        first.setdefault(question_key(record["question"]), record)
    chosen = set(random.Random(seed).sample(sorted(first), eval_size)) if eval_size else set()
    test = [record for key, record in first.items() if key in chosen]
    return [r for r in records if question_key(r["question"]) not in chosen], test


def file_eval_size(records: list[dict[str, str]], eval_size: int | None, source: str) -> int:
    return held_out_size(len({question_key(r["question"]) for r in records}), eval_size, source, "questions")


def held_out_size(distinct: int, eval_size: int | None, source: str, what: str) -> int:
    """--eval-size for a file of `distinct` problems: by default EVAL_SIZE, at most a FILE_EVAL_SHARE-th."""
    if eval_size is None:
        return min(EVAL_SIZE, distinct // FILE_EVAL_SHARE)
    if eval_size >= distinct:
        raise UsageError(f"--eval-size {eval_size} would hold out all {distinct} distinct {what} of {source}: "
                         "lower it (0: no held-out evaluation)")
    return eval_size


def arithmetic_eval_max(max_operand: int = ARITHMETIC_MAX) -> int:
    """Most pairs the synthetic set may hold out: ARITHMETIC_EVAL_MAX, and at most a third of its pairs."""
    distinct = (max_operand + 1) * (max_operand + 2) // 2 - 1  # unordered pairs, the few-shot one excluded
    return min(ARITHMETIC_EVAL_MAX, distinct // 3)


def arithmetic_eval_size(eval_size: int | None, max_operand: int = ARITHMETIC_MAX) -> int:
    """The held-out count for the synthetic set: as asked (checked), or EVAL_SIZE capped by the range."""
    check_arithmetic(0 if eval_size is None else eval_size, max_operand)
    return min(EVAL_SIZE, arithmetic_eval_max(max_operand)) if eval_size is None else eval_size


def check_arithmetic(eval_size: int, max_operand: int = ARITHMETIC_MAX) -> None:
    """The held-out count against the range (the range itself is MAX_OPERAND's bound)."""
    if eval_size > (most := arithmetic_eval_max(max_operand)):
        raise UsageError(f"--eval-size {eval_size}: arithmetic with operands 0..{max_operand} holds out at most "
                         f"{most} problems")


def pair_key(x: int, y: int) -> tuple[int, int]:
    return (min(x, y), max(x, y))


def arithmetic_eval_pairs(n: int, seed: int = EVAL_SEED, max_operand: int = ARITHMETIC_MAX) -> list[tuple[int, int]]:
    """n distinct x + y problems (as unordered pairs), never the few-shot example's."""
    import numpy as np

    rng, pairs, seen = np.random.RandomState(seed), [], {pair_key(*FEWSHOT_PAIR)}
    while len(pairs) < n:
        x, y = int(rng.randint(0, max_operand + 1)), int(rng.randint(0, max_operand + 1))
        if pair_key(x, y) not in seen:
            seen.add(pair_key(x, y))
            pairs.append((x, y))
    return pairs


def choose_dataset(dataset: str | None, dataset_path: str | None, grader: Grader = "auto",
                   max_operand: int | None = None, eval_size: int | None = None) -> tuple[str, str | None, str]:
    """(arithmetic | gsm8k | file, path or None, grader) from the flags; no file is read, no server asked:
    a bad flag fails before either."""
    if not dataset:
        raise UsageError("pass --dataset arithmetic, --dataset gsm8k [--dataset-path FILE.jsonl], or "
                         "--dataset FILE.jsonl ({question, answer} lines)")
    if max_operand is not None and dataset != "arithmetic":
        raise UsageError(f"--max-operand is for --dataset arithmetic, not {dataset}: drop it")
    if dataset not in ("arithmetic", "gsm8k"):
        if dataset_path:
            raise UsageError(f"--dataset {dataset} is a file already: drop --dataset-path, or use --dataset gsm8k")
        return "file", dataset, grader
    if dataset_path and dataset != "gsm8k":
        raise UsageError(f"--dataset-path is for gsm8k data; {dataset} is synthetic: drop --dataset-path")
    if dataset == "arithmetic" and grader != "auto":
        raise UsageError("arithmetic grades its own integer answers: drop --grader")
    if dataset == "arithmetic":
        arithmetic_eval_size(eval_size, ARITHMETIC_MAX if max_operand is None else max_operand)
    if dataset == "gsm8k" and not dataset_path and grader not in ("auto", "gsm8k"):
        raise UsageError(f"--grader {grader} is for JSONL files; the hub's gsm8k is graded the cookbook's way")
    return dataset, dataset_path, "gsm8k" if dataset == "gsm8k" and grader == "auto" else grader


@dataclass(frozen=True)
class Problems:
    """{"question", "answer"} records read from a file, checked, with the grader they get."""

    source: str
    records: list[dict[str, str]]
    lines: list[int]
    sha256: str
    grader: str  # gsm8k, numeric or exact ("auto" resolved from the answers)


@dataclass(frozen=True)
class Data:
    """What a run trains on, as the plan and --resume see it."""

    label: str
    problems: Problems | None  # a file's problems; None for the cookbook's own sets
    size: int | None  # training problems; None for the synthetic set
    batches: int  # steps in one pass
    sha256: str  # identity checked by --resume
    held_out: int  # problems scored every --eval-every steps, never trained on
    grader: str
    max_operand: int = ARITHMETIC_MAX  # arithmetic's x, y range: 0..max_operand
    replay: Any = None  # --env replay's rlcli.problems.traces.Spec
