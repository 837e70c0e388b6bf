"""One-line errors a person can act on, and the exit codes that go with them."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2  # bad flags or input
EXIT_FAILED = 1  # the work itself failed (server died, run crashed)
EXIT_INTERRUPTED = 130


class RlcliError(Exception):
    """An error whose message is complete: what was wrong and what to do."""

    exit_code = EXIT_FAILED


class UsageError(RlcliError):
    """Bad flags or bad input data."""

    exit_code = EXIT_USAGE


def debug_enabled() -> bool:
    return os.environ.get("RLCLI_DEBUG", "") not in ("", "0", "false")


def run_guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Call fn; turn known errors into one line on stderr and an exit code.

    Tracebacks are shown only with RLCLI_DEBUG=1 (or `rlcli --debug`).
    """
    try:
        result = fn(*args, **kwargs)
    except RlcliError as e:
        if debug_enabled():
            traceback.print_exc()
        print(f"rlcli: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rlcli: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # an unexpected failure: still one line unless debugging
        if debug_enabled():
            traceback.print_exc()
        print(
            f"rlcli: error: {type(e).__name__}: {e} (rerun with RLCLI_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
