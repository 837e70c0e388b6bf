"""The on-policy distillation loop of `rlcli train distill`, on tinker-cookbook's `do_sync_training`.

The cookbook's own `distillation.train_on_policy.main` builds its teacher clients with both
base_model and model_path, which SkyRL refuses (rlcli.train.teacher), so rlcli sets the run up here
and hands its teacher client to the cookbook's loop: per step it samples the student, asks the
teacher for the logprobs of the same tokens (compute_logprobs), sets each response token's
advantage to -kl_coef (student logprob - teacher logprob) (optionally discounted, plus the group-
centred reward times --reward-coef), and trains with the planned loss. The teacher is built before
the student: a teacher that cannot be had fails before the student takes a slot. rlcli.train.rl_loop
routes the loss and adds the response weights and the prompt-logprob shape SkyRL needs.

Per step metrics.jsonl has teacher_kl (the mean over sampled tokens of student - teacher logprob:
a sampled estimate of the reverse KL), and on eval steps test/teacher_kl (the same on held-out
prompts) and the held-out problems' test/env/all/correct.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rlcli.train import metrics, run, teacher
from rlcli.train.folder import last_checkpoint, read_jsonl
from rlcli.train.rl_loop import ROUTES


def reference_advantages(student_T, teacher_T, mask_T, kl_coef: float, kl_discount: float):
    """Float64 reference of the advantage each token gets: -kl_coef (student - teacher) on the response,
    0 elsewhere; with a discount g, each token's sum over it and later tokens of g^(k-t) times that."""
    import numpy as np

    s, t, m = (np.asarray(x, dtype=np.float64) for x in (student_T, teacher_T, mask_T))
    adv = -kl_coef * m * (s - t)
    if kl_discount > 0:
        out, running = np.zeros_like(adv), 0.0
        for i in range(len(adv) - 1, -1, -1):
            running = adv[i] + kl_discount * running
            out[i] = running
        adv = out
    return adv


# --- the loop ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Keep:
    """--keep: prompts distilled toward the student's start weights, whose teacher is those weights."""

    teacher: teacher.Teacher
    builder: Any
    batch_size: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """What the loop needs beyond the cookbook's Config."""

    teacher: teacher.Teacher
    builder: Any  # an RLDatasetBuilder: (train set, held-out set | None)
    reward_coef: float
    batch_size: int
    load_checkpoint: str | None
    context: str = "none"  # --teacher-context: answer puts the logged answer in the teacher's prompt
    keep: Keep | None = None


@contextlib.contextmanager
def recipe(plan: Any, progress: Any, config: Callable[[], Any], r: Run) -> Iterator[Callable[[], Any]]:
    import asyncio

    from rlcli.train.rl_loop import routed

    with routed(plan, progress):
        built = config()
        yield lambda: asyncio.run(main(built, r))


async def main(cfg: Any, r: Run) -> None:
    import asyncio

    import tinker
    from tinker_cookbook import checkpoint_utils
    from tinker_cookbook.distillation.datasets import CompositeDataset
    from tinker_cookbook.distillation.train_on_policy import do_sync_training
    from tinker_cookbook.tokenizer_utils import get_tokenizer
    from tinker_cookbook.utils import ml_log

    ml_logger = ml_log.setup_logging(log_dir=cfg.log_path, wandb_project=None, config=cfg)
    resume = checkpoint_utils.get_last_checkpoint(cfg.log_path)
    start = resume.batch if resume else 0
    service = tinker.ServiceClient(base_url=cfg.base_url)
    teacher_client = await teacher.sampling_client(r.teacher, service)  # first: see the module docstring
    register = None
    if r.context == "answer":
        from rlcli.train.teacher_context import ContextTeacher

        teacher_client = ContextTeacher(teacher_client, cfg.log_path)
        register = teacher_client.register
    keep_client = await teacher.sampling_client(r.keep.teacher, service) if r.keep else None
    if r.teacher.kind == "state" or r.keep:  # it took the slot run.server_slots cleaned: clean the student's too
        from rlcli.slots import ensure_clean_next_slot

        await asyncio.to_thread(ensure_clean_next_slot, cfg.base_url, cfg.model_name)
    meta: dict[str, str] = {}
    checkpoint_utils.add_renderer_name_to_user_metadata(meta, cfg.renderer_name)
    if resume:
        student = await service.create_training_client_from_state_with_optimizer(resume.state_path,
                                                                                  user_metadata=meta)
    elif r.load_checkpoint:
        student = await service.create_training_client_from_state(r.load_checkpoint, user_metadata=meta)
    else:
        student = await service.create_lora_training_client(cfg.model_name, rank=cfg.lora_rank, user_metadata=meta)
    train_set, test_set = await r.builder()
    evaluators = []
    if test_set is not None and cfg.eval_every > 0:
        from rlcli.problems.score import HeldOutEvaluator  # the cookbook's, asking as every scoring does

        evaluators = [Unprefixed(HeldOutEvaluator(test_set, max_tokens=cfg.max_tokens, num_groups_to_log=0)),
                      HeldOutKl(test_set, teacher_client, cfg.max_tokens)]
    datasets, sizes, teachers = [RewardScaled(train_set, r.reward_coef, register)], [r.batch_size], [teacher_client]
    if r.keep:  # the cookbook asks each group's teacher by the index of the dataset it came from
        keep_set, _ = await r.keep.builder()
        datasets, sizes, teachers = ([*datasets, Cycled(RewardScaled(keep_set, 0.0), len(train_set))],
                                     [*sizes, r.keep.batch_size],
                                     [*teachers, keep_client])
    dataset = CompositeDataset(datasets, sizes)
    steps = min(cfg.max_steps or len(dataset), len(dataset))
    manager = checkpoint_utils.CheckpointManager(training_client=student, service_client=service,
                                                 log_path=cfg.log_path, save_every=cfg.save_every,
                                                 store=ml_logger.store)
    await do_sync_training(start_batch=start, end_batch=steps, num_batches=steps, config=cfg,
                           training_client=student, checkpoint_mgr=manager, service_client=service,
                           evaluators=evaluators, dataset=dataset, teacher_clients=teachers,
                           ml_logger=ml_logger, tokenizer=get_tokenizer(cfg.model_name))
    if start < steps:
        await manager.save_final_async(loop_state={"batch": steps})
    ml_logger.close()


class Unprefixed:
    """The cookbook's test-set evaluator without its own "test/" prefix (the distillation loop adds one)."""

    def __init__(self, evaluator: Any):
        self.evaluator = evaluator

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        found = await self.evaluator(sampling_client)
        return {k.removeprefix(f"{self.evaluator.name}/"): v for k, v in found.items()}


class HeldOutKl:
    """teacher_kl on held-out prompts: one student sample per prompt (temperature 1), the teacher's
    logprobs of it, the mean of student - teacher logprob over all sampled tokens. Every prompt is asked at once,
    at most IN_FLIGHT at a time (rlcli.problems.score.capped)."""

    def __init__(self, test_set: Any, teacher_client: Any, max_tokens: int):
        from tinker_cookbook.rl.metric_util import dataset_to_env_group_builders

        self.builders = dataset_to_env_group_builders(test_set)
        self.teacher, self.max_tokens = teacher_client, max_tokens

    async def one(self, env: Any, student: Any) -> tuple[float, int]:
        import tinker

        prompt, stop = await env.initial_observation()
        if hasattr(self.teacher, "register"):  # --teacher-context answer
            self.teacher.register(env, prompt)
        params = tinker.SamplingParams(max_tokens=self.max_tokens, temperature=1.0, stop=stop)
        seq = (await student.sample(prompt, 1, params)).sequences[0]
        if not seq.tokens:
            return 0.0, 0
        full = tinker.ModelInput.from_ints(prompt.to_ints() + list(seq.tokens))
        teacher_lp = (await self.teacher.compute_logprobs_async(full))[prompt.length:]
        return sum(s - t for s, t in zip(seq.logprobs, teacher_lp, strict=True)), len(seq.tokens)

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        import asyncio

        from rlcli.problems.score import capped

        envs = [env for b in self.builders for env in await b.make_envs()]
        one = capped(self.one)
        found = await asyncio.gather(*(one(env, sampling_client) for env in envs))
        tokens = sum(n for _, n in found)
        return {metrics.TEACHER_KL: sum(s for s, _ in found) / tokens} if tokens else {}


class Cycled:
    """A dataset read round and round for `length` batches: --keep's prompts last as long as --prompts."""

    def __init__(self, dataset: Any, length: int):
        self.dataset, self.length = dataset, length

    def __len__(self) -> int:
        return self.length

    def get_batch(self, index: int) -> Sequence[Any]:
        return self.dataset.get_batch(index % len(self.dataset))


class RewardScaled:
    """The training set with every reward times `coef` (0: distillation alone; the teacher KL is all)."""

    def __init__(self, dataset: Any, coef: float, register: Callable[[Any, Any], None] | None = None):
        self.dataset, self.coef, self.register = dataset, coef, register

    def __len__(self) -> int:
        return len(self.dataset)

    def get_batch(self, index: int) -> Sequence[Any]:
        return [ScaledGroup(b, self.coef, self.register) for b in self.dataset.get_batch(index)]


class ScaledGroup:
    def __init__(self, builder: Any, coef: float, register: Callable[[Any, Any], None] | None = None):
        self.builder, self.coef, self.register = builder, coef, register

    async def make_envs(self) -> list[Any]:
        return [ScaledEnv(env, self.coef, self.register) for env in await self.builder.make_envs()]

    async def compute_group_rewards(self, trajectory_group: Any, env_group: Any) -> list[tuple[float, Any]]:
        inner = [e.env for e in env_group]
        return [(reward * self.coef, m) for reward, m in await self.builder.compute_group_rewards(trajectory_group,
                                                                                                  inner)]

    def logging_tags(self) -> list[str]:
        return self.builder.logging_tags()

    async def cleanup(self) -> None:
        if hasattr(self.builder, "cleanup"):
            await self.builder.cleanup()


class ScaledEnv:
    """An env with its reward scaled; with `register`, its prompt handed to the teacher (ContextTeacher)."""

    def __init__(self, env: Any, coef: float, register: Callable[[Any, Any], None] | None = None):
        self.env, self.coef, self.register = env, coef, register

    async def initial_observation(self) -> Any:
        prompt, stop = await self.env.initial_observation()
        if self.register is not None:
            self.register(self.env, prompt)
        return prompt, stop

    async def step(self, action: Any, **kwargs: Any) -> Any:
        result = await self.env.step(action, **kwargs)
        return dataclasses.replace(result, reward=result.reward * self.coef)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


# --- progress and report -----------------------------------------------------------------------


class DistillProgress(run.ProgressLine):
    """One line per step: teacher KL, reward (with --reward-coef), sampled length, loss, route, time."""

    step_key = metrics.BATCH

    def __init__(self, total_steps: int, loss: str, passes: int, with_reward: bool, stream: Any = None):
        super().__init__(total_steps, stream)
        self.route, self.with_reward = f"{loss} {ROUTES[passes]}", with_reward

    def line(self, row: dict[str, Any], step: int, elapsed_s: float) -> str:
        def value(key: str, fmt: str) -> str:
            return format(row[key], fmt) if key in row else "-"

        parts = [f"step {step + 1}/{self.total_steps}", f"teacher KL {value(metrics.TEACHER_KL, '+.4f')}"]
        if self.with_reward:
            parts += [f"reward {value(metrics.REWARD, '+.3f')}", f"correct {value(metrics.CORRECT, '.2f')}"]
        parts += [f"tokens {value(metrics.SAMPLED_TOKENS, '.1f')}", f"loss {value(metrics.LOSS, '+.4f')}",
                  self.route, f"{row.get(metrics.TIME, elapsed_s):.2f}s"]
        if metrics.TEST_TEACHER_KL in row:
            parts.append(f"held-out KL {row[metrics.TEST_TEACHER_KL]:+.4f}")
        if metrics.TEST_CORRECT in row:
            parts.append(f"held-out correct {row[metrics.TEST_CORRECT]:.2f}")
        return "  ".join(parts)


def final_report(folder: Path) -> str:
    rows = read_jsonl(folder / "metrics.jsonl")
    lines = []
    for key, label, fmt in ((metrics.TEACHER_KL, "teacher KL", "+.4f"),
                            (metrics.TEST_TEACHER_KL, "held-out teacher KL", "+.4f"),
                            (metrics.TEST_CORRECT, "held-out correct", ".2f")):
        if seen := [m[key] for m in rows if key in m]:
            lines.append(f"{label} {seen[0]:{fmt}} -> {seen[-1]:{fmt}} ({len(seen)} measurements)")
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final := last_checkpoint(folder, "sampler_path"):
        lines.append(f"final weights: {final['sampler_path']} (state: {final.get('state_path')})")
    return "\n".join(lines)
