"""Options declared once: a command's options are a record, a frozen dataclass whose fields carry type, default,
help, bounds and choices; the command line, the scripts, loop.toml and the one validator all derive from it.

    FLAG = Opt("what it does", low=1)              # an option several commands take: declared once
    @dataclass(frozen=True, kw_only=True)
    class Options(Record):
        flag: int = FLAG(8)                        # a record takes it with its own default
        other: str | None = option(None, "...")    # an option of this command alone

`rlcli` (rlcli/cli.py) makes each field a flag (`--flag`, or an argument with positional=True), with its help,
default and, for a `Literal[...]` type, its choices. A record checks itself when it is made (`check`, the one
validator: types, choices, bounds, then the record's own `problems`), so a bad value is one line whether it came
from a flag, loop.toml or a library caller. Stdlib only: `rlcli --help` imports this module.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from typing import Any, Literal

from rlcli.errors import UsageError


@dataclass(frozen=True, eq=False)  # compared by identity: one object is one declaration
class Opt:
    """One option's declaration: its help and its bounds (None: unbounded). A record field takes it with a
    default (`FLAG(8)`). Bounds: low/high inclusive, or exclusive with above/below; `why` follows a bound's
    error in parentheses."""

    help: str
    low: float | None = None
    high: float | None = None
    above: bool = False
    below: bool = False
    short: str | None = None  # a one-letter alias that reads well in pipelines (-f, -o)
    why: str = ""

    def __call__(self, default: Any = MISSING, *, positional: bool = False) -> Any:
        """A record field of this option, with this command's default (none: required)."""
        return dataclasses.field(default=default, metadata={"opt": self, "positional": positional})


def option(default: Any = MISSING, help: str = "", *, positional: bool = False, **bounds: Any) -> Any:
    """A field declared where it is used: the option of one command alone."""
    return Opt(help, **bounds)(default, positional=positional)


@dataclass(frozen=True, kw_only=True)
class Record:
    """A command's options. Made by keyword; checked as it is made (`check`)."""

    def __post_init__(self) -> None:
        check(self)

    def problems(self) -> Iterator[str]:
        """What is wrong between fields (a bound that depends on another flag), one line each."""
        return iter(())


@dataclass(frozen=True)
class Spec:
    """A record field as the command line and the validator see it."""

    name: str
    opt: Opt
    kind: type  # int, float, str or bool (a Literal's values are text)
    choices: tuple[Any, ...] | None
    optional: bool  # None is a value
    default: Any
    positional: bool

    @property
    def flag(self) -> str:
        return self.name if self.positional else "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is MISSING


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The values of `Literal[...]` or `Literal[...] | None`; None for any other annotation."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return next((typing.get_args(a) for a in typing.get_args(annotation) if typing.get_origin(a) is Literal), None)


@functools.cache
def specs(record: type) -> tuple[Spec, ...]:
    """Every option of a record type, in field order."""
    hints = typing.get_type_hints(record)
    found = []
    for f in dataclasses.fields(record):
        if "opt" not in f.metadata:
            raise TypeError(f"{record.__name__}.{f.name} is no option: declare it with an Opt")
        hint = hints[f.name]
        args = typing.get_args(hint)
        choices = literal_values(hint)
        plain = [a for a in args if a is not type(None)] if typing.get_origin(hint) is not Literal else []
        kind = str if choices else (plain[0] if plain else hint)
        found.append(Spec(f.name, f.metadata["opt"], kind, choices, type(None) in args, f.default,
                          f.metadata["positional"]))
    return tuple(found)


def check(record: Record) -> None:
    """The one validator: each field's type, choice and bounds, then the record's own problems; one line."""
    for spec in specs(type(record)):
        value = getattr(record, spec.name)
        if value is None and spec.optional:
            continue
        fixed = _typed(spec, value)
        if fixed is not value:
            object.__setattr__(record, spec.name, fixed)  # an int where a float goes: the float
        if problem := _bound_problem(spec, fixed):
            raise UsageError(problem)
    for problem in record.problems():
        raise UsageError(problem)


def _typed(spec: Spec, value: Any) -> Any:
    if spec.choices is not None:
        if value not in spec.choices:
            raise UsageError(f"{spec.flag} {value}: choose from {', '.join(map(str, spec.choices))}")
        return value
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, spec.kind) or (spec.kind is int and isinstance(value, bool)):
        raise UsageError(f"{spec.flag} {value!r}: give {WORDS.get(spec.kind, spec.kind.__name__)}")
    return value


WORDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


def _bound_problem(spec: Spec, value: Any) -> str | None:
    o = spec.opt
    if spec.kind not in (int, float) or (o.low is None and o.high is None):
        return None
    low_ok = o.low is None or (value > o.low if o.above else value >= o.low)
    high_ok = o.high is None or (value < o.high if o.below else value <= o.high)
    return None if low_ok and high_ok else bound_problem(spec.flag, value, bound_words(o), o.why)


def bound_problem(flag: str, value: Any, bound: str, why: str = "") -> str:
    """The line for a number out of its bound; records' own problems() say theirs the same way."""
    return f"{flag} must be {bound}, got {value}" + (f" ({why})" if why else "")


def bound_words(o: Opt) -> str:
    """How a bound reads in an error: at least 1, positive, 0 or more, between 0 and 1, in [0, 1)."""
    low, high = (_number(o.low), _number(o.high))
    if o.high is None:
        if o.above:
            return "positive" if o.low == 0 else f"above {low}"
        return "0 or more" if o.low == 0 else f"at least {low}"
    if o.low is None:
        return f"below {high}" if o.below else f"at most {high}"
    if o.above and o.below:
        return f"between {low} and {high}"
    if not (o.above or o.below):
        return f"{low} to {high}"
    return f"in {'(' if o.above else '['}{low}, {high}{')' if o.below else ']'}"


def _number(x: float | None) -> str:
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def subset(record: type, *names: str, name: str) -> type:
    """A record of some of another's options, the same declarations and defaults (`serve restart` takes two of
    `serve start`'s)."""
    kept = {f.name: f for f in dataclasses.fields(record)}
    hints = typing.get_type_hints(record)
    made = dataclasses.make_dataclass(
        name, [(n, hints[n], dataclasses.field(default=kept[n].default, metadata=kept[n].metadata)) for n in names],
        bases=(Record,), frozen=True, kw_only=True)
    made.__module__ = record.__module__
    return made


# Flag names that mean different things in different commands: each meaning is declared once, and
# tests/unit/test_options.py counts them (a name declared more often than its meanings here fails).
HOMONYMS: dict[str, tuple[str, ...]] = {
    "name": ("which managed server (serve, tenant list)", "a tenant (tenant add, revoke, claim)"),
    "output": ("import: the conversations' file (-: stdout)", "synth qa: the problems' file", "eval: a copy of the "
               "JSON result", "export: the model's folder", "harbor run: the results' folder", "model build: the "
               "model's folder"),
    "format": ("the logs' shape (import, loop init)", "the export's (export)"),
    "dataset": ("a problem set (train rl, eval)", "chats to imitate (train sl)", "Harbor tasks (train harbor)",
                "preference pairs (train dpo)"),
    "base_model": ("the model a server serves (serve start)", "the model a LoRA was trained on (export)"),
    "loss": ("an RL loss (train rl, harbor)", "a distillation loss, fewer choices (train distill)"),
    "kl_coef": ("a KL penalty, 0: off (train rl)", "the teacher signal's weight (train distill)"),
    "policy": ("an env check without a model (eval)", "a Harbor agent (harbor run)"),
    "loops": ("loop folders whose champions it serves (endpoint start)", "loop folders whose checkpoints stay (train "
              "prune)"),
    "lr": ("a trainer's learning rate", "loop.toml's, where 0 means each trainer's default (TOML has no null)"),
    "steps": ("demo rounds (demo)", "each stage's steps (loop init)", "pretraining steps (model build)"),
}


# --- options most commands take -----------------------------------------------------------------------------

BASE_URL = Opt("server URL (default: TINKER_BASE_URL, else the managed server)")
SERVER_TIMEOUT = Opt("seconds the server may go without answering before the command stops (0: wait for ever)",
                     low=0)
MODEL = Opt("the server's base model, exactly as it was started (default: ask the server)")
RENDERER = Opt("chat renderer (default: from the model name, or the tokenizer of a local folder)")
SEED = Opt("the seed of the command's random draws: the LoRA's (or model's) initialisation, sampling (completion i: "
           "seed + i); a run folder keeps it for --resume", low=0)
MAX_TOKENS = Opt("longest sampled answer (per turn) in tokens", low=1)
TEMPERATURE = Opt("sampling temperature (0: greedy; training needs it above 0)", low=0)
SAMPLES = Opt("answers per problem when scoring (above 1 needs --temperature above 0): a problem scores the share "
              "right", low=1)


def sampled(samples: int, temperature: float) -> Iterator[str]:
    """SAMPLES' problem with TEMPERATURE: several greedy answers are one answer repeated."""
    if samples > 1 and temperature == 0:
        yield "--samples N needs --temperature above 0: greedy answers are the same every time"
CHECKPOINT = Opt("sampler weights, tinker://RUN/sampler_weights/ID (eval also takes a run folder: its last ones); "
                 "without it, the base model")


@dataclass(frozen=True, kw_only=True)
class ServerOptions(Record):
    """Which server a command talks to, and how long it waits for an answer."""

    base_url: str | None = BASE_URL(None)
    server_timeout: float = SERVER_TIMEOUT(60.0)
