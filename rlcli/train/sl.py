"""`rlcli train sl`: supervised fine-tuning on chat JSONL, with tinker-cookbook's recipe, on the server.

Launch:  rlcli train sl --dataset chats.jsonl                       (the managed server's model)
         rlcli import logs.jsonl -f openai | rlcli train sl --dataset - --epochs 3
         rlcli train sl --dataset chats.jsonl --log-path runs/a --resume   (continue after a crash)
         rlcli train sl --dataset chats.jsonl --dry-run                    (check data, print the plan)

Each line of the dataset is {"messages": [{"role": ..., "content": ...}, ...]}; blank lines are
skipped. The data is checked, and a sample of it rendered, before the server spends any compute.
The recipe (tinker_cookbook.supervised.train) writes config.json, metrics.jsonl and
checkpoints.jsonl into the run folder, RLCLI_HOME/runs/sl-<time> unless --log-path says otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from rlcli.config import resolve_base_url
from rlcli.data.validate import conversation_problem, numbered_json_lines
from rlcli.errors import UsageError
from rlcli.options import option
from rlcli.train import metrics, renderers, run
from rlcli.train.folder import last_checkpoint, private_copy, read_jsonl
from rlcli.train.options import BATCH, BATCH_SIZE, EPOCHS, LOAD_CHECKPOINT, LR, MAX_LENGTH, TrainOptions, kept

RECIPE_NAME = "rlcli_train_sl"
RENDER_CHECK = 64  # records rendered before a real run; --dry-run renders all
# Another value would make another run of the same folder.
RESUME_KEYS = ("model", "batch_size", "renderer", "seed", "load_checkpoint")


@dataclass(frozen=True)
class Dataset:
    source: str
    records: list[dict[str, Any]]  # {"messages": [...]} only: the cookbook builds one Arrow table of them
    lines: list[int]  # each record's line number in the source
    payload: bytes  # the records as the JSONL the cookbook reads
    sha256: str


@dataclass(frozen=True, kw_only=True)
class SlOptions(TrainOptions):
    """`rlcli train sl`'s options."""

    dataset: str | None = option(None, 'JSONL file of {"messages": [{"role", "content"}, ...]} records, or - for '
                                       "stdin")
    lr: float | None = LR(None)
    batch_size: int = BATCH(BATCH_SIZE)
    epochs: int = EPOCHS(1)
    max_length: int = MAX_LENGTH(2048)
    test_size: int = option(0, "hold out this many examples for evaluation (its NLL every --eval-every steps)",
                            low=0)
    load_checkpoint: str | None = LOAD_CHECKPOINT(None)

    def problems(self) -> Iterator[str]:
        if not self.dataset:
            yield "pass --dataset FILE (a chat JSONL file), or --dataset - to read stdin"


@dataclass(frozen=True)
class Plan:
    examples: int
    train_examples: int
    test_examples: int
    batch_size: int
    batches_per_epoch: int
    epochs: int
    steps: int


def parse_dataset(lines: Iterator[str], source: str) -> Dataset:
    """The conversations of `lines` (an iterator: a bad line's hint reads on from where the check stopped)."""
    records, numbers = [], []
    for number, obj in numbered_json_lines(lines, source):
        if problem := conversation_problem(obj):
            raise UsageError(f"{source} line {number}: {problem}; {_fix(obj, lines, source)}")
        records.append({"messages": obj["messages"]})
        numbers.append(number)
    if not records:
        raise UsageError(f'{source} is empty: give one JSON object per line, {{"messages": [...]}}')
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    return Dataset(source, records, numbers, payload, hashlib.sha256(payload).hexdigest())


def _fix(record: Any, rest: Iterator[str], source: str, look_ahead: int = 100) -> str:
    """What to do about a line that is no conversation: where it, or one of the next lines (a LangSmith
    export starts with chain runs), is a logged record that `rlcli import` reads, its import command."""
    from rlcli.data.importers import log_format

    def following() -> Iterator[Any]:
        for line in itertools.islice(rest, look_ahead):
            with contextlib.suppress(ValueError):
                yield json.loads(line)

    if fmt := next(filter(None, map(log_format, itertools.chain([record], following()))), None):
        given = "-" if source == "stdin" else source
        return (f"the data holds logged records `rlcli import -f {fmt}` converts: `rlcli import {given} -f {fmt} | "
                "rlcli train sl --dataset - ...`")
    return "fix it, or rebuild with `rlcli import`"


def read_dataset(dataset: str, stdin: TextIO | None = None) -> Dataset:
    if dataset == "-":
        return parse_dataset(iter(stdin or sys.stdin), "stdin")
    try:
        with open(Path(dataset).expanduser(), encoding="utf-8") as f:
            return parse_dataset(iter(f), dataset)
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"no dataset file at {dataset}: pass a JSONL file, or - to read stdin") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{dataset} is not UTF-8 text ({e.reason}): convert it to UTF-8 JSONL") from None


def make_plan(examples: int, batch_size: int, epochs: int, max_steps: int | None, test_size: int) -> Plan:
    """Step counts as the cookbook computes them (it drops each epoch's incomplete last batch)."""
    test = test_size if 0 < test_size < examples else 0
    train = examples - test
    batches = train // batch_size
    if batches == 0:
        raise UsageError(f"{train} training examples make no full batch of {batch_size}: lower --batch-size")
    steps = batches * epochs if max_steps is None else min(batches * epochs, max_steps)
    return Plan(examples, train, test, batch_size, batches, epochs, steps)


def final_report(folder: Path, base_url: str | None) -> str:
    losses = [m[metrics.TRAIN_NLL] for m in read_jsonl(folder / "metrics.jsonl") if metrics.TRAIN_NLL in m]
    final = last_checkpoint(folder, "sampler_path")
    lines = [f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps"] if losses else []
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final:
        url_flag = f" --base-url {base_url}" if base_url else ""
        lines += [f"final weights: {final['sampler_path']} (state: {final.get('state_path')})",
                  f"sample: rlcli sample --checkpoint {final['sampler_path']}{url_flag} --prompt 'Hello'"]
    return "\n".join(lines)


def describe(plan: Plan, data: Dataset, s: SlOptions, lr_source: str, lengths: list[tuple[int, int]],
             all_rendered: bool) -> str:
    tokens = sum(n for n, _ in lengths)
    truncated = sum(1 for n, _ in lengths if n >= s.max_length)
    empty = sum(1 for _, trained in lengths if trained == 0)
    scope = "all" if all_rendered else f"first {len(lengths)}"
    return "\n".join([
        f"data: {plan.examples} examples from {data.source} ({plan.train_examples} train, "
        f"{plan.test_examples} test), sha256 {data.sha256[:12]}",
        f"plan: batch {plan.batch_size} x {plan.batches_per_epoch} steps per epoch x {plan.epochs} epochs"
        f" -> {plan.steps} steps ({plan.train_examples % plan.batch_size} examples left out per epoch)",
        f"model: {s.model}  renderer: {s.renderer}  lr: {s.lr:g} ({lr_source})  "
        f"start: {s.load_checkpoint or 'fresh LoRA rank ' + str(s.lora_rank)}",
        f"tokens ({scope} rendered): {tokens:,}, mean {tokens / max(len(lengths), 1):.0f} per example, "
        f"{truncated} cut at --max-length {s.max_length}, {empty} with nothing left to train on",
    ])


def train_sl(o: SlOptions) -> run.Weights | None:
    """Fine-tune a LoRA on chat JSONL with tinker-cookbook's supervised recipe, on the server.

    Returns the final weights (None for a dry run)."""
    data = read_dataset(str(o.dataset))  # given: the record refuses none
    from rlcli.train.rl import checkpoint_state

    state = checkpoint_state(o.load_checkpoint)
    plan = make_plan(len(data.records), o.batch_size, o.epochs, o.max_steps, o.test_size)
    t = run.target("sl", o, resolve_base_url(o.base_url))
    lr, lr_source = (o.lr, "--lr") if o.lr else run.default_lr(t.model)
    o = replace(o, model=t.model, renderer=t.renderer, lr=lr, load_checkpoint=state)
    train_on_what = renderers.train_on_what(data.records)
    sample = data.records if o.dry_run else data.records[:RENDER_CHECK]
    lengths = renderers.render_lengths(sample, t.model, t.renderer, o.max_length, train_on_what, data.lines)
    job = run.Job(settings=kept(o, train_on_what=train_on_what),
                  summary=describe(plan, data, o, lr_source, lengths, all_rendered=len(sample) == plan.examples),
                  digest=("dataset_sha256", data.sha256), same_input="the same dataset",
                  resume_keys=RESUME_KEYS, info={"examples": plan.examples},
                  resume_step=lambda row: int(row.get("epoch", 0)) * plan.batches_per_epoch + int(row.get("batch", 0)),
                  recipe=lambda folder, url: recipe(folder, url, data, o, train_on_what),
                  progress=SlProgress(plan.steps), report=lambda folder: final_report(folder, o.base_url))
    return run.execute(job, t, o.resume, o.dry_run)


@contextlib.contextmanager
def recipe(folder: Path, url: str, data: Dataset, s: SlOptions, train_on_what: str) -> Iterator[Callable[[], Any]]:
    """The cookbook's SFT main over a private copy of the data (stdin has no path of its own); each periodic
    checkpoint records the batch its state is ready for, so --resume neither redoes nor skips a step; the test
    NLL (--test-size) gets prompt logprobs in the shape the cookbook slices (rlcli.train.hooks)."""
    import asyncio

    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from rlcli.train.hooks import hosted_prompt_logprobs, sl_checkpoints_name_the_next_batch
    from rlcli.train.sl_data import ConversationFileBuilder

    with private_copy(data.payload) as data_path, sl_checkpoints_name_the_next_batch(), hosted_prompt_logprobs():
        common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=s.model, renderer_name=s.renderer,
                                                max_length=s.max_length, batch_size=s.batch_size,
                                                train_on_what=TrainOnWhat(train_on_what))
        builder = ConversationFileBuilder(common_config=common, file_path=data_path, test_size=s.test_size)
        config = train.Config(log_path=str(folder), model_name=s.model, recipe_name=RECIPE_NAME,
                              renderer_name=s.renderer, dataset_builder=builder, learning_rate=s.lr,
                              num_epochs=s.epochs, lora_rank=s.lora_rank, base_url=url, save_every=s.save_every,
                              eval_every=s.eval_every, max_steps=s.max_steps, submit_ahead=0,
                              load_checkpoint_path=s.load_checkpoint)
        yield lambda: asyncio.run(train.main(config))


class SlProgress(run.ProgressLine):
    """One line per SFT step: step, epoch, loss, lr, tokens/s, and the test NLL when it was measured."""

    step_key = metrics.TRAIN_NLL

    def line(self, row: dict[str, Any], step: int, elapsed_s: float) -> str:
        return format_progress(row, step, self.total_steps, elapsed_s)


def format_progress(row: dict[str, Any], step: int, total_steps: int, elapsed_s: float) -> str:
    tokens = row.get(metrics.TOKENS, 0)
    parts = [
        f"step {step + 1}/{total_steps}",
        f"epoch {row.get(metrics.EPOCH, 0)}",
        f"loss {row[metrics.TRAIN_NLL]:.4f}",
        f"lr {row.get(metrics.LR, 0.0):.2e}",
        f"{tokens / max(elapsed_s, 1e-9):,.0f} tok/s",
        f"{elapsed_s:.2f}s",
    ]
    if metrics.TEST_NLL in row:
        parts.append(f"test_nll {row[metrics.TEST_NLL]:.4f}")
    return "  ".join(parts)
