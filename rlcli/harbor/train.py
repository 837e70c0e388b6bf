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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlcli.config import resolve_base_url
from rlcli.harbor.options import COMMAND_TIMEOUT, COMMAND_TIMEOUT_S, HarborOptions
from rlcli.harbor.tasks import Task, load_tasks, split_tasks, tasks_hash
from rlcli.options import MAX_TOKENS, option
from rlcli.train import rl_loop, run
from rlcli.train.losses import Passes
from rlcli.train.options import PASSES, SamplingOptions, group_of_two, kept
from rlcli.train.rl_loop import LOSS, RlLoss

RECIPE_NAME = "rlcli_train_harbor"
RESUME_KEYS = ("model", "renderer", "loss", "group_size", "groups_per_batch", "network", "reward_key", "seed")


@dataclass(frozen=True, kw_only=True)
class HarborTrainOptions(SamplingOptions, HarborOptions):
    """`rlcli train harbor`'s options."""

    dataset: str | None = option(None, "a folder of Harbor tasks (or one task folder), or NAME@VERSION such as "
                                       "terminal-bench@2.0")
    loss: RlLoss = LOSS("gspo")
    passes: Passes = PASSES("auto")
    eval_tasks: int = option(0, "hold out N tasks (chosen by name hash) for evaluation; never trained on", low=0)
    eval_dataset: str | None = option(None, "evaluate on this dataset's tasks instead (folder or NAME@VERSION)")
    groups_per_batch: int = option(4, "tasks per step", low=1)
    max_tokens: int = MAX_TOKENS(1024)
    command_timeout: float | None = COMMAND_TIMEOUT(COMMAND_TIMEOUT_S)

    def problems(self) -> Iterator[str]:
        if not self.dataset:
            yield ("pass --dataset DIR (a folder of Harbor tasks, or one task) or --dataset NAME@VERSION "
                   "(e.g. terminal-bench@2.0)")
        if self.eval_tasks and self.eval_dataset:
            yield "--eval-tasks holds tasks out of --dataset, --eval-dataset evaluates on others: pick one"
        yield from group_of_two(self.group_size)
        yield from super().problems()


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


def describe(plan: Any, source: str, train: list[Task], held: list[Task], s: HarborTrainOptions, steps: int) -> str:
    held_text = f", {len(held)} held out for eval every {s.eval_every} steps" if held else ""
    timeout = f"{s.sandbox_timeout:g} s" if s.sandbox_timeout else "the task's [agent] timeout"
    return "\n".join([
        rl_loop.describe_loss(plan),
        f"tasks: {len(train)} to train on from {source}{held_text}",
        f"plan: {s.groups_per_batch} tasks x {s.group_size} rollouts per step, {steps} step"
        f"{'s' * (steps != 1)}; up to {s.max_turns} turns of {s.max_tokens} tokens per rollout",
        f"sandboxes: up to {s.max_sandboxes} at once; {s.command_timeout:g} s per command, {timeout} per rollout",
        f"network: {'off for every task (--network none)' if s.network == 'none' else 'as each task.toml says'}; "
        f"reward: {repr(s.reward_key) + ' key' if s.reward_key else 'reward.json `reward`, else the mean of its keys'}",
        f"model: {s.model}  renderer: {s.renderer}",
    ])


def build_config(folder: Path, url: str, s: HarborTrainOptions, plan: Any, steps: int, train: list[Task],
                 held: list[Task]) -> Any:
    from tinker_cookbook.rl import train as cookbook

    from rlcli.harbor.dataset import HarborDatasetBuilder

    builder = HarborDatasetBuilder(
        task_paths=[str(t.path) for t in train], task_names=[t.name for t in train],
        eval_paths=[str(t.path) for t in held], eval_names=[t.name for t in held], model_name=s.model,
        renderer_name=s.renderer, groups_per_batch=s.groups_per_batch, group_size=s.group_size,
        steps=steps, max_turns=s.max_turns, command_timeout_s=s.command_timeout,
        sandbox_timeout_s=s.sandbox_timeout, max_sandboxes=s.max_sandboxes,
        trajectories=str(folder / "trajectories"), network=s.network, reward_key=s.reward_key,
        docker_timeout_s=s.docker_timeout)
    # Retry a rollout whose sandbox died (3 per group); a task that keeps failing stops the run.
    return cookbook.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model,
                           recipe_name=RECIPE_NAME, max_tokens=s.max_tokens, log_path=str(folder),
                           eval_every=s.eval_every if held else 0, save_every=s.save_every,
                           renderer_name=s.renderer, loss_fn=plan.loss, loss_fn_config=dict(plan.config) or None,
                           lora_rank=s.lora_rank, temperature=s.temperature, base_url=url,
                           max_steps=steps, rollout_error_tolerance=True)


def train_harbor(o: HarborTrainOptions) -> run.Weights | None:
    """Train a LoRA agent with RL on Harbor tasks run in local Docker; each rollout's test verdict is its reward.

    Returns the final weights (None for a dry run)."""
    url = resolve_base_url(o.base_url)
    plan = rl_loop.plan_losses(url, o.loss, o.loss_config, o.passes)  # first: an unservable loss fails early
    t = run.target("harbor", o, url)
    dataset = str(o.dataset)
    train, held = split_tasks(load_tasks(dataset, o.task_filter, o.limit, network=o.network), o.eval_tasks)
    if o.eval_dataset:
        held = load_tasks(o.eval_dataset, None, None, "--eval-dataset", o.network)
    steps = o.max_steps or math.ceil(len(train) / o.groups_per_batch)
    o = replace(o, model=t.model, renderer=t.renderer)
    settings = kept(o, loss=plan.loss, loss_config=dict(plan.config), passes=plan.passes, steps=steps)
    progress = HarborProgress(steps, plan.loss, plan.passes)
    job = run.Job(settings=settings, summary=describe(plan, dataset, train, held, o, steps),
                  digest=("tasks_sha256", tasks_hash(train + held)), same_input="the same --dataset and filters",
                  resume_keys=RESUME_KEYS, progress=progress, around=lambda: sandboxes(train + held, t.folder),
                  info={"dataset": dataset, "tasks": [task.name for task in train],
                        "eval_tasks": [task.name for task in held]},
                  recipe=lambda folder, url: rl_loop.recipe(
                      plan, progress, lambda: build_config(folder, url, o, plan, steps, train, held)),
                  report=lambda folder: f"{rl_loop.final_report(folder)}\n{rollout_summary(folder / 'trajectories')}")
    return run.execute(job, t, o.resume, o.dry_run)


def rollout_summary(trajectories: Path) -> str:
    """Counted from the rollouts' records: grading errors are scored 0 and must not pass unnoticed."""
    records = [json.loads(p.read_text()) for p in trajectories.rglob("*.json")]
    graded = sum(1 for r in records if r.get("grading_error"))
    failed = sum(1 for r in records if r.get("error"))
    return (f"trajectories: {trajectories} ({len(records)} rollouts, {graded} grading errors, "
            f"{failed} failed rollouts)")
