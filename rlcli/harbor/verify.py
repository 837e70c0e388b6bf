"""The verifier: a task's tests/ go to /tests in the container, test.sh runs, the reward is read as Harbor reads it.

How /logs/verifier becomes one reward (Harbor's rules, so that a task scores the same here as in Harbor):
- reward.txt is read first: one number.
- else reward.json: an object of numbers. Its "reward" entry is the reward; the other entries are
  details kept beside it (the record's `rewards`, e.g. {"reward": 0.5, "passed": 2, "total": 4}).
  An object with a single entry gives that entry, whatever its name (Harbor's metrics read such a
  dict the same way). Several entries and none named "reward" is a grading error: Harbor's own
  metrics refuse that dict too, and any rule picked here (a mean, a max) would guess at the author's intent.
- no file, or one that cannot be read so: reward 0 with a grading error that says why. Grading errors
  are counted (env/all/harbor/grading_error in metrics.jsonl, the run's summary), never passed off as failures.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field

from rlcli.harbor.sandbox import Sandbox
from rlcli.harbor.tasks import Task

REWARD_DIR = "/logs/verifier"


@dataclass
class Verdict:
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    grading_error: str | None = None  # test.sh wrote no usable reward: scored 0, counted
    output: str = ""  # test.sh's exit code and output, for the trajectory


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_reward_txt(data: bytes) -> tuple[float, dict[str, float], str | None]:
    try:
        value = float(data.decode(errors="replace").strip())
    except ValueError:
        return 0.0, {}, f"reward.txt is not a number: {data[:80]!r}"
    if not math.isfinite(value):
        return 0.0, {}, f"reward.txt is not a finite number: {value}"
    return value, {"reward": value}, None


def parse_reward_json(data: bytes) -> tuple[float, dict[str, float], str | None]:
    try:
        doc = json.loads(data)
    except ValueError:
        return 0.0, {}, f"reward.json is not JSON: {data[:80]!r}"
    if not isinstance(doc, dict) or not doc or not all(_number(v) for v in doc.values()):
        return 0.0, {}, f"reward.json is not an object of numbers: {data[:80]!r}"
    rewards = {str(k): float(v) for k, v in doc.items()}
    if "reward" in rewards:
        return rewards["reward"], rewards, None
    if len(rewards) == 1:
        return next(iter(rewards.values())), rewards, None
    return 0.0, rewards, (f'reward.json has {len(rewards)} numbers and no "reward" among them '
                          f"({', '.join(sorted(rewards))}): say which one is the reward")


def parse_reward(reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float, dict[str, float], str | None]:
    """(reward, every number the verifier wrote, grading error or None) from /logs/verifier's files."""
    if reward_txt is not None:
        return parse_reward_txt(reward_txt)
    if reward_json is not None:
        return parse_reward_json(reward_json)
    return 0.0, {}, f"test.sh wrote no {REWARD_DIR}/reward.txt or reward.json"


async def grade(sandbox: Sandbox, task: Task) -> Verdict:
    """Run the task's tests in the sandbox and read the verdict.

    /logs/verifier is emptied first: a reward file the agent wrote itself must not count.
    """
    run = asyncio.to_thread
    await run(sandbox.exec, f"rm -rf {REWARD_DIR} && mkdir -p {REWARD_DIR}", 30, "/")
    await run(sandbox.put_folder, task.path / "tests", "/tests")
    result = await run(sandbox.exec, f"{sandbox.shell} /tests/test.sh", task.verifier_timeout_s, sandbox.workdir)
    files = [await run(sandbox.read_file, f"{REWARD_DIR}/reward.{ext}") for ext in ("json", "txt")]
    reward, rewards, error = parse_reward(*files)
    if error and result.timed_out:
        error = f"test.sh was killed after {task.verifier_timeout_s:g} s; {error}"
    return Verdict(reward, rewards, error, f"exit code {result.exit_code}\n{result.output}")
