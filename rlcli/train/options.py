"""The options every trainer shares, declared once: `train sl`, `dpo`, `rl`, `distill` and `harbor` take them from here
(each record adds its own), and so does the loop's loop.toml where it sets them for its stages.

Stdlib only: `rlcli train sl --help` imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from rlcli.options import MAX_TOKENS, MODEL, RENDERER, SEED, TEMPERATURE, Opt, ServerOptions, bound_problem

BATCH_SIZE = 8  # examples (sl) or problems (rl, distill) per step
LORA_RANK = 32  # SkyRL's jax backend caps the rank at 32 by default
SAVE_EVERY = 20
KEEP_CHECKPOINTS_DEFAULT = 2  # rlcli/train/retention.py; docs/decisions.md says why
GROUP_SIZE = 4  # RL samples per problem
RL_LR = 4e-5  # the cookbook's RL recipes use 1e-5..4e-5; its get_lr is calibrated on supervised LoRA only

LR = Opt("Adam learning rate (train sl: the peak, decayed linearly to 0; by default the cookbook's get_lr for the "
         "model's family, 5e-3 for the embedded model, as measured)", low=0, above=True)
BATCH = Opt("examples (train sl), preference pairs (dpo) or problems (rl, distill: groups) per step", low=1)
BETA = Opt("DPO's beta: how far the policy may move from the reference (higher: less far)", low=0, above=True)
EPOCHS = Opt("passes over the data", low=1)
MAX_LENGTH = Opt("longest example in tokens; longer ones are cut", low=1)
LORA = Opt("LoRA rank (the server caps it; SkyRL's jax backend at 32 by default); a fresh LoRA only", low=1)
MAX_STEPS = Opt("stop after this many steps in all (default: one pass over the data; arithmetic: 100)", low=1)
SAVE = Opt("save a resumable checkpoint every N steps (0: only the final one)", low=0)
KEEP_CHECKPOINTS = Opt("intermediate checkpoints of this run kept on the server: the newest N (and, while training, "
                       "the one just saved); older ones are deleted as new ones are saved, with their sampler "
                       "weights. The final one and any a loop's ledger names are always kept (0: keep every one)",
                       low=0)
EVAL_EVERY = Opt("measure the held-out set every N steps (0: off): sl's --test-size examples (NLL); rl's and "
                 "distill's held-out problems from step 0 (at 0 none are held out); harbor's held-out tasks", low=0)
LOAD_CHECKPOINT = Opt("start from these weights (fresh optimizer, the checkpoint's LoRA rank): a "
                      "tinker://<model>/weights/<name> state, or a run folder (e.g. an SFT run's) to take its newest")
LOG_PATH = Opt("run folder (default: RLCLI_HOME/runs/<trainer>-<time>)")
RESUME = Opt("continue the run in --log-path (default: the trainer's newest run) from its last checkpoint")
DRY_RUN = Opt("check the flags and the data, plan, print the plan; make no model")
GROUP = Opt("samples per problem; rewards are compared within a group", low=1)
LOSS_CONFIG = Opt("JSON object of loss settings, e.g. '{\"clip_high_threshold\": 1.0005}'")
PASSES = Opt("auto (fused when the server serves the loss, else the exact 2-pass form), 1 or 2")

# Where and how a run goes, not what it trains: left out of its run info (rlcli-run.json).
WHERE = ("log_path", "resume", "dry_run", "base_url", "server_timeout")


@dataclass(frozen=True, kw_only=True)
class TrainOptions(ServerOptions):
    """What every trainer takes."""

    model: str | None = MODEL(None)
    renderer: str | None = RENDERER(None)
    lora_rank: int = LORA(LORA_RANK)
    max_steps: int | None = MAX_STEPS(None)
    save_every: int = SAVE(SAVE_EVERY)
    keep_checkpoints: int = KEEP_CHECKPOINTS(KEEP_CHECKPOINTS_DEFAULT)
    eval_every: int = EVAL_EVERY(10)
    log_path: str | None = LOG_PATH(None)
    resume: bool = RESUME(False)
    dry_run: bool = DRY_RUN(False)
    seed: int = SEED(0)


@dataclass(frozen=True, kw_only=True)
class SamplingOptions(TrainOptions):
    """What the trainers that sample take (rl, distill, harbor)."""

    lr: float = LR(RL_LR)
    loss_config: str | None = LOSS_CONFIG(None)
    group_size: int = GROUP(GROUP_SIZE)
    max_tokens: int = MAX_TOKENS(256)
    temperature: float = TEMPERATURE(1.0)

    def problems(self) -> Iterator[str]:
        if self.temperature <= 0:  # a greedy group has nothing to compare: every sample is the same
            yield bound_problem("--temperature", self.temperature, "positive")


def group_of_two(group_size: int, why: str = "rewards are compared within a group") -> Iterator[str]:
    if group_size < 2:
        yield bound_problem("--group-size", group_size, "at least 2", why)


def kept(options: Any, **resolved: Any) -> dict[str, Any]:
    """What a run ran with, for its run info and --resume: its options as resolved, where it went left out."""
    return {k: v for k, v in asdict(options).items() if k not in WHERE} | resolved
