"""What the RL trainers (`train rl`, `train harbor`) share around tinker-cookbook's RL loop.

The loss is planned first, from what the server serves (rlcli.train.losses): a loss or --passes it
cannot serve fails in well under a second, before data is read or a model is made. Inside the run,
every training client the loop builds gets the planned route and has its step statistics recorded
(rlcli.train.stats); sampling draws no bars; one line per step; a final report from metrics.jsonl.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcli.options import Opt
from rlcli.train import greedy_score, metrics, run
from rlcli.train.folder import last_checkpoint, read_jsonl

if TYPE_CHECKING:
    from rlcli.train.losses import Passes

RlLoss = Literal["gspo", "cispo", "dppo", "ppo", "importance_sampling"]  # what the cookbook's RL data suits
LOSS = Opt("the loss, computed on the server: gspo, cispo, dppo, ppo or importance_sampling (the server's defaults; "
           "GSPO the paper's clip 3e-4/4e-4)")
ROUTES = {1: "fused", 2: "2-pass"}


def plan_losses(url: str, loss: RlLoss, loss_config: str | None, passes: Passes) -> Any:
    """Ask the server what it serves and settle loss, config and passes (rlcli.train.losses decides)."""
    from rlcli.train import losses  # called through the module, so tests can swap served_losses for a fake

    _, served = losses.served_losses(url)
    return losses.plan_loss(loss, loss_config, passes, served)


def describe_loss(plan: Any) -> str:
    return f"loss: {plan.loss} {ROUTES[plan.passes]}, config {json.dumps(plan.config, sort_keys=True)}: {plan.message}"


@contextlib.contextmanager
def routed(plan: Any, progress: RlProgress) -> Iterator[None]:
    """Inside the block, every tinker.TrainingClient gets `plan`'s loss route and has its step statistics
    recorded (for `progress`, which hands them to the step's metrics row), sampling draws no bars, the
    loss is reduced over each sequence's response tokens (the mask sent as weights), prompt logprobs
    come in the shape the cookbook slices, and held-out problems are asked as every scoring asks
    (rlcli.train.hooks)."""
    from rlcli.train import hooks
    from rlcli.train.losses import install_loss_route
    from rlcli.train.stats import StepStats

    stats = StepStats(plan.loss, plan.config)
    progress.step_metrics = stats.drain

    def on_client(client: Any) -> None:
        install_loss_route(client, plan)
        stats.watch(client)  # outside the route: it sees the recipe's data and the result the recipe reads

    with (hooks.on_training_client(on_client), hooks.quiet_rl_sampling(), hooks.capped_evaluation(),
          hooks.response_weights(), hooks.hosted_prompt_logprobs()):
        yield


@contextlib.contextmanager
def recipe(plan: Any, progress: RlProgress, config: Callable[[], Any]) -> Iterator[Callable[[], Any]]:
    """The cookbook's RL main on config(), with the loss route installed."""
    import asyncio

    from tinker_cookbook.rl import train

    with routed(plan, progress):
        built = config()
        yield lambda: asyncio.run(train.main(built))


class RlProgress(run.ProgressLine):
    """One line per RL step: step, reward, fraction correct, loss, clip fraction, route, step time."""

    step_key = metrics.BATCH

    def __init__(self, total_steps: int, loss: str, passes: int, stream: Any = None):
        super().__init__(total_steps, stream)
        self.route = f"{loss} {ROUTES[passes]}"

    def line(self, row: dict[str, Any], step: int, elapsed_s: float) -> str:
        # The recipe times each step itself (sampling to optim_step); time between calls adds its setup.
        return format_rl_progress(row, step, self.total_steps, self.route, row.get(metrics.TIME, elapsed_s))


def format_rl_progress(row: dict[str, Any], step: int, total_steps: int, route: str, elapsed_s: float) -> str:
    def value(key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "-"  # a batch whose groups all failed has none

    parts = [f"step {step + 1}/{total_steps}", f"reward {value(metrics.REWARD, '+.3f')}",
             f"correct {value(metrics.CORRECT, '.2f')}", f"loss {value(metrics.LOSS, '+.4f')}",
             f"clip {value(metrics.CLIP, '.2f')}", route, f"{elapsed_s:.2f}s"]
    if metrics.TEST_CORRECT in row:  # an evaluation step: scored before this step trained
        parts.append(f"held-out correct {row[metrics.TEST_CORRECT]:.2f}")
    return "  ".join(parts)


def reward_change(rewards: list[float]) -> str:
    """First -> last as the means of the first and last quarter of the steps: one step's reward is a mean over
    a handful of problems, so single steps swung more than a short run gained (the demo's 3 steps showed
    +0.153 -> +0.028 on batches of 4 problems)."""
    k = max(1, len(rewards) // 4)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    which = f" (mean of the first and last {k})" if k > 1 else ""
    return f"reward {first:+.3f} -> {last:+.3f} over {len(rewards)} steps{which}"


def final_report(folder: Path) -> str:
    rows = read_jsonl(folder / "metrics.jsonl")
    trained = [m for m in rows if metrics.REWARD in m]
    tested = [m for m in rows if metrics.TEST_CORRECT in m]
    final = last_checkpoint(folder, "sampler_path")
    lines = []
    if trained:
        lines.append(reward_change([m[metrics.REWARD] for m in trained]))
    if greedy := greedy_score.report_line(folder):
        lines.append(greedy)
    if tested:
        plural, when = "s" * (len(tested) != 1), ", ".join(str(m[metrics.BATCH] + 1) for m in tested)
        lines.append(f"held-out correct {tested[0][metrics.TEST_CORRECT]:.2f} -> "
                     f"{tested[-1][metrics.TEST_CORRECT]:.2f} ({len(tested)} evaluation{plural}, "
                     f"before step{plural} {when})")
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final:
        lines.append(f"final weights: {final['sampler_path']} (state: {final.get('state_path')})")
    return "\n".join(lines)
