"""`rlcli train rl`: RL with a server-side loss, on tinker-cookbook's RL loop (tinker_cookbook.rl.train).

Launch:  rlcli train rl --loss gspo --dataset arithmetic --max-steps 50        (fused GSPO when served)
         rlcli train rl --loss ppo --dataset gsm8k --dataset-path gsm8k_train.jsonl
         rlcli train rl --loss gspo --passes 2 --dataset problems.jsonl --dry-run   (print the plan)
         rlcli train rl --loss cispo --dataset arithmetic --log-path runs/a --resume

The loss is planned first, from what the server serves (rlcli.train.losses): a loss or --passes it
cannot serve fails in well under a second, before data is read or a model is made. Every training
client the recipe builds gets the planned route (fused, or GSPO's exact 2-pass form) and has its LoRA
slot freed however the run ends. The recipe writes config.json, metrics.jsonl, checkpoints.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.errors import RlcliError, UsageError
from rlcli.train import (
    claim,
    note_models,
    read_jsonl,
    renderers,
    run_folder,
    sigterm_as_interrupt,
    unload_leftovers,
    warn,
)
from rlcli.train.compat import ProgressLine
from rlcli.train.sl import RUN_INFO, resolve_model

if TYPE_CHECKING:
    from rlcli.train.envs import Data  # imports the cookbook: only for the type checker

RL_LOSSES = ("gspo", "cispo", "dppo", "ppo", "importance_sampling")  # what the cookbook's RL data suits
RECIPE_NAME = "rlcli_train_rl"
MINIMUMS = {"batch_size": 1, "group_size": 2, "max_tokens": 1, "lora_rank": 1, "max_steps": 1, "save_every": 0,
            "eval_every": 0}  # flags not listed here (lr, temperature) must be positive
ROUTES = {1: "fused", 2: "2-pass"}
REWARD, CORRECT = "env/all/reward/total", "env/all/correct"  # the cookbook's keys in metrics.jsonl


@dataclass(frozen=True)
class Settings:
    """What the recipe is run with; kept in the run folder so --resume can check it."""

    model: str
    renderer: str
    dataset: str
    loss: str
    loss_config: dict[str, Any]
    passes: int
    batch_size: int
    group_size: int
    lr: float
    max_tokens: int
    temperature: float
    lora_rank: int
    max_steps: int | None
    save_every: int
    eval_every: int


def choose_dataset(dataset: str | None, dataset_path: str | None) -> tuple[str, str | None]:
    """("arithmetic" | "gsm8k", path or None) from --dataset/--dataset-path; no file is read here."""
    if not dataset:
        raise UsageError("pass --dataset arithmetic, --dataset gsm8k [--dataset-path FILE.jsonl], or "
                         "--dataset FILE.jsonl (GSM8K-format {question, answer} lines)")
    if dataset not in ("arithmetic", "gsm8k"):
        if dataset_path:
            raise UsageError(f"--dataset {dataset} is a file already: drop --dataset-path, or use --dataset gsm8k")
        return "gsm8k", dataset
    if dataset_path and dataset != "gsm8k":
        raise UsageError(f"--dataset-path is for gsm8k data; {dataset} is synthetic: drop --dataset-path")
    return dataset, dataset_path


def check_numbers(**values: float | None) -> None:
    """Each flag's lower bound; a group needs two samples (the cookbook's advantages compare within it)."""
    for name, value in values.items():
        low = MINIMUMS.get(name, 0)
        if value is not None and (value < low if name in MINIMUMS else not value > 0):
            bound = f"at least {low}" if low else ("0 (off) or more" if name in MINIMUMS else "positive")
            raise UsageError(f"--{name.replace('_', '-')} must be {bound}, got {value}")


def plan_losses(url: str, loss: str, loss_config: str | None, passes: str) -> Any:
    """Ask the server what it serves and settle loss, config and passes (rlcli.train.losses decides)."""
    if loss not in RL_LOSSES:
        raise UsageError(f"unknown --loss {loss!r}: RL takes {', '.join(RL_LOSSES)}")
    from rlcli.train import losses  # called through the module, so tests can swap served_losses for a fake

    _, served = losses.served_losses(url)
    return losses.plan_loss(loss, loss_config, passes, served)


def describe(plan: Any, data: Data, s: Settings, steps: int) -> str:
    size = "synthetic" if data.size is None else f"{data.size} problems"
    return "\n".join([
        f"loss: {plan.loss} {ROUTES[plan.passes]}, config {json.dumps(plan.config, sort_keys=True)}: {plan.message}",
        f"data: {data.label}: {size}, {data.batches} batches of {s.batch_size}",
        f"plan: {s.batch_size} problems x {s.group_size} samples per step, {steps} step{'s' * (steps != 1)} "
        f"(max {s.max_tokens} tokens per sample, temperature {s.temperature}, lr {s.lr:g})",
        f"model: {s.model}  renderer: {s.renderer}",
    ])


class RlProgress(ProgressLine):
    """One line per RL step: step, mean reward, fraction correct, loss route, step time."""

    def __init__(self, total_steps: int, loss: str, passes: int, stream: TextIO | None = None):
        super().__init__(total_steps, stream)
        self.route = f"{loss} {ROUTES[passes]}"

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None or "progress/batch" not in metrics:
            return
        last, self._last = self._last, time.monotonic()
        # The recipe times each step itself (sampling to optim_step); time between calls adds its setup.
        elapsed = metrics.get("time/total", self._last - last)
        print(format_rl_progress(metrics, step, self.total_steps, self.route, elapsed), file=self.stream, flush=True)


def format_rl_progress(metrics: dict[str, Any], step: int, total_steps: int, route: str, elapsed_s: float) -> str:
    def value(key: str, fmt: str) -> str:
        return format(metrics[key], fmt) if key in metrics else "-"  # a batch whose groups all failed has none

    return "  ".join([f"step {step + 1}/{total_steps}", f"reward {value(REWARD, '+.3f')}",
                      f"correct {value(CORRECT, '.2f')}", route, f"{elapsed_s:.2f}s"])


@contextlib.contextmanager
def cookbook_hooks(plan: Any) -> Iterator[None]:
    """Inside the block, every tinker.TrainingClient gets `plan`'s loss route, and sampling draws no bars.

    The recipe builds its client one of three ways (fresh LoRA, resume, load weights); all of them
    construct a TrainingClient, so __init__ is the one hook that covers each (compat's recorder uses
    it too). The recipe's tqdm bar per sampling batch would bury the one progress line per step.
    """
    import functools

    import tinker
    from tinker_cookbook.rl import train

    from rlcli.train.losses import install_loss_route

    original_init, original_tqdm = tinker.TrainingClient.__init__, train.tqdm

    def routed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        install_loss_route(self, plan)

    tinker.TrainingClient.__init__ = routed_init  # type: ignore[method-assign]
    train.tqdm = functools.partial(original_tqdm, disable=True)
    try:
        yield
    finally:
        tinker.TrainingClient.__init__ = original_init  # type: ignore[method-assign]
        train.tqdm = original_tqdm


def build_config(folder: Path, url: str, s: Settings, data: Data) -> Any:
    from tinker_cookbook.rl import train

    from rlcli.train import envs

    builder = envs.dataset_builder(s.dataset, data.problems, s.model, s.renderer, s.batch_size, s.group_size,
                                   data.batches)
    return train.Config(learning_rate=s.lr, dataset_builder=builder, model_name=s.model, recipe_name=RECIPE_NAME,
                        max_tokens=s.max_tokens, log_path=str(folder), eval_every=s.eval_every,
                        save_every=s.save_every, renderer_name=s.renderer, loss_fn=s.loss,
                        loss_fn_config=s.loss_config or None, lora_rank=s.lora_rank, temperature=s.temperature,
                        base_url=url, max_steps=s.max_steps)


def run_recipe(folder: Path, url: str, s: Settings, data: Data, plan: Any, steps: int) -> None:
    """Run the cookbook's RL main with the loss route installed; free its server slots however it ends."""
    import asyncio

    from tinker_cookbook.rl import train

    from rlcli.train.compat import progress_logging, record_training_clients, unload_models

    ensure_api_key()
    created: list[str] = []

    def on_create(model_id: str) -> None:  # runs on the tinker client's thread
        created.append(model_id)
        note_models(folder, [model_id])

    try:
        with (sigterm_as_interrupt(), record_training_clients(on_create), cookbook_hooks(plan),
              progress_logging(RlProgress(steps, plan.loss, plan.passes))):
            asyncio.run(train.main(build_config(folder, url, s, data)))
    except Exception as e:
        if "Maximum number of LoRA adapters" in str(e):
            raise RlcliError("the server has no free LoRA slot: wait for other runs to finish (an abandoned "
                             "one frees its slot after ~5 min), or restart it with more max_lora_adapters") from e
        raise
    finally:
        left = unload_models(url, list(created))
        note_models(folder, left, append=False)
        if left:
            warn(f"could not free server slots {', '.join(left)}; the server frees them ~5 min after this "
                 "process exits")


def check_resume(folder: Path, url: str, sha256: str, s: Settings) -> None:
    """Refuse to resume on other data, model or sampling shape; free slots a crashed attempt left."""
    info = json.loads((folder / RUN_INFO).read_text()) if (folder / RUN_INFO).is_file() else {}
    if info.get("dataset_sha256", sha256) != sha256:
        raise UsageError(f"{folder} was trained on other data: resume with the same --dataset, or start a new "
                         "--log-path")
    for key in ("model", "renderer", "loss", "batch_size", "group_size"):
        if info.get(key, getattr(s, key)) != getattr(s, key):
            raise UsageError(f"{folder} was run with {key} {info[key]!r}: resume with the same --"
                             f"{key.replace('_', '-')}, or start a new --log-path")
    unload_leftovers(folder, url)
    last = [c for c in read_jsonl(folder / "checkpoints.jsonl") if c.get("state_path")]
    where = f"checkpoint {last[-1]['name']}" if last else "the start (no checkpoint was saved yet)"
    print(f"resuming {folder} from {where}", file=sys.stderr)


def final_report(folder: Path) -> str:
    rows = [m for m in read_jsonl(folder / "metrics.jsonl") if REWARD in m]
    final = next((c for c in reversed(read_jsonl(folder / "checkpoints.jsonl")) if c.get("sampler_path")), None)
    lines = [f"reward {rows[0][REWARD]:+.3f} -> {rows[-1][REWARD]:+.3f} over {len(rows)} steps"] if rows else []
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final:
        lines.append(f"final weights: {final['sampler_path']} (state: {final.get('state_path')})")
    return "\n".join(lines)


def train_rl(loss: str = "gspo", dataset: str | None = None, dataset_path: str | None = None,
             loss_config: str | None = None, passes: str = "auto", model: str | None = None,
             base_url: str | None = None, renderer: str | None = None, batch_size: int = 8, group_size: int = 4,
             lr: float = 4e-5, max_tokens: int = 256, temperature: float = 1.0, lora_rank: int = 32,
             eval_every: int = 20, save_every: int = 20, max_steps: int | None = None, log_path: str | None = None,
             resume: bool = False, dry_run: bool = False) -> int:
    """Train a LoRA with RL (tinker-cookbook's loop) and a loss computed on the server.

    Args:
        loss: gspo, cispo, dppo, ppo or importance_sampling (the server's defaults; GSPO the paper's clip 3e-4/4e-4)
        dataset: arithmetic, gsm8k, or a GSM8K-format JSONL file of {"question", "answer": "...#### 42"}
        dataset_path: with --dataset gsm8k: read it from this JSONL file (offline) instead of the hub
        loss_config: JSON object of loss settings, e.g. '{"clip_high_threshold": 1.0005}'
        passes: auto (fused when the server serves the loss, else the exact 2-pass form), 1 or 2
        model: the server's base model, exactly as it was started (default: ask the server)
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        batch_size: problems (groups) per step
        group_size: samples per problem; rewards are compared within a group
        lr: Adam learning rate
        max_tokens: longest sampled answer in tokens
        temperature: sampling temperature
        lora_rank: LoRA rank (the server caps it; SkyRL's jax backend at 32 by default)
        eval_every: with the hub's gsm8k, score its test split every N steps (0: off)
        save_every: save a resumable checkpoint every N steps (0: only the final one)
        max_steps: stop after this many steps (default: one pass over the data; arithmetic: 100)
        log_path: run folder (default: RLCLI_HOME/runs/rl-<time>)
        resume: continue the run in --log-path (default: the newest rl run) from its last checkpoint
        dry_run: plan the loss, check the data, print the plan; create no model
    """
    name, path = choose_dataset(dataset, dataset_path)
    check_numbers(batch_size=batch_size, group_size=group_size, max_tokens=max_tokens, lora_rank=lora_rank,
                  max_steps=max_steps, save_every=save_every, eval_every=eval_every, lr=lr, temperature=temperature)
    url = resolve_base_url(base_url)
    plan = plan_losses(url, loss, loss_config, passes)  # first: an unservable loss fails before any real work
    folder = run_folder(log_path, resume, kind="rl")
    model = resolve_model(model, url, required=not dry_run)
    if renderers.is_local_model(model):
        renderers.go_offline()  # before `datasets` or the hub client is imported: both read it once
        renderers.register_local_tokenizer(model)
    renderer = renderers.choose_renderer(model, renderer)
    from rlcli.train import envs  # the cookbook and `datasets`: only once the loss plan stands

    data = envs.load_data(name, path, batch_size, max_steps)
    steps = min(data.batches, max_steps or data.batches)
    settings = Settings(model, renderer, name, plan.loss, dict(plan.config), plan.passes, batch_size, group_size,
                        lr, max_tokens, temperature, lora_rank, max_steps, save_every, eval_every)
    summary = f"{describe(plan, data, settings, steps)}\nrun folder: {folder}{' (resume)' * resume}\nserver: {url}"
    if dry_run:
        print(summary)
        return 0
    print(summary, file=sys.stderr)
    with claim(folder):
        if resume:
            check_resume(folder, url, data.sha256, settings)
        info = {"dataset_sha256": data.sha256, "base_url": url, **asdict(settings)}
        (folder / RUN_INFO).write_text(json.dumps(info, indent=1) + "\n")
        run_recipe(folder, url, settings, data, plan, steps)
    print(final_report(folder))
    return 0
