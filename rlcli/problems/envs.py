"""The problems `rlcli train rl` trains on, as tinker-cookbook RL dataset builders.

- `arithmetic`: the cookbook's synthetic "What is x + y?" env (no data, no download).
- `gsm8k`: the cookbook's GSM8K env over the hub's openai/gsm8k (online, or from the local cache).
- a JSONL file of {"question", "answer"}; its answers say which of two forms it is (a mix is refused
  at the first line that differs from line 1):
  - GSM8K-style, every answer ending '#### 42': graded the cookbook's GSM8K way (its dataset class:
    prompt, few-shot prefix, gold after '####', \\boxed{} answer, sympy grader).
  - plain, every answer the final answer itself ("42", "Paris"): the cookbook's MathEnv prompt asks
    for \\boxed{}, its extract_boxed reads the reply, and `grade_answer` compares: as numbers when both
    are numbers (commas and whitespace dropped, 42 == 42.0), else as whitespace-normalized text.
Each keeps problems held out for evaluation (rlcli.problems.heldout). The cookbook and `datasets` are
imported at the top: rl.py imports this module only once a run's loss plan is settled.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import chz
from datasets import Dataset, load_dataset
from tinker_cookbook import renderers
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from rlcli.data.validate import numbered_json_lines
from rlcli.errors import RlcliError, UsageError
from rlcli.problems import heldout
from rlcli.problems.heldout import Data, Problems

try:  # its grader imports sympy and pylatexenc (the cookbook's [math-rl] extra), whose own hint names a git install
    from tinker_cookbook.recipes.math_rl.math_env import (
        Gsm8kDataset,
        Gsm8kDatasetBuilder,
        MathEnv,
        extract_gsm8k_final_answer,
    )
    from tinker_cookbook.recipes.math_rl.math_grading import extract_boxed
except ImportError as e:
    raise RlcliError("tinker-cookbook's math envs need sympy and pylatexenc: pip install sympy pylatexenc") from e

GSM8K_HUB = ("openai/gsm8k", "main")
ARITHMETIC_BATCHES = 100  # the synthetic set has no size of its own: without --max-steps, this many steps
FORMAT_HINT = ('one JSON object per line, {"question": ..., "answer": "42"}, or GSM8K-style with '
               '"answer": "...reasoning...\\n#### 42"')
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


# --- grading -------------------------------------------------------------------------------------


def as_number(text: str) -> Decimal | None:
    """The number a whole answer spells, commas and whitespace dropped; Decimal so 20-digit ints stay exact."""
    compact = re.sub(r"[\s,]", "", text)
    return Decimal(compact) if NUMBER.fullmatch(compact) else None  # the pattern admits no nan or inf


def grade_answer(given: str, gold: str, grader: str = "numeric") -> bool:
    """numeric: equal as numbers when both are numbers (42 == 42.0 == 4,2e1), else as text; exact: as text."""
    if grader == "numeric" and (a := as_number(given)) is not None and (b := as_number(gold)) is not None:
        return a == b
    return " ".join(given.split()) == " ".join(gold.split())


def final_answer(answer: str) -> str | None:
    """The gold after a GSM8K '####' line (the cookbook's own extraction), or None when there is none."""
    try:
        return extract_gsm8k_final_answer(answer)
    except ValueError:
        return None


def gold_answer(answer: str) -> str:
    final = final_answer(answer)
    return answer.strip() if final is None else final


class QaEnv(MathEnv):
    """The cookbook's MathEnv (prompt, \\boxed{} format check and reward) with rlcli's plain grader."""

    def __init__(self, problem: str, answer: str, renderer: renderers.Renderer,
                 convo_prefix: list[renderers.Message] | None = None, match: str = "numeric"):
        super().__init__(problem, answer, renderer, convo_prefix=convo_prefix)
        self.match = match

    def check_answer(self, sample_str: str) -> bool:
        try:
            return grade_answer(extract_boxed(sample_str), self.answer, self.match)
        except ValueError:  # no \boxed{}: wrong (the format penalty is the parent's)
            return False


# --- files ---------------------------------------------------------------------------------------


def record_problem(obj: Any, grader: str) -> str | None:
    """Why a parsed line is not a problem `grader` can grade, or None."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            return f'"{key}" is missing or not a non-empty string'
    final = final_answer(obj["answer"])
    if final is None and grader == "gsm8k":
        return '"answer" has no final answer (GSM8K ends it with a line "#### 42")'
    return '"answer" has an empty final answer after "####"' if final is not None and not final.strip() else None


def resolve_grader(grader: str, finals: list[bool], lines: list[int], source: str) -> str:
    """auto: gsm8k when every answer has a '####' final answer, numeric when none has; a mix is refused."""
    if grader != "auto":
        return grader
    if all(finals) or not any(finals):
        return "gsm8k" if finals[0] else "numeric"
    odd = next(i for i, has in enumerate(finals) if has != finals[0])
    raise UsageError(f"{source} line {lines[odd]}: {'no' if finals[0] else 'a'} '#### N' final answer, unlike line "
                     f"{lines[0]}: write every answer GSM8K-style or every one as the final answer alone "
                     "(or pass --grader numeric|exact to grade the text after any '####')")


def parse_problems(lines: Iterable[str], source: str, grader: str = "auto") -> Problems:
    records, numbers = [], []
    for number, obj in numbered_json_lines(lines, source):
        if problem := record_problem(obj, grader):
            raise UsageError(f"{source} line {number}: {problem}; expected {FORMAT_HINT}")
        records.append({"question": obj["question"], "answer": obj["answer"]})
        numbers.append(number)
    if not records:
        raise UsageError(f"{source} has no problems: expected {FORMAT_HINT}")
    grader = resolve_grader(grader, [final_answer(r["answer"]) is not None for r in records], numbers, source)
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    return Problems(source, records, numbers, hashlib.sha256(payload.encode()).hexdigest(), grader)


def read_problems(path: str, grader: str = "auto") -> Problems:
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            return parse_problems(f, path, grader)
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"no problems file at {path}: pass a JSONL file ({FORMAT_HINT})") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text ({e.reason}): convert it to UTF-8 JSONL") from None


def load_data(name: str, path: str | None, batch_size: int, max_steps: int | None, grader: str = "auto",
              eval_size: int | None = None, max_operand: int = heldout.ARITHMETIC_MAX, replay: Any = None) -> Data:
    """Read and check `choose_dataset`'s data (or ask the hub GSM8K's size); settle the held-out count.
    With `replay` (a rlcli.problems.traces.Spec), the traces it names (rlcli.problems.replay)."""
    if replay is not None:
        from rlcli.problems import replay as replay_env

        return replay_env.load(replay, batch_size, eval_size)
    if path:
        problems = read_problems(path, grader)
        held_out = heldout.file_eval_size(problems.records, eval_size, path)
        train, _ = heldout.split_problems(problems.records, held_out)
        label = f"{'gsm8k-format' if final_answer(problems.records[0]['answer']) else 'question/answer'} file {path}"
        return Data(label, problems, len(train), math.ceil(len(train) / batch_size), problems.sha256, held_out,
                    problems.grader)
    held_out = heldout.EVAL_SIZE if eval_size is None else eval_size
    if name == "arithmetic":
        held_out = heldout.arithmetic_eval_size(eval_size, max_operand)
        batches = max_steps or ARITHMETIC_BATCHES
        default = max_operand == heldout.ARITHMETIC_MAX
        narrowed = "" if default else f", x and y in 0..{max_operand}"
        return Data(f"arithmetic (the cookbook's synthetic x + y problems{narrowed})", None, None, batches,
                    "arithmetic" if default else f"arithmetic:0..{max_operand}", held_out, "arithmetic", max_operand)
    size = hub_gsm8k_size()
    hub = "/".join(GSM8K_HUB)
    return Data(f"gsm8k ({hub}, train split; evaluation on its test split)", None, size,
                math.ceil(size / batch_size), "hub:" + hub, held_out, "gsm8k")


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


class FileDataset(Gsm8kDataset):
    """The cookbook's Gsm8kDataset (batching, and its MathEnv for gsm8k) over records; QaEnv for numeric|exact."""

    def __init__(self, records: list[dict[str, str]], batch_size: int, group_size: int,
                 renderer: renderers.Renderer, grader: str = "gsm8k", seed: int | None = 0):
        ds = Dataset.from_list(records)
        self.ds = ds if seed is None else ds.shuffle(seed=seed)  # the training split is shuffled as the hub's is
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.grader = grader
        self.convo_prefix = MathEnv.standard_fewshot_prefix()  # what the cookbook's gsm8k builder uses

    def _make_env_group_builder(self, x: dict[str, str], group_size: int) -> ProblemGroupBuilder | None:
        if self.grader == "gsm8k":
            return super()._make_env_group_builder(x, group_size)
        env = partial(QaEnv, x["question"], gold_answer(x["answer"]), self.renderer, convo_prefix=self.convo_prefix,
                      match=self.grader)
        return ProblemGroupBuilder(env_thunk=env, num_envs=group_size)


@chz.chz
class FileBuilder(RLDatasetBuilder):
    """Rereads the checked file when the recipe asks (the recipe writes builders into config.json)."""

    file_path: str
    sha256: str  # of the records checked before the run: a file changed since then is refused
    grader: str
    eval_size: int  # distinct questions held out (heldout.split_problems)
    batch_size: int
    model_name_for_tokenizer: str
    renderer_name: str
    group_size: int
    seed: int = 0

    async def __call__(self) -> tuple[FileDataset, FileDataset | None]:
        problems = read_problems(self.file_path, self.grader)
        if problems.sha256 != self.sha256:
            raise UsageError(f"{self.file_path} changed after it was checked: rerun the command")
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        train, test = heldout.split_problems(problems.records, self.eval_size)
        train_set = FileDataset(train, self.batch_size, self.group_size, renderer, self.grader, self.seed)
        # One sample per held-out problem, in file order, as the cookbook's GSM8K test split is scored.
        test_set = FileDataset(test, len(test), 1, renderer, self.grader, seed=None) if test else None
        return train_set, test_set


@chz.chz
class HubGsm8kBuilder(Gsm8kDatasetBuilder):
    """The cookbook's hub GSM8K builder; its test split cut to the first eval_size problems (0: none),
    as all 1,319 every --eval-every steps would dwarf a CPU-sized run."""

    eval_size: int = heldout.EVAL_SIZE

    async def __call__(self) -> tuple[Gsm8kDataset, Gsm8kDataset | None]:
        train, test = await super().__call__()
        if not self.eval_size:
            return train, None
        test.ds = test.ds.select(range(min(self.eval_size, len(test.ds))))
        return train, test


@chz.chz
class ArithmeticSplitBuilder(RLDatasetBuilder):
    """The cookbook's ArithmeticDatasetBuilder, with eval_size pairs held out (arithmetic_datasets)."""

    batch_size: int
    model_name_for_tokenizer: str
    renderer_name: str
    n_batches: int
    group_size: int
    eval_size: int = heldout.EVAL_SIZE
    max_operand: int = heldout.ARITHMETIC_MAX

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        return arithmetic_datasets(self.batch_size, self.group_size, self.n_batches, self.eval_size, renderer,
                                           self.max_operand)


def arithmetic_datasets(batch_size: int, group_size: int, n_batches: int, eval_size: int, renderer: Any,
                        max_operand: int = heldout.ARITHMETIC_MAX):
    """(train, test | None): the cookbook's ArithmeticDataset (x, y in 0..max_operand; the cookbook's own
    range is 0..100) minus the held-out pairs, and those pairs."""
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv

    pairs = heldout.arithmetic_eval_pairs(eval_size, max_operand=max_operand)
    held_out = {heldout.pair_key(x, y) for x, y in pairs}
    prefix = ArithmeticEnv.standard_fewshot_prefix()

    def group(x: int, y: int, size: int) -> ProblemGroupBuilder:
        return ProblemGroupBuilder(env_thunk=partial(ArithmeticEnv, x, y, convo_prefix=prefix, renderer=renderer),
                                   num_envs=size)

    class HeldOutArithmetic(ArithmeticDataset):
        def _make_env_group_builder(self, rng: Any) -> ProblemGroupBuilder:
            while True:  # the same draws as the parent's; a held-out pair is drawn again (get_batch seeds rng)
                x, y = rng.randint(0, max_operand + 1), rng.randint(0, max_operand + 1)
                if heldout.pair_key(x, y) not in held_out:
                    return group(x, y, self.group_size)

    class ArithmeticTestSet(RLDataset):  # one batch: every held-out pair, sampled once
        def get_batch(self, index: int) -> list[ProblemGroupBuilder]:
            return [group(x, y, 1) for x, y in pairs]

        def __len__(self) -> int:
            return 1

    train = HeldOutArithmetic(batch_size=batch_size, renderer=renderer, group_size=group_size, n_batches=n_batches)
    return train, (ArithmeticTestSet() if pairs else None)


def dataset_builder(data: Data, model: str, renderer: str, batch_size: int, group_size: int) -> RLDatasetBuilder:
    """The cookbook builder for `data` (from load_data): training set and held-out test set."""
    if data.replay is not None:
        from rlcli.problems import replay

        return replay.builder(data, model, renderer, batch_size, group_size)
    common = dict(batch_size=batch_size, model_name_for_tokenizer=model, renderer_name=renderer,
                  group_size=group_size)
    if data.problems is not None:
        return FileBuilder(file_path=str(Path(data.problems.source).expanduser().resolve()),
                           sha256=data.problems.sha256, grader=data.grader, eval_size=data.held_out, **common)
    if data.grader == "arithmetic":
        return ArithmeticSplitBuilder(n_batches=data.batches, eval_size=data.held_out, max_operand=data.max_operand,
                                      **common)
    return HubGsm8kBuilder(eval_size=data.held_out, **common)
