"""`--env replay`: RL on logged conversations. The policy writes a logged assistant turn; a reward scores it.

Each problem (rlcli.problems.traces) renders its prompt conversation with the run's renderer; the sampled
reply is scored by `--reward` (rlcli.problems.rewards; `judge` by rlcli.problems.judge, relative within the
group). Every step's metrics carry the reward's components (env/all/reward/<name>, env/all/format,
env/all/echo, env/all/correct) so a run that games one part shows it; each trajectory's logs carry its
source (FILE:LINE) and trace id, which the recipe writes with the rollouts of every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult, Trajectory
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.utils import logtree

from rlcli.errors import UsageError
from rlcli.problems import rewards, traces
from rlcli.problems.heldout import Data
from rlcli.problems.traces import Problem, Spec


def read(spec: Spec) -> tuple[traces.Traces, rewards.Rubric | None]:
    found = traces.read_traces(spec.path, spec.turn, tools_env=spec.env == "tools")
    if spec.reward == "verdict":
        found = traces.with_verdicts(found)
    return found, rewards.read_rubric(spec.rubric) if spec.rubric else None


def load(spec: Spec, batch_size: int, eval_size: int | None) -> Data:
    """The replay problems checked and split: the Data a run's plan, --resume and builders see."""
    found, rubric = read(spec)
    held_out = traces.eval_size(found.problems, eval_size, spec.path)
    train, _ = traces.split(found.problems, held_out)
    if not train:
        raise UsageError(f"{spec.path}: every problem is held out: lower --eval-size")
    digest = found.sha256 if rubric is None else f"{found.sha256}+{hash_file(spec.rubric)}"
    label = found.label("tool traces" if spec.env == "tools" else "replay traces")
    path = str(Path(spec.path).expanduser().resolve())
    rubric_path = str(Path(spec.rubric).expanduser().resolve()) if spec.rubric else None
    return Data(label, None, len(train), math.ceil(len(train) / batch_size), digest, held_out, spec.label,
                replay=replace(spec, path=path, rubric=rubric_path))


def hash_file(path: str | None) -> str:
    import hashlib

    return hashlib.sha256(Path(path or "").expanduser().read_bytes()).hexdigest()[:16]


def score(problem: Problem, reply: str, spec: Spec, rubric: rewards.Rubric | None) -> tuple[float, dict[str, float]]:
    """(score, its components) of one reply, before the format penalty; judge scores come per group."""
    if rewards.is_echo(reply, problem.last_user()):
        return 0.0, {"echo": 1.0, "correct": 0.0}
    parts: dict[str, float] = {"echo": 0.0}
    if spec.reward in ("match", "judge"):
        parts["correct"] = float(rewards.matches(reply, problem.text, spec.match))
        value = parts["correct"] if spec.reward == "match" else 0.0
    elif spec.reward == "verdict":
        value = rewards.verdict_reward(reply, problem.text, problem.score or 0.0, spec.match)
        parts["correct"], parts["negative_match"] = float(value > 0), float(value < 0)
    else:
        value = rewards.rubric_score(reply, rubric.checks_for(problem.trace_id, problem.source) if rubric else [])
        parts["correct"] = float(value == 1.0)
    if spec.reward != "judge":  # the judge's own score comes per group (rlcli.problems.judge), under the same key
        parts[f"reward/{spec.reward}"] = value
    return value, parts


def renderer_messages(messages: list[dict[str, Any]]) -> list[renderers.Message]:
    """Imported messages as the renderer takes them: tool calls as ToolCall, reasoning left out."""
    out: list[renderers.Message] = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            msg["tool_calls"] = [renderers.ToolCall.model_validate(c) for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if m.get(key):
                msg[key] = m[key]
        out.append(msg)  # type: ignore[arg-type]
    return out


class ReplayEnv(Env):
    """One sample of one problem: the prompt conversation, the reply scored on its own (judge: per group)."""

    def __init__(self, problem: Problem, renderer: renderers.Renderer, spec: Spec, rubric: rewards.Rubric | None):
        self.problem, self.renderer, self.spec, self.rubric = problem, renderer, spec, rubric
        self.reply = ""  # what the policy wrote, for the judge
        self.well_formed = False

    async def initial_observation(self) -> tuple[tinker.ModelInput, Any]:
        prompt = self.renderer.build_generation_prompt(renderer_messages(self.problem.prompt))
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        self.reply = renderers.get_text_content(message)
        self.well_formed = rewards.format_ok(self.reply, termination.is_stop_sequence)
        value, parts = score(self.problem, self.reply, self.spec, self.rubric)
        parts["format"] = float(self.well_formed)
        with logtree.scope_header("Replay"):  # the run folder's train.html: what was asked, said and scored
            logtree.table_from_dict({"source": self.problem.source, "trace_id": self.problem.trace_id,
                                     "logged": self.problem.text, "reply": self.reply,
                                     **{k: f"{v:g}" for k, v in parts.items()}}, caption="Reward components")
        return StepResult(reward=rewards.total(value, self.well_formed), episode_done=True,
                          next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences(), metrics=parts,
                          logs={"source": self.problem.source, "trace_id": self.problem.trace_id})


class ToolsEnv(Env):
    """A tool-using conversation replayed (rlcli.problems.tools_env): the logged calls answer with their outputs."""

    def __init__(self, problem: Problem, renderer: renderers.Renderer, spec: Spec, rubric: Any = None):
        from rlcli.problems.tools_env import Episode, tool_specs

        self.problem, self.renderer, self.episode = problem, renderer, Episode(problem, spec.match)
        system = "\n".join(traces.text_of(m) for m in problem.prompt if m["role"] == "system")
        prefix = renderer.create_conversation_prefix_with_tools(tool_specs(problem.tools), system)
        self.history = prefix + renderer_messages([m for m in problem.prompt if m["role"] != "system"])
        self.reply = ""

    async def initial_observation(self) -> tuple[tinker.ModelInput, Any]:
        return self.renderer.build_generation_prompt(self.history), self.renderer.get_stop_sequences()

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        calls = [c.model_dump() for c in message.get("tool_calls") or []]
        malformed = len(message.get("unparsed_tool_calls") or []) + (not termination.is_clean)
        self.reply = renderers.get_text_content(message)
        observations, done = self.episode.respond(calls, self.reply, malformed)
        stop = self.renderer.get_stop_sequences()
        logs = {"source": self.problem.source, "trace_id": self.problem.trace_id}
        if done:
            parts = self.episode.score()
            return StepResult(reward=parts["reward/tools"], episode_done=True,
                              next_observation=tinker.ModelInput.empty(), next_stop_condition=stop,
                              metrics=parts, logs=logs)
        self.history = [*self.history, message, *renderer_messages(observations)]
        return StepResult(reward=0.0, episode_done=False,
                          next_observation=self.renderer.build_generation_prompt(self.history),
                          next_stop_condition=stop, logs=logs)


@dataclass(frozen=True)
class ReplayGroup(EnvGroupBuilder):
    """group_size samples of one problem; with --reward judge, the judge ranks them together."""

    env_thunk: Any
    num_envs: int
    judge: Any = None  # rlcli.problems.judge.Judge

    async def make_envs(self) -> Sequence[Env]:
        return [self.env_thunk() for _ in range(self.num_envs)]

    async def compute_group_rewards(self, trajectory_group: list[Trajectory],
                                    env_group: Sequence[Env]) -> list[tuple[float, dict[str, float]]]:
        if self.judge is None:
            return [(0.0, {}) for _ in trajectory_group]
        return await self.judge.group_rewards(list(env_group))

    def logging_tags(self) -> list[str]:
        return ["replay"]


class ReplayDataset(RLDataset):
    def __init__(self, groups: list[ReplayGroup], batch_size: int):
        self.groups, self.batch_size = groups, batch_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.groups[index * self.batch_size:(index + 1) * self.batch_size]

    def __len__(self) -> int:
        return math.ceil(len(self.groups) / self.batch_size)


def datasets(spec: Spec, eval_size: int, batch_size: int, group_size: int, renderer: renderers.Renderer,
             seed: int | None = 0, sha256: str | None = None) -> tuple[ReplayDataset, ReplayDataset | None]:
    """(train, held-out test | None); the training problems shuffled with `seed`, the test ones sampled once."""
    import random

    found, rubric = read(spec)
    env_class = ToolsEnv if spec.env == "tools" else ReplayEnv
    if sha256 and not sha256.startswith(found.sha256):
        raise UsageError(f"{spec.path} changed after it was checked: rerun the command")
    judge = None
    if spec.reward == "judge":
        from rlcli.problems.judge import Judge

        judge = Judge.from_settings(spec.judge or {}, rubric)
    train, test = traces.split(found.problems, eval_size)
    if seed is not None:
        random.Random(seed).shuffle(train)

    def group(p: Problem, size: int) -> ReplayGroup:
        return ReplayGroup(partial(env_class, p, renderer, spec, rubric), size, judge if size > 1 else None)

    test_groups = one_each(test, renderer, spec, rubric)
    return (ReplayDataset([group(p, group_size) for p in train], batch_size),
            ReplayDataset(test_groups, len(test_groups)) if test else None)


def one_each(problems: list[Problem], renderer: renderers.Renderer, spec: Spec,
             rubric: rewards.Rubric | None = None, samples: int = 1) -> list[ReplayGroup]:
    """`samples` answers of each problem, each scored alone: the judge ranks a group, so a judged problem is scored
    by match instead (held-out problems, and the loop's evaluation through rlcli.problems.score)."""
    env_class = ToolsEnv if spec.env == "tools" else ReplayEnv
    alone = replace(spec, reward="match") if spec.reward == "judge" else spec
    return [ReplayGroup(partial(env_class, p, renderer, alone, rubric), samples) for p in problems]


@chz.chz
class ReplayBuilder(RLDatasetBuilder):
    """Rereads the checked traces when the recipe asks (the recipe writes builders into config.json)."""

    path: str
    env: str
    turn: str
    reward: str
    match: str
    rubric: str | None
    judge: dict[str, Any] | None
    sha256: str
    eval_size: int
    batch_size: int
    model_name_for_tokenizer: str
    renderer_name: str
    group_size: int
    seed: int = 0

    async def __call__(self) -> tuple[ReplayDataset, ReplayDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        spec = Spec(self.path, self.turn, self.reward, self.match, self.rubric, self.judge, self.env)
        return datasets(spec, self.eval_size, self.batch_size, self.group_size, renderer, self.seed, self.sha256)


def builder(data: Data, model: str, renderer: str, batch_size: int, group_size: int) -> ReplayBuilder:
    spec: Spec = data.replay
    return ReplayBuilder(path=spec.path, env=spec.env, turn=spec.turn, reward=spec.reward, match=spec.match,
                         rubric=spec.rubric, judge=spec.judge, sha256=data.sha256, eval_size=data.held_out,
                         batch_size=batch_size, model_name_for_tokenizer=model, renderer_name=renderer,
                         group_size=group_size)
