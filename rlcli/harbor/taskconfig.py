"""task.toml as Harbor 0.25 reads it: network policies per phase, steps, env tables, workdir, what is ignored.

Pure parsing (no Docker, no network); tasks.py turns a folder into a Task with these pieces.

Network (Harbor's rules; docs/decisions.md says how to re-check them):
- [environment] network_mode = "public" (the default) | "no-network" | "allowlist" (+ allowed_hosts);
  `allow_internet = true|false` is the older spelling, used only when network_mode is not set.
- [agent] and [verifier] (and a step's [steps.agent] / [steps.verifier]) may set their own network_mode
  for their phase; a step's setting wins over the task's, and a phase without one uses the environment's.
- rlcli's own older `network = true|false|"bridge"|"none"` is still read, after both Harbor fields.
`--network none` (force_offline) turns every phase off. An allowlist cannot be enforced by a plain
Docker container here, so a task that asks for one is refused (tasks.py says how to run it offline).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from rlcli.errors import UsageError
from rlcli.harbor import privileges

NETWORK_MODES = ("public", "no-network", "allowlist")
REWARD_STRATEGIES = ("mean", "final")
DEFAULT_AGENT_TIMEOUT_S = 600.0  # Harbor has none by default; an RL rollout needs one
DEFAULT_VERIFIER_TIMEOUT_S = 600.0  # Harbor's VerifierConfig.timeout_sec
DEFAULT_BUILD_TIMEOUT_S = 600.0
# Fields rlcli reads but cannot apply with one local container: said per task, never silently dropped.
UNAPPLIED = ("storage_mb", "storage", "gpus", "gpu_types", "tpu", "mcp_servers", "healthcheck", "skills_dir")
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


@dataclass(frozen=True)
class Network:
    mode: str = "public"
    hosts: tuple[str, ...] = ()

    @property
    def public(self) -> bool:
        return self.mode == "public"

    def describe(self) -> str:
        return f"allowlist ({', '.join(self.hosts)})" if self.mode == "allowlist" else self.mode


OFFLINE = Network("no-network")


@dataclass(frozen=True)
class Step:
    """One instruction and its tests. A single-step task has one, named None."""

    name: str | None
    instruction: str
    agent_network: Network
    verifier_network: Network
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: dict[str, str] = field(default_factory=dict)
    min_reward: float | dict[str, float] | None = None


def _where(where: str, table: str) -> str:
    return f"{where} [{table}]" if table else where


def parse_network(table: dict[str, Any], where: str, default: Network | None, legacy: bool) -> Network | None:
    """A table's network policy, or default when it sets none (phases inherit the environment's)."""
    mode, hosts = table.get("network_mode"), table.get("allowed_hosts")
    if mode is None and legacy:
        old = table.get("allow_internet", table.get("network"))
        if isinstance(old, str) and old.lower() in ("none", "bridge", "off", "on"):
            old = old.lower() in ("bridge", "on")
        if old is not None and not isinstance(old, bool):
            raise UsageError(f"{where}: allow_internet must be true or false, got {old!r}")
        mode = None if old is None else "public" if old else "no-network"
    if mode is None:
        if hosts is not None:
            raise UsageError(f'{where}: allowed_hosts needs network_mode = "allowlist"')
        return default
    if mode not in NETWORK_MODES:
        raise UsageError(f"{where}: network_mode must be one of {', '.join(NETWORK_MODES)}, got {mode!r}")
    if hosts is not None and (mode != "allowlist" or not isinstance(hosts, list)
                              or not all(isinstance(h, str) and h.strip() for h in hosts)):
        raise UsageError(f'{where}: allowed_hosts must be a list of host names, with network_mode = "allowlist"')
    return Network(mode, tuple(h.strip().lower().rstrip(".") for h in hosts or []))


def positive(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
        raise UsageError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def resolve_env(table: Any, where: str) -> dict[str, str]:
    """An env table with Harbor's templates: "${VAR}" (from rlcli's environment) and "${VAR:-default}"."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise UsageError(f"{where}: env must be a table of strings")
    resolved = {}
    for key, value in table.items():
        match = _TEMPLATE.fullmatch(str(value))
        if match and match.group(1) in privileges.RLCLI_SECRETS:
            raise UsageError(f"{where}: env {key} asks for ${match.group(1)}, rlcli's own secret, which a task cannot "
                             "have: remove it (give the task a key of its own, under another name)")
        if not match:
            resolved[str(key)] = str(value)
        elif match.group(1) in os.environ:
            resolved[str(key)] = os.environ[match.group(1)]
        elif match.group(2) is not None:
            resolved[str(key)] = match.group(2)
        else:
            raise UsageError(f"{where}: env {key} needs ${match.group(1)} set in rlcli's environment "
                             "(or a default: \"${VAR:-value}\")")
    return resolved


def parse_min_reward(value: Any, where: str) -> float | dict[str, float] | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, dict) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise UsageError(f"{where}: min_reward must be a number or a table of numbers, got {value!r}")


def parse_steps(doc: dict[str, Any], baseline: Network, where: str, instructions: dict[str | None, str]) -> list[Step]:
    """The task's steps in order ([[steps]]), or its one step; instructions maps step name -> text."""
    agent, verifier = doc.get("agent") or {}, doc.get("verifier") or {}
    task_agent = parse_network(agent, _where(where, "agent"), None, legacy=False)
    task_verifier = parse_network(verifier, _where(where, "verifier"), None, legacy=False)
    agent_timeout = positive(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, _where(where, "agent"))
    verifier_timeout = positive(verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, _where(where, "verifier"))
    verifier_env = resolve_env(verifier.get("env"), _where(where, "verifier"))
    tables = doc.get("steps") or [{}]
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{where}: steps must be an array of tables ([[steps]])")
    steps, seen = [], set()
    for n, table in enumerate(tables):
        name = table.get("name") if doc.get("steps") else None
        here = f"{where} [[steps]] #{n + 1}"
        if doc.get("steps") and (not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name) or name in seen):
            raise UsageError(f"{here}: each step needs a unique name (letters, digits, '-', '_', '.'), got {name!r}")
        seen.add(name)
        s_agent, s_verifier = table.get("agent") or {}, table.get("verifier") or {}
        steps.append(Step(
            name=name, instruction=instructions.get(name, ""),
            agent_network=parse_network(s_agent, here, None, legacy=False) or task_agent or baseline,
            verifier_network=parse_network(s_verifier, here, None, legacy=False) or task_verifier or baseline,
            agent_timeout_s=positive(s_agent, "timeout_sec", agent_timeout, here),
            verifier_timeout_s=positive(s_verifier, "timeout_sec", verifier_timeout, here),
            verifier_env={**verifier_env, **resolve_env(s_verifier.get("env"), here)},
            min_reward=parse_min_reward(table.get("min_reward"), here)))
    return steps


def step_names(doc: dict[str, Any]) -> list[str]:
    """The names [[steps]] declares (for finding their instruction.md files before parsing the rest)."""
    return [t.get("name") for t in doc.get("steps") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]


def unapplied(env: dict[str, Any], verifier: dict[str, Any], agent: dict[str, Any]) -> list[str]:
    """What the task asks for that rlcli's one local container does not do (said in the run's summary)."""
    notes = [f"{key} = {env[key]!r}" for key in UNAPPLIED if env.get(key) not in (None, [], {}, 0)]
    if verifier.get("environment") is not None or verifier.get("environment_mode") == "separate":
        notes.append("a separate verifier environment (the verifier runs in the agent's container)")
    notes += [f"[{name}] user (commands run as the image's user)" for name, table in
              (("agent", agent), ("verifier", verifier)) if table.get("user") is not None]
    return notes


def force_offline(steps: list[Step]) -> list[Step]:
    """`--network none`: every phase of every step without a network."""
    return [replace(s, agent_network=OFFLINE, verifier_network=OFFLINE) for s in steps]


def combine_step_rewards(per_step: list[dict[str, float]], strategy: str) -> dict[str, float]:
    """Harbor's multi-step reward: each key's mean over the graded steps (a missing key counts 0), or the
    last graded step's dict ("final")."""
    if not per_step:
        return {}
    if strategy == "final":
        return dict(per_step[-1])
    keys = sorted({k for rewards in per_step for k in rewards})
    return {k: sum(r.get(k, 0.0) for r in per_step) / len(per_step) for k in keys}


def below_min_reward(rewards: dict[str, float], min_reward: float | dict[str, float] | None) -> str | None:
    """Why a step's rewards stop the remaining steps (Harbor: a number gates "reward", a table each key)."""
    if min_reward is None:
        return None
    gates = {"reward": float(min_reward)} if isinstance(min_reward, int | float) else min_reward
    for key, threshold in gates.items():
        actual = rewards.get(key, float("-inf"))
        if actual < threshold:
            return f"{key} = {actual:g} is below min_reward {threshold:g}"
    return None
