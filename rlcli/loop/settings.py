"""`DIR/loop.toml`: a loop's settings, written once by `loop init` (readable, diffable, editable by hand).

Read with tomllib; written by the small writer below, which knows the flat table of strings, numbers and
booleans this file holds (no arrays of tables, no nesting): one `key = value` line each, in field order.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from rlcli.errors import UsageError

FILE = "loop.toml"
STAGES = ("sft", "rl", "distill")
Format = Literal["openai", "anthropic", "messages", "langsmith", "gemini", "otel"]  # rlcli import's -f
FORMATS = get_args(Format)


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """Everything one iteration runs with. Paths are stored absolute (resolved at init)."""

    traces: str  # a glob, or a folder (every *.jsonl in it)
    format: str = "openai"
    redact: bool = True
    dedupe: bool = True
    train: str = "sft"  # stages in order, comma-separated: sft, rl, distill
    train_on: str = "all"  # sft and rl: all train data so far (new + a replay of earlier), or only the new
    gate: str = "auto"  # auto | manual
    heldout_share: float = 0.2  # of new prompts, held out by a stable hash
    match: str = "normalized"  # how a reply is scored against the logged one (train rl's --match)
    eval_limit: int = 64  # at most this many problems per set (held-out, regression), smallest hash first
    regression_margin: float = 0.05  # the largest drop in regression score the gate accepts
    confidence: float = 0.95  # of the paired bootstrap interval
    bootstrap: int = 2000  # resamples of that interval
    export_format: str = "peft"  # peft | merged: DIR/champion
    hook: str = ""  # a command run after each promotion (and rollback), champion folder in RLCLI_LOOP_CHAMPION
    batch_size: int = 8
    lr: float = 0.0  # 0: each trainer's default
    steps: int = 4  # max steps per training stage
    distill_lr: float = 0.0  # distill's learning rate (0: lr): gentler than sft, so recovering the old keeps the new
    distill_steps: int = 0  # distill's max steps (0: steps)
    save_every: int = 2  # checkpoint every N steps (what a killed loop resumes from)
    lora_rank: int = 32
    group_size: int = 4  # rl and distill samples per prompt
    max_tokens: int = 16  # rl, distill and evaluation: longest sampled reply
    seed: int = 0
    shuffle_answers: bool = False  # a deliberately bad candidate: SFT replies shuffled across chats (tests, demos)
    base_url: str = ""  # "": TINKER_BASE_URL, else the managed server


def check(s: LoopSettings) -> LoopSettings:
    """Each value in range, or one line that names it."""
    named = stages(s)
    if not named or any(x not in STAGES for x in named):
        raise UsageError(f"--train {s.train!r}: give stages from {', '.join(STAGES)}, comma-separated "
                         "(e.g. sft,distill)")
    if s.train_on not in ("all", "new"):
        raise UsageError(f"--train-on {s.train_on!r}: choose all (new and earlier data) or new")
    if s.gate not in ("auto", "manual"):
        raise UsageError(f"--gate {s.gate!r}: choose auto or manual")
    if s.format not in FORMATS:
        raise UsageError(f"-f {s.format!r}: choose one of {', '.join(FORMATS)}")
    if s.export_format not in ("peft", "merged"):
        raise UsageError(f"--export-format {s.export_format!r}: choose peft or merged")
    if not 0 < s.heldout_share < 1:
        raise UsageError(f"--heldout-share must be between 0 and 1, got {s.heldout_share}")
    if not 0 < s.confidence < 1:
        raise UsageError(f"--confidence must be between 0 and 1, got {s.confidence}")
    if s.regression_margin < 0:
        raise UsageError(f"--regression-margin must be 0 or more, got {s.regression_margin}")
    for name in ("eval_limit", "bootstrap", "batch_size", "steps", "lora_rank", "max_tokens"):
        if getattr(s, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(s, name)}")
    if s.group_size < 2:
        raise UsageError(f"--group-size must be at least 2, got {s.group_size}")
    for name in ("lr", "distill_lr", "save_every", "distill_steps", "seed"):
        if getattr(s, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(s, name)}")
    from rlcli.problems.rewards import check_match

    check_match(s.match)
    return s


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
    lines = ["# rlcli loop settings (`rlcli loop init` wrote them; edit, then `rlcli loop run`)"]
    lines += [f"{k} = {_value(v)}" for k, v in asdict(s).items()]
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
    known = {f.name: f.type for f in fields(LoopSettings)}
    if unknown := sorted(set(data) - set(known)):
        raise UsageError(f"{source}: unknown setting {unknown[0]!r}: remove it (settings: {', '.join(known)})")
    defaults = asdict(LoopSettings(traces=""))
    for k, v in data.items():
        want = type(defaults[k])
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            data[k] = float(v)
        elif type(v) is not want:
            raise UsageError(f"{source}: {k} = {v!r} should be a {want.__name__}")
    if "traces" not in data:
        raise UsageError(f"{source}: no traces setting: add traces = \"logs/*.jsonl\"")
    return check(LoopSettings(**data))


def read(folder: Path) -> LoopSettings:
    path = folder / FILE
    if not path.is_file():
        raise UsageError(f"{folder} is not a loop folder (no {FILE}): run `rlcli loop init {folder} --traces GLOB` "
                         "first")
    return loads(path.read_text(), str(path))
