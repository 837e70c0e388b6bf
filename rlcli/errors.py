"""One-line errors a person can act on, and the exit codes that go with them."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2  # bad flags or input
EXIT_FAILED = 1  # the work itself failed (server died, run crashed)
EXIT_SERVER_GONE = 75  # the server stopped answering: start it again and resume (sysexits' EX_TEMPFAIL)
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
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return _unexpected(e)
        if debug_enabled():
            traceback.print_exc()
        path = e.filename2 or e.filename  # a copy names its source first and its destination second
        where = f" ({path})" if path else ""
        print(f"rlcli: error: no space left on the device{where}: free some space, then run the command again "
              "(a training run: with --resume)", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # an unexpected failure: still one line unless debugging
        return _unexpected(e)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _unexpected(e: BaseException) -> int:
    if debug_enabled():
        traceback.print_exc()
    print(f"rlcli: error: {type(e).__name__}: {e} (rerun with RLCLI_DEBUG=1 for the traceback)", file=sys.stderr)
    return EXIT_FAILED
