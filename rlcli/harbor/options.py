"""The options `rlcli harbor run` and `rlcli train harbor` share, declared once.

Stdlib only: `rlcli harbor run --help` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcli.harbor.daemon import DEFAULT_DOCKER_TIMEOUT_S
from rlcli.harbor.tasks import NetworkChoice
from rlcli.options import Opt, Record

COMMAND_TIMEOUT_S = 120.0  # a model's command, unless --command-timeout says otherwise

COMMAND_TIMEOUT = Opt(f"seconds one command may run before it is killed inside the container (default: "
                      f"{COMMAND_TIMEOUT_S:g}; `harbor run` gives the oracle's solve.sh the agent's whole time)",
                      low=0, above=True)


@dataclass(frozen=True, kw_only=True)
class HarborOptions(Record):
    """Which tasks, and how each rollout runs in its sandbox."""

    task_filter: str | None = Opt("only tasks whose names match these comma-separated globs, e.g. 'fix-*,hello'")(None)
    limit: int | None = Opt("only the first N tasks (by name) after --task-filter", low=1)(None)
    max_turns: int = Opt("most assistant turns per rollout", low=1)(10)
    command_timeout: float | None = COMMAND_TIMEOUT(None)
    sandbox_timeout: float | None = Opt("seconds a rollout's agent phase may take (default: the task's [agent] "
                                        "timeout_sec)", low=0, above=True)(None)
    max_sandboxes: int = Opt("containers alive at once; the rollouts of a step share them", low=1)(4)
    network: NetworkChoice = Opt("task (each phase as task.toml says; Harbor's default is the public network) or "
                                 "none (no network for any task, in any phase)")("task")
    reward_key: str | None = Opt("the reward.json key that is the reward (default: \"reward\" if present, else the "
                                 "mean of the keys)")(None)
    docker_timeout: float = Opt("seconds to wait for a Docker daemon that stopped answering before the run stops "
                                "(the rollouts in flight fail with that reason; sandboxes not yet started wait for it)",
                                low=0, above=True)(DEFAULT_DOCKER_TIMEOUT_S)
