"""Evaluate stage: champion and candidate answer the same held-out and regression problems (greedy), each
answer scored 0 or 1 against the logged reply under --match; the per-problem pairs go to the gate.

Problems are the last assistant turn of each conversation (rlcli.problems.traces), one per distinct prompt, the
`eval_limit` with the smallest prompt hash: the same problems for both models, and a stable subset as the
held-out set grows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcli.loop.ledger import Champion
from rlcli.loop.settings import LoopSettings


def problems(rows: list[dict[str, Any]], limit: int, source: str) -> list[Any]:
    from rlcli.problems import traces

    if not rows:
        return []
    lines = [json.dumps(r) for r in rows]
    found = traces.parse_traces(iter(lines), source).problems
    unique = {p.key: p for p in found}
    return [unique[k] for k in sorted(unique)[:limit]]


def answers(model: Champion, prompts: list[list[dict[str, Any]]], s: LoopSettings, url: str) -> list[str]:
    """Greedy replies of one model to every prompt, rendered and parsed by the renderer the trainers use (so a
    model is asked as it was trained), one request at a time: the server compiles a sampling batch's shape
    once, and one at a time keeps that shape the same however many problems there are."""
    import tinker
    from tinker_cookbook import renderers as cookbook
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlcli import sample
    from rlcli.problems.replay import renderer_messages
    from rlcli.train import run

    if not prompts:
        return []
    smp = sample.open_sampler(model.sampler_path, None, url, None, s.max_tokens, 0.0, s.seed)
    try:
        sample.complete(smp, prompts[0])  # serves an unloaded checkpoint again if need be
        renderer = cookbook.get_renderer(run.prepare_model(smp.base_model, None), get_tokenizer(smp.base_model))
        params = tinker.SamplingParams(max_tokens=s.max_tokens, temperature=0.0, seed=s.seed,
                                       stop=renderer.get_stop_sequences())
        out = []
        for p in prompts:
            prompt = renderer.build_generation_prompt(renderer_messages(p))
            tokens = smp.client.sample(prompt=prompt, num_samples=1, sampling_params=params).result().sequences[0]
            out.append(cookbook.get_text_content(renderer.parse_response(tokens.tokens)[0]).strip())
        return out
    finally:
        sample.close(smp)


def score_sets(sets: dict[str, list[Any]], models: dict[str, Champion], s: LoopSettings, url: str,
               out: Path) -> dict[str, dict[str, list[float]]]:
    """{set: {model: per-problem scores}}; every answer is written to `out` (eval.jsonl) to read later."""
    from rlcli.problems.rewards import matches

    scores: dict[str, dict[str, list[float]]] = {name: {} for name in sets}
    lines = []
    for who, model in models.items():
        prompts = [p.prompt for name in sets for p in sets[name]]
        replies = iter(answers(model, prompts, s, url))
        for name, probs in sets.items():
            got = []
            for p in probs:
                reply = next(replies)
                got.append(1.0 if matches(reply, p.text, s.match) else 0.0)
                lines.append({"set": name, "model": who, "source": p.source, "prompt": p.last_user(),
                              "logged": p.text, "reply": reply, "score": got[-1]})
            scores[name][who] = got
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))
    return scores
