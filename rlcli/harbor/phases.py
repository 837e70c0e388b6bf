"""A rollout's phases in one container, in Harbor's order: for each step, its setup, the agent, the verifier.

Each step (a single-step task has one) runs in the same container: its steps/<name>/workdir/ files are
copied into the working directory and its setup.sh runs; the network switches to the agent phase's
policy; the agent (model, oracle or nop) works; the verifier grades it on the verifier's network; the
network returns to the environment's. A step whose grading failed, or whose rewards fall below its
min_reward, ends the rollout (Harbor aborts the remaining steps). The rollout's rewards are the steps'
dicts combined (each key's mean over the graded steps, or the final one), then one number (verify.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlcli.harbor.sandbox import Sandbox, SandboxError
from rlcli.harbor.taskconfig import Step, below_min_reward, combine_step_rewards
from rlcli.harbor.tasks import Task
from rlcli.harbor.verify import grade, scalar_reward


async def begin_step(sandbox: Sandbox, task: Task, step: Step, timeout_s: float) -> None:
    """A step's files and setup.sh (multi-step tasks), then the agent phase's network."""
    run = asyncio.to_thread
    if (files := task.step_workdir(step)) is not None:
        await run(sandbox.put_folder, files, sandbox.workdir, False)
        if (files / "setup.sh").is_file():
            result = await run(sandbox.exec, f"bash {sandbox.workdir}/setup.sh", timeout_s, sandbox.workdir)
            if result.exit_code != 0:
                raise SandboxError(f"step {step.name}: setup.sh exited with {result.exit_code}: "
                                   f"{result.output.strip()[-200:]}")
    await run(sandbox.set_network, step.agent_network.public)


async def end_step(sandbox: Sandbox, task: Task, step: Step, record: Any) -> bool:
    """Grade a step into the record; whether the next step may run."""
    await asyncio.to_thread(sandbox.set_network, task.network.public)
    verdict = await grade(sandbox, task, step)
    prefix = f"step {step.name}: " if step.name else ""
    record.steps.append({"name": step.name, "rewards": verdict.rewards,
                         "grading_error": verdict.grading_error and prefix + verdict.grading_error})
    record.verifier_output += (f"[step {step.name}] " if step.name else "") + verdict.output + "\n"
    if verdict.grading_error:
        return False
    if why := below_min_reward(verdict.rewards, step.min_reward):
        record.aborted = f"{prefix}{why}: the remaining steps were not run"
        return False
    return True


def finish(record: Any, task: Task, reward_key: str | None) -> None:
    """The rollout's rewards from its graded steps (Harbor's multi-step rule), and the number RL uses."""
    graded = [s["rewards"] for s in record.steps if not s["grading_error"]]
    errors = [s["grading_error"] for s in record.steps if s["grading_error"]]
    record.rewards = combine_step_rewards(graded, task.reward_strategy)
    record.reward, error = scalar_reward(record.rewards, reward_key)
    record.grading_error = error or (errors[0] if errors else None)
    if record.grading_error and not graded:
        record.reward = 0.0
