"""tinker-cookbook wiring for `rlcli train harbor`: a group of HarborEnvs per task, batches of groups, the builder.

The cookbook's RL loop asks the builder (plain fields, written into config.json) for a training and an
eval dataset; each batch is groups_per_batch tasks, each group group_size rollouts of one task whose
rewards are compared within the group. Every env of a run shares one renderer and one SandboxPool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import chz
from tinker_cookbook.renderers import get_renderer
from tinker_cookbook.renderers.base import Renderer
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from rlcli.harbor.agent import AgentSettings, HarborEnv
from rlcli.harbor.daemon import DEFAULT_DOCKER_TIMEOUT_S, DockerWatch
from rlcli.harbor.sandbox import SandboxPool, connect
from rlcli.harbor.tasks import Task, load_task


@dataclass
class Shared:
    """What every env of a run shares: made once, inside the recipe's event loop."""

    renderer: Renderer
    settings: AgentSettings
    pool: SandboxPool


class HarborGroup(EnvGroupBuilder):
    """group_size rollouts of one task; rewards are compared within the group. Containers start lazily
    (in each env's first observation), so a retried rollout or an eval round costs no idle sandboxes."""

    def __init__(self, task: Task, group_size: int, shared: Shared, folder: Path | None):
        self.task, self.group_size, self.shared, self.folder = task, group_size, shared, folder
        self.rounds, self.envs = 0, []  # every env ever made, so cleanup reaches those of earlier rounds too

    async def make_envs(self) -> list[HarborEnv]:
        self.rounds += 1  # the cookbook calls again to retry a failed rollout, and its evaluator each round
        suffix = "" if self.rounds == 1 else f"-round{self.rounds}"
        envs = [HarborEnv(self.task, self.shared.renderer, self.shared.settings, self.shared.pool,
                          self.folder / f"{self.task.name.replace('/', '_')}-{i}{suffix}" if self.folder else None)
                for i in range(self.group_size)]
        self.envs += envs
        return envs

    async def cleanup(self) -> None:
        for env in self.envs:
            await env.close()

    def logging_tags(self) -> list[str]:
        return ["harbor"]


class HarborDataset(RLDataset):
    """`steps` batches of groups_per_batch tasks, cycling through the tasks in a fresh order each pass."""

    def __init__(self, tasks: list[Task], groups_per_batch: int, group_size: int, steps: int, shared: Shared,
                 folder: Path | None, seed: int = 0, per_step: bool = True):
        self.tasks, self.groups_per_batch, self.group_size, self.steps = tasks, groups_per_batch, group_size, steps
        self.shared, self.folder, self.seed, self.per_step = shared, folder, seed, per_step

    def task_at(self, position: int) -> Task:
        rounds, index = divmod(position, len(self.tasks))
        return self.tasks[random.Random(self.seed + rounds).sample(range(len(self.tasks)), len(self.tasks))[index]]

    def get_batch(self, index: int) -> list[HarborGroup]:
        folder = self.folder / f"step-{index + 1:04d}" if self.folder and self.per_step else self.folder
        return [HarborGroup(self.task_at(index * self.groups_per_batch + k), self.group_size, self.shared, folder)
                for k in range(self.groups_per_batch)]

    def __len__(self) -> int:
        return self.steps


@chz.chz
class HarborDatasetBuilder(RLDatasetBuilder):
    """Plain fields only: the recipe writes its builder into config.json."""

    task_paths: list[str]
    task_names: list[str]
    eval_paths: list[str]
    eval_names: list[str]
    model_name: str
    renderer_name: str
    groups_per_batch: int
    group_size: int
    steps: int
    max_turns: int
    command_timeout_s: float
    sandbox_timeout_s: float | None
    max_sandboxes: int
    trajectories: str
    seed: int = 0
    network: str = "task"  # --network: "none" turns every phase off
    reward_key: str | None = None
    docker_timeout_s: float = DEFAULT_DOCKER_TIMEOUT_S  # --docker-timeout

    async def __call__(self) -> tuple[HarborDataset, HarborDataset | None]:
        renderer = get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        settings = AgentSettings(self.max_turns, self.command_timeout_s, self.sandbox_timeout_s,
                                 reward_key=self.reward_key)
        pool = SandboxPool(connect(pool_size=2 * self.max_sandboxes + 8), self.max_sandboxes,
                           on_gone=DockerWatch(self.docker_timeout_s).check)
        shared, folder = Shared(renderer, settings, pool), Path(self.trajectories)
        train = [load_task(Path(p), n, self.network) for p, n in zip(self.task_paths, self.task_names, strict=True)]
        held = [load_task(Path(p), n, self.network) for p, n in zip(self.eval_paths, self.eval_names, strict=True)]
        dataset = HarborDataset(train, self.groups_per_batch, self.group_size, self.steps, shared, folder, self.seed)
        # Held-out tasks: one rollout each, all in one batch, every --eval-every steps. The cookbook's evaluator
        # reuses its groups each time: eval/<task>-0.md, then <task>-0-round2.md, ...
        test = HarborDataset(held, len(held), 1, 1, shared, folder / "eval", per_step=False) if held else None
        return dataset, test
