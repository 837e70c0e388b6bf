"""Held-out evaluation, 2 models x N problems (issue 48): one request at a time (the baseline), every request sent
at once uncapped (how the cookbook's test-set evaluator asked in `train rl --eval-every` and `train distill` before
issue 48), and at most IN_FLIGHT waiting (rlcli.problems.score: `rlcli eval`, `--greedy-score`, the loop, and now the
trainers' held-out evaluation through score.HeldOutEvaluator). Then the trainers' evaluators themselves, as a run
calls them (temperature 1): the cookbook's RLTestSetEvaluator against score.HeldOutEvaluator.

    .venv/bin/python -m benchmarks.eval_batching [--problems 400] [--rounds 2] [--max-tokens 32] [--out DIR]

One private server on the embedded model. The two models: the base model and a LoRA's sampler weights (saved
untrained: what is timed is the asking, not what the model knows), scored one after the other as `rlcli eval` or a
trainer scores them. The problems: `rlcli eval --dataset arithmetic --max-operand 99 --eval-size N`'s held-out sums,
graded by their env, answered greedily (so the arms' answers can be compared). A first pass of each arm builds the
sampling programs (recorded, not timed); then `rounds` timed passes, the order turned around each round. Recorded:
every pass's wall time, the medians and their ratios, how many greedy replies agree with one at a time's, and each
evaluator's mean correct share (sampled: close, not equal).
Writes benchmarks/receipts/eval-batching-<date>.json (or in --out).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import fire

from benchmarks.common import stop_servers_on_sigterm, summary, versions, write_receipt
from benchmarks.loop_scoring import alternating
from benchmarks.models import server_versions
from rlcli.model import ensure_embedded_model
from rlcli.server.private import private_server

ARMS = ("one_at_a_time", "uncapped", "capped")
EVALUATORS = ("cookbook", "rlcli")


def held_out(model: str, count: int) -> tuple[Any, list, Any]:
    """`rlcli eval --dataset arithmetic --max-operand 99 --eval-size count`'s test set, its problems, their
    renderer."""
    from tinker_cookbook import renderers as cookbook
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlcli.problems import envs, score
    from rlcli.train import run

    renderer = run.prepare_model(model, None)
    data = envs.load_data("arithmetic", None, 1, None, "arithmetic", count, 99)
    _, test = asyncio.run(envs.dataset_builder(data, model, renderer, 1, 1)())
    problems = score.problems_of(test)
    assert len(problems) == count, f"only {len(problems)} held-out problems"
    return test, problems, cookbook.get_renderer(renderer, get_tokenizer(model))


def score_both(policies: dict[str, Any], problems: list, renderer: Any, arm: str) -> tuple[float, list[str]]:
    """Both models, one after the other, answer every problem: one request at a time, all at once, or capped."""
    from rlcli.problems import score

    start = time.perf_counter()
    replies: list[str] = []
    for policy in policies.values():
        in_flight = len(problems) if arm == "uncapped" else score.IN_FLIGHT
        graded = score.answer(problems, policy, one_at_a_time=arm == "one_at_a_time", in_flight=in_flight)
        replies += [g.reply for g in score.per_problem(graded, renderer)]
    return time.perf_counter() - start, replies


def evaluate_both(clients: dict[str, Any], test: Any, max_tokens: int, arm: str) -> tuple[float, float]:
    """Both models, one after the other, through a trainer's held-out evaluator: (seconds, mean correct share)."""
    from tinker_cookbook.rl.metric_util import RLTestSetEvaluator

    from rlcli.problems.score import HeldOutEvaluator

    kind = RLTestSetEvaluator if arm == "cookbook" else HeldOutEvaluator
    start = time.perf_counter()
    correct = [asyncio.run(kind(test, max_tokens=max_tokens, num_groups_to_log=0)(c))["test/env/all/correct"]
               for c in clients.values()]
    return time.perf_counter() - start, sum(correct) / len(correct)


def main(problems: int = 400, rounds: int = 2, max_tokens: int = 32, label: str = "", out: str | None = None) -> None:
    import tinker
    from tinker_cookbook.completers import TinkerTokenCompleter

    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    model = str(ensure_embedded_model())
    test, probs, renderer = held_out(model, problems)
    with private_server(model) as server:
        service = tinker.ServiceClient(base_url=server.url)
        training = service.create_lora_training_client(base_model=model, rank=8).result()
        lora = training.save_weights_for_sampler(name="bench").result().path
        clients = {"base": service.create_sampling_client(base_model=model).result(),
                   "lora": service.create_sampling_client(model_path=lora).result()}
        policies = {who: TinkerTokenCompleter(c, max_tokens=max_tokens, temperature=0.0) for who, c in clients.items()}
        first, replies = {}, {}
        for arm in ARMS:  # builds every sampling program the arms need
            first[arm], replies[arm] = score_both(policies, probs, renderer, arm)
            print(f"first pass {arm}: {first[arm]:.2f}s", flush=True)
        for arm in EVALUATORS:
            first[f"evaluator_{arm}"], _ = evaluate_both(clients, test, max_tokens, arm)
        raw = alternating(ARMS, rounds, lambda a: score_both(policies, probs, renderer, a)[0])
        correct: dict[str, list[float]] = {arm: [] for arm in EVALUATORS}

        def evaluated(arm: str) -> float:
            seconds, share = evaluate_both(clients, test, max_tokens, arm)
            correct[arm].append(share)
            return seconds

        raw_evaluators = alternating(EVALUATORS, rounds, evaluated)
    results = {arm: summary(v) for arm, v in raw.items()}
    evaluators = {arm: summary(v) for arm, v in raw_evaluators.items()}
    speedup = {arm: results["one_at_a_time"]["median"] / results[arm]["median"] for arm in ARMS[1:]}
    speedup["capped_over_uncapped"] = results["uncapped"]["median"] / results["capped"]["median"]
    speedup["evaluator_rlcli_over_cookbook"] = evaluators["cookbook"]["median"] / evaluators["rlcli"]["median"]
    agree = {arm: sum(a == b for a, b in zip(replies["one_at_a_time"], replies[arm], strict=True)) for arm in ARMS[1:]}
    body = {"label": label, "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {"problems": problems, "models": 2, "rounds": rounds, "max_tokens": max_tokens,
                       "dataset": "arithmetic, --max-operand 99, held out", "temperature": 0,
                       "model": "rlcli-tiny-qwen3-v1", "server": "`rlcli serve start` defaults"},
            "raw": {"seconds": raw, "evaluator_seconds": raw_evaluators, "first_pass_s": first},
            "results": results, "evaluators": evaluators, "evaluator_correct": correct, "speedup": speedup,
            "greedy_replies_agree_with_one_at_a_time": {arm: f"{n}/{2 * problems}" for arm, n in agree.items()}}
    receipt = write_receipt("eval-batching", body, Path(out) if out else None)
    print(f"2 models x {problems} problems: " + ", ".join(f"{arm} {r['median']:.2f}s" for arm, r in results.items())
          + "; evaluators (temperature 1): " + ", ".join(f"{arm} {r['median']:.2f}s" for arm, r in evaluators.items())
          + "; speed-ups " + ", ".join(f"{k} {v:.1f}x" for k, v in speedup.items()))
    print(f"greedy replies agree with one at a time: {agree}; receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
