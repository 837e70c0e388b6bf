"""Harbor task folders and datasets: task.toml with defaults, discovery, selection, name@version via the registry.

A task folder (Harbor's format):
    task.toml          [agent] timeout_sec, [verifier] timeout_sec, [environment] cpus, memory_mb (or
                       memory = "2G"), pids_limit, network / allow_internet, build_timeout_sec, docker_image
    instruction.md     what the agent is asked to do
    environment/       Dockerfile and its build context (docker-compose.yaml alone is not supported)
    tests/test.sh      the verifier: writes /logs/verifier/reward.txt (one number) or reward.json (an
                       object of numbers whose "reward" is the reward; verify.py has the rules)
    solution/solve.sh  optional: what `--policy oracle` runs

Pure file reading, no Docker; only `download_dataset` touches the network.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.config import rlcli_home
from rlcli.errors import UsageError
from rlcli.files import staged_folder

# Harbor's registry of datasets (name, version, tasks with git_url, git_commit_id, path).
REGISTRY_URL = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
DATASET_SPEC = re.compile(r"^[A-Za-z0-9][\w.-]*@[\w.-]+$")
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
DEFAULT_BUILD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Limits:
    """What a task's container may use. No network unless the task asks: agents run arbitrary commands."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024
    network: bool = False


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    instruction: str
    limits: Limits
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    docker_image: str | None = None  # a prebuilt image task.toml names; used when no Dockerfile is given

    @property
    def environment(self) -> Path:
        return self.path / "environment"

    @property
    def has_dockerfile(self) -> bool:
        return (self.environment / "Dockerfile").is_file()

    @property
    def solution(self) -> Path | None:
        script = self.path / "solution" / "solve.sh"
        return script if script.is_file() else None


def parse_memory_mb(value: Any, where: str) -> int:
    """memory_mb = 2048, or memory = "2G" / "512M" / "512" (MB) as older task.toml files write it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        mb = float(value)
    else:
        match = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)i?b?\s*", str(value).lower())
        if not match:
            raise UsageError(f"{where}: memory {value!r} is not a size such as 2048, \"512M\" or \"2G\"")
        scale = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}[match.group(2)]
        mb = float(match.group(1)) * scale
    if not math.isfinite(mb) or mb < 6:  # Docker refuses less than 6 MB
        raise UsageError(f"{where}: memory {value!r} is too small (Docker needs at least 6 MB)")
    return int(mb)


def _positive(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def parse_network(env: dict[str, Any], where: str) -> bool:
    """`network = true|false|"bridge"|"none"` or `allow_internet = true`; off when neither is set."""
    value = env.get("network", env.get("allow_internet", False))
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("none", "bridge", "off", "on"):
        return value.lower() in ("bridge", "on")
    raise UsageError(f"{where}: network must be true, false, \"bridge\" or \"none\", got {value!r}")


def parse_task_toml(text: str, where: str = "task.toml") -> dict[str, Any]:
    """task.toml -> the Task fields it sets (limits and timeouts), defaults filled in."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where} is not valid TOML ({e})") from None
    env, agent, verifier = (doc.get(k) or {} for k in ("environment", "agent", "verifier"))
    memory = env.get("memory_mb", env.get("memory", Limits.memory_mb))
    limits = Limits(cpus=_positive(env, "cpus", Limits.cpus, where), memory_mb=parse_memory_mb(memory, where),
                    pids=int(_positive(env, "pids_limit", env.get("pids", Limits.pids), where)),
                    network=parse_network(env, where))
    image = env.get("docker_image")
    return {"limits": limits, "docker_image": str(image) if image else None,
            "agent_timeout_s": _positive(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, where),
            "verifier_timeout_s": _positive(verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, where),
            "build_timeout_s": _positive(env, "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S, where)}


def load_task(folder: Path, name: str | None = None) -> Task:
    """One task folder, checked; a UsageError says what is missing."""
    toml = folder / "task.toml"
    fields = parse_task_toml(toml.read_text(encoding="utf-8"), str(toml)) if toml.is_file() else \
        parse_task_toml("", str(toml))
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise UsageError(f"{folder} has no instruction.md: not a Harbor task folder")
    if not (folder / "tests" / "test.sh").is_file():
        raise UsageError(f"{folder} has no tests/test.sh, so it cannot be graded")
    if not (folder / "environment" / "Dockerfile").is_file() and not fields["docker_image"]:
        compose = (folder / "environment" / "docker-compose.yaml").is_file()
        raise UsageError(f"{folder}: " + ("docker-compose tasks are not supported (rlcli runs one container per "
                                          "rollout): give it an environment/Dockerfile" if compose else
                                          "no environment/Dockerfile and no [environment] docker_image"))
    return Task(name=name or folder.name, path=folder.resolve(), instruction=instruction.read_text(encoding="utf-8"),
                **fields)


def is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file()


def find_tasks(root: Path, max_depth: int = 3) -> tuple[list[Task], list[tuple[str, str]]]:
    """(tasks, [(folder, why skipped)]) under root: root itself if it is a task, else task folders below it.

    Harbor's downloads nest tasks one level down (<hash>/<task>/); folders that cannot run are
    skipped with the reason, so one compose-only task does not stop a dataset.
    """
    if not root.is_dir():
        raise UsageError(f"no task folder at {root}")
    if is_task_folder(root):
        return [load_task(root)], []
    folders: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        below = sorted(p for d in level for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        folders += [p for p in below if is_task_folder(p)]
        level = [p for p in below if not is_task_folder(p)]
    names = [p.name for p in folders]
    tasks, skipped = [], []
    for folder in folders:
        # Two tasks with one folder name (in different hash folders) are told apart by their path.
        name = folder.name if names.count(folder.name) == 1 else str(folder.relative_to(root))
        try:
            tasks.append(load_task(folder, name))
        except UsageError as e:
            skipped.append((str(folder), str(e)))
    if not tasks:
        why = f" ({len(skipped)} skipped: {skipped[0][1]})" if skipped else ""
        raise UsageError(f"no Harbor task under {root}{why}: pass a task folder or a folder of them")
    return tasks, skipped


def select_tasks(tasks: list[Task], task_filter: str | None, limit: int | None) -> list[Task]:
    """--task-filter (comma-separated name globs) then --limit (the first N by name)."""
    chosen = tasks
    if task_filter:
        globs = [g.strip() for g in task_filter.split(",") if g.strip()]
        chosen = [t for t in tasks if any(fnmatch.fnmatchcase(t.name, g) for g in globs)]
        if not chosen:
            raise UsageError(f"--task-filter {task_filter!r} matches none of the {len(tasks)} tasks "
                             f"(e.g. {', '.join(t.name for t in tasks[:3])})")
    return chosen[:limit] if limit else chosen


def split_tasks(tasks: list[Task], eval_tasks: int) -> tuple[list[Task], list[Task]]:
    """(train, held out): the held-out tasks are chosen by a hash of their names, so they stay the
    same when a dataset grows, and never appear in training."""
    if eval_tasks <= 0:
        return tasks, []
    if eval_tasks >= len(tasks):
        raise UsageError(f"--eval-tasks {eval_tasks} leaves no task to train on (there are {len(tasks)})")
    ranked = sorted(tasks, key=lambda t: hashlib.sha256(t.name.encode()).hexdigest())
    held = {t.name for t in ranked[:eval_tasks]}
    return [t for t in tasks if t.name not in held], [t for t in tasks if t.name in held]


def folder_hash(folder: Path) -> str:
    """sha256 over every file below folder (relative path, executable bit, bytes): an image is rebuilt
    exactly when its Dockerfile or build context changes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        if path.is_symlink():
            digest.update(b"link:" + os.readlink(path).encode())
        else:
            digest.update(b"x" if os.access(path, os.X_OK) else b"-")
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def tasks_hash(tasks: list[Task]) -> str:
    """What --resume compares: task names with their environment, tests and instruction."""
    parts = [f"{t.name}:{folder_hash(t.environment)}:{folder_hash(t.path / 'tests')}:"
             f"{hashlib.sha256(t.instruction.encode()).hexdigest()}" for t in sorted(tasks, key=lambda t: t.name)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def resolve_dataset(spec: str) -> Path:
    """--dataset DIR (a task, or a folder of tasks), or NAME@VERSION from the cache or Harbor's registry."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if not DATASET_SPEC.match(spec):
        raise UsageError(f"no task folder at {spec}: pass a folder of Harbor tasks (or one task), or NAME@VERSION "
                         "such as terminal-bench@2.0")
    cached = rlcli_home() / "harbor" / "datasets" / spec
    if cached.is_dir() and any(cached.iterdir()):
        return cached
    return download_dataset(spec, cached)


def _offline_hint(spec: str) -> str:
    return (f"on a connected machine run `harbor datasets download {spec} -o DIR`, copy DIR here and pass "
            "--dataset DIR")


def fetch_registry(spec: str, url: str | None = None, timeout: float = 15.0) -> list[dict[str, Any]]:
    url = url or os.environ.get("RLCLI_HARBOR_REGISTRY", REGISTRY_URL)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            registry = json.loads(resp.read())
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise UsageError(f"cannot fetch Harbor's registry to resolve {spec} ({reason}): {_offline_hint(spec)}") \
            from None
    if not isinstance(registry, list):
        raise UsageError(f"Harbor's registry at {url} is not a list of datasets: {_offline_hint(spec)}")
    return registry


def registry_tasks(registry: list[dict[str, Any]], spec: str) -> list[dict[str, str]]:
    name, _, version = spec.partition("@")
    for entry in registry:
        if entry.get("name") == name and str(entry.get("version")) == version:
            return list(entry.get("tasks") or [])
    versions = sorted(str(e.get("version")) for e in registry if e.get("name") == name)
    known = f"versions of {name}: {', '.join(versions)}" if versions else f"no dataset named {name}"
    raise UsageError(f"Harbor's registry has no {spec} ({known})")


def download_dataset(spec: str, dest: Path) -> Path:
    """Fetch each task of spec from its git repository into dest (atomically: a partial download is
    never mistaken for a dataset)."""
    entries = registry_tasks(fetch_registry(spec), spec)
    if shutil.which("git") is None:
        raise UsageError(f"downloading {spec} needs git: install it, or {_offline_hint(spec)}")
    by_repo: dict[tuple[str, str], list[dict[str, str]]] = {}
    for entry in entries:
        by_repo.setdefault((entry["git_url"], entry.get("git_commit_id") or "HEAD"), []).append(entry)
    try:
        with staged_folder(dest) as staging:
            for n, ((git_url, commit), group) in enumerate(by_repo.items()):
                checkout = staging / f".repo{n}"
                _git("clone", "--quiet", "--no-checkout", git_url, str(checkout))
                commit = "HEAD" if commit.lower() == "head" else commit
                _git("-C", str(checkout), "checkout", "--quiet", commit, "--", *[e.get("path") or "." for e in group])
                for entry in group:
                    shutil.move(str(checkout / (entry.get("path") or ".")), str(staging / entry["name"]))
                shutil.rmtree(checkout)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = (e.stderr or "").strip().splitlines()[-1:] if isinstance(e, subprocess.CalledProcessError) else [e]
        raise UsageError(f"downloading {spec} failed ({detail[0] if detail else e}): {_offline_hint(spec)}") \
            from None
    return dest


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, text=True, timeout=600)


def load_tasks(dataset: str, task_filter: str | None, limit: int | None, label: str = "--dataset") -> list[Task]:
    tasks, skipped = find_tasks(resolve_dataset(dataset))
    for folder, why in skipped:
        print(f"rlcli: warning: {label}: skipped {folder}: {why}", file=sys.stderr)
    return select_tasks(tasks, task_filter, limit)
