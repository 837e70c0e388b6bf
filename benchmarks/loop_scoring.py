"""The loop's evaluation: 2 models x N problems scored one request at a time (how the loop scored before issue 46)
against every request sent at once (the server samples pending requests in one padded batch); and `rlcli eval
--samples K`'s rounds in turn against all rounds at once.

    .venv/bin/python -m benchmarks.loop_scoring [--problems 64] [--rounds 3] [--samples 4] [--label L]

One private server on the embedded model. The two models: the base model and a LoRA's sampler weights (saved
untrained: what is timed is the scoring, not what the model knows). The problems: `rlcli.loop.batches` chats, as
the loop evaluates them (greedy, --match number, 16 answer tokens), through `rlcli.loop.evaluation`. Loop arms: one
request at a time (before), each model's requests at once with the models in turn, both models' at once (now). A
first pass of each arm builds the sampling programs (recorded, not timed); then `rounds` timed passes, the order
turned around each round. Recorded: every pass's wall time, the medians and their ratios, how many greedy replies
agree with one-at-a-time's, and eval's K rounds (temperature 1) in turn against at once likewise. Writes
benchmarks/receipts/loop-scoring-<date>.json.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import fire

from benchmarks.common import stop_servers_on_sigterm, summary, versions, write_receipt
from benchmarks.models import server_versions
from rlcli.loop import batches, evaluation
from rlcli.loop.ledger import Champion
from rlcli.loop.settings import LoopSettings
from rlcli.model import ensure_embedded_model
from rlcli.problems.traces import first_problems
from rlcli.server.private import private_server

ARMS = ("one_at_a_time", "each_at_once", "both_at_once")
EVAL_ARMS = ("in_turn", "at_once")


def loop_problems(count: int) -> list:
    """`count` distinct loop problems: the three batches' chats (sums, doors, chests)."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for batch in (1, 2, 3) for q, a in batches.chats(batch, count, seed=7)]
    found = first_problems(rows, count, "bench")
    assert len(found) == count, f"only {len(found)} distinct prompts"
    return found


def score_both(models: dict[str, Champion], probs: list, s: LoopSettings, url: str, arm: str) -> tuple[float, list]:
    """2 models x the problems: one request at a time (the loop before), each model's requests at once (the
    models in turn), or both models' at once (the loop now: evaluation.answers_of)."""
    start = time.perf_counter()
    if arm == "both_at_once":
        graded = evaluation.answers_of(models, probs, s, url)
    else:
        graded = {who: evaluation.answers(model, probs, s, url, one_at_a_time=arm == "one_at_a_time")
                  for who, model in models.items()}
    return time.perf_counter() - start, [g.reply for got in graded.values() for g in got]


def eval_policy(url: str, model: str, probs: list) -> tuple:
    """What `rlcli eval --samples K --temperature 1` asks with: these problems as replay envs, a sampling policy."""
    from tinker_cookbook import renderers as cookbook
    from tinker_cookbook.completers import TinkerTokenCompleter
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlcli import sample
    from rlcli.problems import replay
    from rlcli.problems.traces import Spec
    from rlcli.train import run

    smp = sample.open_sampler(None, None, url, None, 16, 1.0, 0)
    renderer = cookbook.get_renderer(run.prepare_model(model, None), get_tokenizer(model))
    return (replay.one_each(probs, renderer, Spec("", match="number")),
            TinkerTokenCompleter(smp.client, max_tokens=16, temperature=1.0))


def eval_rounds(groups: list, policy: object, k: int, arm: str) -> float:
    """k rounds of every problem: in turn (how eval ran them before), or all at once (score.rounds)."""
    from rlcli.problems import score

    start = time.perf_counter()
    if arm == "at_once":
        score.rounds(groups, policy, k)
    else:
        for _ in range(k):
            score.answer(groups, policy)
    return time.perf_counter() - start


def alternating(arms: tuple[str, ...], rounds: int, timed) -> dict[str, list[float]]:
    """`rounds` timings of each arm, the order turned around every round (A B C, C B A, ...)."""
    raw: dict[str, list[float]] = {arm: [] for arm in arms}
    for i in range(rounds):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            raw[arm].append(timed(arm))
            print(f"round {i + 1} {arm}: {raw[arm][-1]:.2f}s", flush=True)
    return raw


def main(problems: int = 64, rounds: int = 3, samples: int = 4, label: str = "", out: str | None = None) -> None:
    import tinker

    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    model = str(ensure_embedded_model())
    probs = loop_problems(problems)
    s = LoopSettings(traces="bench", match="number", max_tokens=16)
    with private_server(model) as server:
        service = tinker.ServiceClient(base_url=server.url)
        training = service.create_lora_training_client(base_model=model, rank=8).result()
        lora = training.save_weights_for_sampler(name="bench").result().path
        models = {"champion": Champion(0), "candidate": Champion(1, lora, None)}
        groups, policy = eval_policy(server.url, model, probs)
        first, replies = {}, {}
        for arm in ARMS:  # builds every sampling program the arms need
            first[arm], replies[arm] = score_both(models, probs, s, server.url, arm)
        for arm in EVAL_ARMS:
            first[f"eval_{arm}"] = eval_rounds(groups, policy, samples, arm)
        raw = {"loop_scoring_s": alternating(ARMS, rounds, lambda a: score_both(models, probs, s, server.url, a)[0]),
               "eval_rounds_s": alternating(EVAL_ARMS, rounds, lambda a: eval_rounds(groups, policy, samples, a))}
    results = {name: {arm: summary(v) for arm, v in timings.items()} for name, timings in raw.items()}
    loop, evals = results["loop_scoring_s"], results["eval_rounds_s"]
    speedup = {arm: loop["one_at_a_time"]["median"] / loop[arm]["median"] for arm in ARMS[1:]}
    speedup["eval_at_once"] = evals["in_turn"]["median"] / evals["at_once"]["median"]
    agree = {arm: sum(a == b for a, b in zip(replies["one_at_a_time"], replies[arm], strict=True)) for arm in ARMS[1:]}
    body = {"label": label, "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {"problems": problems, "models": 2, "rounds": rounds, "eval_samples": samples,
                       "max_tokens": 16, "loop": "greedy, one answer each", "eval": "temperature 1",
                       "model": "rlcli-tiny-qwen3-v1", "server": "`rlcli serve start` defaults"},
            "raw": {**raw, "first_pass_s": first}, "results": results, "speedup": speedup,
            "greedy_replies_agree_with_one_at_a_time": {arm: f"{n}/{2 * problems}" for arm, n in agree.items()}}
    receipt = write_receipt("loop-scoring", body, Path(out) if out else None)
    print(f"2 models x {problems} problems: " + ", ".join(f"{arm} {r['median']:.2f}s" for arm, r in loop.items()))
    print(f"eval --samples {samples}: in turn {evals['in_turn']['median']:.2f}s, at once "
          f"{evals['at_once']['median']:.2f}s; speed-ups {', '.join(f'{k} {v:.1f}x' for k, v in speedup.items())}")
    print(f"greedy replies agree with one at a time: {agree}; receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
