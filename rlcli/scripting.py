"""What every scripts/*.py shares: fire over rlcli functions, with rlcli's error handling.

fire would print a command's integer return value and show tracebacks for rlcli's
one-line errors; this wrapper turns both into an exit code and a single line, and checks each fixed
choice (rlcli.choices) as `rlcli` does.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from rlcli.choices import call_checked
from rlcli.errors import run_guarded


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        sys.exit(run_guarded(call_checked, fn, *args, **kwargs))

    return wrapper


def fire_main(component: Callable[..., Any] | dict[str, Callable[..., Any]]) -> None:
    import fire

    if isinstance(component, dict):
        fire.Fire({name: _guarded(fn) for name, fn in component.items()})
    else:
        fire.Fire(_guarded(component))
