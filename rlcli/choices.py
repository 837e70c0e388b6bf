"""A command's fixed choices, declared once as `Literal[...]` annotations on its function, and read here.

Both entry points take them from here: `rlcli` (argparse) passes `choices_of(fn)` to its flags, so a bad
value stops with argparse's own usage error; `scripts/*.py` (fire) call through `call_checked`, which
stops a bad value with one `rlcli: error:` line. The functions themselves carry no "choose one of" checks.

fire also parses each value as a Python literal (`--input 2024` is an int, a bare `--input` is True,
`--loss-config '{"a": 1}'` a dict); for text parameters, which argparse always hands over as text,
`call_checked` turns a dict or list back into JSON and refuses the others in one line.

    Passes = Literal["auto", "1", "2"]
    def train_rl(passes: Passes = "auto", ...)   # rlcli train rl --passes 3  -> usage error, exit 2
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from typing import Any, Literal

from rlcli.errors import UsageError


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The values of `Literal[...]` or `Literal[...] | None`; None for any other annotation."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def choices_of(fn: Callable[..., Any]) -> dict[str, tuple[Any, ...]]:
    """{parameter: its allowed values} for each parameter of fn annotated with a Literal."""
    hints = typing.get_type_hints(fn)
    found = {name: literal_values(hint) for name, hint in hints.items() if name != "return"}
    return {name: values for name, values in found.items() if values is not None}


def checked(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    """fn's arguments bound, each fixed choice checked; fire's `--passes 2` (an int) becomes the choice "2"."""
    bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    for name in _text_parameters(fn):
        value = bound.arguments.get(name)
        if isinstance(value, dict | list):  # a JSON flag (--loss-config '{...}'): fire parsed it; as JSON again
            bound.arguments[name] = json.dumps(value)
        elif value is not None and not isinstance(value, str):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} needs a value" if value is True else
                             f"{flag}: fire read {value!r} as Python {type(value).__name__}, not text; quote it: "
                             f"{flag}='\"{value}\"'")
    for name, allowed in choices_of(fn).items():
        if name not in bound.arguments or bound.arguments[name] is None:
            continue
        value = bound.arguments[name]
        match = next((c for c in allowed if c == value or (not isinstance(value, str) and c == str(value))), None)
        if match is None:
            raise UsageError(f"--{name.replace('_', '-')} {value}: choose from {', '.join(map(str, allowed))}")
        bound.arguments[name] = match
    return bound


def _text_parameters(fn: Callable[..., Any]) -> list[str]:
    return [name for name, hint in typing.get_type_hints(fn).items() if hint in (str, str | None)]


def call_checked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) once every fixed choice among them is one fn allows."""
    bound = checked(fn, args, kwargs)
    return fn(*bound.args, **bound.kwargs)
