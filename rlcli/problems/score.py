"""The one scorer: a model answers problems, and each answer is graded by its problem's own env, as in training.

A problem is a tinker-cookbook env group (a problem set's held-out split, or logged conversations as replay envs);
the model answers through a token completer, and the env's step says what the answer earned. `rlcli eval` takes
the means (`means`: the cookbook's trajectory metrics, as its RL test-set evaluator reports them, under `test/`);
the loop's gate compares two models problem by problem (`Scored`: with k answers, the share right). The caller
opens the sampler and chooses the renderer: nothing here imports a trainer. Every scoring asks the same way
(`capped`): all problems at once, at most IN_FLIGHT requests waiting; so does the trainers' held-out evaluation
(`HeldOutEvaluator`, the cookbook's test-set evaluator with its requests capped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import AllTrajectoriesFailedError
from tinker_cookbook.rl.metric_util import (
    RLTestSetEvaluator,
    compute_trajectory_metrics,
    dataset_to_env_group_builders,
)
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, TrajectoryGroup
from tinker_cookbook.utils import logtree

PREFIX = "test"  # the metrics' namespace: what the trainers log for held-out problems (rlcli.train.metrics)
# Sampling requests one scoring keeps waiting at the server at once. SkyRL samples every pending sequence in one
# batch (unless sample_max_num_sequences is set): uncapped, `eval --samples 8` on 1,319 GSM8K problems would be one
# batch of 10,552 sequences. 64 keeps batches within the padded sizes up to 72, which a server compiles once.
IN_FLIGHT = 64


@dataclass(frozen=True)
class Scored:
    """One problem's grade: its env's correct share and total reward (means over the group), the first reply."""

    correct: float
    reward: float
    reply: str


def problems_of(dataset: RLDataset) -> list[EnvGroupBuilder]:
    """Every problem of a test set, in its order."""
    return dataset_to_env_group_builders(dataset)


def capped(policy: Any, in_flight: int = IN_FLIGHT) -> Any:
    """`policy` (a token completer) with at most `in_flight` of its calls waiting at once (IN_FLIGHT says why).
    Make it inside the event loop that calls it: its semaphore belongs to that loop."""
    room = asyncio.Semaphore(in_flight)

    async def limited(*args: Any, **kwargs: Any) -> Any:
        async with room:
            return await policy(*args, **kwargs)

    return limited


class HeldOutEvaluator(RLTestSetEvaluator):
    """The cookbook's test-set evaluator (`train rl --eval-every`, `train distill`'s held-out correctness), asking as
    every scoring here does: its own evaluator sends every problem's request at once, uncapped, so 400 held-out
    problems were batches of whatever sizes their arrival made, each new size a new sampling program to build
    (benchmarks/eval_batching.py). Same rollouts, same metrics; with a rollout executor, the cookbook's own path."""

    async def __call__(self, sampling_client: Any, **kwargs: Any) -> dict[str, float]:
        from tinker_cookbook.completers import TinkerTokenCompleter
        from tinker_cookbook.rl.rollouts import get_rollout_executor

        if get_rollout_executor() is not None:
            return await super().__call__(sampling_client, **kwargs)
        policy = TinkerTokenCompleter(sampling_client, max_tokens=self.max_tokens)  # as the cookbook's: temperature 1
        return await self.eval_token_completer(capped(policy), **kwargs)


def answer(problems: Sequence[EnvGroupBuilder], policy: Any, one_at_a_time: bool = False,
           in_flight: int = IN_FLIGHT) -> list[TrajectoryGroup | None]:
    """Each problem answered by `policy` (a token completer) and graded by its env; None where every answer
    failed. Every problem's requests are sent at once, at most `in_flight` waiting at a time: the server samples the
    sequences of all pending requests in one batch, padded to a few sizes (IN_FLIGHT says why the cap), and a group
    of k answers is k requests. one_at_a_time: each problem waits for the one before (how the loop scored before
    batching; the baseline of benchmarks/loop_scoring.py)."""

    async def every() -> list[TrajectoryGroup | None]:
        limited = capped(policy, 1 if one_at_a_time else in_flight)

        async def one(problem: EnvGroupBuilder) -> TrajectoryGroup | None:
            try:
                with logtree.optional_enable_logging(enable=False):
                    return await do_group_rollout(problem, limited)
            except AllTrajectoriesFailedError:
                return None

        if one_at_a_time:
            return [await one(p) for p in problems]
        return list(await asyncio.gather(*(one(p) for p in problems)))

    return asyncio.run(every())


def rounds(problems: Sequence[EnvGroupBuilder], policy: Any, count: int) -> list[list[TrajectoryGroup | None]]:
    """`count` rounds of every problem (each round answers each problem once), all sent at once: `rlcli eval
    --samples K` in one batch instead of K in turn."""
    graded = answer([p for _ in range(count) for p in problems], policy)
    return [graded[r * len(problems):(r + 1) * len(problems)] for r in range(count)]


def means(problems: Sequence[EnvGroupBuilder], graded: Sequence[TrajectoryGroup | None]) -> dict[str, float]:
    """The cookbook's metrics over every graded problem, `test/env/all/correct` and `.../reward/total` among them."""
    done = [(p, g) for p, g in zip(problems, graded, strict=True) if g is not None]
    if not done:
        return {}
    found = compute_trajectory_metrics([g for _, g in done], [p.logging_tags() for p, _ in done])
    return {f"{PREFIX}/{key}": value for key, value in found.items()}


def per_problem(graded: Sequence[TrajectoryGroup | None], renderer: renderers.Renderer) -> list[Scored]:
    """Each problem's grade (a problem whose answers all failed scores 0, with no reply)."""
    return [_scored(g, renderer) if g is not None else Scored(0.0, 0.0, "") for g in graded]


def _scored(group: TrajectoryGroup, renderer: renderers.Renderer) -> Scored:
    rewards = group.get_total_rewards()
    correct = [t.metrics.get("correct", 0.0) for traj in group.trajectories_G for t in traj.transitions[-1:]]
    first = group.trajectories_G[0].transitions[0].ac.tokens
    reply = renderers.get_text_content(renderer.parse_response(first)[0]).strip()
    return Scored(sum(correct) / max(len(correct), 1), sum(rewards) / max(len(rewards), 1), reply)
