"""`DIR/loop.toml`: a loop's settings, written once by `loop init` (readable, diffable, editable by hand).

Read with tomllib; written by the small writer below, which knows the flat table of strings, numbers and
booleans this file holds (no arrays of tables, no nesting): one `key = value` line each, in field order.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rlcli.data.import_cmd import DEDUPE, FORMAT, REDACT, Format
from rlcli.errors import UsageError
from rlcli.export import Format as ExportFormat
from rlcli.options import (
    BASE_URL,
    MAX_TOKENS,
    SAMPLES,
    SEED,
    SERVER_TIMEOUT,
    TEMPERATURE,
    Record,
    option,
    sampled,
    specs,
)
from rlcli.problems.rewards import check_match
from rlcli.problems.traces import MATCH, REWARD, Reward
from rlcli.train.options import BATCH, BETA, GROUP, LORA, SAVE, group_of_two

FILE = "loop.toml"
STAGES = ("sft", "rl", "distill", "dpo")
Gate = Literal["auto", "pooled", "manual"]
TrainOn = Literal["all", "new"]


@dataclass(frozen=True, kw_only=True)
class LoopSettings(Record):
    """Everything one iteration runs with: loop.toml, and `loop init`'s flags. Paths are stored absolute. The
    training defaults (steps, lr, train_on, replay, heldout_share) are calibrated on the embedded model by
    `python -m benchmarks.loop_defaults` (docs/decisions.md; other families: docs/loop.md)."""

    traces: str | None = option(None, "where new trace files appear: a glob ('logs/*.jsonl') or a folder (its *.jsonl)")
    format: Format = FORMAT("openai")
    redact: bool = REDACT(True)
    dedupe: bool = DEDUPE(True)
    train: str = option("sft", "training stages in order, comma-separated: sft, rl (replay env), distill (from the "
                               "champion), dpo (on the preference pairs in iterations/N/pairs.jsonl)")
    train_on: TrainOn = option("all", "sft and rl train on all data so far (new and a replay of earlier; less "
                                      "forgetting), dpo on every iteration's pairs so far; or new")
    replay: float = option(0.5, "with train_on all: the share of each iteration's training set replayed from "
                                "earlier iterations, the rest this iteration's (0: every example so far once, in "
                                "proportion)", low=0, high=1, below=True)
    gate: Gate = option("auto", "auto: per slice (promote when a slice new since the champion gains beyond its "
                                "interval and no slice falls beyond the margin); pooled: all held-out problems as one "
                                "(the rule before slices); manual: wait for `rlcli loop promote`")
    heldout_share: float = option(0.25, "share of new prompts held out (by a stable hash of the prompt)", low=0,
                                  high=1, above=True, below=True)
    match: str = MATCH("normalized")
    reward: Reward = REWARD("match")
    eval_limit: int = option(64, "at most this many problems per slice of each set (held-out, regression) in each "
                                 "evaluation, smallest prompt hash first", low=1)
    samples: int = SAMPLES(1)
    temperature: float = TEMPERATURE(0.0)
    regression_margin: float = option(0.05, "the largest drop of a slice the auto gate lets pass (pooled: of the "
                                            "regression set's mean; 0.05: 5 points)", low=0)
    confidence: float = option(0.95, "that all slices' intervals hold together (each at 1 - (1 - this) / slices); "
                                     "pooled: of its one interval", low=0, high=1, above=True, below=True)
    bootstrap: int = option(2000, "resamples of the pooled gate's interval", low=1)
    export_format: ExportFormat = option("peft", "the champion's export in DIR/champion: peft or merged")
    hook: str = option("", "a shell command run after each promotion or rollback (RLCLI_LOOP_CHAMPION: the folder)")
    batch_size: int = BATCH(8)
    lr: float = option(0.0, "the stages' learning rate (0: each trainer's default: sft 5e-3 on the embedded model, "
                            "the cookbook's get_lr for Qwen and Llama)", low=0)
    steps: int = option(128, "training steps per stage", low=1)
    distill_lr: float = option(0.0, "the distill stage's learning rate (0: --lr): gentler, so recovering the old "
                                    "keeps the new", low=0)
    distill_steps: int = option(0, "the distill stage's steps (0: --steps; at most one pass over the earlier "
                                   "prompts)", low=0)
    dpo_lr: float = option(0.0, "the dpo stage's learning rate (0: a tenth of --lr, else dpo's own default)", low=0)
    dpo_beta: float = BETA(0.1)
    save_every: int = SAVE(2)
    lora_rank: int = LORA(32)
    group_size: int = GROUP(4)
    max_tokens: int = MAX_TOKENS(16)
    seed: int = SEED(0)
    shuffle_answers: bool = option(False, "a deliberately bad candidate: SFT replies shuffled across chats (tests, "
                                          "demos)")
    base_url: str | None = BASE_URL(None)
    server_timeout: float = SERVER_TIMEOUT(60.0)

    def problems(self) -> Iterator[str]:
        if not self.traces:
            yield "pass --traces GLOB (or a folder): where new trace files appear"
        named = stages(self)
        if not named or any(x not in STAGES for x in named):
            yield (f"--train {self.train!r}: give stages from {', '.join(STAGES)}, comma-separated "
                   "(e.g. sft,distill)")
        if self.reward not in ("match", "verdict"):
            yield (f"--reward {self.reward}: the loop's rl stage scores by match or verdict (ratings an endpoint "
                   "captured: `loop init --traces capture:DIR --reward verdict`)")
        yield from group_of_two(self.group_size)
        yield from sampled(self.samples, self.temperature)
        check_match(self.match)


def stages(s: LoopSettings) -> list[str]:
    return [x.strip() for x in s.train.split(",") if x.strip()]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no TOML form here")
        return repr(v)
    text = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{text}"'


def dumps(s: LoopSettings) -> str:
    """One `key = value` line per setting, in field order; a setting left at None is left out (TOML has no null)."""
    lines = ["# rlcli loop settings (`rlcli loop init` wrote them; edit, then `rlcli loop run`)"]
    lines += [f"{k} = {_value(v)}" for k, v in asdict(s).items() if v is not None]
    return "\n".join(lines) + "\n"


def write(folder: Path, s: LoopSettings) -> Path:
    from rlcli.files import staged_file

    path = folder / FILE
    with staged_file(path) as f:
        f.write(dumps(s).encode())
    return path


def loads(text: str, source: str = FILE) -> LoopSettings:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{source}: not valid TOML ({e}): fix it, or run `rlcli loop init` again") from None
    kinds = {spec.name: spec.kind for spec in specs(LoopSettings)}
    if unknown := sorted(set(data) - set(kinds)):
        raise UsageError(f"{source}: unknown setting {unknown[0]!r}: remove it (settings: {', '.join(kinds)})")
    for k, v in data.items():
        if kinds[k] is float and isinstance(v, int) and not isinstance(v, bool):
            data[k] = float(v)
        elif type(v) is not kinds[k]:
            raise UsageError(f"{source}: {k} = {v!r} should be a {kinds[k].__name__}")
    if "traces" not in data:
        raise UsageError(f"{source}: no traces setting: add traces = \"logs/*.jsonl\"")
    return LoopSettings(**data)


def read(folder: Path) -> LoopSettings:
    path = folder / FILE
    if not path.is_file():
        raise UsageError(f"{folder} is not a loop folder (no {FILE}): run `rlcli loop init {folder} --traces GLOB` "
                         "first")
    return loads(path.read_text(), str(path))
