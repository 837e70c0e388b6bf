"""The GPU check's sizes: each a list of stages (a model shape and the phases on its server, most wanted first),
the command line's overrides, and what the budget lets start.

The model shapes are Qwen3's (the 4B's and the 1.7B's from their Hugging Face configs), in bf16; the plans'
sampling shapes are the RL run's (8 prompts x 8 samples x 32 tokens) and the issue's target (64 x 32).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks.fused_vs_2pass import Config
from benchmarks.gpu import roofline
from benchmarks.gpu.sampling import Breakdown

QWEN3_1_7B = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=6144, max_position_embeddings=40960, tie_word_embeddings=True,
                  rms_norm_eps=1e-6)
# Qwen/Qwen3-4B's config.json on the Hugging Face hub (and its model card: 36 layers, 32 query / 8 KV heads,
# 4.0B parameters of which 3.6B non-embedding; roofline.param_count gives 4.02B / 3.63B for this shape).
QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=9728, max_position_embeddings=40960, tie_word_embeddings=True,
                rms_norm_eps=1e-6)
QWEN3_VOCAB = 151_936  # the LM head's real width: a 2,048-token head hides most of its cost
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-6)


@dataclass
class Plan:
    size: str
    arch: dict
    dtype: str
    bench: Config  # fused_vs_2pass's workload: batch shape, warm-up, pairs, floor, LoRA rank, lr
    main_slots: int = 4  # the main server: bench_loss holds three LoRA slots at once (slot 0 is SkyRL's)
    run_steps: int = 4
    slots: tuple[int, ...] = (32, 8, 2)  # the sweep, most wanted first; the main server's count is free
    slot_reps: int = 5
    slot_batch: tuple[int, int] = (8, 64)  # sequences x tokens of the sweep's SFT batch
    budget_s: float = 470.0  # optional phases start only while they fit in it (leave a margin under any limit)
    vocab: int | None = None  # the model's vocabulary when larger than the tokenizer's (None: the tokenizer's)
    phases: tuple[str, ...] = ("batch", "pairs", "exactness", "run", "slots")  # on this stage's server, in order
    breakdown: Breakdown = Breakdown()
    then: str | None = None  # the next stage: another size's plan, its own model and server
    notes: list[str] = field(default_factory=list)


# The RL run's shape: 8 prompts x 8 samples x 32 tokens, rank-32 LoRA (64 sequences of ~92 tokens a step)
RL_SHAPE = Config(size="1.7b", prompts=8, samples=8, fewshot=1, max_tokens=32, warmup=2, pairs=10, floor_reps=4,
                  lr=1e-4, rank=32, seed=0)
TINY_SHAPE = Config(size="tiny", prompts=2, samples=4, fewshot=1, max_tokens=16, warmup=1, pairs=3, floor_reps=2,
                    lr=1e-4, rank=32, seed=0)
PLANS = {
    # The headline: the 4B's sampling breakdown and RL step split first, then its fused-vs-2-pass exactness
    # and a short pairs timing on the same server (no second start), then, while the budget lasts, the 1.7B's
    # breakdown at batch 64: the shape of issue 48's targets.
    "4b": Plan("4b", QWEN3_4B, "bfloat16", replace(RL_SHAPE, size="4b", pairs=4, floor_reps=2), run_steps=3,
               slots=(), budget_s=530.0, vocab=QWEN3_VOCAB, phases=("breakdown", "run", "batch", "exactness", "pairs"),
               then="1.7b-target"),
    "1.7b-target": Plan("1.7b-target", QWEN3_1_7B, "bfloat16", RL_SHAPE, run_steps=0, slots=(), vocab=QWEN3_VOCAB,
                        phases=("breakdown",), breakdown=Breakdown(shapes=((64, 1), (64, 32)), reps=3, handovers=3)),
    # The 1.7B alone (the first receipt's check, with the real vocabulary), its target shape measured first.
    "1.7b": Plan("1.7b", QWEN3_1_7B, "bfloat16", RL_SHAPE, run_steps=3, budget_s=470.0, vocab=QWEN3_VOCAB,
                 phases=("breakdown", "run", "batch", "pairs", "exactness", "slots")),
    # The dry run on CPU: both stages of the 4b size and every phase (the slot sweep too), a 2-layer model whose
    # vocabulary (4,096) is wider than the tokenizer's (2,048), as the 4B's is.
    "tiny": Plan("tiny", TINY, "bfloat16", TINY_SHAPE, run_steps=2, slots=(), budget_s=900.0, vocab=4096,
                 phases=("breakdown", "run", "batch", "exactness", "pairs"), then="tiny-target",
                 breakdown=Breakdown(shapes=((4, 1), (4, 8), (8, 1), (8, 8)), reps=2, handovers=3)),
    "tiny-target": Plan("tiny-target", TINY, "bfloat16", TINY_SHAPE, run_steps=0, slots=(8,), slot_reps=2,
                        vocab=4096, phases=("breakdown", "slots"),
                        breakdown=Breakdown(shapes=((8, 1), (8, 8)), reps=2, handovers=2)),
}
SIZES = ("4b", "1.7b", "tiny")  # what --size offers; the others are later stages


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The size's (first stage's) plan with the command line's overrides applied."""
    return override(PLANS[args.size], args)


def stages_from_args(args: argparse.Namespace) -> list[Plan]:
    """The size's stages in order, each with the command line's overrides (the budget is the whole run's)."""
    out = [plan_from_args(args)]
    while out[-1].then:
        out.append(override(PLANS[out[-1].then], args))
    return out


def override(plan: Plan, args: argparse.Namespace) -> Plan:
    bench = plan.bench
    if args.pairs is not None:
        bench = replace(bench, pairs=args.pairs)
    changes: dict[str, Any] = {"bench": bench}
    if args.slots is not None:
        changes["slots"] = parse_slots(args.slots)
    for name in ("run_steps", "budget_s", "dtype"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    return replace(plan, **changes)


def parse_slots(text: str) -> tuple[int, ...]:
    """'32,8,2' -> (32, 8, 2); '' -> none. A server needs slot 0 (SkyRL's) and one LoRA: at least 2."""
    counts = tuple(int(s) for s in text.split(",") if s.strip())
    if any(c < 2 for c in counts):
        raise SystemExit(f"--slots {text!r}: each count must be at least 2 (slot 0 is SkyRL's own)")
    return counts




# Seconds of the budget an optional phase needs left to start: rough H200 figures for the 4B, each shape a
# sampler compile; a later stage also needs its model built and its server started (stage_need).
PHASE_NEED_S = {"run": 60.0, "batch": 0.0, "pairs": 60.0, "exactness": 30.0, "slots": 45.0}


def phase_need(plan: Plan, name: str) -> float:
    return 10.0 + 25.0 * len(plan.breakdown.shapes) if name == "breakdown" else PHASE_NEED_S[name]


def describe_stage(plan: Plan) -> dict:
    """The plan as the receipt and --plan show it, with the model's parameter count and weight bytes."""
    vocab = plan.vocab or 2048  # the embedded tokenizer's when the plan names none
    params = roofline.param_count(plan.arch, vocab)["total"]
    return {**asdict(plan), "model_vocab": vocab, "params": params,
            "weight_bytes": params * roofline.DTYPE_BYTES[plan.dtype]}


def plan_line(stages: list[Plan]) -> str:
    """One line: each stage's model and phases, and the budget."""
    parts = []
    for plan in stages:
        d = describe_stage(plan)
        phases = ", ".join(p if p != "breakdown" else "breakdown " + "/".join(f"{b}x{n}"
                                                                             for b, n in plan.breakdown.shapes)
                           for p in plan.phases if p != "run" or plan.run_steps)
        parts.append(f"{plan.size}: {d['params'] / 1e9:.2f}B params, vocab {d['model_vocab']:,}, {plan.dtype} "
                     f"({d['weight_bytes'] / 1e9:.1f} GB of weights) -> {phases}")
    return "plan: " + "; then ".join(parts) + f"; budget {stages[0].budget_s:.0f}s"
