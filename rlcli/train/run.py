"""The trainer skeleton: what every `rlcli train` command does the same way around tinker-cookbook's loops.

A trainer (sl.py, rl.py, distill.py, harbor/train.py) is a function that takes its options (a record extending
rlcli.train.options.TrainOptions, checked as it is made) and returns the weights it made, and the few functions
that differ: what it reads, what it plans, its cookbook config, its progress line and its final report. It
calls `target` (run folder, server, model and renderer) and hands a Job to `execute`, which owns the rest: the
dry run, the folder's lock, the resume check, the run info, slot hygiene, the progress line, and the final
report. Nothing heavy is imported at module level: `rlcli train sl --help` must stay fast.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rlcli.config import ensure_api_key
from rlcli.errors import RlcliError, UsageError
from rlcli.train import folder as runs
from rlcli.train import renderers
from rlcli.train.options import TrainOptions

EMBEDDED_LR = 5e-3  # SFT on the embedded model: measured, docs/decisions.md
UNCALIBRATED_LR = 5e-4  # the cookbook's LoRA rate before its per-family scaling (5e-5 x its LoRA factor 10)


@dataclass(frozen=True)
class Weights:
    """What a run made: its folder and its final weights (sampler_path to sample or export, state_path to train
    on from), as its checkpoints.jsonl lists them."""

    folder: Path
    sampler_path: str | None
    state_path: str | None


def resolve_model(model: str | None, base_url: str, required: bool) -> str:
    """The server's base model; --model must name it exactly (the engine refuses anything else)."""
    import urllib.error

    from rlcli.client import key_refused, server_base_model

    try:
        served = server_base_model(base_url)
    except (OSError, ValueError, KeyError, IndexError) as e:
        if model and not required:
            return model  # a dry run with --model needs no server
        if isinstance(e, urllib.error.HTTPError) and e.code == 401:  # --tenants, and no key or a wrong one
            raise UsageError(key_refused(base_url)) from None
        raise RlcliError(f"cannot reach a Tinker server at {base_url} ({e}): start one with "
                         "`rlcli serve start`, or pass --base-url") from None
    if model and model != served:
        raise UsageError(f"--model {model!r} is not the server's model {served!r}: omit --model, "
                         "or start a server with --base-model set to it")
    return served


def prepare_model(model: str, renderer: str | None) -> str:
    """Make the model's tokenizer loadable the safe way, and return its renderer (--renderer, else chosen)."""
    if renderers.is_local_model(model):
        renderers.go_offline()  # before the hub client, transformers or datasets are imported: each reads it once
        renderers.register_local_tokenizer(model)
    return renderers.choose_renderer(model, renderer)


def default_lr(model: str) -> tuple[float, str]:
    """(learning rate, where it comes from) for supervised LoRA when --lr is not given."""
    from rlcli.model import EMBEDDED_MODEL_NAME

    if renderers.is_local_model(model) and Path(model).expanduser().name == EMBEDDED_MODEL_NAME:
        return EMBEDDED_LR, "measured for the embedded model"
    from tinker_cookbook import hyperparam_utils

    try:
        return hyperparam_utils.get_lr(model, is_lora=True), "the cookbook's get_lr for this model"
    except Exception:  # not a family it calibrates (or no config to read its width from)
        return UNCALIBRATED_LR, "the cookbook's uncalibrated LoRA rate: pass --lr to choose"


@dataclass(frozen=True)
class Target:
    """Where a run goes: its folder, its server, and the model and renderer it trains."""

    folder: Path
    url: str
    model: str
    renderer: str
    server_timeout: float  # seconds without an answer before the server counts as gone


def target(kind: str, o: TrainOptions, url: str) -> Target:
    folder = runs.run_folder(o.log_path, o.resume, kind=kind)
    model = resolve_model(o.model, url, required=not o.dry_run)
    return Target(folder, url, model, prepare_model(model, o.renderer), o.server_timeout)


class ProgressLine:
    """A cookbook metrics logger that prints one dense line per training step (ml_log.Logger, duck-typed).

    Subclasses say which key marks a step's row and how the line reads. Elapsed time is measured between
    consecutive steps: the cookbook pipelines requests, so its own per-step timings overlap.
    """

    step_key = ""
    step_metrics: Callable[[], dict[str, float]] | None = None  # more figures for each step's metrics row

    def __init__(self, total_steps: int, stream: TextIO | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self._last = time.monotonic()
        self.last_step: int | None = None  # the last step that finished (0-based), for the dead-server line

    def log_hparams(self, config: Any) -> None:
        pass

    def get_logger_url(self) -> str | None:
        return None

    # tinker-cookbook 0.6.1's MultiplexLogger forwards these to every logger it holds (docs/decisions.md,
    # "tinker-cookbook 0.6.1"): an event row is a metrics row at its step; running totals have no line.
    def enable_event_steps(self) -> None:
        pass

    def log_metrics_event(self, metrics: dict[str, Any], step: int, step_metric: str,
                          metric_axes: dict[str, str] | None = None) -> None:
        self.log_metrics({**metrics, step_metric: step}, step)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None or self.step_key not in metrics:
            return
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        self.last_step = step
        print(self.line(metrics, step, elapsed), file=self.stream, flush=True)

    def line(self, metrics: dict[str, Any], step: int, elapsed_s: float) -> str:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Job:
    """One run, as a trainer hands it to `execute`."""

    settings: dict[str, Any]  # what the run runs with (rlcli.train.options.kept): its run info, checked by --resume
    summary: str  # the plan, printed before anything is spent (and all a dry run prints)
    digest: tuple[str, str]  # (run-info key, this run's hash of its input): --resume refuses other input
    same_input: str  # what --resume must keep, e.g. "the same --dataset"
    resume_keys: tuple[str, ...]  # settings --resume must keep
    recipe: Callable[[Path, str], AbstractContextManager[Callable[[], Any]]]  # (folder, url) -> run the loop
    progress: ProgressLine
    report: Callable[[Path], str]
    info: dict[str, Any] = field(default_factory=dict)  # more for rlcli-run.json
    # The step a checkpoints.jsonl row resumes at (the RL recipe records it as "batch"; SL as epoch and batch).
    resume_step: Callable[[dict[str, Any]], int] = lambda row: int(row.get("batch", 0))
    around: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext  # e.g. harbor's sandboxes


def execute(job: Job, t: Target, resume: bool, dry_run: bool) -> Weights | None:
    """Print the plan; unless a dry run: lock the folder, check a resume, record the run, train, report. Returns
    the final weights (None for a dry run)."""
    summary = f"{job.summary}\nrun folder: {t.folder}{' (resume)' * resume}\nserver: {t.url}"
    if dry_run:
        print(summary)
        return None
    print(summary, file=sys.stderr)
    with runs.claim(t.folder), job.around():  # the lock first: a second trainer is refused before any work
        start = 0
        if resume:
            start = check_resume(t.folder, t.url, digest=job.digest, same_input=job.same_input,
                                 settings=job.settings, keys=job.resume_keys, resume_step=job.resume_step)
        info = {job.digest[0]: job.digest[1], "base_url": t.url, **job.info, **job.settings}
        (t.folder / runs.RUN_INFO).write_text(json.dumps(info, indent=1) + "\n")
        run_recipe(t.folder, t.url, job, t.server_timeout, first_step=start)
    print(job.report(t.folder))
    final = runs.last_checkpoint(t.folder, "sampler_path") or {}
    return Weights(t.folder, final.get("sampler_path"), final.get("state_path"))


def gone_message(folder: Path, url: str, progress: ProgressLine) -> Callable[..., str]:
    """The one line a run ends with when its server stops answering, or is gone for a known cause (watchdog)."""
    def message(silent_s: float, cause: str | None = None) -> str:
        step = "before its first step" if progress.last_step is None else f"after step {progress.last_step + 1}"
        what = f"{cause} {step}" if cause else f"stopped answering {step} (no answer for {silent_s:.0f} s)"
        last = runs.last_checkpoint(folder, "state_path")
        saved = f"the last checkpoint is {last['name']}" if last else "no checkpoint was saved yet"
        return (f"the server at {url} {what}; {saved}: "
                f"restart it (`rlcli serve restart`), then rerun the same command with --log-path {folder} --resume")
    return message


def save_failed_message(folder: Path) -> Callable[[str, str], str]:
    """The one line a run ends with when the server could not save one of its checkpoints."""
    def message(what: str, reason: str) -> str:
        last = runs.last_checkpoint(folder, "state_path")
        saved = f"the last good checkpoint is {last['name']}" if last else "no checkpoint was saved before it"
        fix = ("free space where the server keeps its checkpoints (`rlcli serve start --checkpoints-base`)"
               if "No space left" in reason or "Errno 28" in reason else "fix that on the server")
        return (f"the server could not save {what} ({reason}); nothing was recorded for it and {saved}: "
                f"{fix}, then rerun the same command with --log-path {folder} --resume")
    return message


def run_recipe(folder: Path, url: str, job: Job, server_timeout: float, first_step: int = 0) -> None:
    """The trainer's cookbook loop inside the hooks; whatever happens, the server slots it took are freed,
    and a server that stops answering for server_timeout seconds ends the run with one line. first_step: the
    step a resume begins at (the loops make one sampling client per step: its seeds continue from there)."""
    from rlcli import watchdog
    from rlcli.train.hooks import cookbook_logging, failed_saves, seeded_lora, seeded_sampling
    from rlcli.train.retention import kept_checkpoints

    ensure_api_key()
    with (watchdog.watch(url, server_timeout, gone_message(folder, url, job.progress)) as watch,
          sigterm_as_interrupt(), server_slots(folder, url, job.settings["model"], watch),
          seeded_lora(job.settings["seed"]), seeded_sampling(job.settings["seed"], first_step),
          kept_checkpoints(folder, url, job.settings.get("keep_checkpoints", 0)),  # inside failed_saves
          failed_saves(save_failed_message(folder)),
          job.recipe(folder, url) as start, cookbook_logging(job.progress)):
        start()


def check_resume(folder: Path, url: str, *, digest: tuple[str, str], same_input: str, settings: dict[str, Any],
                 keys: tuple[str, ...], resume_step: Callable[[dict[str, Any]], int] = lambda row: 0) -> int:
    """Refuse to resume a run folder on other input or settings (Job's fields of those names); free the
    slots a crashed attempt left; drop the metrics rows of the steps the resume will run again. Returns the
    step the resume begins at."""
    info, (key, value), current = runs.read_info(folder), digest, settings
    if info.get(key, value) != value:
        raise UsageError(f"{folder} was trained on other {key.split('_')[0]}: resume with {same_input}, "
                         "or start a new --log-path")
    for name in keys:
        if info.get(name, current[name]) != current[name]:
            raise UsageError(f"{folder} was run with {name} {info[name]!r}: resume with the same --"
                             f"{name.replace('_', '-')}, or start a new --log-path")
    if leftover := runs.held_models(folder):  # an earlier attempt could not free them (SIGKILL, power loss)
        from rlcli.client import unload_models

        runs.note_models(folder, unload_models(url, leftover), append=False)
    last, start = runs.resume_point(folder, resume_step)
    where = f"checkpoint {last['name']} (step {start + 1})" if last else "the start (no checkpoint was saved yet)"
    print(f"resuming {folder} from {where}", file=sys.stderr)
    return start


@contextlib.contextmanager
def server_slots(folder: Path, base_url: str, model: str, watch: Any = None) -> Iterator[list[str]]:
    """Around a cookbook run: a clean LoRA slot before it, every slot it took freed after it.

    The cookbook never unloads its models and SkyRL's jax backend has a fixed number of slots;
    a stock server may also hand a new model gradients that an earlier one left (rlcli/slots.py).
    Yields the list of model ids created so far (recorded in the run folder as they appear).
    """
    from rlcli.client import NO_FREE_SLOT, unload_models
    from rlcli.slots import ensure_clean_next_slot
    from rlcli.train.hooks import on_training_client

    created: list[str] = []

    def on_create(client: Any) -> None:  # runs on the tinker client's thread
        created.append(str(client.model_id))
        runs.note_models(folder, [created[-1]])

    ensure_clean_next_slot(base_url, model)
    try:
        with on_training_client(on_create):
            yield created
    except Exception as e:
        if NO_FREE_SLOT in str(e):
            raise RlcliError("the server has no free LoRA slot: wait for other runs to finish (an "
                             "abandoned one frees its slot after ~5 min), or restart it with more "
                             "(`rlcli serve start --slots N`)") from e
        raise
    finally:
        # A server that is gone frees nothing: the models stay listed for --resume to free (if it kept them).
        left = list(created) if watch is not None and watch.gone else unload_models(base_url, list(created))
        runs.note_models(folder, left, append=False)
        if left:
            warn(f"could not free server slots {', '.join(left)}; the server frees them ~5 min after "
                 "this process exits")


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
