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
steps (rlcli.problems.heldout).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlcli.config import resolve_base_url
from rlcli.errors import UsageError
from rlcli.options import option
from rlcli.problems import heldout
from rlcli.problems.heldout import Data, ProblemSet, choose_dataset
from rlcli.problems.traces import ReplayOptions, judge_settings, spec_from_flags
from rlcli.train import greedy_score, rl_loop, run
from rlcli.train.folder import last_checkpoint
from rlcli.train.losses import Passes
from rlcli.train.options import (
    BATCH,
    BATCH_SIZE,
    EVAL_EVERY,
    LOAD_CHECKPOINT,
    PASSES,
    SamplingOptions,
    group_of_two,
    kept,
)
from rlcli.train.rl_loop import LOSS, RlLoss, RlProgress

RECIPE_NAME = "rlcli_train_rl"
RESUME_KEYS = ("model", "renderer", "loss", "batch_size", "group_size", "grader", "eval_size", "seed", "kl_coef")


@dataclass(frozen=True, kw_only=True)
class RlOptions(SamplingOptions, ProblemSet, ReplayOptions):
    """`rlcli train rl`'s options."""

    loss: RlLoss = LOSS("gspo")
    passes: Passes = PASSES("auto")
    batch_size: int = BATCH(BATCH_SIZE)
    eval_every: int = EVAL_EVERY(20)
    load_checkpoint: str | None = LOAD_CHECKPOINT(None)
    judge: str | None = option(None, "the judge for --reward judge: base (the server's base model) or "
                                     "tinker://RUN/sampler_weights/ID")
    judge_url: str | None = option(None, "the Tinker server the judge runs on (default: the training server)")
    judge_openai: str | None = option(None, "an OpenAI-compatible endpoint (http://HOST/v1) as the judge instead")
    judge_model: str | None = option(None, "the model name the --judge-openai endpoint serves")
    greedy_score: bool = option(False, "score the held-out problems greedily with the start weights before the first "
                                       "step and the final weights after the last: one line in the final report")
    kl_coef: float = option(0.0, "penalize each sampled token's logprob above the base model's by this (the "
                                 "cookbook's KL penalty, centred on the batch mean; 0: off)", low=0)

    def problems(self) -> Iterator[str]:
        yield from group_of_two(self.group_size)
        yield from super().problems()


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


def describe(plan: Any, data: Data, s: RlOptions, steps: int) -> str:
    size = "synthetic" if data.size is None else f"{data.size} problems"
    held_out = heldout.kept_out(data.held_out, s.eval_every)
    if s.greedy_score:
        held_out = (f"{data.held_out} held-out problems kept out of training, answered greedily before the first step "
                    f"and after the last{f', and scored every {s.eval_every} steps' if s.eval_every else ''}")
    return "\n".join([
        rl_loop.describe_loss(plan),
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}; grader {data.grader}; {held_out}",
        f"plan: {s.batch_size} problems x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"model: {s.model}  renderer: {s.renderer}  start: {s.load_checkpoint or f'fresh LoRA rank {s.lora_rank}'}"
        f"{f'  KL penalty vs the base model: {s.kl_coef:g}' if s.kl_coef else ''}",
    ])


def build_config(folder: Path, url: str, s: RlOptions, plan: Any, data: Data) -> Any:
    from tinker_cookbook.rl import train

    from rlcli.problems import envs

    builder = envs.dataset_builder(data, s.model, s.renderer, s.batch_size, s.group_size)
    # Only base_model: SkyRL refuses a sampling client that names a model_path too (docs/decisions.md).
    reference = train.KLReferenceConfig(base_model=s.model) if s.kl_coef else None
    return train.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model, recipe_name=RECIPE_NAME,
                        max_tokens=s.max_tokens, log_path=str(folder), eval_every=s.eval_every,
                        save_every=s.save_every, renderer_name=s.renderer, loss_fn=plan.loss,
                        loss_fn_config=dict(plan.config) or None, lora_rank=s.lora_rank, temperature=s.temperature,
                        base_url=url, max_steps=s.max_steps, load_checkpoint_path=s.load_checkpoint,
                        kl_penalty_coef=s.kl_coef, kl_reference_config=reference)


def recipe(folder: Path, url: str, s: RlOptions, plan: Any, progress: RlProgress, data: Data,
           start: str | None) -> Any:
    """The cookbook's RL loop on this run's config; with --greedy-score, between the two greedy scores."""
    loop = rl_loop.recipe(plan, progress, lambda: build_config(folder, url, s, plan, data))
    if not s.greedy_score:
        return loop
    return greedy_score.scoring(loop, folder, url, start, s.model, s.renderer, data, s.max_tokens)


def train_rl(o: RlOptions) -> run.Weights | None:
    """Train a LoRA with RL (tinker-cookbook's loop) and a loss computed on the server.

    Returns the final weights (None for a dry run)."""
    spec = spec_from_flags(o.env, o.dataset, o.dataset_path, o.grader, o.max_operand, o.reward, o.match, o.turn,
                           o.rubric, judge_settings(o.judge, o.judge_url, o.judge_openai, o.judge_model))
    held = heldout.held_out_for(o.eval_every, o.eval_size)
    name, path, grader = ("replay", None, "auto") if spec else choose_dataset(o.dataset, o.dataset_path, o.grader,
                                                                              o.max_operand, held)
    state = checkpoint_state(o.load_checkpoint)
    start = greedy_score.start_weights(o.load_checkpoint) if o.greedy_score else None
    url = resolve_base_url(o.base_url)
    plan = rl_loop.plan_losses(url, o.loss, o.loss_config, o.passes)  # first: an unservable loss fails early
    t = run.target("rl", o, url)
    from rlcli.problems import envs  # the cookbook and `datasets`: only once the loss plan stands

    data = envs.load_data(name, path, o.batch_size, o.max_steps, grader, held,
                          o.max_operand or heldout.ARITHMETIC_MAX, spec and spec.on_server(url))
    if o.greedy_score and not data.held_out:
        raise UsageError("--greedy-score scores the held-out problems, and this run holds none out: pass --eval-size N")
    steps = min(data.batches, o.max_steps or data.batches)
    o = replace(o, model=t.model, renderer=t.renderer, load_checkpoint=state)
    settings = kept(o, dataset=name, loss=plan.loss, loss_config=dict(plan.config), passes=plan.passes,
                    grader=data.grader, eval_size=data.held_out)
    progress = RlProgress(steps, plan.loss, plan.passes)
    job = run.Job(settings=settings, summary=describe(plan, data, o, steps), digest=("dataset_sha256", data.sha256),
                  same_input="the same --dataset", resume_keys=RESUME_KEYS, progress=progress,
                  recipe=lambda folder, url: recipe(folder, url, o, plan, progress, data, start),
                  report=rl_loop.final_report)
    return run.execute(job, t, o.resume, o.dry_run)
