"""`rlcli eval`: score a checkpoint, a run's final weights, or the base model on held-out problems (the one
scorer: rlcli.problems.score).

Launch:  rlcli eval --dataset arithmetic                               (the server's base model)
         rlcli eval --dataset arithmetic --checkpoint RUN_FOLDER       (the run's last sampler weights)
         rlcli eval --dataset gsm8k --eval-size 1319 --checkpoint tinker://RUN/sampler_weights/ID

The problems are exactly the ones `rlcli train rl` holds out for the same --dataset, --eval-size and
--max-operand (rlcli.problems.heldout): never in a training batch of such a run, so a score before and a
score after training compare the same unseen problems. They are graded by the same env code as in
training (the cookbook's; rlcli's for plain files). --temperature 0 (the default) scores the greedy
answer; --temperature 1 --samples K scores K sampled answers per problem, as training samples them. Every
answer of every round is asked at once, and the server samples them in batches.
The result is one line on stderr and a JSON object on stdout (and in --output).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlcli.errors import UsageError
from rlcli.options import (
    CHECKPOINT,
    MAX_TOKENS,
    RENDERER,
    SAMPLES,
    TEMPERATURE,
    ServerOptions,
    bound_problem,
    option,
    sampled,
)
from rlcli.problems.heldout import ProblemSet
from rlcli.problems.traces import ReplayOptions
from rlcli.train.metrics import TEST_CORRECT as CORRECT
from rlcli.train.metrics import TEST_REWARD as REWARD

Policy = Literal["oracle", "nop"]


@dataclass(frozen=True, kw_only=True)
class EvalOptions(ServerOptions, ProblemSet, ReplayOptions):
    """`rlcli eval`'s options: train rl's problem set and replay options, and how to sample."""

    checkpoint: str | None = CHECKPOINT(None)
    samples: int = SAMPLES(1)
    temperature: float = TEMPERATURE(0.0)
    max_tokens: int = MAX_TOKENS(256)
    renderer: str | None = RENDERER(None)
    output: str | None = option(None, "also write the JSON result to this file", short="-o")
    policy: Policy | None = option(None, "with --env tools: oracle (replays the logged calls and answer) or nop "
                                         "(calls and says nothing) instead of a model: checks an environment, asks no "
                                         "server")

    def problems(self) -> Iterator[str]:
        yield from sampled(self.samples, self.temperature)
        if self.eval_size is not None and self.eval_size < 1:  # unlike train rl's, 0 would score nothing
            yield bound_problem("--eval-size", self.eval_size, "at least 1")
        if self.reward == "judge":
            yield ("--reward judge ranks a group of samples in training; score held-out replies with --reward match, "
                   "verdict or rubric")


def sampler_path(checkpoint: str) -> str:
    """A tinker:// sampler path as given, or the newest one a run folder's checkpoints.jsonl lists."""
    if checkpoint.startswith("tinker://"):
        return checkpoint
    from rlcli.train.folder import last_checkpoint

    folder = Path(checkpoint).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--checkpoint {checkpoint}: neither a tinker:// path nor a run folder")
    last = last_checkpoint(folder, "sampler_path")
    if not last:
        raise UsageError(f"--checkpoint {checkpoint}: its checkpoints.jsonl lists no sampler weights "
                         "(a run saves them at its end; was it finished?)")
    return last["sampler_path"]


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Mean correct share and reward over the rounds (each round scores every problem once)."""
    correct = [r[CORRECT] for r in rounds]
    reward = [r[REWARD] for r in rounds if REWARD in r]
    return {"correct": sum(correct) / len(correct), "reward": sum(reward) / len(reward) if reward else None,
            "correct_per_round": correct}


def evaluate(o: EvalOptions) -> int:
    """Score a checkpoint (or the base model) on the problems `rlcli train rl` holds out."""
    if o.policy:
        return _play(o.env, o.dataset, o.policy, o.match, o.output)
    from rlcli.problems.heldout import choose_dataset
    from rlcli.problems.traces import spec_from_flags

    spec = spec_from_flags(o.env, o.dataset, o.dataset_path, o.grader, o.max_operand, o.reward, o.match, o.turn,
                           o.rubric, None)
    name, path, grader = ("replay", None, "auto") if spec else choose_dataset(o.dataset, o.dataset_path, o.grader,
                                                                              o.max_operand, o.eval_size)
    source = sampler_path(o.checkpoint) if o.checkpoint else None
    started = time.monotonic()
    from rlcli.config import resolve_base_url
    from rlcli.watchdog import watch

    with watch(resolve_base_url(o.base_url), o.server_timeout):
        result = _evaluate(name, path, grader, source, o.eval_size, o.max_operand, o.samples, o.temperature,
                           o.max_tokens, o.base_url, o.renderer, spec)
    result["seconds"] = round(time.monotonic() - started, 2)
    line = json.dumps(result)
    if o.output:
        Path(o.output).expanduser().write_text(json.dumps(result, indent=1) + "\n")
    print(f"rlcli: {result['source']}: {result['correct']:.3f} correct on {result['problems']} held-out problems of "
          f"{result['dataset']} ({o.samples} answer{'s' * (o.samples > 1)} each, temperature {o.temperature:g}) "
          f"in {result['seconds']:.1f} s", file=sys.stderr)
    print(line)
    return 0


def _play(env: str, dataset: str | None, policy: str | None, match: str, output: str | None) -> int:
    from rlcli.problems import rewards, tools_env

    if env != "tools" or not policy or not dataset:
        raise UsageError("--policy oracle|nop plays --env tools --dataset TRACES.jsonl without a model: "
                         "pass all three (or drop --policy to score the model)")
    result = tools_env.run_policy(dataset, policy, rewards.check_match(match))
    if output:
        Path(output).expanduser().write_text(json.dumps(result, indent=1) + "\n")
    print(f"rlcli: policy {policy}: reward {result['reward']:.3f}, answers correct {result['correct']:.3f}, call "
          f"precision {result['precision']:.3f} recall {result['recall']:.3f} on {result['problems']} problems of "
          f"{result['dataset']}", file=sys.stderr)
    print(json.dumps(result))
    return 0


def _evaluate(name: str, path: str | None, grader: str, source: str | None, eval_size: int | None,
              max_operand: int | None, samples: int, temperature: float, max_tokens: int,
              base_url: str | None, renderer: str | None, spec: Any = None) -> dict[str, Any]:
    import asyncio

    from rlcli import sample
    from rlcli.config import resolve_base_url
    from rlcli.problems import heldout
    from rlcli.train import run

    url = resolve_base_url(base_url)
    s = sample.open_sampler(source, None, url, None, max_tokens, temperature, 0)
    try:
        if source:  # a finished run's weights are served again from its training state if need be
            sample.complete(s, [{"role": "user", "content": "1 + 1"}])
        model = s.base_model
        renderer = run.prepare_model(model, renderer)
        from tinker_cookbook.completers import TinkerTokenCompleter

        from rlcli.problems import envs, score

        data = envs.load_data(name, path, 1, None, grader, eval_size, max_operand or heldout.ARITHMETIC_MAX, spec)
        if not data.held_out:
            raise UsageError(f"{data.label}: too few distinct prompts to hold any out: pass --eval-size N")
        _, test = asyncio.run(envs.dataset_builder(data, model, renderer, 1, 1)())
        problems = score.problems_of(test)
        policy = TinkerTokenCompleter(s.client, max_tokens=max_tokens, temperature=temperature)
        rounds = [score.means(problems, graded) for graded in score.rounds(problems, policy, samples)]
        for r, found in enumerate(rounds if samples > 1 else []):
            print(f"rlcli: eval round {r + 1}/{samples}: {found[CORRECT]:.3f} correct", file=sys.stderr)
    finally:
        sample.close(s)
    return {"source": source or model, "dataset": data.label, "problems": data.held_out, "samples": samples,
            "temperature": temperature, "max_tokens": max_tokens, "renderer": renderer, "base_model": model,
            **summarize(rounds)}
