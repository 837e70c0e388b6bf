"""`--env tools`: conversations that used tools, replayed. The logged calls answer with their recorded output.

A problem (rlcli.problems.traces, tools_env=True) starts at the first assistant turn that called tools; the
logged tool schemas are offered to the policy. A call whose name and arguments (as JSON, key order
ignored) match a logged call gets the recorded output; anything else gets an "unknown call"
observation. The episode ends when the policy answers without calling (or after MAX_TURNS).

Reward, in 0..1 less penalties: ANSWER_WEIGHT x the final answer matching the logged one (--match), plus
CALL_WEIGHT x the precision and the recall of the calls made against the logged calls, less
MALFORMED_PENALTY per call that did not parse (bad JSON, no name). `--policy oracle` replays the logged
turns and scores 1; `--policy nop` calls nothing and says nothing and scores 0: a check of an environment
without a model (`rlcli eval --env tools --policy oracle|nop`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlcli.problems import rewards
from rlcli.problems.traces import Problem, text_of

ANSWER_WEIGHT, CALL_WEIGHT, MALFORMED_PENALTY = 0.5, 0.25, 0.1
MAX_TURNS = 8


def call_key(name: str, arguments: str) -> tuple[str, str] | None:
    """(name, canonical JSON of the arguments), or None for a malformed call."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    return (name, json.dumps(args, sort_keys=True)) if name else None


@dataclass
class Episode:
    """One replay of a tool-using conversation, driven by messages; pure."""

    problem: Problem
    match: str = "normalized"
    made: Counter[tuple[str, str]] = field(default_factory=Counter)
    malformed: int = 0
    answer: str | None = None
    turns: int = 0

    def __post_init__(self) -> None:
        turns = [self.problem.reply, *self.problem.after]
        outputs = {m.get("tool_call_id"): text_of(m) for m in turns if m["role"] == "tool"}
        self.recorded: dict[tuple[str, str], str] = {}
        self.logged: Counter[tuple[str, str]] = Counter()
        for m in turns:
            for call in m.get("tool_calls") or []:
                key = call_key(call["function"]["name"], call["function"]["arguments"])
                if key is not None:
                    self.logged[key] += 1
                    self.recorded.setdefault(key, outputs.get(call.get("id"), ""))
        finals = [text_of(m) for m in turns if m["role"] == "assistant" and text_of(m).strip()]
        self.final = finals[-1] if finals else ""

    def respond(self, calls: list[dict[str, Any]], text: str, malformed: int = 0) -> tuple[list[dict[str, Any]], bool]:
        """The tool messages answering one assistant turn, and whether the episode is over."""
        self.turns += 1
        self.malformed += malformed
        if not calls or self.turns >= MAX_TURNS:  # an answer (a call that did not parse ends the episode too)
            self.answer = text
            return [], True
        out = []
        for call in calls:
            fn = call.get("function", {})
            key = call_key(fn.get("name", ""), fn.get("arguments", ""))
            if key is None:
                self.malformed += 1
                content = f"malformed call {fn.get('name')!r}: arguments must be a JSON object"
            elif key in self.recorded:
                self.made[key] += 1
                content = self.recorded[key]
            else:
                self.made[key] += 1
                content = f"unknown call {key[0]}({key[1]}): no logged call matches this name and these arguments"
            out.append({"role": "tool", "content": content, "tool_call_id": call.get("id") or "",
                        "name": fn.get("name", "")})
        return out, False

    def score(self) -> dict[str, float]:
        hits = sum((self.made & self.logged).values())
        made, logged = sum(self.made.values()), sum(self.logged.values())
        parts = {"precision": hits / made if made else 0.0, "recall": hits / logged if logged else 1.0,
                 "correct": float(rewards.matches(self.answer or "", self.final, self.match)),
                 "malformed": float(self.malformed)}
        parts["reward/tools"] = (ANSWER_WEIGHT * parts["correct"] + CALL_WEIGHT * (parts["precision"] + parts["recall"])
                                 - MALFORMED_PENALTY * self.malformed)
        return parts


def oracle_turns(problem: Problem) -> list[dict[str, Any]]:
    """The logged assistant turns from the problem's on: what the oracle policy says."""
    return [m for m in [problem.reply, *problem.after] if m["role"] == "assistant"]


def play(problem: Problem, policy: str, match: str = "normalized") -> dict[str, float]:
    """Run `policy` (oracle | nop) through one episode; its score parts."""
    episode = Episode(problem, match)
    scripted = oracle_turns(problem) if policy == "oracle" else []
    done, i = False, 0
    while not done:
        turn = scripted[i] if i < len(scripted) else {"role": "assistant", "content": ""}
        i += 1
        _, done = episode.respond(turn.get("tool_calls") or [], text_of(turn))
    return episode.score()


def tool_specs(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The logged tool schemas as renderers take them ({name, description, parameters: dict})."""
    specs = []
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters") or {}
        if isinstance(params, str):
            try:
                params = json.loads(params)
            except ValueError:
                params = {}
        specs.append({"name": fn.get("name", ""), "description": fn.get("description", ""), "parameters": params})
    return specs


def run_policy(path: str, policy: str, match: str = "normalized") -> dict[str, Any]:
    """Every tool problem of a traces file played by `policy`: the mean of each score part, and per problem."""
    from rlcli.problems.traces import read_traces

    found = read_traces(path, "last", tools_env=True)
    played = [(p, play(p, policy, match)) for p in found.problems]
    keys = played[0][1].keys()
    means = {k: sum(parts[k] for _, parts in played) / len(played) for k in keys}
    return {"policy": policy, "dataset": f"tool traces {path}: {found.summary()}", "problems": len(played),
            "reward": means.pop("reward/tools"), **means,
            "per_problem": [{"source": p.source, "trace_id": p.trace_id, "reward": parts["reward/tools"]}
                            for p, parts in played]}
