"""Harbor task folders and datasets: task.toml with defaults, discovery, selection, name@version via the registry.

A task folder (Harbor's format; taskconfig.py reads task.toml's network, steps and env tables):
    task.toml          [agent] timeout_sec, [verifier] timeout_sec and env, [environment] cpus, memory_mb (or
                       memory = "2G"), pids_limit, network_mode / allowed_hosts / allow_internet, workdir, env,
                       build_timeout_sec, docker_image; [[steps]] for a multi-step task
    instruction.md     what the agent is asked to do (a multi-step task: steps/<name>/instruction.md each)
    environment/       Dockerfile and its build context (docker-compose.yaml alone is not supported)
    tests/test.sh      the verifier: writes /logs/verifier/reward.json (an object of numbers) or reward.txt
                       (one number); verify.py has the rules. A step may have its own steps/<name>/tests/.
    solution/solve.sh  optional: what `--policy oracle` runs (a step: steps/<name>/solution/solve.sh first)

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rlcli.config import rlcli_home
from rlcli.errors import UsageError
from rlcli.files import staged_folder
from rlcli.harbor import privileges, taskconfig
from rlcli.harbor.taskconfig import OFFLINE, Network, Step

# Harbor's registry of datasets (name, version, tasks with git_url, git_commit_id, path).
REGISTRY_URL = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
DATASET_SPEC = re.compile(r"^[A-Za-z0-9][\w.-]*@[\w.-]+$")
NetworkChoice = Literal["task", "none"]  # --network: as each task.toml says, or off for every phase


@dataclass(frozen=True)
class Limits:
    """What a task's container may use."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    steps: tuple[Step, ...]
    limits: Limits = Limits()
    network: Network = Network()  # the environment's baseline: while the container starts, between phases
    build_timeout_s: float = taskconfig.DEFAULT_BUILD_TIMEOUT_S
    docker_image: str | None = None  # a prebuilt image task.toml names: preferred when it is on this machine
    workdir: str | None = None  # [environment] workdir: where commands run (else the image's WORKDIR)
    env: dict[str, str] = field(default_factory=dict)  # [environment] env: every command sees it
    solution_env: dict[str, str] = field(default_factory=dict)  # [solution] env: the oracle's solve.sh sees it
    reward_strategy: str = "mean"  # multi-step: each key's mean over the steps, or the final step's
    notes: tuple[str, ...] = ()  # what task.toml asks for that rlcli does not apply

    @property
    def instruction(self) -> str:
        if not self.multi_step:
            return self.steps[0].instruction
        return "\n\n".join(f"### Step {s.name}\n\n{s.instruction.strip()}" for s in self.steps)

    @property
    def multi_step(self) -> bool:
        return self.steps[0].name is not None

    @property
    def environment(self) -> Path:
        return self.path / "environment"

    @property
    def has_dockerfile(self) -> bool:
        return (self.environment / "Dockerfile").is_file()

    @property
    def agent_timeout_s(self) -> float:
        return sum(s.agent_timeout_s for s in self.steps)

    @property
    def verifier_timeout_s(self) -> float:
        return sum(s.verifier_timeout_s for s in self.steps)

    @property
    def needs_network(self) -> bool:
        """Whether any moment of a rollout is online: the container then starts attached to a network."""
        return self.network.public or any(s.agent_network.public or s.verifier_network.public for s in self.steps)

    def describe_network(self) -> str:
        phases = {p for s in self.steps for p in (s.agent_network.describe(), s.verifier_network.describe())}
        if phases == {self.network.describe()}:
            return self.network.describe()
        step = self.steps[0]
        return f"agent {step.agent_network.describe()}, verifier {step.verifier_network.describe()}" + (
            " (step 1)" if self.multi_step else "")

    def step_dir(self, step: Step) -> Path:
        return self.path if step.name is None else self.path / "steps" / step.name

    def tests(self, step: Step) -> tuple[list[Path], str]:
        """(folders copied into /tests in order, the test script's path inside /tests) for a step."""
        shared, own = self.path / "tests", self.step_dir(step) / "tests"
        folders = [d for d in dict.fromkeys([shared, own]) if d.is_dir()]
        return folders, "test.sh"

    def solution(self, step: Step | None = None) -> Path | None:
        """The solve.sh the oracle runs for a step: the step's own, else the task's."""
        step = step or self.steps[0]
        for folder in dict.fromkeys([self.step_dir(step) / "solution", self.path / "solution"]):
            if (folder / "solve.sh").is_file():
                return folder / "solve.sh"
        return None

    def step_workdir(self, step: Step) -> Path | None:
        """steps/<name>/workdir/: copied into the working directory before the step (setup.sh runs there)."""
        folder = self.step_dir(step) / "workdir"
        return folder if step.name is not None and folder.is_dir() else None


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


def read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where} is not valid TOML ({e})") from None


def parse_task_toml(text: str, where: str = "task.toml",
                    instructions: dict[str | None, str] | None = None) -> dict[str, Any]:
    """task.toml -> the Task fields it sets, defaults filled in (Harbor's, see taskconfig.py)."""
    doc = read_toml(text, where)
    env, verifier = doc.get("environment") or {}, doc.get("verifier") or {}
    here = f"{where} [environment]"
    memory = env.get("memory_mb", env.get("memory", Limits.memory_mb))
    limits = Limits(cpus=taskconfig.positive(env, "cpus", Limits.cpus, here),
                    memory_mb=parse_memory_mb(memory, here),
                    pids=int(taskconfig.positive(env, "pids_limit", env.get("pids", Limits.pids), here)))
    baseline = taskconfig.parse_network(env, here, Network(), legacy=True) or Network()
    strategy = doc.get("multi_step_reward_strategy") or "mean"
    if strategy not in taskconfig.REWARD_STRATEGIES:
        raise UsageError(f"{where}: multi_step_reward_strategy must be mean or final, got {strategy!r}")
    workdir = env.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise UsageError(f"{here}: workdir must be an absolute path, got {workdir!r}")
    image = env.get("docker_image")
    return {"limits": limits, "network": baseline, "docker_image": str(image) if image else None,
            "steps": tuple(taskconfig.parse_steps(doc, baseline, where, instructions or {})),
            "build_timeout_s": taskconfig.positive(env, "build_timeout_sec", taskconfig.DEFAULT_BUILD_TIMEOUT_S, here),
            "workdir": workdir, "env": taskconfig.resolve_env(env.get("env"), here),
            "solution_env": taskconfig.resolve_env((doc.get("solution") or {}).get("env"), f"{where} [solution]"),
            "reward_strategy": strategy,
            "notes": tuple(taskconfig.unapplied(env, verifier, doc.get("agent") or {}))}


def _instructions(folder: Path, doc: dict[str, Any]) -> dict[str | None, str]:
    names = taskconfig.step_names(doc)
    if not doc.get("steps"):
        path = folder / "instruction.md"
        if not path.is_file():
            raise UsageError(f"{folder} has no instruction.md: not a Harbor task folder")
        return {None: path.read_text(encoding="utf-8")}
    found = {}
    for name in names:
        path = folder / "steps" / name / "instruction.md"
        if not path.is_file():
            raise UsageError(f"{folder}: step {name} has no steps/{name}/instruction.md")
        found[name] = path.read_text(encoding="utf-8")
    return found


def refuse_allowlist(folder: Path, steps: tuple[Step, ...], baseline: Network) -> None:
    lists = [n for n in (baseline, *(p for s in steps for p in (s.agent_network, s.verifier_network)))
             if n.mode == "allowlist"]
    if lists:
        raise UsageError(f"{folder}: network_mode = \"allowlist\" ({', '.join(lists[0].hosts) or 'no hosts'}) cannot "
                         "be enforced by rlcli's Docker sandbox: pass --network none to run it with no network, or "
                         "run it in Harbor")


def load_task(folder: Path, name: str | None = None, network: NetworkChoice = "task") -> Task:
    """One task folder, checked; a UsageError says what is missing. network="none" turns every phase off."""
    toml = folder / "task.toml"
    text = toml.read_text(encoding="utf-8") if toml.is_file() else ""
    doc = read_toml(text, str(toml))
    privileges.check_task(folder, doc, str(toml))  # before anything is built or started
    fields = parse_task_toml(text, str(toml), _instructions(folder, doc))
    task = Task(name=name or folder.name, path=folder.resolve(), **fields)
    for step in task.steps:
        folders, script = task.tests(step)
        if not any((f / script).is_file() for f in folders):
            where = "tests/test.sh" if step.name is None else f"steps/{step.name}/tests/test.sh or tests/test.sh"
            raise UsageError(f"{folder} has no {where}, so it cannot be graded")
    if not task.has_dockerfile and not task.docker_image:
        compose = (folder / "environment" / "docker-compose.yaml").is_file()
        raise UsageError(f"{folder}: " + ("docker-compose tasks are not supported (rlcli runs one container per "
                                          "rollout): give it an environment/Dockerfile" if compose else
                                          "no environment/Dockerfile and no [environment] docker_image"))
    if network == "none":
        return replace(task, network=OFFLINE, steps=tuple(taskconfig.force_offline(list(task.steps))))
    refuse_allowlist(folder, task.steps, task.network)
    return task


def is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file()


def find_tasks(root: Path, max_depth: int = 3,
               network: NetworkChoice = "task") -> tuple[list[Task], list[tuple[str, str]]]:
    """(tasks, [(folder, why skipped)]) under root: root itself if it is a task, else task folders below it.

    Harbor's downloads nest tasks one level down (<hash>/<task>/); folders that cannot run are
    skipped with the reason, so one compose-only task does not stop a dataset.
    """
    if not root.is_dir():
        raise UsageError(f"no task folder at {root}")
    if is_task_folder(root):
        return [load_task(root, network=network)], []
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
            tasks.append(load_task(folder, name, network))
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
    """What --resume compares: task names with their environment, tests, steps and instruction (a task
    without steps/ hashes as it did before steps existed, so older runs still resume)."""
    parts = [f"{t.name}:{folder_hash(t.environment)}:{folder_hash(t.path / 'tests')}:"
             + (f"{folder_hash(t.path / 'steps')}:" if (t.path / "steps").is_dir() else "")
             + hashlib.sha256(t.instruction.encode()).hexdigest() for t in sorted(tasks, key=lambda t: t.name)]
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
    # A public dataset, not the user's data (its cache folder is private): files keep git's ordinary modes, which a
    # Dockerfile's COPY carries into the image, where a task's non-root USER must read them.
    subprocess.run(["git", *args], check=True, capture_output=True, text=True, timeout=600, umask=0o022)


def load_tasks(dataset: str, task_filter: str | None, limit: int | None, label: str = "--dataset",
               network: NetworkChoice = "task", found_skipped: list[tuple[str, str]] | None = None) -> list[Task]:
    tasks, skipped = find_tasks(resolve_dataset(dataset), network=network)
    if found_skipped is not None:
        found_skipped += skipped
    for folder, why in skipped:
        print(f"rlcli: warning: {label}: skipped {folder}: {why}", file=sys.stderr)
    return select_tasks(tasks, task_filter, limit)
