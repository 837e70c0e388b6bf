"""`rlcli train rl`: RL with a server-side loss, on tinker-cookbook's RL loop (tinker_cookbook.rl.train).

Launch:  rlcli train rl --loss gspo --dataset arithmetic --max-steps 50        (fused GSPO when served)
         rlcli train rl --loss ppo --dataset gsm8k --dataset-path gsm8k_train.jsonl
         rlcli train rl --loss gspo --passes 2 --dataset problems.jsonl --dry-run   (print the plan)
         rlcli train rl --loss cispo --dataset arithmetic --log-path runs/a --resume
         rlcli train rl --loss gspo --dataset arithmetic --load-checkpoint runs/sft   (start from SFT weights)

The loss is planned first, from what the server serves (rlcli.train.losses): a loss or --passes it
cannot serve fails in well under a second, before data is read or a model is made. Every training
client the recipe builds gets the planned route (fused, or GSPO's exact 2-pass form) and has its LoRA
slot freed however the run ends. The recipe writes config.json, metrics.jsonl, checkpoints.jsonl;
rlcli adds each step's loss and clip fraction, and held-out problems are scored every --eval-every
steps (rlcli.train.rl_eval).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.errors import UsageError
from rlcli.train import (
    check_resume_info,
    claim,
    last_checkpoint,
    renderers,
    rl_eval,
    run_folder,
    server_slots,
    sigterm_as_interrupt,
)
from rlcli.train.rl_eval import ROUTES, RlProgress, final_report  # harbor's RL command imports these from here
from rlcli.train.sl import RUN_INFO, resolve_model

if TYPE_CHECKING:
    from rlcli.train.envs import Data  # imports the cookbook: only for the type checker

RL_LOSSES = ("gspo", "cispo", "dppo", "ppo", "importance_sampling")  # what the cookbook's RL data suits
RECIPE_NAME = "rlcli_train_rl"
MINIMUMS = {"batch_size": 1, "group_size": 2, "max_tokens": 1, "lora_rank": 1, "max_steps": 1, "save_every": 0,
            "eval_every": 0, "eval_size": 0}  # flags not listed here (lr, temperature) must be positive
GRADERS = ("auto", "gsm8k", "numeric", "exact")  # how a file's answers are graded (rlcli.train.envs)


@dataclass(frozen=True)
class Settings:
    """What the recipe is run with; kept in the run folder so --resume can check it."""

    model: str
    renderer: str
    dataset: str
    loss: str
    loss_config: dict[str, Any]
    passes: int
    batch_size: int
    group_size: int
    lr: float
    max_tokens: int
    temperature: float
    lora_rank: int
    max_steps: int | None
    save_every: int
    eval_every: int
    grader: str = "auto"  # as resolved from the data
    eval_size: int = 0  # problems held out: what --eval-size came to
    load_checkpoint: str | None = None  # a training-state path
    max_operand: int | None = None  # arithmetic's operand range, when --max-operand set it


def choose_dataset(dataset: str | None, dataset_path: str | None, grader: str = "auto",
                   max_operand: int | None = None, eval_size: int | None = None) -> tuple[str, str | None, str]:
    """(arithmetic | gsm8k | file, path or None, grader) from the flags; no file is read, no server asked:
    a bad flag fails before either."""
    if not dataset:
        raise UsageError("pass --dataset arithmetic, --dataset gsm8k [--dataset-path FILE.jsonl], or "
                         "--dataset FILE.jsonl ({question, answer} lines)")
    if max_operand is not None and dataset != "arithmetic":
        raise UsageError(f"--max-operand is for --dataset arithmetic, not {dataset}: drop it")
    if grader not in GRADERS:
        raise UsageError(f"--grader {grader!r}: choose {', '.join(GRADERS)}")
    if dataset not in ("arithmetic", "gsm8k"):
        if dataset_path:
            raise UsageError(f"--dataset {dataset} is a file already: drop --dataset-path, or use --dataset gsm8k")
        return "file", dataset, grader
    if dataset_path and dataset != "gsm8k":
        raise UsageError(f"--dataset-path is for gsm8k data; {dataset} is synthetic: drop --dataset-path")
    if dataset == "arithmetic" and grader != "auto":
        raise UsageError("arithmetic grades its own integer answers: drop --grader")
    if dataset == "arithmetic":
        rl_eval.arithmetic_eval_size(eval_size, rl_eval.ARITHMETIC_MAX if max_operand is None else max_operand)
    if dataset == "gsm8k" and not dataset_path and grader not in ("auto", "gsm8k"):
        raise UsageError(f"--grader {grader} is for JSONL files; the hub's gsm8k is graded the cookbook's way")
    return dataset, dataset_path, "gsm8k" if dataset == "gsm8k" and grader == "auto" else grader


def checkpoint_state(load_checkpoint: str | None) -> str | None:
    """--load-checkpoint as a training-state path: given as one, or a run folder's newest saved state."""
    if not load_checkpoint:
        return None
    path = load_checkpoint
    if not path.startswith("tinker://"):
        folder = Path(path).expanduser()
        last = last_checkpoint(folder, "state_path")
        if not last:
            raise UsageError(f"--load-checkpoint {path}: not a tinker:// path, nor a run folder whose "
                             "checkpoints.jsonl lists a saved state")
        path = last["state_path"]
    if "/weights/" not in path:  # tinker://<model>/<name> is a sampler export: it holds no training state
        raise UsageError(f"--load-checkpoint {path}: give a training state, tinker://<model>/weights/<name>")
    return path


def check_numbers(**values: float | None) -> None:
    """Each flag's lower bound; a group needs two samples (the cookbook's advantages compare within it)."""
    for name, value in values.items():
        low = MINIMUMS.get(name, 0)
        if value is not None and (value < low if name in MINIMUMS else not value > 0):
            bound = f"at least {low}" if low else ("0 (off) or more" if name in MINIMUMS else "positive")
            raise UsageError(f"--{name.replace('_', '-')} must be {bound}, got {value}")


def plan_losses(url: str, loss: str, loss_config: str | None, passes: str) -> Any:
    """Ask the server what it serves and settle loss, config and passes (rlcli.train.losses decides)."""
    if loss not in RL_LOSSES:
        raise UsageError(f"unknown --loss {loss!r}: RL takes {', '.join(RL_LOSSES)}")
    from rlcli.train import losses  # called through the module, so tests can swap served_losses for a fake

    _, served = losses.served_losses(url)
    return losses.plan_loss(loss, loss_config, passes, served)


def describe(plan: Any, data: Data, s: Settings, steps: int) -> str:
    size = "synthetic" if data.size is None else f"{data.size} problems"
    held_out = (f"{data.held_out} held-out problems scored every {s.eval_every} steps" if data.held_out
                else "no held-out evaluation")
    return "\n".join([
        f"loss: {plan.loss} {ROUTES[plan.passes]}, config {json.dumps(plan.config, sort_keys=True)}: {plan.message}",
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}; grader {data.grader}; {held_out}",
        f"plan: {s.batch_size} problems x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"model: {s.model}  renderer: {s.renderer}  start: {s.load_checkpoint or f'fresh LoRA rank {s.lora_rank}'}",
    ])


@contextlib.contextmanager
def cookbook_hooks(plan: Any) -> Iterator[None]:
    """Inside the block, every tinker.TrainingClient gets `plan`'s loss route and has its step
    statistics logged (rl_eval), and sampling draws no bars.

    The recipe builds its client one of three ways (fresh LoRA, resume, load weights); all of them
    construct a TrainingClient, so __init__ is the one hook that covers each (compat's recorder uses
    it too). The recipe's tqdm bar per sampling batch would bury the one progress line per step.
    """
    import functools

    import tinker
    from tinker_cookbook.rl import train

    from rlcli.train.losses import install_loss_route

    original_init, original_tqdm = tinker.TrainingClient.__init__, train.tqdm
    stats = rl_eval.StepStats(plan.loss, plan.config)

    def routed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        install_loss_route(self, plan)
        stats.watch(self)  # outside the route: it sees the recipe's data and the result the recipe reads

    tinker.TrainingClient.__init__ = routed_init  # type: ignore[method-assign]
    train.tqdm = functools.partial(original_tqdm, disable=True)
    try:
        with rl_eval.step_statistics_logged(stats):
            yield
    finally:
        tinker.TrainingClient.__init__ = original_init  # type: ignore[method-assign]
        train.tqdm = original_tqdm


def build_config(folder: Path, url: str, s: Settings, data: Data) -> Any:
    from tinker_cookbook.rl import train

    from rlcli.train import envs

    builder = envs.dataset_builder(data, s.model, s.renderer, s.batch_size, s.group_size)
    return train.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model, recipe_name=RECIPE_NAME,
                        max_tokens=s.max_tokens, log_path=str(folder), eval_every=s.eval_every,
                        save_every=s.save_every, renderer_name=s.renderer, loss_fn=s.loss,
                        loss_fn_config=s.loss_config or None, lora_rank=s.lora_rank, temperature=s.temperature,
                        base_url=url, max_steps=s.max_steps, load_checkpoint_path=s.load_checkpoint)


def run_recipe(folder: Path, url: str, s: Settings, data: Data, plan: Any, steps: int) -> None:
    """Run the cookbook's RL main with the loss route installed; free its server slots however it ends."""
    import asyncio

    from tinker_cookbook.rl import train

    from rlcli.train.compat import progress_logging

    ensure_api_key()
    with (sigterm_as_interrupt(), server_slots(folder, url, s.model), cookbook_hooks(plan),
          progress_logging(RlProgress(steps, plan.loss, plan.passes))):
        asyncio.run(train.main(build_config(folder, url, s, data)))


def check_resume(folder: Path, url: str, sha256: str, s: Settings) -> None:
    """Refuse to resume on other data, model or sampling shape; free slots a crashed attempt left."""
    check_resume_info(folder, url, ("dataset_sha256", sha256), asdict(s),
                      ("model", "renderer", "loss", "batch_size", "group_size", "grader", "eval_size"),
                      "the same --dataset")


def train_rl(loss: str = "gspo", dataset: str | None = None, dataset_path: str | None = None,
             loss_config: str | None = None, passes: str = "auto", model: str | None = None,
             base_url: str | None = None, renderer: str | None = None, batch_size: int = 8, group_size: int = 4,
             lr: float = 4e-5, max_tokens: int = 256, temperature: float = 1.0, lora_rank: int = 32,
             eval_every: int = 20, eval_size: int | None = None, grader: str = "auto", save_every: int = 20,
             max_steps: int | None = None, load_checkpoint: str | None = None, log_path: str | None = None,
             resume: bool = False, dry_run: bool = False, max_operand: int | None = None) -> int:
    """Train a LoRA with RL (tinker-cookbook's loop) and a loss computed on the server.

    Args:
        loss: gspo, cispo, dppo, ppo or importance_sampling (the server's defaults; GSPO the paper's clip 3e-4/4e-4)
        dataset: arithmetic, gsm8k, or a JSONL file of {"question", "answer"}: "42", or GSM8K-style "...#### 42"
        dataset_path: with --dataset gsm8k: read it from this JSONL file (offline) instead of the hub
        loss_config: JSON object of loss settings, e.g. '{"clip_high_threshold": 1.0005}'
        passes: auto (fused when the server serves the loss, else the exact 2-pass form), 1 or 2
        model: the server's base model, exactly as it was started (default: ask the server)
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        batch_size: problems (groups) per step
        group_size: samples per problem; rewards are compared within a group
        lr: Adam learning rate
        max_tokens: longest sampled answer in tokens
        temperature: sampling temperature
        lora_rank: LoRA rank (the server caps it; SkyRL's jax backend at 32 by default)
        eval_every: score the held-out problems every N steps, from step 0 (0: off, and none held out)
        eval_size: problems held out of training for that (default 32; a file: at most a tenth
            of it; arithmetic: at most a third of its pairs)
        grader: auto (a file whose answers end '#### N': gsm8k, else numeric), gsm8k (the cookbook's sympy
            grader), numeric (numbers compared as numbers, other answers as text) or exact (as text)
        save_every: save a resumable checkpoint every N steps (0: only the final one)
        max_steps: stop after this many steps (default: one pass over the data; arithmetic: 100)
        load_checkpoint: start from these weights (fresh optimizer, the checkpoint's LoRA rank): a
            tinker://<model>/weights/<name> state, or a run folder (e.g. an SFT run's) to take its newest
        log_path: run folder (default: RLCLI_HOME/runs/rl-<time>)
        resume: continue the run in --log-path (default: the newest rl run) from its last checkpoint
        dry_run: plan the loss, check the data, print the plan; create no model
        max_operand: with --dataset arithmetic: draw x and y from 0..N (default 100, the cookbook's range)
    """
    name, path, grader = choose_dataset(dataset, dataset_path, grader, max_operand,
                                        0 if eval_every == 0 else eval_size)
    check_numbers(batch_size=batch_size, group_size=group_size, max_tokens=max_tokens, lora_rank=lora_rank,
                  max_steps=max_steps, save_every=save_every, eval_every=eval_every, eval_size=eval_size, lr=lr,
                  temperature=temperature)
    state = checkpoint_state(load_checkpoint)
    url = resolve_base_url(base_url)
    plan = plan_losses(url, loss, loss_config, passes)  # first: an unservable loss fails before any real work
    folder = run_folder(log_path, resume, kind="rl")
    model = resolve_model(model, url, required=not dry_run)
    if renderers.is_local_model(model):
        renderers.go_offline()  # before `datasets` or the hub client is imported: both read it once
        renderers.register_local_tokenizer(model)
    renderer = renderers.choose_renderer(model, renderer)
    from rlcli.train import envs  # the cookbook and `datasets`: only once the loss plan stands

    data = envs.load_data(name, path, batch_size, max_steps, grader, 0 if eval_every == 0 else eval_size,
                          max_operand or rl_eval.ARITHMETIC_MAX)
    steps = min(data.batches, max_steps or data.batches)
    settings = Settings(model, renderer, name, plan.loss, dict(plan.config), plan.passes, batch_size, group_size,
                        lr, max_tokens, temperature, lora_rank, max_steps, save_every, eval_every, data.grader,
                        data.held_out, state, max_operand)
    summary = f"{describe(plan, data, settings, steps)}\nrun folder: {folder}{' (resume)' * resume}\nserver: {url}"
    if dry_run:
        print(summary)
        return 0
    print(summary, file=sys.stderr)
    with claim(folder):
        if resume:
            check_resume(folder, url, data.sha256, settings)
        info = {"dataset_sha256": data.sha256, "base_url": url, **asdict(settings)}
        (folder / RUN_INFO).write_text(json.dumps(info, indent=1) + "\n")
        run_recipe(folder, url, settings, data, plan, steps)
    print(final_report(folder))
    return 0
