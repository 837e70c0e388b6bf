"""The problems `rlcli train rl` trains on, as tinker-cookbook RL dataset builders.

- `arithmetic`: the cookbook's synthetic "What is x + y?" env (no data, no download).
- `gsm8k`: the cookbook's GSM8K env over the hub's openai/gsm8k (online, or from the local cache).
- a GSM8K-format JSONL file ({"question", "answer"} with the gold after '####'): the cookbook's own
  GSM8K dataset class (prompt, few-shot prefix, gold extraction, \\boxed{} grading with its sympy
  grader), fed from the file instead of the hub. That is the offline path, and what the tests run.

This module imports the cookbook (and `datasets`) at the top: rl.py imports it only once a run's
loss plan is settled, so `rlcli train rl --help` and the loss checks never pay for it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chz
from datasets import Dataset, load_dataset
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.rl.types import RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from rlcli.errors import RlcliError, UsageError

try:  # its grader imports sympy and pylatexenc (the cookbook's [math-rl] extra), whose own hint names a git install
    from tinker_cookbook.recipes.math_rl.math_env import (
        Gsm8kDataset,
        Gsm8kDatasetBuilder,
        MathEnv,
        extract_gsm8k_final_answer,
    )
except ImportError as e:
    raise RlcliError("tinker-cookbook's math envs need sympy and pylatexenc: pip install sympy pylatexenc") from e

GSM8K_HUB = ("openai/gsm8k", "main")
ARITHMETIC_BATCHES = 100  # the synthetic set has no size of its own: without --max-steps, this many steps
FORMAT_HINT = 'one JSON object per line, {"question": ..., "answer": "...reasoning...\\n#### 42"}'


@dataclass(frozen=True)
class Problems:
    """GSM8K-format problems read from a file: {"question", "answer"} records, checked."""

    source: str
    records: list[dict[str, str]]
    lines: list[int]
    sha256: str


@dataclass(frozen=True)
class Data:
    """What a run trains on, as the plan and --resume see it."""

    label: str
    problems: Problems | None  # a file's problems; None for the cookbook's own sets
    size: int | None  # problems; None for the synthetic set
    batches: int  # steps in one pass
    sha256: str  # identity checked by --resume


def load_data(name: str, path: str | None, batch_size: int, max_steps: int | None) -> Data:
    """Read and check the data of `choose_dataset`'s (name, path), or ask the hub for GSM8K's size."""
    if path:
        problems = read_problems(path)
        size = len(problems.records)
        return Data(f"gsm8k-format file {path}", problems, size, math.ceil(size / batch_size), problems.sha256)
    if name == "arithmetic":
        batches = max_steps or ARITHMETIC_BATCHES
        return Data("arithmetic (the cookbook's synthetic x + y problems)", None, None, batches, "arithmetic")
    size = hub_gsm8k_size()
    hub = "/".join(GSM8K_HUB)
    return Data(f"gsm8k ({hub}, train split)", None, size, math.ceil(size / batch_size), "hub:" + hub)


def record_problem(obj: Any) -> str | None:
    """Why a parsed line is not a problem the cookbook's GSM8K env can grade, or None."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            return f'"{key}" is missing or not a non-empty string'
    try:
        gold = extract_gsm8k_final_answer(obj["answer"])  # the cookbook's own: what it will grade against
    except ValueError:
        return '"answer" has no final answer (GSM8K ends it with a line "#### 42")'
    return None if gold.strip() else '"answer" has an empty final answer after "####"'


def parse_problems(lines: Iterable[str], source: str) -> Problems:
    records, numbers = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{source} line {number}: not valid JSON ({e})") from None
        if problem := record_problem(obj):
            raise UsageError(f"{source} line {number}: {problem}; expected {FORMAT_HINT}")
        records.append({"question": obj["question"], "answer": obj["answer"]})
        numbers.append(number)
    if not records:
        raise UsageError(f"{source} has no problems: expected {FORMAT_HINT}")
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    return Problems(source, records, numbers, hashlib.sha256(payload.encode()).hexdigest())


def read_problems(path: str) -> Problems:
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            return parse_problems(f, path)
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"no problems file at {path}: pass a GSM8K-format JSONL file ({FORMAT_HINT})") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text ({e.reason}): convert it to UTF-8 JSONL") from None


def hub_gsm8k_size() -> int:
    """How many training problems the hub's GSM8K has; a one-line error when it cannot be had.

    `datasets` answers from its local cache when HF_HUB_OFFLINE is set (rlcli sets it for a local
    model folder), so a machine that downloaded GSM8K once keeps working offline.
    """
    try:
        return len(load_dataset(*GSM8K_HUB, split="train"))
    except Exception as e:  # offline, no cache, hub down: all end the same way for the user
        raise UsageError(
            f"cannot load GSM8K from the Hugging Face hub ({type(e).__name__}): offline, pass it as a file with "
            f"--dataset-path FILE.jsonl, {FORMAT_HINT} (openai/gsm8k's train split saved as JSONL elsewhere)"
        ) from None


class Gsm8kFileDataset(Gsm8kDataset):
    """The cookbook's Gsm8kDataset over records instead of the hub.

    Only loading differs: get_batch, the MathEnv prompt, the gold extraction and grading are the parent's.
    """

    def __init__(self, records: list[dict[str, str]], batch_size: int, group_size: int,
                 renderer: renderers.Renderer, seed: int = 0):
        self.ds = Dataset.from_list(records).shuffle(seed=seed)  # shuffled as the hub's train split is
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.convo_prefix = MathEnv.standard_fewshot_prefix()  # what the cookbook's gsm8k builder uses


@chz.chz
class Gsm8kFileBuilder(RLDatasetBuilder):
    """Rereads the checked file when the recipe asks (the recipe writes builders into config.json)."""

    file_path: str
    sha256: str  # of the records checked before the run: a file changed since then is refused
    batch_size: int
    model_name_for_tokenizer: str
    renderer_name: str
    group_size: int
    seed: int = 0

    async def __call__(self) -> tuple[Gsm8kFileDataset, None]:
        problems = read_problems(self.file_path)
        if problems.sha256 != self.sha256:
            raise UsageError(f"{self.file_path} changed after it was checked: rerun the command")
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        return Gsm8kFileDataset(problems.records, self.batch_size, self.group_size, renderer, self.seed), None


def dataset_builder(dataset: str, problems: Problems | None, model: str, renderer: str, batch_size: int,
                    group_size: int, n_batches: int) -> RLDatasetBuilder:
    """The cookbook builder for `dataset`; `problems` when the data came from a file."""
    common = dict(batch_size=batch_size, model_name_for_tokenizer=model, renderer_name=renderer,
                  group_size=group_size)
    if problems is not None:
        return Gsm8kFileBuilder(file_path=str(Path(problems.source).expanduser().resolve()),
                                sha256=problems.sha256, **common)
    if dataset == "arithmetic":
        return ArithmeticDatasetBuilder(n_batches=n_batches, **common)
    return Gsm8kDatasetBuilder(**common)
