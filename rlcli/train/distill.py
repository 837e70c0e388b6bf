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

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rlcli.config import resolve_base_url
from rlcli.errors import UsageError
from rlcli.options import option
from rlcli.problems import heldout, traces
from rlcli.problems.heldout import DATASET_PATH, GRADER, HELD_OUT, MAX_OPERAND, Data, Grader
from rlcli.train import rl_loop, run
from rlcli.train.options import BATCH, BATCH_SIZE, LOAD_CHECKPOINT, SamplingOptions, group_of_two, kept
from rlcli.train.rl import checkpoint_state
from rlcli.train.teacher_context import TeacherContext
from rlcli.train.teacher_context import check as teacher_context_check

RECIPE_NAME = "rlcli_train_distill"
DistillLoss = Literal["importance_sampling", "ppo", "cispo", "gspo"]  # what the cookbook's distillation data suits
RESUME_KEYS = ("model", "renderer", "loss", "batch_size", "group_size", "teacher", "teacher_url", "kl_coef",
               "kl_discount", "reward_coef", "teacher_context", "eval_size", "seed", "keep", "keep_batch_size")


@dataclass(frozen=True, kw_only=True)
class DistillOptions(SamplingOptions):
    """`rlcli train distill`'s options."""

    prompts: str | None = option(None, "arithmetic, gsm8k, or a JSONL file: {question, answer} lines (as train rl's "
                                       "--dataset), or conversations as `rlcli import` writes them (the prompt: the "
                                       "conversation before its last assistant turn; that logged reply: the answer); "
                                       "held out by a stable hash of the prompt")
    teacher: str | None = option(None, "base (the served base model), a run folder (its newest saved state), "
                                       "tinker://RUN/weights/NAME, or tinker://RUN/sampler_weights/NAME (its state of "
                                       "that name is used)")
    teacher_url: str | None = option(None, "a second server whose base model is the teacher (same tokenizer as the "
                                           "student)")
    teacher_context: TeacherContext = option("none", "none, or answer (self-distillation: the teacher's logprobs are "
                                                     "computed on the prompt with the logged answer noted in its last "
                                                     "user turn; the student trains on its plain prompt)")
    loss: DistillLoss = option("importance_sampling", "the loss, computed on the server: importance_sampling, ppo, "
                                                      "cispo or gspo (what the cookbook's distillation data suits)")
    kl_coef: float = option(1.0, "weight of the per-token teacher signal", low=0, above=True,
                            why="RL without a teacher is `rlcli train rl`")
    kl_discount: float = option(0.0, "discount for later tokens' signal (0: each token its own)", low=0, high=1,
                                below=True)
    reward_coef: float = option(0.0, "add the prompts' graded reward times this (RL with a teacher; 0: off)", low=0)
    keep: str | None = option(None, "a JSONL file of prompts (as --prompts FILE) whose answers the student must keep: "
                                    "each step also distills --keep-batch-size of them toward the start weights "
                                    "(--load-checkpoint), re-created as a second teacher; they go round as often as "
                                    "the steps need")
    keep_batch_size: int = option(4, "--keep prompts per step, beside --batch-size of --prompts", low=1)
    batch_size: int = BATCH(BATCH_SIZE)
    load_checkpoint: str | None = LOAD_CHECKPOINT(None)
    dataset_path: str | None = DATASET_PATH(None)
    eval_size: int | None = HELD_OUT(None)
    grader: Grader = GRADER("auto")
    max_operand: int | None = MAX_OPERAND(None)

    def problems(self) -> Iterator[str]:
        if not self.prompts:
            yield ("pass --prompts arithmetic, --prompts gsm8k [--dataset-path FILE.jsonl], or --prompts FILE.jsonl "
                   "({question, answer} lines, or `rlcli import` conversations)")
        if self.reward_coef:
            yield from group_of_two(self.group_size)
        if self.keep and not self.load_checkpoint:
            yield ("--keep distills its prompts toward the weights the student starts from: pass --load-checkpoint "
                   "RUN_FOLDER (the run that taught what --keep guards)")
        yield from super().problems()


def describe(plan: Any, data: Data, s: DistillOptions, steps: int, teacher: Any, keep: Data | None) -> str:
    size = "synthetic" if data.size is None else f"{data.size} prompts"
    held_out = heldout.kept_out(data.held_out, s.eval_every, "prompts", "(teacher KL and correctness) scored")
    reward = f" + {s.reward_coef:g} x reward ({data.grader})" if s.reward_coef else ""
    context = ("; its prompt also shows the logged answer (teacher_prompts.jsonl)"
               if s.teacher_context == "answer" else "")
    return "\n".join([
        f"teacher: {teacher.describe()}{context}",
        f"signal: -{s.kl_coef:g} x (student - teacher logprob) per token"
        f"{f', discounted {s.kl_discount:g}' if s.kl_discount else ''}{reward}",
        rl_loop.describe_loss(plan),
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}; {held_out}",
        *([f"keep: {keep.label}: {keep.size} prompts, {keep.batches} batches of {s.keep_batch_size} (round and round), "
           f"distilled toward "
           f"the start weights {s.load_checkpoint} (a second teacher, in a LoRA slot of its own)"] if keep else []),
        f"plan: {s.batch_size} prompts x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"student: {s.model}  renderer: {s.renderer}  start: {s.load_checkpoint or f'fresh LoRA rank {s.lora_rank}'}",
    ])


def build_config(folder: Path, url: str, s: DistillOptions, plan: Any) -> Any:
    from tinker_cookbook.distillation.train_on_policy import Config

    return Config(learning_rate=s.lr, dataset_configs=[], model_name=s.model, recipe_name=RECIPE_NAME,
                  renderer_name=s.renderer, max_tokens=s.max_tokens, temperature=s.temperature,
                  lora_rank=s.lora_rank, kl_penalty_coef=s.kl_coef, kl_discount_factor=s.kl_discount,
                  loss_fn=plan.loss, loss_fn_config=dict(plan.config) or None, log_path=str(folder), base_url=url,
                  eval_every=s.eval_every, save_every=s.save_every, max_steps=s.max_steps)


def keep_data(path: str | None, batch_size: int, max_steps: int | None) -> Data | None:
    """--keep's prompts, all trained on (none held out): conversations or {question, answer} lines."""
    if not path:
        return None
    from rlcli.problems import envs

    if traces.is_traces_file(path):
        return envs.load_data("file", path, batch_size, max_steps, eval_size=0, replay=traces.Spec(path))
    return envs.load_data("file", path, batch_size, max_steps, eval_size=0)


def train_distill(o: DistillOptions) -> run.Weights | None:
    """Distill a teacher into a LoRA student on the student's own samples (on-policy distillation).

    Returns the final weights (None for a dry run)."""
    teacher_context_check(o.teacher_context, str(o.prompts))
    held = heldout.held_out_for(o.eval_every, o.eval_size)
    try:  # train rl's flag check, its messages in this command's words
        name, path, grader = heldout.choose_dataset(o.prompts, o.dataset_path, o.grader, o.max_operand, held)
    except UsageError as e:
        raise UsageError(str(e).replace("--dataset ", "--prompts ")) from None
    conversations = None
    if name == "file" and traces.is_traces_file(str(path)):  # `rlcli import` output: train rl's replay reader
        if grader != "auto":
            raise UsageError(f"--grader is for {{question, answer}} files; {path} holds conversations, scored by "
                             "matching the logged reply: drop --grader")
        conversations = traces.Spec(str(path))
    state = checkpoint_state(o.load_checkpoint)
    url = resolve_base_url(o.base_url)
    plan = rl_loop.plan_losses(url, o.loss, o.loss_config, "auto")
    t = run.target("distill", o, url)
    from rlcli.train import teacher as teachers

    chosen = teachers.resolve(o.teacher, o.teacher_url, url, t.model, o.dry_run)
    from rlcli.problems import envs
    from rlcli.train import distill_loop  # the cookbook and `datasets`: only once the plan stands

    data = envs.load_data(name, path, o.batch_size, o.max_steps, grader, held,
                          o.max_operand or heldout.ARITHMETIC_MAX, replay=conversations)
    keep = keep_data(o.keep, o.keep_batch_size, o.max_steps)
    steps = min(data.batches, o.max_steps or data.batches)  # --keep's batches go round as often as needed
    o = replace(o, model=t.model, renderer=t.renderer, load_checkpoint=state)
    settings = kept(o, prompts=name if name != "file" else str(path), loss=plan.loss,
                    loss_config=dict(plan.config), passes=plan.passes, teacher=chosen.path or chosen.source,
                    teacher_url=chosen.url if chosen.kind == "url" else None, eval_size=data.held_out,
                    grader=data.grader)
    progress = distill_loop.DistillProgress(steps, plan.loss, plan.passes, with_reward=o.reward_coef > 0)
    loop = distill_loop.Run(teacher=chosen, reward_coef=o.reward_coef, batch_size=o.batch_size,
                            load_checkpoint=state, context=o.teacher_context,
                            builder=envs.dataset_builder(data, t.model, t.renderer, o.batch_size, o.group_size),
                            keep=keep and distill_loop.Keep(
                                teachers.Teacher("state", str(o.keep), path=state, url=url, model=t.model),
                                envs.dataset_builder(keep, t.model, t.renderer, o.keep_batch_size, o.group_size),
                                o.keep_batch_size))
    job = run.Job(settings=settings, summary=describe(plan, data, o, steps, chosen, keep),
                  digest=("dataset_sha256", data.sha256), same_input="the same --prompts", resume_keys=RESUME_KEYS,
                  progress=progress, report=distill_loop.final_report,
                  recipe=lambda folder, url: distill_loop.recipe(plan, progress,
                                                                 lambda: build_config(folder, url, o, plan), loop))
    return run.execute(job, t, o.resume, o.dry_run)
