"""`rlcli eval`: score a checkpoint, a run's final weights, or the base model on held-out problems.

Launch:  rlcli eval --dataset arithmetic                               (the server's base model)
         rlcli eval --dataset arithmetic --checkpoint RUN_FOLDER       (the run's last sampler weights)
         rlcli eval --dataset gsm8k --eval-size 1319 --checkpoint tinker://RUN/sampler_weights/ID

The problems are exactly the ones `rlcli train rl` holds out for the same --dataset, --eval-size and
--max-operand (rlcli.problems.heldout): never in a training batch of such a run, so a score before and a
score after training compare the same unseen problems. They are graded by the same env code as in
training (the cookbook's; rlcli's for plain files). --temperature 0 (the default) scores the greedy
answer; --temperature 1 --samples K scores K sampled answers per problem, as training samples them.
The result is one line on stderr and a JSON object on stdout (and in --output).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

from rlcli.errors import UsageError
from rlcli.problems.heldout import Grader
from rlcli.problems.traces import Env, Reward, Turn
from rlcli.train.metrics import TEST_CORRECT as CORRECT
from rlcli.train.metrics import TEST_REWARD as REWARD

Policy = Literal["oracle", "nop"]


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


def check_numbers(samples: int, temperature: float, max_tokens: int, eval_size: int | None) -> None:
    from rlcli.train.run import check_numbers as at_least

    at_least(samples=samples, max_tokens=max_tokens)
    if temperature < 0:
        raise UsageError(f"--temperature must be 0 (greedy) or more, got {temperature}")
    if samples > 1 and temperature == 0:
        raise UsageError("--samples N needs --temperature above 0: greedy answers are the same every time")
    if eval_size is not None and eval_size < 1:  # unlike train rl's, 0 would score nothing
        raise UsageError(f"--eval-size must be at least 1, got {eval_size}")


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Mean correct share and reward over the rounds (each round scores every problem once)."""
    correct = [r[CORRECT] for r in rounds]
    reward = [r[REWARD] for r in rounds if REWARD in r]
    return {"correct": sum(correct) / len(correct), "reward": sum(reward) / len(reward) if reward else None,
            "correct_per_round": correct}


def evaluate(dataset: str | None = None, checkpoint: str | None = None, dataset_path: str | None = None,
             eval_size: int | None = None, max_operand: int | None = None, grader: Grader = "auto",
             samples: int = 1, temperature: float = 0.0, max_tokens: int = 256,
             base_url: str | None = None, renderer: str | None = None, output: str | None = None,
             env: Env = "problems", reward: Reward = "match", match: str = "normalized", turn: Turn = "last",
             rubric: str | None = None, policy: Policy | None = None,
             server_timeout: float = 60.0) -> int:
    """Score a checkpoint (or the base model) on the problems `rlcli train rl` holds out.

    Args:
        dataset: arithmetic, gsm8k, or a JSONL file of {"question", "answer"} (as for train rl)
        checkpoint: sampler weights tinker://RUN/sampler_weights/ID, or a run folder (its last ones);
            default: the server's base model
        dataset_path: with --dataset gsm8k: read it from this JSONL file (offline) instead of the hub
        eval_size: held-out problems, as train rl's --eval-size (default 32, fewer for a
            small --max-operand; gsm8k: its first N test problems)
        max_operand: with --dataset arithmetic: x and y in 0..N, as train rl's --max-operand (default 100)
        grader: for files, as train rl's --grader
        samples: answers per problem (needs --temperature above 0)
        temperature: sampling temperature (0: the greedy answer)
        max_tokens: longest answer in tokens
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        output: also write the JSON result to this file
        env: problems, or replay|tools: --dataset is traces, scored on the prompts train rl --env replay|tools
            holds out
        reward: with --env replay: match, verdict or rubric, as train rl's (a judge ranks groups: not here)
        match: as train rl's --match
        turn: as train rl's --turn
        rubric: as train rl's --rubric
        policy: with --env tools: oracle (replays the logged calls and answer) or nop (calls and says
            nothing) instead of a model: checks an environment, asks no server
        server_timeout: seconds the server may go without answering before the command stops (0: wait for ever)
    """
    if policy:
        return _play(env, dataset, policy, match, output)
    from rlcli.problems.heldout import choose_dataset
    from rlcli.problems.traces import spec_from_flags

    check_numbers(samples, temperature, max_tokens, eval_size)
    if reward == "judge":
        raise UsageError("--reward judge ranks a group of samples in training; score held-out replies with "
                         "--reward match, verdict or rubric")
    spec = spec_from_flags(env, dataset, dataset_path, grader, max_operand, reward, match, turn, rubric, None)
    name, path, grader = ("replay", None, "auto") if spec else choose_dataset(dataset, dataset_path, grader,
                                                                              max_operand, eval_size)
    source = sampler_path(checkpoint) if checkpoint else None
    started = time.monotonic()
    from rlcli.config import resolve_base_url
    from rlcli.watchdog import watch

    with watch(resolve_base_url(base_url), server_timeout):
        result = _evaluate(name, path, grader, source, eval_size, max_operand, samples, temperature, max_tokens,
                           base_url, renderer, spec)
    result["seconds"] = round(time.monotonic() - started, 2)
    line = json.dumps(result)
    if output:
        Path(output).expanduser().write_text(json.dumps(result, indent=1) + "\n")
    print(f"rlcli: {result['source']}: {result['correct']:.3f} correct on {result['problems']} held-out problems of "
          f"{result['dataset']} ({samples} answer{'s' * (samples > 1)} each, temperature {temperature:g}) "
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
        from tinker_cookbook.rl.metric_util import RLTestSetEvaluator

        from rlcli.problems import envs

        data = envs.load_data(name, path, 1, None, grader, eval_size, max_operand or heldout.ARITHMETIC_MAX, spec)
        if not data.held_out:
            raise UsageError(f"{data.label}: too few distinct prompts to hold any out: pass --eval-size N")
        _, test = asyncio.run(envs.dataset_builder(data, model, renderer, 1, 1)())
        evaluator = RLTestSetEvaluator(test, max_tokens=max_tokens, name="test", num_groups_to_log=0)
        rounds = []
        for r in range(samples):
            policy = TinkerTokenCompleter(s.client, max_tokens=max_tokens, temperature=temperature)
            rounds.append(asyncio.run(evaluator.eval_token_completer(policy)))
            if samples > 1:
                print(f"rlcli: eval round {r + 1}/{samples}: {rounds[-1][CORRECT]:.3f} correct", file=sys.stderr)
    finally:
        sample.close(s)
    return {"source": source or model, "dataset": data.label, "problems": data.held_out, "samples": samples,
            "temperature": temperature, "max_tokens": max_tokens, "renderer": renderer, "base_model": model,
            **summarize(rounds)}
