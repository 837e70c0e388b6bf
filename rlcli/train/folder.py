"""A run folder: where a training run keeps what it writes, and what --resume reads back.

RLCLI_HOME/runs/<kind>-<time>, or --log-path. A folder is never reused without --resume, is locked
while a run writes to it, and lists in server-models.txt the LoRA models the run holds on the server,
so that a --resume after a crash frees the slots the crashed attempt left behind. checkpoints.jsonl
(written by the cookbook) is the one place a run's checkpoints are looked up.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlcli.config import private_dir, rlcli_home
from rlcli.errors import UsageError

MODELS_FILE = "server-models.txt"
RUN_INFO = "rlcli-run.json"  # the input's hash and the settings, checked by --resume
TEMP_PREFIX = "rlcli-train-"


def run_folder(log_path: str | None, resume: bool, kind: str = "sl") -> Path:
    """--log-path, or a fresh RLCLI_HOME/runs/<kind>-<time> (the newest one with --resume)."""
    if log_path:
        folder = Path(log_path).expanduser().resolve()
        if resume and not folder.is_dir():
            raise UsageError(f"--resume: no run folder at {folder}: pass the --log-path of the run to continue")
        if not resume and folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise UsageError(f"run folder {folder} already exists: pass --resume to continue that run, "
                             "or a new --log-path")
        return folder
    runs = rlcli_home() / "runs"
    if resume:
        previous = sorted(p for p in runs.glob(f"{kind}-*") if p.is_dir())
        if not previous:
            raise UsageError(f"--resume: no {kind} run under {runs} to continue: pass --log-path")
        return previous[-1]
    name = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = runs / name, 1
    while folder.exists():
        n += 1
        folder = runs / f"{name}-{n}"
    return folder


@contextlib.contextmanager
def claim(folder: Path) -> Iterator[None]:
    """Create the folder (0700: logs.log shows rendered examples) and hold its lock for the run.

    Two processes appending to one metrics.jsonl would interleave their steps; the lock also makes
    it safe for --resume to unload the models a previous attempt recorded.
    """
    import fcntl

    private_dir(folder)
    with open(folder / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another rlcli run is using {folder}: wait for it, or pass a new --log-path") from None
        yield


def parsed_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(the rows of a JSONL file, how many lines did not parse): a write cut short by a kill or a full disk
    leaves a torn last line, which is no row."""
    rows, torn = [], 0
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                torn += 1
    return rows, torn


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return parsed_lines(path)[0]


def rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    from rlcli.files import staged_file

    with staged_file(path, shared=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())


def resume_point(folder: Path, resume_step: Callable[[dict[str, Any]], int]) -> tuple[dict[str, Any] | None, int]:
    """The checkpoint a resume starts from and its step, after making the folder agree with it.

    Torn lines of metrics.jsonl and checkpoints.jsonl go (a record cut short by a kill or a full disk was never
    complete). A checkpoint counts only if every step before it has its metrics row: a run that died between
    saving a checkpoint and logging that step's row resumes from the checkpoint before, so no step goes
    unrecorded. Then the rows of the steps the resume will run again go. Each file changes in one rename.
    """
    metrics, torn = parsed_lines(folder / "metrics.jsonl")
    logged = {r["step"] for r in metrics if isinstance(r.get("step"), int)}
    covered = next(step for step in range(len(logged) + 1) if step not in logged)  # first step without a row
    checkpoints, torn_checkpoints = parsed_lines(folder / "checkpoints.jsonl")
    usable = [c for c in checkpoints if not c.get("state_path") or resume_step(c) <= covered]
    if torn_checkpoints or len(usable) != len(checkpoints):
        rewrite_jsonl(folder / "checkpoints.jsonl", usable)
    last = next((c for c in reversed(usable) if c.get("state_path")), None)
    start = resume_step(last) if last else 0
    keep = [r for r in metrics if r.get("step", -1) < start]
    if torn or len(keep) != len(metrics):
        rewrite_jsonl(folder / "metrics.jsonl", keep)
    return last, start


def read_info(folder: Path) -> dict[str, Any]:
    path = folder / RUN_INFO
    return json.loads(path.read_text()) if path.is_file() else {}


def last_checkpoint(folder: Path, key: str) -> dict[str, Any] | None:
    """The newest row of a run folder's checkpoints.jsonl that has `key` (state_path, sampler_path)."""
    return next((c for c in reversed(read_jsonl(folder / "checkpoints.jsonl")) if c.get(key)), None)


def held_models(folder: Path) -> list[str]:
    path = folder / MODELS_FILE
    return [m.strip() for m in path.read_text().splitlines() if m.strip()] if path.is_file() else []


def note_models(folder: Path, model_ids: list[str], append: bool = True) -> None:
    """Record (or, with append=False, replace) the models this run holds on the server."""
    with open(folder / MODELS_FILE, "a" if append else "w") as f:
        f.writelines(m + "\n" for m in model_ids)


@contextlib.contextmanager
def private_copy(payload: bytes) -> Iterator[str]:
    """A path to the data that only this process can read, and that no crash leaves behind.

    The cookbook reads data from a path, and stdin has none. The copy is made with mkstemp in a
    0700 folder; where /proc exists it is unlinked at once and read through /proc/self/fd, so not
    even SIGKILL can leave it in the folder. Elsewhere it is deleted on the way out.
    """
    folder = private_dir(rlcli_home() / "tmp")
    fd, path = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".jsonl", dir=folder)
    linked = True
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(payload)
        if os.path.exists(f"/proc/self/fd/{fd}"):
            os.unlink(path)
            linked = False
            yield f"/proc/self/fd/{fd}"
        else:
            yield path
    finally:
        os.close(fd)
        if linked:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
