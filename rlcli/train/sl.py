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

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.data.validate import conversation_problem, numbered_json_lines
from rlcli.errors import RlcliError, UsageError
from rlcli.train import (
    RUN_INFO,
    check_resume_info,
    claim,
    last_checkpoint,
    private_copy,
    read_jsonl,
    renderers,
    run_folder,
    server_slots,
    sigterm_as_interrupt,
)

RECIPE_NAME = "rlcli_train_sl"
RENDER_CHECK = 64  # records rendered before a real run; --dry-run renders all


@dataclass(frozen=True)
class Dataset:
    source: str
    records: list[dict[str, Any]]  # {"messages": [...]} only: the cookbook builds one Arrow table of them
    lines: list[int]  # each record's line number in the source
    payload: bytes  # the records as the JSONL the cookbook reads
    sha256: str


@dataclass(frozen=True)
class Settings:
    """What the recipe is run with; kept in the run folder so --resume can check it."""

    model: str
    renderer: str
    train_on_what: str
    batch_size: int
    lr: float
    epochs: int
    max_steps: int | None
    lora_rank: int
    max_length: int
    save_every: int
    eval_every: int
    test_size: int


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
    records, numbers = [], []
    for number, obj in numbered_json_lines(lines, source):
        if problem := conversation_problem(obj):
            raise UsageError(f"{source} line {number}: {problem}; fix it, or rebuild with `rlcli import`")
        records.append({"messages": obj["messages"]})
        numbers.append(number)
    if not records:
        raise UsageError(f'{source} is empty: give one JSON object per line, {{"messages": [...]}}')
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    return Dataset(source, records, numbers, payload, hashlib.sha256(payload).hexdigest())


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


def check_numbers(batch_size: int, lr: float, epochs: int, max_steps: int | None, lora_rank: int,
                  max_length: int, save_every: int, eval_every: int, test_size: int) -> None:
    positive = {"--batch-size": batch_size, "--epochs": epochs, "--lora-rank": lora_rank,
                "--max-length": max_length}
    at_least_zero = {"--save-every": save_every, "--eval-every": eval_every, "--test-size": test_size}
    for flag, value in positive.items():
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    for flag, value in at_least_zero.items():
        if value < 0:
            raise UsageError(f"{flag} must be 0 (off) or more, got {value}")
    if max_steps is not None and max_steps < 1:
        raise UsageError(f"--max-steps must be at least 1, got {max_steps}")
    if not lr > 0:
        raise UsageError(f"--lr must be positive, got {lr}")


def resolve_model(model: str | None, base_url: str, required: bool) -> str:
    """The server's base model; --model must name it exactly (the engine refuses anything else)."""
    from rlcli.client import server_base_model

    try:
        served = server_base_model(base_url)
    except (OSError, ValueError, KeyError, IndexError) as e:
        if model and not required:
            return model  # a dry run with --model needs no server
        raise RlcliError(f"cannot reach a Tinker server at {base_url} ({e}): start one with "
                         "`rlcli serve start`, or pass --base-url") from None
    if model and model != served:
        raise UsageError(f"--model {model!r} is not the server's model {served!r}: omit --model, "
                         "or start a server with --base-model set to it")
    return served


def prepare_resume(folder: Path, url: str, sha256: str, settings: Settings) -> None:
    """Refuse to resume on other data or batches; free the slots a crashed attempt left on the server."""
    check_resume_info(folder, url, ("dataset_sha256", sha256), asdict(settings), ("model", "batch_size", "renderer"),
                      "the same dataset")


def final_report(folder: Path, base_url: str | None) -> str:
    losses = [m["train_mean_nll"] for m in read_jsonl(folder / "metrics.jsonl") if "train_mean_nll" in m]
    final = last_checkpoint(folder, "sampler_path")
    lines = [f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps"] if losses else []
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final:
        url_flag = f" --base-url {base_url}" if base_url else ""
        lines += [f"final weights: {final['sampler_path']} (state: {final.get('state_path')})",
                  f"sample: rlcli sample --checkpoint {final['sampler_path']}{url_flag} --prompt 'Hello'"]
    return "\n".join(lines)


def describe(plan: Plan, data: Dataset, model: str, renderer: str, lengths: list[tuple[int, int]],
             max_length: int, all_rendered: bool) -> str:
    tokens = sum(n for n, _ in lengths)
    truncated = sum(1 for n, _ in lengths if n >= max_length)
    empty = sum(1 for _, trained in lengths if trained == 0)
    scope = "all" if all_rendered else f"first {len(lengths)}"
    return "\n".join([
        f"data: {plan.examples} examples from {data.source} ({plan.train_examples} train, "
        f"{plan.test_examples} test), sha256 {data.sha256[:12]}",
        f"plan: batch {plan.batch_size} x {plan.batches_per_epoch} steps per epoch x {plan.epochs} epochs"
        f" -> {plan.steps} steps ({plan.train_examples % plan.batch_size} examples left out per epoch)",
        f"model: {model}  renderer: {renderer}",
        f"tokens ({scope} rendered): {tokens:,}, mean {tokens / max(len(lengths), 1):.0f} per example, "
        f"{truncated} cut at --max-length {max_length}, {empty} with nothing left to train on",
    ])


def train_sl(dataset: str | None = None, model: str | None = None, base_url: str | None = None,
             renderer: str | None = None, batch_size: int = 8, lr: float = 1e-4, epochs: int = 1,
             max_steps: int | None = None, lora_rank: int = 32, max_length: int = 2048,
             save_every: int = 20, eval_every: int = 10, test_size: int = 0, log_path: str | None = None,
             resume: bool = False, dry_run: bool = False) -> int:
    """Fine-tune a LoRA on chat JSONL with tinker-cookbook's supervised recipe, on the server.

    Args:
        dataset: JSONL file of {"messages": [{"role", "content"}, ...]} records, or - for stdin
        model: the server's base model, exactly as it was started (default: ask the server)
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        batch_size: examples per step
        lr: peak Adam learning rate (linear decay to 0)
        epochs: passes over the data
        max_steps: stop after this many steps in all
        lora_rank: LoRA rank (the server caps it; SkyRL's jax backend at 32 by default)
        max_length: longest example in tokens; longer ones are cut
        save_every: save a resumable checkpoint every N steps (0: only the final one)
        eval_every: with --test-size, measure the held-out NLL every N steps
        test_size: hold out this many examples for evaluation
        log_path: run folder (default: RLCLI_HOME/runs/sl-<time>)
        resume: continue the run in --log-path (default: the newest sl run) from its last checkpoint
        dry_run: check the data, choose the renderer, print the plan; train nothing
    """
    if not dataset:
        raise UsageError("pass --dataset FILE (a chat JSONL file), or --dataset - to read stdin")
    check_numbers(batch_size, lr, epochs, max_steps, lora_rank, max_length, save_every, eval_every, test_size)
    data = read_dataset(dataset)
    plan = make_plan(len(data.records), batch_size, epochs, max_steps, test_size)
    folder = run_folder(log_path, resume, kind="sl")
    url = resolve_base_url(base_url)
    model = resolve_model(model, url, required=not dry_run)
    if renderers.is_local_model(model):
        renderers.go_offline()  # before anything imports huggingface_hub, which reads it once
    renderer = renderers.choose_renderer(model, renderer)
    if renderers.is_local_model(model):
        renderers.register_local_tokenizer(model)
    train_on = renderers.train_on_what(data.records)
    sample = data.records if dry_run else data.records[:RENDER_CHECK]
    lengths = renderers.render_lengths(sample, model, renderer, max_length, train_on, data.lines)
    summary = describe(plan, data, model, renderer, lengths, max_length, all_rendered=len(sample) == plan.examples)
    if dry_run:
        print(f"{summary}\nrun folder: {folder}{' (resume)' if resume else ''}\nserver: {url}")
        return 0
    print(f"{summary}\nrun folder: {folder}\nserver: {url}", file=sys.stderr)
    settings = Settings(model, renderer, train_on, batch_size, lr, epochs, max_steps, lora_rank, max_length,
                        save_every, eval_every, test_size)
    with claim(folder):
        if resume:
            prepare_resume(folder, url, data.sha256, settings)
        info = {"dataset_sha256": data.sha256, "examples": plan.examples, "base_url": url, **asdict(settings)}
        (folder / RUN_INFO).write_text(json.dumps(info, indent=1) + "\n")
        run_recipe(folder, data, url, plan, settings)
    print(final_report(folder, base_url))
    return 0


def build_config(folder: Path, data_path: str, url: str, s: Settings) -> Any:
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=s.model, renderer_name=s.renderer,
                                            max_length=s.max_length, batch_size=s.batch_size,
                                            train_on_what=TrainOnWhat(s.train_on_what))
    builder = FromConversationFileBuilder(common_config=common, file_path=data_path, test_size=s.test_size)
    return train.Config(log_path=str(folder), model_name=s.model, recipe_name=RECIPE_NAME,
                        renderer_name=s.renderer, dataset_builder=builder, learning_rate=s.lr,
                        num_epochs=s.epochs, lora_rank=s.lora_rank, base_url=url, save_every=s.save_every,
                        eval_every=s.eval_every, max_steps=s.max_steps)


def run_recipe(folder: Path, data: Dataset, url: str, plan: Plan, settings: Settings) -> None:
    """Run the cookbook's SFT main; whatever happens, free the server slots it took."""
    import asyncio

    from tinker_cookbook.supervised import train

    from rlcli.train.compat import ProgressLine, progress_logging

    ensure_api_key()
    with (sigterm_as_interrupt(), private_copy(data.payload) as data_path,
          server_slots(folder, url, settings.model), progress_logging(ProgressLine(plan.steps))):
        asyncio.run(train.main(build_config(folder, data_path, url, settings)))
