"""Training commands over tinker-cookbook's recipes, and what they share: the run folder.

sl.py         `rlcli train sl`: supervised fine-tuning on chat JSONL
renderers.py  which renderer and tokenizer a model gets; a dry render of the data
compat.py     in-process shims between the cookbook, the tinker client and SkyRL

A run folder (RLCLI_HOME/runs/<kind>-<time>, or --log-path) is never reused without --resume,
is locked while a run writes to it, and lists in server-models.txt the LoRA models the run holds
on the server, so that a --resume after a crash frees the slots the crashed attempt left behind.
Nothing heavy is imported here: `rlcli train sl --help` must stay fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlcli.config import private_dir, rlcli_home
from rlcli.errors import RlcliError, UsageError

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_checkpoint(folder: Path, key: str) -> dict[str, Any] | None:
    """The newest row of a run folder's checkpoints.jsonl that has `key` (state_path, sampler_path)."""
    return next((c for c in reversed(read_jsonl(folder / "checkpoints.jsonl")) if c.get(key)), None)


def note_models(folder: Path, model_ids: list[str], append: bool = True) -> None:
    """Record (or, with append=False, replace) the models this run holds on the server."""
    with open(folder / MODELS_FILE, "a" if append else "w") as f:
        f.writelines(m + "\n" for m in model_ids)


def unload_leftovers(folder: Path, base_url: str) -> None:
    """Free the server slots that an earlier attempt in this folder could not (SIGKILL, power loss)."""
    path = folder / MODELS_FILE
    leftover = [m.strip() for m in path.read_text().splitlines() if m.strip()] if path.is_file() else []
    if leftover:
        from rlcli.train.compat import unload_models

        note_models(folder, unload_models(base_url, leftover), append=False)


def check_resume_info(folder: Path, url: str, digest: tuple[str, str], current: dict[str, Any],
                      keys: tuple[str, ...], same_input: str) -> None:
    """Refuse to resume a run folder on other input or settings; free slots a crashed attempt left.

    digest: (key in the folder's run info, this attempt's hash of its input); same_input: what to
    tell the user to keep, e.g. "the same --dataset".
    """
    info_path = folder / RUN_INFO
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if info.get(digest[0], digest[1]) != digest[1]:
        raise UsageError(f"{folder} was trained on other {digest[0].split('_')[0]}: resume with {same_input}, "
                         "or start a new --log-path")
    for key in keys:
        if info.get(key, current[key]) != current[key]:
            raise UsageError(f"{folder} was run with {key} {info[key]!r}: resume with the same --"
                             f"{key.replace('_', '-')}, or start a new --log-path")
    unload_leftovers(folder, url)
    last = last_checkpoint(folder, "state_path")
    where = f"checkpoint {last['name']}" if last else "the start (no checkpoint was saved yet)"
    print(f"resuming {folder} from {where}", file=sys.stderr)


@contextlib.contextmanager
def server_slots(folder: Path, base_url: str, model: str) -> Iterator[list[str]]:
    """Around a cookbook run: a clean LoRA slot before it, every slot it took freed after it.

    The cookbook never unloads its models and SkyRL's jax backend has a fixed number of slots;
    a stock server may also hand a new model gradients that an earlier one left (rlcli/slots.py).
    Yields the list of model ids created so far (recorded in the run folder as they appear).
    """
    from rlcli.slots import ensure_clean_next_slot
    from rlcli.train.compat import record_training_clients, unload_models

    created: list[str] = []

    def on_create(model_id: str) -> None:  # runs on the tinker client's thread
        created.append(model_id)
        note_models(folder, [model_id])

    ensure_clean_next_slot(base_url, model)
    try:
        with record_training_clients(on_create):
            yield created
    except Exception as e:
        if "Maximum number of LoRA adapters" in str(e):
            raise RlcliError("the server has no free LoRA slot: wait for other runs to finish (an "
                             "abandoned one frees its slot after ~5 min), or restart it with more "
                             "(`rlcli serve start --slots N`)") from e
        raise
    finally:
        left = unload_models(base_url, list(created))
        note_models(folder, left, append=False)
        if left:
            warn(f"could not free server slots {', '.join(left)}; the server frees them ~5 min after "
                 "this process exits")


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


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks (slot unload, temp copy) run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def warn(message: str) -> None:
    print(f"rlcli: warning: {message}", file=sys.stderr)
