"""`rlcli train distill`: on-policy distillation, the student trained on its own samples with a teacher's
per-token logprobs as the signal (advantage = -kl_coef (student logprob - teacher logprob)).

Launch:  rlcli train distill --prompts arithmetic --teacher base --load-checkpoint runs/sft   (recover)
         rlcli train distill --prompts gsm8k --dataset-path train.jsonl --teacher runs/rl --lora-rank 4
         rlcli train distill --prompts problems.jsonl --teacher tinker://RUN/weights/000040 --dry-run
         rlcli train distill --prompts arithmetic --teacher-url http://127.0.0.1:8001   (a second server)
         rlcli train distill --prompts arithmetic --teacher base --log-path runs/d --resume
         rlcli train distill --prompts traces.jsonl --teacher base --teacher-context answer   (self-distillation)

--prompts FILE.jsonl is {"question", "answer"} lines or `rlcli import` conversations (read and held out by
rlcli.problems.traces, as `train rl --env replay` does). --teacher-context answer (rlcli.train.teacher_context):
the teacher's logprobs come from the prompt with the logged answer noted; the student trains on the plain one.

The teacher (rlcli.train.teacher) and the loss are settled first: a bad flag, an unservable loss, a
teacher that is not there or a second server whose tokenizer differs all fail in one line before a
model is made. The loop (rlcli.train.distill_loop) writes config.json, metrics.jsonl (teacher_kl per
step; test/teacher_kl and held-out correctness on eval steps) and checkpoints.jsonl; --resume
continues from the last checkpoint; every LoRA slot the run took (the student's, a checkpoint
teacher's) is freed however it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcli.config import resolve_base_url
from rlcli.errors import UsageError
from rlcli.problems import heldout, traces
from rlcli.problems.heldout import Grader
from rlcli.train import rl_loop, run
from rlcli.train.rl import checkpoint_state
from rlcli.train.rl_loop import RlSettings
from rlcli.train.teacher_context import TeacherContext
from rlcli.train.teacher_context import check as teacher_context_check

if TYPE_CHECKING:
    from rlcli.problems.heldout import Data

RECIPE_NAME = "rlcli_train_distill"
DistillLoss = Literal["importance_sampling", "ppo", "cispo", "gspo"]  # what the cookbook's distillation data suits
RESUME_KEYS = ("model", "renderer", "loss", "batch_size", "group_size", "teacher", "teacher_url", "kl_coef",
               "kl_discount", "reward_coef", "teacher_context", "eval_size", "seed")


@dataclass(frozen=True, kw_only=True)
class Settings(RlSettings):
    prompts: str
    teacher: str  # as resolved: base, a training state, or the second server's model
    teacher_url: str | None = None
    kl_coef: float = 1.0
    kl_discount: float = 0.0
    reward_coef: float = 0.0
    teacher_context: str = "none"
    batch_size: int = run.BATCH_SIZE
    eval_every: int = 10
    eval_size: int = 0
    grader: str = "auto"
    load_checkpoint: str | None = None


def check_flags(kl_coef: float, kl_discount: float, reward_coef: float, group_size: int) -> None:
    if not kl_coef > 0:
        raise UsageError(f"--kl-coef must be positive, got {kl_coef} (RL without a teacher is `rlcli train rl`)")
    if not 0 <= kl_discount < 1:
        raise UsageError(f"--kl-discount must be in [0, 1), got {kl_discount}")
    if reward_coef < 0:
        raise UsageError(f"--reward-coef must be 0 (off) or more, got {reward_coef}")
    if group_size < (2 if reward_coef else 1):
        raise UsageError(f"--group-size must be at least {2 if reward_coef else 1}, got {group_size}"
                         f"{' (rewards are compared within a group)' if reward_coef else ''}")


def describe(plan: Any, data: Data, s: Settings, steps: int, teacher: Any) -> str:
    size = "synthetic" if data.size is None else f"{data.size} prompts"
    held_out = (f"{data.held_out} held-out prompts: teacher KL and correctness every {s.eval_every} steps"
                if data.held_out and s.eval_every else "no held-out evaluation")
    reward = f" + {s.reward_coef:g} x reward ({data.grader})" if s.reward_coef else ""
    context = ("; its prompt also shows the logged answer (teacher_prompts.jsonl)"
               if s.teacher_context == "answer" else "")
    return "\n".join([
        f"teacher: {teacher.describe()}{context}",
        f"signal: -{s.kl_coef:g} x (student - teacher logprob) per token"
        f"{f', discounted {s.kl_discount:g}' if s.kl_discount else ''}{reward}",
        rl_loop.describe_loss(plan),
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}; {held_out}",
        f"plan: {s.batch_size} prompts x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"student: {s.model}  renderer: {s.renderer}  start: {s.load_checkpoint or f'fresh LoRA rank {s.lora_rank}'}",
    ])


def build_config(folder: Path, url: str, s: Settings) -> Any:
    from tinker_cookbook.distillation.train_on_policy import Config

    return Config(learning_rate=s.lr, dataset_configs=[], model_name=s.model, recipe_name=RECIPE_NAME,
                  renderer_name=s.renderer, max_tokens=s.max_tokens, temperature=s.temperature,
                  lora_rank=s.lora_rank, kl_penalty_coef=s.kl_coef, kl_discount_factor=s.kl_discount,
                  loss_fn=s.loss, loss_fn_config=s.loss_config or None, log_path=str(folder), base_url=url,
                  eval_every=s.eval_every, save_every=s.save_every, max_steps=s.max_steps)


def train_distill(prompts: str | None = None, teacher: str | None = None, teacher_url: str | None = None,
                  dataset_path: str | None = None, load_checkpoint: str | None = None, kl_coef: float = 1.0,
                  kl_discount: float = 0.0, reward_coef: float = 0.0, teacher_context: TeacherContext = "none",
                  loss: DistillLoss = "importance_sampling",
                  loss_config: str | None = None, model: str | None = None, base_url: str | None = None,
                  renderer: str | None = None, batch_size: int = run.BATCH_SIZE, group_size: int = run.GROUP_SIZE,
                  lr: float = run.RL_LR, max_tokens: int = 256, temperature: float = run.TEMPERATURE,
                  lora_rank: int = run.LORA_RANK, eval_every: int = 10, eval_size: int | None = None,
                  grader: Grader = "auto", save_every: int = run.SAVE_EVERY, max_steps: int | None = None,
                  log_path: str | None = None, resume: bool = False, dry_run: bool = False,
                  max_operand: int | None = None, seed: int = run.SEED,
                  server_timeout: float = run.SERVER_TIMEOUT) -> int:
    """Distill a teacher into a LoRA student on the student's own samples (on-policy distillation).

    Args:
        prompts: arithmetic, gsm8k, or a JSONL file: {"question", "answer"} lines (as train rl's --dataset), or
            conversations as `rlcli import` writes them (the prompt: the conversation before its last
            assistant turn; that logged reply: the answer); held out by a stable hash of the prompt
        teacher: base (the served base model), a run folder (its newest saved state),
            tinker://RUN/weights/NAME, or tinker://RUN/sampler_weights/NAME (its state of that name is used)
        teacher_url: a second server whose base model is the teacher (same tokenizer as the student)
        dataset_path: with --prompts gsm8k: read it from this JSONL file (offline) instead of the hub
        load_checkpoint: where the student starts: a run folder or tinker://RUN/weights/NAME (default a fresh LoRA)
        kl_coef: weight of the per-token teacher signal
        kl_discount: discount for later tokens' signal (0: each token its own)
        reward_coef: add the prompts' graded reward times this (RL with a teacher; 0: off)
        teacher_context: none, or answer (self-distillation: the teacher's logprobs are computed on the prompt
            with the logged answer noted in its last user turn; the student trains on its plain prompt)
        loss: importance_sampling, ppo, cispo or gspo (computed on the server)
        loss_config: JSON object of loss settings, as for train rl
        model: the server's base model, exactly as it was started (default: ask the server)
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        batch_size: prompts per step
        group_size: samples per prompt
        lr: Adam learning rate
        max_tokens: longest sampled answer in tokens
        temperature: sampling temperature
        lora_rank: the student's LoRA rank (a fresh LoRA only)
        eval_every: measure the held-out teacher KL and correctness every N steps, from step 0 (0: off)
        eval_size: prompts held out for that (as train rl's --eval-size)
        grader: for files, as train rl's --grader (scores the held-out prompts, and --reward-coef)
        save_every: save a resumable checkpoint every N steps (0: only the final one)
        max_steps: stop after this many steps (default: one pass over the prompts; arithmetic: 100)
        log_path: run folder (default: RLCLI_HOME/runs/distill-<time>)
        resume: continue the run in --log-path (default: the newest distill run) from its last checkpoint
        dry_run: check the flags, the teacher and the data, print the plan; create no model
        max_operand: with --prompts arithmetic: x and y in 0..N (default 100)
        seed: the run's seed (the student's LoRA initialisation and every sampling seed; --resume keeps it)
        server_timeout: seconds the server may go without answering before the run stops (0: wait for ever)
    """
    if not prompts:
        raise UsageError("pass --prompts arithmetic, --prompts gsm8k [--dataset-path FILE.jsonl], or --prompts "
                         "FILE.jsonl ({question, answer} lines, or `rlcli import` conversations)")
    check_flags(kl_coef, kl_discount, reward_coef, group_size)
    teacher_context_check(teacher_context, prompts)
    held = 0 if eval_every == 0 else eval_size
    try:  # train rl's flag check, its messages in this command's words
        name, path, grader = heldout.choose_dataset(prompts, dataset_path, grader, max_operand, held)
    except UsageError as e:
        raise UsageError(str(e).replace("--dataset ", "--prompts ")) from None
    run.check_numbers(seed=seed, batch_size=batch_size, max_tokens=max_tokens, lora_rank=lora_rank, max_steps=max_steps,
                      save_every=save_every, eval_every=eval_every, eval_size=eval_size, lr=lr, temperature=temperature)
    conversations = None
    if name == "file" and traces.is_traces_file(str(path)):  # `rlcli import` output: train rl's replay reader
        if grader != "auto":
            raise UsageError(f"--grader is for {{question, answer}} files; {path} holds conversations, scored by "
                             "matching the logged reply: drop --grader")
        conversations = traces.Spec(str(path))
    state = checkpoint_state(load_checkpoint)
    url = resolve_base_url(base_url)
    plan = rl_loop.plan_losses(url, loss, loss_config, "auto")
    t = run.target("distill", log_path, resume, url, model, renderer, dry_run, server_timeout)
    from rlcli.train import teacher as teachers

    chosen = teachers.resolve(teacher, teacher_url, url, t.model, dry_run)
    from rlcli.problems import envs
    from rlcli.train import distill_loop  # the cookbook and `datasets`: only once the plan stands

    data = envs.load_data(name, path, batch_size, max_steps, grader, held, max_operand or heldout.ARITHMETIC_MAX,
                          replay=conversations)
    steps = min(data.batches, max_steps or data.batches)
    s = Settings(model=t.model, renderer=t.renderer, prompts=name if name != "file" else str(path), loss=plan.loss,
                 loss_config=dict(plan.config), passes=plan.passes, teacher=chosen.path or chosen.source,
                 teacher_url=chosen.url if chosen.kind == "url" else None, kl_coef=kl_coef, kl_discount=kl_discount,
                 reward_coef=reward_coef, teacher_context=teacher_context, batch_size=batch_size,
                 group_size=group_size, lr=lr, max_tokens=max_tokens,
                 temperature=temperature, lora_rank=lora_rank, max_steps=max_steps, save_every=save_every,
                 eval_every=eval_every, eval_size=data.held_out, grader=data.grader, load_checkpoint=state,
                 seed=seed)
    progress = distill_loop.DistillProgress(steps, plan.loss, plan.passes, with_reward=reward_coef > 0)
    loop = distill_loop.Run(teacher=chosen, reward_coef=reward_coef, batch_size=batch_size, load_checkpoint=state,
                            context=teacher_context,
                            builder=envs.dataset_builder(data, t.model, t.renderer, batch_size, group_size))
    job = run.Job(settings=s, summary=describe(plan, data, s, steps, chosen), digest=("dataset_sha256", data.sha256),
                  same_input="the same --prompts", resume_keys=RESUME_KEYS, progress=progress,
                  recipe=lambda folder, url: distill_loop.recipe(plan, progress,
                                                                 lambda: build_config(folder, url, s), loop),
                  report=distill_loop.final_report)
    return run.execute(job, t, resume, dry_run)
