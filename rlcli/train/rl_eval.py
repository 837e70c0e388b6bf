"""What an RL run is measured on and by, and how it says so: held-out problems, each step's loss and
clip fraction, the progress line and the final report.

Held-out evaluation. Every dataset keeps a test split that no training batch draws from; the recipe's
own evaluator (RLTestSetEvaluator, fed by the builder's second return value) samples each held-out
problem once every --eval-every steps, before that step trains, and metrics.jsonl gets `test/` keys
(test/env/all/correct, test/env/all/reward/total, ...).
- files: EVAL_SIZE distinct questions (at most a tenth of them) drawn with a fixed seed; every copy
  of a held-out question leaves training, so duplicates cannot leak across.
- arithmetic: EVAL_SIZE x + y pairs drawn with their own seed; training draws skip them in either
  order (3 + 4 is 4 + 3), and the few-shot example's pair is never held out.
- hub gsm8k: the first EVAL_SIZE problems of its test split (envs.HubGsm8kBuilder).

Step statistics. The cookbook logs no loss and no clip fraction (SkyRL returns per-token losses and
no loss metric), so each forward_backward future is wrapped; when the recipe reads its result:
    optim/loss           the server's objective as it reduces it: per sequence sum(loss_t) / sum(w_t),
                         then the mean over sequences (w: the weights the server used)
    optim/clip_fraction  among tokens with a non-zero advantage (those with gradient), the share the
                         clip acted on: ppo and gspo where the clipped term wins the min (ratio > high
                         with A > 0, ratio < low with A < 0: no gradient), cispo where the importance
                         weight was truncated, importance_sampling never; gspo's ratio is the
                         sequence's s_i. dppo has no ratio clip: no clip fraction.
They join the step's row in the cookbook's own logger call: one metrics.jsonl row per step.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from rlcli.train import last_checkpoint, read_jsonl
from rlcli.train.compat import ProgressLine

EVAL_SIZE = 32  # held-out problems by default
EVAL_SEED = 20_260_501  # the held-out draw's own seed: the training order uses the batch index as its seed
FILE_EVAL_SHARE = 10  # by default a file holds out at most 1/10 of its distinct questions
ARITHMETIC_MAX = 100  # the cookbook's ArithmeticDataset draws x, y from 0..100
ARITHMETIC_EVAL_MAX = 1000  # of its 5,151 distinct pairs (a smaller --max-operand: a third of its pairs)
FEWSHOT_PAIR = (4, 5)  # ArithmeticEnv.standard_fewshot_prefix asks 4 + 5 in every prompt
LOSS, CLIP = "optim/loss", "optim/clip_fraction"
ROUTES = {1: "fused", 2: "2-pass"}
REWARD, CORRECT = "env/all/reward/total", "env/all/correct"  # the cookbook's keys in metrics.jsonl
TEST_CORRECT = "test/env/all/correct"  # its RLTestSetEvaluator's, on the held-out problems
CLIPPED_LOSSES = ("ppo", "gspo", "cispo", "importance_sampling")
SERVER_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # SkyRL jax's (backends/jax.py)


# --- held-out splits (pure) ----------------------------------------------------------------------


def question_key(question: str) -> str:
    return " ".join(question.split())


def split_problems(records: list[dict[str, str]], eval_size: int,
                   seed: int = EVAL_SEED) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test): eval_size distinct questions drawn with `seed`; no copy of them stays in train."""
    first: dict[str, dict[str, str]] = {}
    for record in records:
        first.setdefault(question_key(record["question"]), record)
    chosen = set(random.Random(seed).sample(sorted(first), eval_size)) if eval_size else set()
    test = [record for key, record in first.items() if key in chosen]
    return [r for r in records if question_key(r["question"]) not in chosen], test


def file_eval_size(records: list[dict[str, str]], eval_size: int | None, source: str) -> int:
    from rlcli.errors import UsageError

    distinct = len({question_key(r["question"]) for r in records})
    if eval_size is None:
        return min(EVAL_SIZE, distinct // FILE_EVAL_SHARE)
    if eval_size >= distinct:
        raise UsageError(f"--eval-size {eval_size} would hold out all {distinct} distinct questions of {source}: "
                         "lower it (0: no held-out evaluation)")
    return eval_size


def arithmetic_eval_max(max_operand: int = ARITHMETIC_MAX) -> int:
    """Most pairs the synthetic set may hold out: ARITHMETIC_EVAL_MAX, and at most a third of its pairs."""
    distinct = (max_operand + 1) * (max_operand + 2) // 2 - 1  # unordered pairs, the few-shot one excluded
    return min(ARITHMETIC_EVAL_MAX, distinct // 3)


def arithmetic_eval_size(eval_size: int | None, max_operand: int = ARITHMETIC_MAX) -> int:
    """The held-out count for the synthetic set: as asked (checked), or EVAL_SIZE capped by the range."""
    check_arithmetic(0 if eval_size is None else eval_size, max_operand)
    return min(EVAL_SIZE, arithmetic_eval_max(max_operand)) if eval_size is None else eval_size


def check_arithmetic(eval_size: int, max_operand: int = ARITHMETIC_MAX) -> None:
    from rlcli.errors import UsageError

    if not FEWSHOT_PAIR[1] <= max_operand <= 10**6:
        raise UsageError(f"--max-operand {max_operand}: give {FEWSHOT_PAIR[1]} to 1000000 (the few-shot example "
                         f"asks {FEWSHOT_PAIR[0]} + {FEWSHOT_PAIR[1]})")
    if eval_size > (most := arithmetic_eval_max(max_operand)):
        raise UsageError(f"--eval-size {eval_size}: arithmetic with operands 0..{max_operand} holds out at most "
                         f"{most} problems")


def pair_key(x: int, y: int) -> tuple[int, int]:
    return (min(x, y), max(x, y))


def arithmetic_eval_pairs(n: int, seed: int = EVAL_SEED, max_operand: int = ARITHMETIC_MAX) -> list[tuple[int, int]]:
    """n distinct x + y problems (as unordered pairs), never the few-shot example's."""
    import numpy as np

    rng, pairs, seen = np.random.RandomState(seed), [], {pair_key(*FEWSHOT_PAIR)}
    while len(pairs) < n:
        x, y = int(rng.randint(0, max_operand + 1)), int(rng.randint(0, max_operand + 1))
        if pair_key(x, y) not in seen:
            seen.add(pair_key(x, y))
            pairs.append((x, y))
    return pairs


# --- the cookbook's datasets, split (import the cookbook: call only from a run) -------------------


def arithmetic_datasets(batch_size: int, group_size: int, n_batches: int, eval_size: int, renderer: Any,
                        max_operand: int = ARITHMETIC_MAX):
    """(train, test | None): the cookbook's ArithmeticDataset (x, y in 0..max_operand; the cookbook's own
    range is 0..100) minus the held-out pairs, and those pairs."""
    from functools import partial

    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset

    pairs = arithmetic_eval_pairs(eval_size, max_operand=max_operand)
    held_out = {pair_key(x, y) for x, y in pairs}
    prefix = ArithmeticEnv.standard_fewshot_prefix()

    def group(x: int, y: int, size: int) -> ProblemGroupBuilder:
        return ProblemGroupBuilder(env_thunk=partial(ArithmeticEnv, x, y, convo_prefix=prefix, renderer=renderer),
                                   num_envs=size)

    class HeldOutArithmetic(ArithmeticDataset):
        def _make_env_group_builder(self, rng: Any) -> ProblemGroupBuilder:
            while True:  # the same draws as the parent's; a held-out pair is drawn again (get_batch seeds rng)
                x, y = rng.randint(0, max_operand + 1), rng.randint(0, max_operand + 1)
                if pair_key(x, y) not in held_out:
                    return group(x, y, self.group_size)

    class ArithmeticTestSet(RLDataset):  # one batch: every held-out pair, sampled once
        def get_batch(self, index: int) -> list[ProblemGroupBuilder]:
            return [group(x, y, 1) for x, y in pairs]

        def __len__(self) -> int:
            return 1

    train = HeldOutArithmetic(batch_size=batch_size, renderer=renderer, group_size=group_size, n_batches=n_batches)
    return train, (ArithmeticTestSet() if pairs else None)


# --- step statistics -----------------------------------------------------------------------------


def clip_acted(loss: str, ratio_T, adv_T, low: float, high: float):
    """Per token: did the clip act (see the module docstring)?"""
    import numpy as np

    if loss in ("ppo", "gspo"):
        return ((ratio_T > high) & (adv_T > 0)) | ((ratio_T < low) & (adv_T < 0))
    if loss == "cispo":
        return (ratio_T > high) | (ratio_T < low)
    return np.zeros_like(ratio_T, dtype=bool)


def datum_statistics(loss: str, config: dict[str, float], datum: Any, output: dict[str, Any]):
    """(this sequence's loss as the server reduces it, clipped tokens, tokens with an advantage), or None."""
    import numpy as np

    from rlcli.train.losses import log_sequence_ratio, with_response_weights

    if loss == "gspo":  # both gspo routes send the response weights (losses.with_response_weights)
        datum = with_response_weights(datum)
    inputs = datum.loss_fn_inputs
    if not {"elementwise_loss", "logprobs"} <= set(output):  # a backend that returns no per-token losses
        return None
    loss_T, lp_T = (np.asarray(output[k].tolist(), dtype=np.float64) for k in ("elementwise_loss", "logprobs"))
    w_T = np.asarray(inputs["weights"].tolist(), dtype=np.float64) if "weights" in inputs else np.ones_like(lp_T)
    seq_loss = float(loss_T.sum() / max(w_T.sum(), 1e-9))
    if loss not in CLIPPED_LOSSES or "advantages" not in inputs:
        return seq_loss, 0, 0
    adv_T, old_T = (np.asarray(inputs[k].tolist(), dtype=np.float64) for k in ("advantages", "logprobs"))
    if loss == "gspo":
        ratio_T = np.full_like(lp_T, math.exp(log_sequence_ratio(lp_T, old_T, w_T)))
    else:
        ratio_T = np.exp(lp_T - old_T)
    limits = {**SERVER_CLIP_DEFAULTS, **config}
    active_T = (adv_T != 0) & (w_T != 0)
    clipped_T = clip_acted(loss, ratio_T, adv_T, limits["clip_low_threshold"], limits["clip_high_threshold"])
    return seq_loss, int((clipped_T & active_T).sum()), int(active_T.sum())


class StepStats:
    """Collects the statistics of each forward_backward result; `drain` hands over one step's worth."""

    def __init__(self, loss: str, config: dict[str, float] | None):
        self.loss, self.config = loss, dict(config or {})
        self._seq_losses: list[float] = []
        self._clipped = self._active = 0

    def record(self, data: list, result: Any, config: dict[str, float] | None) -> None:
        for datum, output in zip(data, result.loss_fn_outputs, strict=True):
            if figures := datum_statistics(self.loss, {**self.config, **(config or {})}, datum, output):
                self._seq_losses.append(figures[0])
                self._clipped, self._active = self._clipped + figures[1], self._active + figures[2]

    def drain(self) -> dict[str, float]:
        if not self._seq_losses:
            return {}
        out = {LOSS: sum(self._seq_losses) / len(self._seq_losses)}
        if self.loss in CLIPPED_LOSSES:
            out[CLIP] = self._clipped / self._active if self._active else 0.0  # nothing with gradient: nothing clipped
        self._seq_losses, self._clipped, self._active = [], 0, 0
        return out

    def watch(self, client: Any) -> None:
        """Record every forward_backward_async result of `client` (the cookbook's RL loop uses no other)."""
        submit = client.forward_backward_async

        async def forward_backward_async(data, loss_fn, loss_fn_config=None):
            future = await submit(data, loss_fn, loss_fn_config)
            return RecordingFuture(future, lambda result: self.record(data, result, loss_fn_config))

        client.forward_backward_async = forward_backward_async


class RecordingFuture:
    """A tinker future that hands its result to `on_result` once, the first time it is read."""

    def __init__(self, future: Any, on_result: Any):
        self._future, self._on_result = future, on_result

    def _seen(self, result: Any) -> Any:
        if self._on_result is not None:
            on_result, self._on_result = self._on_result, None
            on_result(result)
        return result

    async def result_async(self, timeout: float | None = None) -> Any:
        return self._seen(await self._future.result_async(timeout))

    def result(self, timeout: float | None = None) -> Any:
        return self._seen(self._future.result(timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


@contextlib.contextmanager
def step_statistics_logged(stats: StepStats) -> Iterator[None]:
    """Inside the block, the cookbook's metrics logger adds `stats` to each step's row of metrics.jsonl."""
    from tinker_cookbook.utils import ml_log

    original = ml_log.setup_logging

    def setup_logging(*args: Any, **kwargs: Any) -> Any:
        ml_logger = original(*args, **kwargs)
        log_metrics = ml_logger.log_metrics

        def with_step_statistics(metrics: dict[str, Any], step: int | None = None) -> None:
            if "progress/batch" in metrics:  # a training step's row (the recipe logs one per step)
                metrics = {**metrics, **stats.drain()}
            log_metrics(metrics, step)

        ml_logger.log_metrics = with_step_statistics
        return ml_logger

    ml_log.setup_logging = setup_logging
    try:
        yield
    finally:
        ml_log.setup_logging = original


# --- what the run prints ---------------------------------------------------------------------------


class RlProgress(ProgressLine):
    """One line per RL step: step, reward, fraction correct, loss, clip fraction, route, step time."""

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

    parts = [f"step {step + 1}/{total_steps}", f"reward {value(REWARD, '+.3f')}", f"correct {value(CORRECT, '.2f')}",
             f"loss {value(LOSS, '+.4f')}", f"clip {value(CLIP, '.2f')}", route, f"{elapsed_s:.2f}s"]
    if TEST_CORRECT in metrics:  # an evaluation step: scored before this step trained
        parts.append(f"held-out correct {metrics[TEST_CORRECT]:.2f}")
    return "  ".join(parts)


def final_report(folder: Path) -> str:
    rows = read_jsonl(folder / "metrics.jsonl")
    trained, tested = [m for m in rows if REWARD in m], [m for m in rows if TEST_CORRECT in m]
    final = last_checkpoint(folder, "sampler_path")
    lines = []
    if trained:
        lines.append(f"reward {trained[0][REWARD]:+.3f} -> {trained[-1][REWARD]:+.3f} over {len(trained)} steps")
    if tested:
        plural, when = "s" * (len(tested) != 1), ", ".join(str(m["progress/batch"] + 1) for m in tested)
        lines.append(f"held-out correct {tested[0][TEST_CORRECT]:.2f} -> {tested[-1][TEST_CORRECT]:.2f} "
                     f"({len(tested)} evaluation{plural}, before step{plural} {when})")
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final:
        lines.append(f"final weights: {final['sampler_path']} (state: {final.get('state_path')})")
    return "\n".join(lines)
