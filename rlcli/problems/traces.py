"""Imported traces as RL problems: the prompt is a conversation up to an assistant turn, the target that turn.

Pure (no cookbook, no model): `rlcli train rl --env replay|tools`, `rlcli eval` and `rlcli synth qa` read
traces here. A trace file is what `rlcli import` writes: one conversation per line, {"messages": [...],
"tools"?, "run_id"?, "trace_id"?, "feedback"?, "score"?}. Each problem keeps where it came from
(FILE:LINE and the trace id), and every turn that does not become a problem is counted under a reason.

Held out by a stable hash of the prompt, never of the reply: the `eval_size` distinct prompts with the
smallest SHA-256 of their canonical JSON are scored, not trained on, whatever order the file is in
and whatever the logged replies say; every copy of such a prompt leaves training.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rlcli.data.validate import conversation_problem, numbered_json_lines
from rlcli.errors import UsageError
from rlcli.options import Opt, Record
from rlcli.problems import rewards

Turn = Literal["last", "all"]
Env = Literal["problems", "replay", "tools"]  # what `train rl` and `eval` run: a problem set, or traces
TRACES_HINT = "conversations as `rlcli import` writes them: run `rlcli import FILE -f FORMAT -o traces.jsonl` first"


@dataclass(frozen=True)
class Problem:
    """One assistant turn to reproduce: what came before it, what was logged, and where it came from."""

    prompt: list[dict[str, Any]]
    reply: dict[str, Any]  # the logged assistant message (content, maybe tool_calls)
    source: str  # FILE:LINE
    trace_id: str = ""  # trace_id, else run_id, else ""
    score: float | None = None  # the conversation's verdict (rlcli import's mean feedback score)
    tools: list[dict[str, Any]] = field(default_factory=list)
    after: list[dict[str, Any]] = field(default_factory=list)  # the logged turns after `reply` (tool results...)

    @property
    def key(self) -> str:
        return prompt_key(self.prompt)

    @property
    def text(self) -> str:
        return text_of(self.reply)

    def last_user(self) -> str:
        return next((text_of(m) for m in reversed(self.prompt) if m["role"] == "user"), "")


@dataclass(frozen=True)
class Traces:
    source: str
    problems: list[Problem]
    skipped: Counter[str]  # turns (or lines) that became no problem, by reason
    sha256: str  # of the problems as read: what --resume and the builders check

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return f"{len(self.problems)} problems" + (f" (skipped: {skipped})" if skipped else "")

    def label(self, kind: str) -> str:
        """What the plan line calls the file: its kind, its path, and what was skipped."""
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return f"{kind} {self.source}" + (f" (skipped: {skipped})" if skipped else "")


def text_of(message: dict[str, Any]) -> str:
    """A message's text: its content string, or its text parts joined (the shape allows a list of parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text")


def prompt_key(prompt: list[dict[str, Any]]) -> str:
    """The SHA-256 of a prompt's canonical JSON: its identity for the held-out split."""
    return hashlib.sha256(json.dumps(prompt, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def turn_indices(messages: list[dict[str, Any]], turn: str, tools_env: bool = False) -> list[int]:
    """The assistant turns that become problems; with tools_env, the turns that start a run of tool calls."""
    if tools_env:
        found = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")
                 and not (i and messages[i - 1]["role"] in ("tool", "assistant"))]
    else:
        found = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return found[-1:] if turn == "last" else found


def until_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    end = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    return messages[:end]


def conversation_problems(conv: dict[str, Any], where: str, turn: str, tools_env: bool,
                          skipped: Counter[str]) -> list[Problem]:
    """The problems one conversation gives, each skipped turn counted under its reason."""
    messages = conv["messages"]
    trace = str(conv.get("trace_id") or conv.get("run_id") or "")
    found = []
    indices = turn_indices(messages, turn, tools_env)
    if tools_env and not indices:
        skipped["no_tool_call"] += 1
    for i in indices:
        reply = messages[i]
        if not any(m["role"] == "user" for m in messages[:i]):
            skipped["no_user_turn_before"] += 1
        elif tools_env:
            found.append(Problem(messages[:i], reply, where, trace, rewards.verdict_of(conv),
                                 conv.get("tools") or [], until_user(messages[i + 1:])))
        elif not text_of(reply).strip():
            skipped["tool_call_turn" if reply.get("tool_calls") else "empty_reply"] += 1
        else:
            found.append(Problem(messages[:i], reply, where, trace, rewards.verdict_of(conv)))
    return found


def is_traces_file(path: str) -> bool:
    """Whether a JSONL file's first record is a conversation ({"messages": [...]}), as `rlcli import` writes;
    False for anything else (its own reader then says what is wrong)."""
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        obj = json.loads(first) if first else None
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and "messages" in obj


def parse_traces(lines: Any, source: str, turn: str = "last", tools_env: bool = False) -> Traces:
    problems: list[Problem] = []
    skipped: Counter[str] = Counter()
    name = Path(source).name
    for number, obj in numbered_json_lines(lines, source):
        if why := conversation_problem(obj):
            raise UsageError(f"{source} line {number}: {why}; expected {TRACES_HINT}")
        got = conversation_problems(obj, f"{name}:{number}", turn, tools_env, skipped)
        if tools_env and got and not got[0].tools:
            skipped["no_tool_schemas"] += len(got)
            continue
        problems += got
    payload = "".join(json.dumps([p.prompt, p.reply, p.source, p.score, p.tools], sort_keys=True) + "\n"
                      for p in problems)
    return Traces(source, problems, skipped, hashlib.sha256(payload.encode()).hexdigest())


def read_traces(path: str, turn: str = "last", tools_env: bool = False) -> Traces:
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            traces = parse_traces(f, path, turn, tools_env)
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"no traces file at {path}: pass {TRACES_HINT}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text ({e.reason}): convert it to UTF-8 JSONL") from None
    if not traces.problems:
        what = "an assistant turn with tool calls and tool schemas" if tools_env else "an assistant reply with text"
        raise UsageError(f"{path} has no problems ({traces.summary()}): it needs {what} after a user turn")
    return traces


def first_problems(rows: list[dict[str, Any]], limit: int, source: str) -> list[Problem]:
    """The last assistant turn of each conversation, one problem per distinct prompt: the `limit` with the smallest
    prompt hash (a stable subset as the rows grow)."""
    if not rows:
        return []
    found = parse_traces(iter(json.dumps(r) for r in rows), source).problems
    unique = {p.key: p for p in found}
    return [unique[k] for k in sorted(unique)[:limit]]


def with_verdicts(traces: Traces) -> Traces:
    """Only problems with a verdict (the verdict reward needs one); the others counted as skipped."""
    kept = [p for p in traces.problems if p.score is not None]
    skipped = traces.skipped + Counter({"no_verdict": len(traces.problems) - len(kept)})
    if not kept:
        raise UsageError(f"{traces.source}: no conversation has a verdict: --reward verdict needs a \"score\" "
                         "(rlcli import -f langsmith attaches the mean feedback score)")
    return Traces(traces.source, kept, +skipped, traces.sha256)


def eval_size(problems: list[Problem], asked: int | None, source: str) -> int:
    """As heldout.file_eval_size: by default 32 prompts, at most a tenth of the distinct ones."""
    from rlcli.problems.heldout import held_out_size

    return held_out_size(len({p.key for p in problems}), asked, source, "prompts")


def split(problems: list[Problem], size: int) -> tuple[list[Problem], list[Problem]]:
    """(train, test): the `size` distinct prompts with the smallest hash are held out, each once."""
    held = set(sorted({p.key for p in problems})[:size])
    test, seen = [], set()
    for p in problems:
        if p.key in held and p.key not in seen:
            seen.add(p.key)
            test.append(p)
    return [p for p in problems if p.key not in held], test


# --- how a replay run scores -------------------------------------------------------------------


Reward = Literal["match", "verdict", "rubric", "judge"]
ENV = Opt("problems (--dataset is a problem set), or replay: --dataset is traces from `rlcli import`, the policy "
          "writes a logged assistant turn and --reward scores it; or tools: traces that called tools, the logged "
          "calls answer with their recorded output (answer match + call precision/recall)")
REWARD = Opt("with --env replay: match (the logged reply), verdict (good-verdict replies are targets, bad ones "
             "penalised), rubric (--rubric checks) or judge (a judge model ranks each group; training only)")
MATCH = Opt("how a reply matches the logged one: exact, normalized, number, or regex:PATTERN")
TURN = Opt("with --env replay: the last assistant turn of each conversation, or all of them")
RUBRIC = Opt("JSON file of checks (contains, not_contains, regex, min/max_length, json, json_schema)")


@dataclass(frozen=True, kw_only=True)
class ReplayOptions(Record):
    """How traces become problems and how a reply is scored (spec_from_flags checks them together)."""

    env: Env = ENV("problems")
    reward: Reward = REWARD("match")
    match: str = MATCH("normalized")
    turn: Turn = TURN("last")
    rubric: str | None = RUBRIC(None)


@dataclass(frozen=True)
class Spec:
    """What a replay run reads and how it scores: settled before the run, rebuilt by the builder."""

    path: str
    turn: str = "last"
    reward: str = "match"
    match: str = "normalized"
    rubric: str | None = None
    judge: dict[str, Any] | None = None  # rlcli.problems.judge.Judge settings, for --reward judge
    env: str = "replay"  # or tools (rlcli.problems.tools_env)

    def on_server(self, url: str) -> Spec:
        """A Tinker judge without --judge-url runs on the training server."""
        if self.judge and self.judge["kind"] == "tinker" and not self.judge.get("url"):
            return replace(self, judge={**self.judge, "url": url})
        return self

    @property
    def label(self) -> str:
        scored = {"match": f"match {self.match}", "verdict": f"verdict, match {self.match}",
                  "rubric": f"rubric {self.rubric}", "judge": "judge"}[self.reward]
        if self.env == "tools":
            return f"tools:answer match {self.match}, call precision/recall/turn:{self.turn}"
        return f"replay/{self.reward}:{scored}/turn:{self.turn}"


def check_spec(reward: str, match: str, rubric: str | None, judge: dict[str, Any] | None) -> None:
    rewards.check_match(match)
    if reward == "rubric" and not rubric:
        raise UsageError("--reward rubric needs --rubric FILE.json: " + rewards.RUBRIC_HINT)
    if rubric and reward not in ("rubric", "judge"):
        raise UsageError(f"--rubric is for --reward rubric or judge, not {reward}: drop it")
    if reward == "judge" and not judge:
        raise UsageError("--reward judge needs a judge: --judge base|tinker://..., or --judge-openai URL "
                         "--judge-model NAME")
    if judge and reward != "judge":
        raise UsageError(f"judge flags are for --reward judge, not {reward}: drop them")


def judge_settings(judge: str | None, judge_url: str | None, judge_openai: str | None,
                   judge_model: str | None) -> dict[str, Any] | None:
    """The judge flags as one record: a model on a Tinker server, or an OpenAI-compatible endpoint."""
    if judge_openai:
        if judge or judge_url:
            raise UsageError("--judge-openai names the judge already: drop --judge and --judge-url")
        if not judge_model:
            raise UsageError("--judge-openai URL needs --judge-model NAME (the model the endpoint serves)")
        return {"kind": "openai", "url": judge_openai, "model": judge_model}
    if judge_model and not judge:
        raise UsageError("--judge-model is for --judge-openai: drop it, or pass --judge-openai URL")
    if judge_url and not judge:
        judge = "base"
    if not judge:
        return None
    if judge != "base" and not judge.startswith("tinker://"):
        raise UsageError(f"--judge {judge}: give base (the server's base model) or tinker://RUN/sampler_weights/ID")
    return {"kind": "tinker", "checkpoint": None if judge == "base" else judge, "url": judge_url}


def spec_from_flags(env: str, dataset: str | None, dataset_path: str | None, grader: str, max_operand: int | None,
                    reward: str, match: str, turn: str, rubric: str | None,
                    judge: dict[str, Any] | None) -> Spec | None:
    """--env replay's settings checked before any file is read (None for --env problems)."""
    if env == "problems":
        if reward != "match" or rubric or judge or turn != "last" or match != "normalized":
            raise UsageError("--reward, --match, --turn, --rubric and the judge flags are for --env replay|tools: "
                             "add --env replay, or drop them")
        return None
    if not dataset:
        raise UsageError(f"--env {env} needs --dataset TRACES.jsonl ({TRACES_HINT})")
    if dataset_path or max_operand is not None or grader != "auto":
        raise UsageError(f"--dataset-path, --max-operand and --grader are for problem sets, not --env {env}: "
                         "drop them (--reward and --match say how replies are scored)")
    check_spec(reward, match, rubric, judge)
    if env == "tools" and (reward != "match" or rubric or judge):
        raise UsageError("--env tools is scored by answer match and tool-call precision/recall: drop --reward, "
                         "--rubric and the judge flags")
    return Spec(dataset, turn, reward, match, rubric, judge, env)
