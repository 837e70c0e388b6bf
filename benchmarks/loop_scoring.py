"""The loop's evaluation: 2 models x N problems scored one request at a time (how the loop scored before issue 46)
against every request of a model sent at once (the server samples pending requests in one padded batch); and
`rlcli eval --samples K`'s rounds in turn against all rounds at once.

    .venv/bin/python -m benchmarks.loop_scoring [--problems 64] [--rounds 3] [--samples 4] [--label L]

One private server on the embedded model. The two models: the base model and a LoRA's sampler weights (saved
untrained: what is timed is the scoring, not what the model knows). The problems: `rlcli.loop.batches` chats, as
the loop evaluates them (greedy, --match number, 16 answer tokens), through `rlcli.loop.evaluation.answers`. A first
pass of each arm builds the sampling programs (recorded, not timed); then `rounds` timed passes, arms alternating
(A B, B A, ...). Recorded: every pass's wall time, the medians and their ratio, how many greedy replies the two arms
agree on, and the K-round eval arm likewise (temperature 1). Writes benchmarks/receipts/loop-scoring-<date>.json.
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

ARMS = ("one_at_a_time", "batched")


def loop_problems(count: int) -> list:
    """`count` distinct loop problems: the three batches' chats (sums, doors, chests)."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for batch in (1, 2, 3) for q, a in batches.chats(batch, count, seed=7)]
    found = first_problems(rows, count, "bench")
    assert len(found) == count, f"only {len(found)} distinct prompts"
    return found


def score_both(models: dict[str, Champion], probs: list, s: LoopSettings, url: str, arm: str) -> tuple[float, list]:
    start = time.perf_counter()
    replies = [g.reply for model in models.values()
               for g in evaluation.answers(model, probs, s, url, one_at_a_time=arm == "one_at_a_time")]
    return time.perf_counter() - start, replies


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
    """k rounds of every problem: in turn (before), or all at once (score.rounds)."""
    from rlcli.problems import score

    start = time.perf_counter()
    if arm == "batched":
        score.rounds(groups, policy, k)
    else:
        for _ in range(k):
            score.answer(groups, policy)
    return time.perf_counter() - start


def main(problems: int = 64, rounds: int = 3, samples: int = 4, label: str = "", out: str | None = None) -> None:
    import tinker

    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    model = str(ensure_embedded_model())
    probs = loop_problems(problems)
    s = LoopSettings(traces="bench", match="number", max_tokens=16)
    raw: dict[str, list[float]] = {arm: [] for arm in ARMS}
    eval_raw: dict[str, list[float]] = {arm: [] for arm in ARMS}
    first: dict[str, float] = {}
    with private_server(model) as server:
        training = tinker.ServiceClient(base_url=server.url).create_lora_training_client(base_model=model, rank=8)
        lora = training.save_weights_for_sampler(name="bench").result().path
        models = {"champion": Champion(0), "candidate": Champion(1, lora, None)}
        groups, policy = eval_policy(server.url, model, probs)
        replies: dict[str, list] = {}
        for arm in ARMS:  # builds every sampling program either arm needs
            first[arm], replies[arm] = score_both(models, probs, s, server.url, arm)
            eval_rounds(groups, policy, samples, arm)
        for i in range(rounds):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                raw[arm].append(score_both(models, probs, s, server.url, arm)[0])
                eval_raw[arm].append(eval_rounds(groups, policy, samples, arm))
                print(f"round {i + 1} {arm}: loop {raw[arm][-1]:.1f}s, eval {eval_raw[arm][-1]:.1f}s", flush=True)
    agree = sum(a == b for a, b in zip(replies["one_at_a_time"], replies["batched"], strict=True))
    results = {"loop_scoring_s": {arm: summary(v) for arm, v in raw.items()},
               "eval_rounds_s": {arm: summary(v) for arm, v in eval_raw.items()}}
    speedup = {name: r["one_at_a_time"]["median"] / r["batched"]["median"] for name, r in results.items()}
    body = {"label": label, "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {"problems": problems, "models": 2, "rounds": rounds, "eval_samples": samples,
                       "max_tokens": 16, "loop": "greedy, one answer each", "eval": "temperature 1",
                       "model": "rlcli-tiny-qwen3-v1", "server": "`rlcli serve start` defaults"},
            "raw": {"loop_scoring_s": raw, "eval_rounds_s": eval_raw, "first_pass_s": first},
            "greedy_replies_agree": f"{agree}/{len(replies['batched'])}",
            "results": results, "speedup": speedup}
    receipt = write_receipt("loop-scoring", body, Path(out) if out else None)
    for name, r in results.items():
        print(f"{name}: one at a time {r['one_at_a_time']['median']:.2f}s, batched {r['batched']['median']:.2f}s "
              f"({speedup[name]:.1f}x)")
    print(f"greedy replies agree: {agree}/{len(replies['batched'])}; receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
