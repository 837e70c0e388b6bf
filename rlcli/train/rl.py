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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcli.config import resolve_base_url
from rlcli.errors import UsageError
from rlcli.problems import heldout
from rlcli.problems.heldout import Grader, choose_dataset
from rlcli.problems.traces import Env, Reward, Turn, judge_settings, spec_from_flags
from rlcli.train import rl_loop, run
from rlcli.train.folder import last_checkpoint
from rlcli.train.losses import Passes
from rlcli.train.rl_loop import RlLoss, RlProgress, RlSettings

if TYPE_CHECKING:
    from rlcli.problems.heldout import Data

RECIPE_NAME = "rlcli_train_rl"
RESUME_KEYS = ("model", "renderer", "loss", "batch_size", "group_size", "grader", "eval_size", "seed", "kl_coef")


@dataclass(frozen=True, kw_only=True)
class Settings(RlSettings):
    dataset: str
    batch_size: int = run.BATCH_SIZE
    eval_every: int = 20
    grader: str = "auto"  # as resolved from the data
    eval_size: int = 0  # problems held out: what --eval-size came to
    load_checkpoint: str | None = None  # a training-state path
    max_operand: int | None = None  # arithmetic's operand range, when --max-operand set it
    kl_coef: float = 0.0  # the cookbook's KL penalty against the base model (0: off)


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


def describe(plan: Any, data: Data, s: Settings, steps: int) -> str:
    size = "synthetic" if data.size is None else f"{data.size} problems"
    held_out = (f"{data.held_out} held-out problems scored every {s.eval_every} steps" if data.held_out
                else "no held-out evaluation")
    return "\n".join([
        rl_loop.describe_loss(plan),
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}; grader {data.grader}; {held_out}",
        f"plan: {s.batch_size} problems x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"model: {s.model}  renderer: {s.renderer}  start: {s.load_checkpoint or f'fresh LoRA rank {s.lora_rank}'}"
        f"{f'  KL penalty vs the base model: {s.kl_coef:g}' if s.kl_coef else ''}",
    ])


def build_config(folder: Path, url: str, s: Settings, data: Data) -> Any:
    from tinker_cookbook.rl import train

    from rlcli.problems import envs

    builder = envs.dataset_builder(data, s.model, s.renderer, s.batch_size, s.group_size)
    # Only base_model: SkyRL refuses a sampling client that names a model_path too (docs/decisions.md).
    reference = train.KLReferenceConfig(base_model=s.model) if s.kl_coef else None
    return train.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model, recipe_name=RECIPE_NAME,
                        max_tokens=s.max_tokens, log_path=str(folder), eval_every=s.eval_every,
                        save_every=s.save_every, renderer_name=s.renderer, loss_fn=s.loss,
                        loss_fn_config=s.loss_config or None, lora_rank=s.lora_rank, temperature=s.temperature,
                        base_url=url, max_steps=s.max_steps, load_checkpoint_path=s.load_checkpoint,
                        kl_penalty_coef=s.kl_coef, kl_reference_config=reference)


def train_rl(loss: RlLoss = "gspo", dataset: str | None = None, dataset_path: str | None = None,
             loss_config: str | None = None, passes: Passes = "auto", model: str | None = None,
             base_url: str | None = None, renderer: str | None = None, batch_size: int = run.BATCH_SIZE,
             group_size: int = run.GROUP_SIZE, lr: float = run.RL_LR, max_tokens: int = 256,
             temperature: float = run.TEMPERATURE, lora_rank: int = run.LORA_RANK, eval_every: int = 20,
             eval_size: int | None = None, grader: Grader = "auto", save_every: int = run.SAVE_EVERY,
             max_steps: int | None = None, load_checkpoint: str | None = None, log_path: str | None = None,
             resume: bool = False, dry_run: bool = False, max_operand: int | None = None, env: Env = "problems",
             reward: Reward = "match", match: str = "normalized", turn: Turn = "last", rubric: str | None = None,
             judge: str | None = None, judge_url: str | None = None, judge_openai: str | None = None,
             judge_model: str | None = None, seed: int = run.SEED,
             server_timeout: float = run.SERVER_TIMEOUT,
             kl_coef: float = 0.0) -> int:
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
        env: problems (--dataset is a problem set), or replay: --dataset is traces from `rlcli import`, the
            policy writes a logged assistant turn and --reward scores it; or tools: traces that called tools,
            the logged calls answer with their recorded output (answer match + call precision/recall)
        reward: with --env replay: match (the logged reply), verdict (good-verdict replies are targets,
            bad ones penalised), rubric (--rubric checks) or judge (a judge model ranks each group)
        match: how a reply matches the logged one: exact, normalized, number, or regex:PATTERN
        turn: with --env replay: the last assistant turn of each conversation, or all of them
        rubric: JSON file of checks (contains, not_contains, regex, min/max_length, json, json_schema)
        judge: the judge for --reward judge: base (the server's base model) or tinker://RUN/sampler_weights/ID
        judge_url: the Tinker server the judge runs on (default: the training server)
        judge_openai: an OpenAI-compatible endpoint (http://HOST/v1) as the judge instead
        judge_model: the model name the --judge-openai endpoint serves
        seed: the run's seed (the LoRA's initialisation and every sampling seed; kept in the run folder)
        server_timeout: seconds the server may go without answering before the run stops (0: wait for ever)
        kl_coef: penalize each sampled token's logprob above the base model's by this (the cookbook's KL
            penalty, centred on the batch mean; 0: off)
    """
    spec = spec_from_flags(env, dataset, dataset_path, grader, max_operand, reward, match, turn, rubric,
                           judge_settings(judge, judge_url, judge_openai, judge_model))
    held = 0 if eval_every == 0 else eval_size
    name, path, grader = ("replay", None, "auto") if spec else choose_dataset(dataset, dataset_path, grader,
                                                                              max_operand, held)
    run.check_numbers(seed=seed, batch_size=batch_size, group_size=group_size, max_tokens=max_tokens,
                      lora_rank=lora_rank, max_steps=max_steps, save_every=save_every, eval_every=eval_every,
                      eval_size=eval_size, lr=lr, temperature=temperature)
    if kl_coef < 0:
        raise UsageError(f"--kl-coef must be 0 (off) or more, got {kl_coef}")
    state = checkpoint_state(load_checkpoint)
    url = resolve_base_url(base_url)
    plan = rl_loop.plan_losses(url, loss, loss_config, passes)  # first: an unservable loss fails before real work
    t = run.target("rl", log_path, resume, url, model, renderer, dry_run, server_timeout)
    from rlcli.problems import envs  # the cookbook and `datasets`: only once the loss plan stands

    data = envs.load_data(name, path, batch_size, max_steps, grader, 0 if eval_every == 0 else eval_size,
                          max_operand or heldout.ARITHMETIC_MAX, spec and spec.on_server(url))
    steps = min(data.batches, max_steps or data.batches)
    s = Settings(model=t.model, renderer=t.renderer, dataset=name, loss=plan.loss, loss_config=dict(plan.config),
                 passes=plan.passes, batch_size=batch_size, group_size=group_size, lr=lr, max_tokens=max_tokens,
                 temperature=temperature, lora_rank=lora_rank, max_steps=max_steps, save_every=save_every,
                 eval_every=eval_every, grader=data.grader, eval_size=data.held_out, load_checkpoint=state,
                 max_operand=max_operand, seed=seed, kl_coef=kl_coef)
    progress = RlProgress(steps, plan.loss, plan.passes)
    job = run.Job(settings=s, summary=describe(plan, data, s, steps), digest=("dataset_sha256", data.sha256),
                  same_input="the same --dataset", resume_keys=RESUME_KEYS, progress=progress,
                  recipe=lambda folder, url: rl_loop.recipe(plan, progress, lambda: build_config(folder, url, s, data)),
                  report=rl_loop.final_report)
    return run.execute(job, t, resume, dry_run)
