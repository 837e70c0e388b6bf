"""A Harbor rollout: the agent's bash-tool conversation in the task's container, the verifier, the record.

`HarborEnv` is a tinker-cookbook Env, so the cookbook's RL loop (and `harbor run --policy model`) samples
each turn, keeping its tokens and logprobs for training. The conversation is rendered by the model's
renderer: its native tool calls where it has them (Qwen3's <tool_call>), else ```bash blocks. Every
episode is graded the same way, whatever ended it (done, --max-turns, --sandbox-timeout, a reply cut
at --max-tokens): tests/ goes to /tests, test.sh runs, and the reward is read as Harbor reads it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import chz
import tinker
from tinker_cookbook.renderers.base import Message, Renderer, get_text_content
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult

from rlcli.harbor.sandbox import ExecResult, Sandbox, SandboxError, SandboxPool
from rlcli.harbor.tasks import Task

SYSTEM_PROMPT = ("You are an agent in a Linux container, working as root. Do the user's task by running bash "
                 "commands; you see each command's exit code and output, and each may run {timeout:g} s. When the "
                 "task is done, answer without running a command.")
TEXT_PROTOCOL = " To run a command, put it in a ```bash code block (one per answer)."
BASH_TOOL: dict[str, Any] = {
    "name": "bash", "description": "Run a bash command in the task's container; returns its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]},
}
FENCE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.S)
REWARD_DIR = "/logs/verifier"
LIFETIME_MARGIN_S = 300  # a container outlives its agent phase + verifier by this much at most


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int = 10
    command_timeout_s: float = 120.0
    sandbox_timeout_s: float | None = None  # the agent phase's wall clock; None: the task's [agent] timeout_sec

    def budget(self, task: Task) -> float:
        return self.sandbox_timeout_s or task.agent_timeout_s

    def lifetime(self, task: Task) -> float:
        return self.budget(task) + task.verifier_timeout_s + LIFETIME_MARGIN_S


@dataclass
class Record:
    """One rollout as a person reads it: each turn's text and commands, the verdict, what went wrong."""

    task: str
    policy: str
    instruction: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    grading_error: str | None = None  # test.sh wrote no usable reward: scored 0, counted
    error: str | None = None  # the rollout could not finish (the sandbox died, Docker failed)
    stop: str = ""
    verifier_output: str = ""
    seconds: float = 0.0

    def add_command(self, command: str, result: ExecResult) -> None:
        self.turns[-1]["commands"].append({"command": command, "exit_code": result.exit_code,
                                           "timed_out": result.timed_out, "seconds": round(result.seconds, 2),
                                           "output": result.output})

    def write(self, stem: Path) -> None:
        stem.parent.mkdir(parents=True, exist_ok=True)  # not with_suffix: task names may hold dots
        stem.parent.joinpath(stem.name + ".json").write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False)
                                                             + "\n")
        stem.parent.joinpath(stem.name + ".md").write_text(to_markdown(self))


def fenced(text: str, lang: str = "") -> list[str]:
    """A markdown code block that the text's own backticks cannot close."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return [fence + lang, text.rstrip(), fence]


def to_markdown(r: Record) -> str:
    verdict = f"error: {r.error}" if r.error else f"reward {r.reward:g}" + (
        f" (grading error: {r.grading_error})" if r.grading_error else "")
    lines = [f"# {r.task}: {verdict}", "",
             f"policy {r.policy} · turns {len(r.turns)} · stop: {r.stop or '-'} · {r.seconds:.1f} s", "",
             "## Instruction", "", r.instruction.strip(), ""]
    for n, turn in enumerate(r.turns, 1):
        lines += [f"## Turn {n}", "", turn["assistant"].strip() or "(no text)", ""]
        for c in turn["commands"]:
            killed = ", killed at its timeout" if c["timed_out"] else ""
            lines += [f"**command** (exit {c['exit_code']}, {c['seconds']:g} s{killed}):", "",
                      *fenced(c["command"], "bash"), "", "output:", "", *fenced(c["output"]), ""]
    rewards = json.dumps(r.rewards) if r.rewards else "none"
    lines += ["## Verifier", "", f"reward {r.reward:g}, rewards: {rewards}", "", *fenced(r.verifier_output), ""]
    return "\n".join(lines)


def parse_reward(reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float, dict[str, float], str | None]:
    """(reward, all rewards, grading error) from /logs/verifier, as Harbor reads it.

    reward.json is a dict of numbers (its "reward" is the reward, else its only value, else their mean);
    else reward.txt holds one float. Neither, or garbage: reward 0 and the error says why.
    """
    if reward_json is not None:
        try:
            data = json.loads(reward_json)
        except ValueError:
            return 0.0, {}, f"reward.json is not JSON: {reward_json[:80]!r}"
        numbers = isinstance(data, dict) and data and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in data.values())
        if not numbers:
            return 0.0, {}, f"reward.json is not a dict of numbers: {reward_json[:80]!r}"
        rewards = {str(k): float(v) for k, v in data.items()}
        value = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else
                            sum(rewards.values()) / len(rewards))
        return value, rewards, None
    if reward_txt is not None:
        try:
            value = float(reward_txt.decode(errors="replace").strip())
        except ValueError:
            return 0.0, {}, f"reward.txt is not a number: {reward_txt[:80]!r}"
        if not math.isfinite(value):
            return 0.0, {}, f"reward.txt is not a finite number: {value}"
        return value, {"reward": value}, None
    return 0.0, {}, f"test.sh wrote no {REWARD_DIR}/reward.json or reward.txt"


async def grade(sandbox: Sandbox, task: Task, record: Record) -> None:
    """Run the task's tests in the sandbox and put the verdict in record.

    /logs/verifier is emptied first: a reward file the agent wrote itself must not count.
    """
    run = asyncio.to_thread
    await run(sandbox.exec, f"rm -rf {REWARD_DIR} && mkdir -p {REWARD_DIR}", 30, "/")
    await run(sandbox.put_folder, task.path / "tests", "/tests")
    result = await run(sandbox.exec, f"{sandbox.shell} /tests/test.sh", task.verifier_timeout_s, sandbox.workdir)
    files = [await run(sandbox.read_file, f"{REWARD_DIR}/reward.{ext}") for ext in ("json", "txt")]
    record.reward, record.rewards, record.grading_error = parse_reward(*files)
    if record.grading_error and result.timed_out:
        record.grading_error = f"test.sh was killed after {task.verifier_timeout_s:g} s; {record.grading_error}"
    record.verifier_output = f"exit code {result.exit_code}\n{result.output}"


def outcome_metrics(record: Record) -> dict[str, float]:
    """What the cookbook averages into metrics.jsonl (env/all/<key>) for each rollout."""
    commands = [c for t in record.turns for c in t["commands"]]
    return {"correct": float(record.reward >= 1.0), "harbor/grading_error": float(record.grading_error is not None),
            "harbor/turns": float(len(record.turns)), "harbor/commands": float(len(commands)),
            "harbor/command_timeouts": float(sum(c["timed_out"] for c in commands)),
            "harbor/seconds": record.seconds, f"stop/{record.stop}": 1.0}


def conversation_start(renderer: Renderer, task: Task, settings: AgentSettings) -> tuple[list[Message], bool]:
    """(messages, native tool calls?): the renderer's tool format where it has one, else ```bash blocks."""
    system = SYSTEM_PROMPT.format(timeout=settings.command_timeout_s)
    user = Message(role="user", content=task.instruction.strip())
    try:
        return [*renderer.create_conversation_prefix_with_tools([BASH_TOOL], system_prompt=system), user], True
    except NotImplementedError:
        return [Message(role="system", content=system + TEXT_PROTOCOL), user], False


def parse_calls(message: Message, native: bool) -> list[tuple[str | None, str | None, str]]:
    """[(call id, command, error)] the assistant asked for; a call that cannot run has an error instead."""
    if not native:
        found = FENCE.findall(get_text_content(message))
        return [(None, found[0].strip(), "")] if found else []
    calls: list[tuple[str | None, str | None, str]] = []
    for call in message.get("tool_calls") or []:
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            args = None
        command = args.get("command") if isinstance(args, dict) else None
        if call.function.name != "bash" or not isinstance(command, str):
            calls.append((call.id, None, 'error: the only tool is bash, called with {"command": "..."}'))
        else:
            calls.append((call.id, command, ""))
    calls += [(None, None, f"error: the tool call could not be parsed ({bad.error})")
              for bad in message.get("unparsed_tool_calls") or []]
    return calls


def result_message(call_id: str | None, text: str, native: bool) -> Message:
    if not native:
        return Message(role="user", content=f"Output:\n{text}")
    message = Message(role="tool", content=text, name="bash")
    if call_id:
        message["tool_call_id"] = call_id
    return message


def describe_result(result: ExecResult, timeout_s: float) -> str:
    killed = f" (killed: it ran past {timeout_s:g} s)" if result.timed_out else ""
    return f"exit code {result.exit_code}{killed}\n{result.output}"


class HarborEnv(Env):
    """One agent, one container, one task; single use, as the cookbook's Envs are."""

    def __init__(self, task: Task, renderer: Renderer, settings: AgentSettings, pool: SandboxPool,
                 record_stem: Path | None = None, policy: str = "model"):
        self.task, self.renderer, self.settings, self.pool = task, renderer, settings, pool
        self.record_stem, self.record = record_stem, Record(task.name, policy, task.instruction)
        self.sandbox: Sandbox | None = None
        self.messages: list[Message] = []
        self.native, self.started, self.finished = True, 0.0, False

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[str] | list[int]]:
        self.messages, self.native = conversation_start(self.renderer, self.task, self.settings)
        self.sandbox = await self.pool.open(self.task, self.settings.lifetime(self.task))
        self.started = time.monotonic()  # after the wait for a free sandbox: that is not the agent's time
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action: list[int], *, extra: dict[str, Any] | None = None) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        cut = (extra or {}).get("stop_reason") == "length" or not termination.is_clean
        self.messages.append(message)
        self.record.turns.append({"assistant": get_text_content(message), "commands": []})
        calls = [] if cut else parse_calls(message, self.native)
        try:
            replies = [await self._run(call_id, command, error) for call_id, command, error in calls]
            left = self.settings.budget(self.task) - (time.monotonic() - self.started)
            stop = ("max_tokens" if cut else "completed" if not calls else "max_turns"
                    if len(self.record.turns) >= self.settings.max_turns else "rollout_timeout" if left <= 0 else "")
            if not stop:
                self.messages += replies
                prompt = self.renderer.build_generation_prompt(self.messages)
                return StepResult(0.0, False, prompt, self.renderer.get_stop_sequences())
            self.record.stop = stop
            assert self.sandbox is not None
            await grade(self.sandbox, self.task, self.record)
        except SandboxError as e:
            self.record.error = str(e)
            await self.close()
            raise
        await self.close()
        return StepResult(self.record.reward, True, tinker.ModelInput.empty(), self.renderer.get_stop_sequences(),
                          metrics=outcome_metrics(self.record))

    async def _run(self, call_id: str | None, command: str | None, error: str) -> Message:
        if command is None:
            return result_message(call_id, error, self.native)
        left = self.settings.budget(self.task) - (time.monotonic() - self.started)
        if left <= 0:
            return result_message(call_id, "not run: the time for this task is up", self.native)
        timeout = min(self.settings.command_timeout_s, left)
        assert self.sandbox is not None
        result = await asyncio.to_thread(self.sandbox.exec, command, timeout)
        self.record.add_command(command, result)
        return result_message(call_id, describe_result(result, timeout), self.native)

    async def close(self) -> None:
        """Remove the container and write the record (once), however the rollout ended."""
        if self.finished:
            return
        self.finished = True
        self.record.seconds = time.monotonic() - self.started if self.started else 0.0
        if not self.record.stop and not self.record.error:
            self.record.error = "the rollout did not finish (interrupted, or sampling failed)"
        try:
            await self.pool.close(self.sandbox)
        finally:
            if self.record_stem is not None:
                self.record.write(self.record_stem)


async def run_scripted(task: Task, policy: str, pool: SandboxPool, settings: AgentSettings,
                       record_stem: Path | None) -> Record:
    """`harbor run --policy oracle|nop`: solution/solve.sh (oracle) or nothing (nop), then the verifier."""
    record, sandbox, started = Record(task.name, policy, task.instruction), None, time.monotonic()
    try:
        sandbox = await pool.open(task, settings.lifetime(task))
        if policy == "oracle":
            if task.solution is None:
                raise SandboxError(f"task {task.name} has no solution/solve.sh for --policy oracle")
            await asyncio.to_thread(sandbox.put_folder, task.solution.parent, "/solution")
            record.turns.append({"assistant": "(oracle) runs the task's solution/solve.sh", "commands": []})
            command = f"{sandbox.shell} /solution/solve.sh"
            record.add_command(command, await asyncio.to_thread(sandbox.exec, command, settings.budget(task)))
        record.stop = "completed"
        await grade(sandbox, task, record)
    except SandboxError as e:
        record.error = str(e)
    finally:
        record.seconds = time.monotonic() - started
        await pool.close(sandbox)
        if record_stem is not None:
            record.write(record_stem)
    return record


# --- tinker-cookbook wiring: a group of HarborEnvs per task, batches of groups, the dataset builder ------------


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

    async def __call__(self) -> tuple[HarborDataset, HarborDataset | None]:
        from tinker_cookbook.renderers import get_renderer
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        from rlcli.harbor.sandbox import connect
        from rlcli.harbor.tasks import load_task

        renderer = get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        settings = AgentSettings(self.max_turns, self.command_timeout_s, self.sandbox_timeout_s)
        pool = SandboxPool(connect(pool_size=2 * self.max_sandboxes + 8), self.max_sandboxes)
        shared, folder = Shared(renderer, settings, pool), Path(self.trajectories)
        train = [load_task(Path(p), n) for p, n in zip(self.task_paths, self.task_names, strict=True)]
        held = [load_task(Path(p), n) for p, n in zip(self.eval_paths, self.eval_names, strict=True)]
        dataset = HarborDataset(train, self.groups_per_batch, self.group_size, self.steps, shared, folder, self.seed)
        # Held-out tasks: one rollout each, all in one batch, every --eval-every steps. The cookbook's evaluator
        # reuses its groups each time: eval/<task>-0.md, then <task>-0-round2.md, ...
        test = HarborDataset(held, len(held), 1, 1, shared, folder / "eval", per_step=False) if held else None
        return dataset, test
