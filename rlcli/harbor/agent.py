"""A Harbor rollout: the agent's bash-tool conversation in the task's container, graded, and its record.

`HarborEnv` is a tinker-cookbook Env, so the cookbook's RL loop (and `harbor run --policy model`) samples
each turn, keeping its tokens and logprobs for training. The conversation is rendered by the model's
renderer: its native tool calls where it has them (Qwen3's <tool_call>), else ```bash blocks. Every
step is graded the same way (verify.py, phases.py), whatever ended it (done, --max-turns, --sandbox-timeout,
a reply cut at --max-tokens); a multi-step task's next instruction then arrives as the next user message in
the same conversation and container. `run_scripted` is the oracle and nop policies of `harbor run`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tinker
from tinker_cookbook.renderers.base import Message, Renderer, get_text_content
from tinker_cookbook.rl.types import Env, StepResult

from rlcli.harbor.daemon import DockerGone, DockerRestarted, gone_error, is_gone
from rlcli.harbor.phases import begin_step, end_step, finish
from rlcli.harbor.sandbox import ExecResult, Sandbox, SandboxError, SandboxPool, script_command
from rlcli.harbor.taskconfig import Step
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
LIFETIME_MARGIN_S = 300  # a container outlives its agent phase + verifier by this much at most


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int = 10
    command_timeout_s: float = 120.0
    sandbox_timeout_s: float | None = None  # the agent phase's wall clock; None: the task's [agent] timeout_sec
    # The oracle's solve.sh is one command, but real solutions (builds, installs) often need longer than a
    # model's command gets: it is bounded by the agent phase unless `harbor run --command-timeout` says otherwise.
    solve_timeout_s: float | None = None
    reward_key: str | None = None  # --reward-key: the reward.json key RL uses (default: "reward", else the mean)

    def budget(self, step: Step) -> float:
        return self.sandbox_timeout_s or step.agent_timeout_s

    def solve_budget(self, step: Step) -> float:
        return min(self.solve_timeout_s or float("inf"), self.budget(step))

    def lifetime(self, task: Task) -> float:
        return sum(self.budget(s) + s.verifier_timeout_s + 60 for s in task.steps) + LIFETIME_MARGIN_S


@dataclass
class Record:
    """One rollout as a person reads it: each turn's text and commands, the verdict, what went wrong."""

    task: str
    policy: str
    instruction: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    network: str = ""  # the network its phases had, as task.toml (or --network none) set it
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)  # every key the verifier wrote (steps combined)
    steps: list[dict[str, Any]] = field(default_factory=list)  # each graded step: name, rewards, grading_error
    grading_error: str | None = None  # test.sh wrote no usable reward: scored 0, counted
    error: str | None = None  # the rollout could not finish (the sandbox died, Docker failed)
    stop: str = ""
    aborted: str = ""  # a step below its min_reward: the steps after it did not run
    verifier_output: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what task.toml asked for that rlcli did not apply

    def add_command(self, command: str, result: ExecResult) -> None:
        self.turns[-1]["commands"].append({"command": command, "exit_code": result.exit_code,
                                           "timed_out": result.timed_out, "seconds": round(result.seconds, 2),
                                           "output": result.output})

    @classmethod
    def start(cls, task: Task, policy: str) -> Record:
        return cls(task.name, policy, task.instruction, network=task.describe_network(), notes=list(task.notes))

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
             f"policy {r.policy} · turns {len(r.turns)} · stop: {r.stop or '-'} · network: {r.network} · "
             f"{r.seconds:.1f} s", "", *([f"not applied: {'; '.join(r.notes)}", ""] if r.notes else []),
             *([r.aborted, ""] if r.aborted else []),
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


def outcome_metrics(record: Record) -> dict[str, float]:
    """What the cookbook averages into metrics.jsonl (env/all/<key>) for each rollout."""
    commands = [c for t in record.turns for c in t["commands"]]
    rewards = {f"harbor/reward/{key}": value for key, value in record.rewards.items()}
    return {**rewards, "correct": float(record.reward >= 1.0),
            "harbor/grading_error": float(record.grading_error is not None), "harbor/steps": float(len(record.steps)),
            "harbor/turns": float(len(record.turns)), "harbor/commands": float(len(commands)),
            "harbor/command_timeouts": float(sum(c["timed_out"] for c in commands)),
            "harbor/seconds": record.seconds, f"stop/{record.stop}": 1.0}


def conversation_start(renderer: Renderer, task: Task, settings: AgentSettings) -> tuple[list[Message], bool]:
    """(messages, native tool calls?): the renderer's tool format where it has one, else ```bash blocks."""
    system = SYSTEM_PROMPT.format(timeout=settings.command_timeout_s)
    user = Message(role="user", content=task.steps[0].instruction.strip())
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
    """One agent, one container, one task (its steps in order); single use, as the cookbook's Envs are."""

    def __init__(self, task: Task, renderer: Renderer, settings: AgentSettings, pool: SandboxPool,
                 record_stem: Path | None = None, policy: str = "model"):
        self.task, self.renderer, self.settings, self.pool = task, renderer, settings, pool
        self.record_stem, self.record = record_stem, Record.start(task, policy)
        self.sandbox: Sandbox | None = None
        self.messages: list[Message] = []
        self.native, self.started, self.finished = True, 0.0, False
        self.step_index, self.step_started, self.step_turns = 0, 0.0, 0

    @property
    def current(self) -> Step:
        return self.task.steps[self.step_index]

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[str] | list[int]]:
        self.messages, self.native = conversation_start(self.renderer, self.task, self.settings)
        self.sandbox = await self.pool.open(self.task, self.settings.lifetime(self.task))
        try:
            await begin_step(self.sandbox, self.task, self.current, self.settings.budget(self.current))
        except SandboxError as e:
            await self._failed(e)
            raise
        self.started = self.step_started = time.monotonic()  # after the wait for a sandbox: not the agent's time
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    def _left(self) -> float:
        return self.settings.budget(self.current) - (time.monotonic() - self.step_started)

    async def step(self, action: list[int], *, extra: dict[str, Any] | None = None) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        cut = (extra or {}).get("stop_reason") == "length" or not termination.is_clean
        self.messages.append(message)
        self.record.turns.append({"assistant": get_text_content(message), "commands": []})
        self.step_turns += 1
        calls = [] if cut else parse_calls(message, self.native)
        try:
            replies = [await self._run(call_id, command, error) for call_id, command, error in calls]
            stop = ("max_tokens" if cut else "completed" if not calls else "max_turns"
                    if self.step_turns >= self.settings.max_turns else "rollout_timeout" if self._left() <= 0 else "")
            if not stop:
                self.messages += replies
                prompt = self.renderer.build_generation_prompt(self.messages)
                return StepResult(0.0, False, prompt, self.renderer.get_stop_sequences())
            self.record.stop = stop
            assert self.sandbox is not None
            go_on = await end_step(self.sandbox, self.task, self.current, self.record)
            if go_on and not cut and self.step_index + 1 < len(self.task.steps):
                return await self._next_step(replies)
            finish(self.record, self.task, self.settings.reward_key)
        except SandboxError as e:
            await self._failed(e)
            raise
        await self.close()
        return StepResult(self.record.reward, True, tinker.ModelInput.empty(), self.renderer.get_stop_sequences(),
                          metrics=outcome_metrics(self.record))

    async def _next_step(self, replies: list[Message]) -> StepResult:
        """The next step's instruction as the next user turn, in the same conversation and container."""
        self.step_index, self.step_turns = self.step_index + 1, 0
        assert self.sandbox is not None
        await begin_step(self.sandbox, self.task, self.current, self.settings.budget(self.current))
        self.step_started = time.monotonic()
        self.messages += [*replies, Message(role="user", content=self.current.instruction.strip())]
        return StepResult(0.0, False, self.renderer.build_generation_prompt(self.messages),
                          self.renderer.get_stop_sequences())

    async def _run(self, call_id: str | None, command: str | None, error: str) -> Message:
        if command is None:
            return result_message(call_id, error, self.native)
        left = self._left()
        if left <= 0:
            return result_message(call_id, "not run: the time for this task is up", self.native)
        timeout = min(self.settings.command_timeout_s, left)
        assert self.sandbox is not None
        result = await asyncio.to_thread(self.sandbox.exec, command, timeout)
        self.record.add_command(command, result)
        return result_message(call_id, describe_result(result, timeout), self.native)

    async def _failed(self, error: SandboxError) -> None:
        """The rollout failed with its reason; when the daemon itself went away, the run waits for it (and
        stops when it is not back within --docker-timeout: the pool's on_gone raises)."""
        self.record.error = str(error)
        await self.close()
        if isinstance(error, DockerGone) and self.pool.on_gone is not None:
            await self.pool.on_gone(self.task.name, error)

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


async def run_solution(sandbox: Sandbox, task: Task, step: Step, record: Record, settings: AgentSettings) -> bool:
    """The oracle's move for a step: its solve.sh (or the task's) with [solution] env; whether it timed out."""
    solution = task.solution(step)
    if solution is None:
        raise SandboxError(f"task {task.name} has no solution/solve.sh for --policy oracle")
    await asyncio.to_thread(sandbox.put_folder, solution.parent, "/solution")
    name = f" for step {step.name}" if step.name else ""
    record.turns.append({"assistant": f"(oracle) runs the task's {solution.relative_to(task.path)}{name}",
                         "commands": []})
    command = script_command("/solution/solve.sh")
    result = await asyncio.to_thread(sandbox.exec, command, settings.solve_budget(step), None, env=task.solution_env)
    record.add_command(command, result)
    return result.timed_out


async def run_scripted(task: Task, policy: str, pool: SandboxPool, settings: AgentSettings,
                       record_stem: Path | None) -> Record:
    """`harbor run --policy oracle|nop`: each step's solve.sh (oracle) or nothing (nop), then its verifier."""
    record, sandbox, started = Record.start(task, policy), None, time.monotonic()
    timed_out = False
    try:
        sandbox = await pool.open(task, settings.lifetime(task))
        for step in task.steps:
            await begin_step(sandbox, task, step, settings.budget(step))
            if policy == "oracle":
                timed_out = await run_solution(sandbox, task, step, record, settings) or timed_out
            # Graded either way: a solution killed at its timeout may still have done part of the task.
            record.stop = "timeout" if timed_out else "completed"
            if not await end_step(sandbox, task, step, record):
                break
        finish(record, task, settings.reward_key)
    except SandboxError as e:
        record.error = str(e)
        if isinstance(e, DockerRestarted) and pool.on_gone is not None:  # said once; the run goes on
            await pool.on_gone(task.name, e)
    except Exception as e:
        if not is_gone(e):
            raise
        record.error = str(gone_error(f" (task {task.name})"))
    finally:
        record.seconds = time.monotonic() - started
        await pool.close(sandbox)
        if record_stem is not None:
            record.write(record_stem)
    return record
