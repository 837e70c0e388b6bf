"""`rlcli train harbor`: agent RL on Harbor tasks in local Docker; the test verdict is the reward.

Launch:  rlcli train harbor --dataset tests/fixtures/harbor --max-steps 20            (gspo, fused when served)
         rlcli train harbor --dataset ~/tb2 --task-filter 'fix-*' --eval-tasks 8 --max-sandboxes 8
         rlcli train harbor --dataset terminal-bench@2.0 --dry-run     (resolve the tasks, print the plan)
         rlcli train harbor --dataset DIR --log-path runs/h --resume    (after a crash)

Built on tinker-cookbook's RL loop (agent.py has its Env, dataset.py its group builder and dataset),
with `train rl`'s loss handling: the loss is planned from what the server serves before anything else,
so an unservable loss fails in under a second; every training client gets the planned route and its
slot is freed however the run ends. Images are built before the model is made. Each rollout's
conversation is written to <run>/trajectories/step-NNNN/<task>-<i>.md (and .json); eval rollouts
under trajectories/eval/.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.config import resolve_base_url
from rlcli.errors import UsageError
from rlcli.harbor.daemon import DEFAULT_DOCKER_TIMEOUT_S
from rlcli.harbor.tasks import NetworkChoice, Task, load_tasks, split_tasks, tasks_hash
from rlcli.train import rl_loop, run
from rlcli.train.losses import Passes
from rlcli.train.rl_loop import RlLoss, RlSettings

RECIPE_NAME = "rlcli_train_harbor"
RESUME_KEYS = ("model", "renderer", "loss", "group_size", "groups_per_batch", "network", "reward_key", "seed")


@dataclass(frozen=True, kw_only=True)
class Settings(RlSettings):
    eval_every: int = 10
    max_tokens: int = 1024
    groups_per_batch: int = 4
    steps: int
    max_turns: int = 10
    command_timeout: float = 120.0
    sandbox_timeout: float | None = None
    max_sandboxes: int = 4
    network: NetworkChoice = "task"
    reward_key: str | None = None
    docker_timeout: float = DEFAULT_DOCKER_TIMEOUT_S


@contextlib.contextmanager
def sandboxes(tasks: list[Task], folder: Path) -> Iterator[Any]:
    """Docker ready with every task's image built; the sandboxes this process made removed afterwards.

    A task whose image cannot be made stops training before the model is made (a run that silently
    trained on fewer tasks than asked would be hard to compare): the line says which, and why. A daemon
    that went away and did not come back within --docker-timeout stops the run: the line says how to go on.
    """
    from rlcli.errors import RlcliError
    from rlcli.harbor.daemon import LOST, DockerGone
    from rlcli.harbor.sandbox import prepare_images, remove_mine
    from rlcli.train.folder import last_checkpoint

    client, failed = prepare_images(tasks)
    if failed:
        remove_mine(client)
        name, why = next(iter(failed.items()))
        raise RlcliError(f"{len(failed)} task image(s) could not be made ({name}: {why}); leave them out with "
                         "--task-filter, or fix them")
    LOST.clear()
    try:
        yield client
    except DockerGone as e:
        last = last_checkpoint(folder, "state_path")
        saved = f"the last checkpoint is {last['name']}" if last else "no checkpoint was saved yet"
        raise DockerGone(f"{e}; {saved}: start the daemon again (it removes this run's containers as it starts), "
                         f"then rerun the same command with --log-path {folder} --resume") from None
    finally:
        remove_mine(client)  # whatever the rollouts could not remove themselves (Ctrl-C, a crash)


class HarborProgress(rl_loop.RlProgress):
    """RL's line per step; then, if the Docker daemon went away and did not come back, the run stops (the
    cookbook trained on without the rollouts that failed, and would go on to save a final checkpoint)."""

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        from rlcli.harbor.daemon import LOST

        super().log_metrics(metrics, step)
        if LOST:
            raise LOST[-1]


def describe(plan: Any, source: str, train: list[Task], held: list[Task], s: Settings) -> str:
    held_text = f", {len(held)} held out for eval every {s.eval_every} steps" if held else ""
    timeout = f"{s.sandbox_timeout:g} s" if s.sandbox_timeout else "the task's [agent] timeout"
    return "\n".join([
        rl_loop.describe_loss(plan),
        f"tasks: {len(train)} to train on from {source}{held_text}",
        f"plan: {s.groups_per_batch} tasks x {s.group_size} rollouts per step, {s.steps} step"
        f"{'s' * (s.steps != 1)}; up to {s.max_turns} turns of {s.max_tokens} tokens per rollout",
        f"sandboxes: up to {s.max_sandboxes} at once; {s.command_timeout:g} s per command, {timeout} per rollout",
        f"network: {'off for every task (--network none)' if s.network == 'none' else 'as each task.toml says'}; "
        f"reward: {repr(s.reward_key) + ' key' if s.reward_key else 'reward.json `reward`, else the mean of its keys'}",
        f"model: {s.model}  renderer: {s.renderer}",
    ])


def build_config(folder: Path, url: str, s: Settings, train: list[Task], held: list[Task]) -> Any:
    from tinker_cookbook.rl import train as cookbook

    from rlcli.harbor.dataset import HarborDatasetBuilder

    builder = HarborDatasetBuilder(
        task_paths=[str(t.path) for t in train], task_names=[t.name for t in train],
        eval_paths=[str(t.path) for t in held], eval_names=[t.name for t in held], model_name=s.model,
        renderer_name=s.renderer, groups_per_batch=s.groups_per_batch, group_size=s.group_size,
        steps=s.steps, max_turns=s.max_turns, command_timeout_s=s.command_timeout,
        sandbox_timeout_s=s.sandbox_timeout, max_sandboxes=s.max_sandboxes,
        trajectories=str(folder / "trajectories"), network=s.network, reward_key=s.reward_key,
        docker_timeout_s=s.docker_timeout)
    # Retry a rollout whose sandbox died (3 per group); a task that keeps failing stops the run.
    return cookbook.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model,
                           recipe_name=RECIPE_NAME, max_tokens=s.max_tokens, log_path=str(folder),
                           eval_every=s.eval_every if held else 0, save_every=s.save_every,
                           renderer_name=s.renderer, loss_fn=s.loss, loss_fn_config=s.loss_config or None,
                           lora_rank=s.lora_rank, temperature=s.temperature, base_url=url,
                           max_steps=s.steps, rollout_error_tolerance=True)


def train_harbor(dataset: str | None = None, loss: RlLoss = "gspo", loss_config: str | None = None,
                 passes: Passes = "auto", model: str | None = None, base_url: str | None = None,
                 renderer: str | None = None, task_filter: str | None = None, limit: int | None = None,
                 eval_tasks: int = 0, eval_dataset: str | None = None, eval_every: int = 10,
                 group_size: int = run.GROUP_SIZE, groups_per_batch: int = 4, max_turns: int = 10,
                 max_tokens: int = 1024, temperature: float = run.TEMPERATURE, lr: float = run.RL_LR,
                 lora_rank: int = run.LORA_RANK, command_timeout: float = 120.0, sandbox_timeout: float | None = None,
                 max_sandboxes: int = 4, max_steps: int | None = None, save_every: int = run.SAVE_EVERY,
                 log_path: str | None = None, resume: bool = False, network: NetworkChoice = "task",
                 reward_key: str | None = None, dry_run: bool = False, seed: int = run.SEED,
                 server_timeout: float = run.SERVER_TIMEOUT, docker_timeout: float = DEFAULT_DOCKER_TIMEOUT_S) -> int:
    """Train a LoRA agent with RL on Harbor tasks run in local Docker; each rollout's test verdict is its reward.

    Args:
        dataset: a folder of Harbor tasks (or one task folder), or NAME@VERSION such as terminal-bench@2.0
        loss: gspo, cispo, dppo, ppo or importance_sampling (as `rlcli train rl`)
        loss_config: JSON object of loss settings, e.g. '{"clip_high_threshold": 1.0005}'
        passes: auto (fused when the server serves the loss, else the exact 2-pass form), 1 or 2
        model: the server's base model, exactly as it was started (default: ask the server)
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        task_filter: only tasks whose names match these comma-separated globs, e.g. 'fix-*,hello'
        limit: only the first N tasks (by name) after --task-filter
        eval_tasks: hold out N tasks (chosen by name hash) for evaluation; never trained on
        eval_dataset: evaluate on this dataset's tasks instead (folder or NAME@VERSION)
        eval_every: evaluate the held-out tasks every N steps (0: never)
        group_size: rollouts per task per step; rewards are compared within a group
        groups_per_batch: tasks per step
        max_turns: most assistant turns per rollout
        max_tokens: most sampled tokens per turn
        temperature: sampling temperature
        lr: Adam learning rate
        lora_rank: LoRA rank (the server caps it; SkyRL's jax backend at 32 by default)
        command_timeout: seconds one command may run before it is killed inside the container
        sandbox_timeout: seconds a rollout's agent phase may take (default: the task's [agent] timeout_sec)
        max_sandboxes: containers alive at once; the rollouts of a step share them
        max_steps: stop after N steps (default: one pass over the tasks)
        save_every: save a resumable checkpoint every N steps (0: only the final one)
        log_path: run folder (default: RLCLI_HOME/runs/harbor-<time>)
        resume: continue the run in --log-path (default: the newest harbor run) from its last checkpoint
        network: task (each phase as task.toml says; Harbor's default is the public network) or none (no network)
        reward_key: the reward.json key that is the reward (default: "reward" if present, else the mean of the keys)
        dry_run: plan the loss, find the tasks, print the plan; make no model and no container
        seed: the run's seed (the LoRA's initialisation and every sampling seed; kept in the run folder)
        server_timeout: seconds the server may go without answering before the run stops (0: wait for ever)
        docker_timeout: seconds to wait for a Docker daemon that stopped answering before the run stops (the
            rollouts in flight fail with that reason; sandboxes not yet started wait for it)
    """
    if not dataset:
        raise UsageError("pass --dataset DIR (a folder of Harbor tasks, or one task) or --dataset NAME@VERSION "
                         "(e.g. terminal-bench@2.0)")
    if eval_tasks and eval_dataset:
        raise UsageError("--eval-tasks holds tasks out of --dataset, --eval-dataset evaluates on others: pick one")
    run.check_numbers(group_size=group_size, max_tokens=max_tokens, lora_rank=lora_rank, max_steps=max_steps,
                      save_every=save_every, eval_every=eval_every, lr=lr, temperature=temperature,
                      groups_per_batch=groups_per_batch, max_turns=max_turns, max_sandboxes=max_sandboxes,
                      command_timeout=command_timeout, sandbox_timeout=sandbox_timeout, limit=limit,
                      eval_tasks=eval_tasks, seed=seed, docker_timeout=docker_timeout)
    url = resolve_base_url(base_url)
    plan = rl_loop.plan_losses(url, loss, loss_config, passes)  # first: an unservable loss fails before real work
    t = run.target("harbor", log_path, resume, url, model, renderer, dry_run, server_timeout)
    train, held = split_tasks(load_tasks(dataset, task_filter, limit, network=network), eval_tasks)
    if eval_dataset:
        held = load_tasks(eval_dataset, None, None, "--eval-dataset", network)
    s = Settings(model=t.model, renderer=t.renderer, loss=plan.loss, loss_config=dict(plan.config),
                 passes=plan.passes, group_size=group_size, groups_per_batch=groups_per_batch,
                 steps=max_steps or math.ceil(len(train) / groups_per_batch), max_turns=max_turns,
                 max_tokens=max_tokens, temperature=temperature, lr=lr, lora_rank=lora_rank, eval_every=eval_every,
                 command_timeout=command_timeout, sandbox_timeout=sandbox_timeout, max_sandboxes=max_sandboxes,
                 save_every=save_every, max_steps=max_steps, network=network, reward_key=reward_key, seed=seed,
                 docker_timeout=docker_timeout)
    progress = HarborProgress(s.steps, plan.loss, plan.passes)
    job = run.Job(settings=s, summary=describe(plan, dataset, train, held, s),
                  digest=("tasks_sha256", tasks_hash(train + held)), same_input="the same --dataset and filters",
                  resume_keys=RESUME_KEYS, progress=progress, around=lambda: sandboxes(train + held, t.folder),
                  info={"dataset": dataset, "tasks": [task.name for task in train],
                        "eval_tasks": [task.name for task in held]},
                  recipe=lambda folder, url: rl_loop.recipe(
                      plan, progress, lambda: build_config(folder, url, s, train, held)),
                  report=lambda folder: f"{rl_loop.final_report(folder)}\n{rollout_summary(folder / 'trajectories')}")
    return run.execute(job, t, resume, dry_run)


def rollout_summary(trajectories: Path) -> str:
    """Counted from the rollouts' records: grading errors are scored 0 and must not pass unnoticed."""
    records = [json.loads(p.read_text()) for p in trajectories.rglob("*.json")]
    graded = sum(1 for r in records if r.get("grading_error"))
    failed = sum(1 for r in records if r.get("error"))
    return (f"trajectories: {trajectories} ({len(records)} rollouts, {graded} grading errors, "
            f"{failed} failed rollouts)")
