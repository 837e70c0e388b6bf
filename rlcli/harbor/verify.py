"""The verifier: a step's tests go to /tests in the container, test.sh runs, the reward is read as Harbor reads it.

How /logs/verifier becomes rewards (Harbor 0.25's rules, so that a task scores the same here as in Harbor):
- reward.json is read first: an object of numbers, kept whole (the record's `rewards`, every key in
  metrics.jsonl as env/all/harbor/reward/<key>).
- else reward.txt: one number, kept as {"reward": number}.
- no file, or one that cannot be read so: reward 0 with a grading error that says why. Grading errors
  are counted (env/all/harbor/grading_error in metrics.jsonl, the run's summary), never passed off as failures.
RL needs one number from that dict (`scalar_reward`): --reward-key KEY picks one key; without it, a
"reward" key is the reward (Harbor's single-number convention, which its min_reward gates read), and a
dict without one gives the mean of its keys (as Harbor's mean metric averages each key).
A multi-step task combines its steps' dicts first (taskconfig.combine_step_rewards), then takes the number.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field

from rlcli.harbor.sandbox import Sandbox, script_command
from rlcli.harbor.taskconfig import Step
from rlcli.harbor.tasks import Task

REWARD_DIR = "/logs/verifier"


@dataclass
class Verdict:
    rewards: dict[str, float] = field(default_factory=dict)
    grading_error: str | None = None  # test.sh wrote no usable reward: scored 0, counted
    output: str = ""  # test.sh's exit code and output, for the trajectory


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_reward_txt(data: bytes) -> tuple[dict[str, float], str | None]:
    try:
        value = float(data.decode(errors="replace").strip())
    except ValueError:
        return {}, f"reward.txt is not a number: {data[:80]!r}"
    if not math.isfinite(value):
        return {}, f"reward.txt is not a finite number: {value}"
    return {"reward": value}, None


def parse_reward_json(data: bytes) -> tuple[dict[str, float], str | None]:
    try:
        doc = json.loads(data)
    except ValueError:
        return {}, f"reward.json is not JSON: {data[:80]!r}"
    if not isinstance(doc, dict) or not doc or not all(_number(v) for v in doc.values()):
        return {}, f"reward.json is not an object of numbers: {data[:80]!r}"
    return {str(k): float(v) for k, v in doc.items()}, None


def parse_reward(reward_json: bytes | None, reward_txt: bytes | None) -> tuple[dict[str, float], str | None]:
    """(every number the verifier wrote, grading error or None) from /logs/verifier's files."""
    if reward_json is not None:
        return parse_reward_json(reward_json)
    if reward_txt is not None:
        return parse_reward_txt(reward_txt)
    return {}, f"test.sh wrote no {REWARD_DIR}/reward.json or reward.txt"


def scalar_reward(rewards: dict[str, float], reward_key: str | None = None) -> tuple[float, str | None]:
    """(the one number RL trains on, grading error or None) from a rewards dict (see the module doc)."""
    if not rewards:
        return 0.0, None
    if reward_key:
        if reward_key not in rewards:
            return 0.0, f"--reward-key {reward_key} is not among the rewards ({', '.join(sorted(rewards))})"
        return rewards[reward_key], None
    if "reward" in rewards:
        return rewards["reward"], None
    return sum(rewards.values()) / len(rewards), None


async def grade(sandbox: Sandbox, task: Task, step: Step) -> Verdict:
    """Run a step's tests in the sandbox, on the verifier's network, and read the verdict.

    /logs/verifier and /tests are emptied first: a reward file the agent wrote itself must not count.
    """
    run = asyncio.to_thread
    await run(sandbox.set_network, step.verifier_network.public)
    try:
        await run(sandbox.exec, f"rm -rf {REWARD_DIR} && mkdir -p {REWARD_DIR}", 30, "/")
        folders, script = task.tests(step)
        for n, folder in enumerate(folders):
            await run(sandbox.put_folder, folder, "/tests", n == 0)
        result = await run(sandbox.exec, script_command(f"/tests/{script}"), step.verifier_timeout_s,
                           sandbox.workdir, env=step.verifier_env)
        files = [await run(sandbox.read_file, f"{REWARD_DIR}/reward.{ext}") for ext in ("json", "txt")]
    finally:
        await run(sandbox.set_network, task.network.public)
    rewards, error = parse_reward(*files)
    if error and result.timed_out:
        error = f"test.sh was killed after {step.verifier_timeout_s:g} s; {error}"
    return Verdict(rewards, error, f"exit code {result.exit_code}\n{result.output}")
