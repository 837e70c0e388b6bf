"""The engine's own liveness: a thread of the engine process touches HEARTBEAT_FILE in the server's folder (its working
directory) every BEAT_S seconds, and the API reports the file's age on ENGINE_ROUTE (rlcli_api). A process stopped
with SIGSTOP, or hung with its interpreter locked, stops beating while its API still answers health checks; one that
compiles or computes keeps beating, as jax releases the GIL in both (docs/decisions.md, "The engine's heartbeat").
rlcli/watchdog.py and `rlcli serve status` read the route.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

from shared import HEARTBEAT_FILE

BEAT_S = 1.0


def forget(folder: Path) -> None:
    """At the API's start, before it starts its engine: an earlier server's file says nothing about this one."""
    with contextlib.suppress(FileNotFoundError):
        (folder / HEARTBEAT_FILE).unlink()


def start(folder: Path) -> None:
    """In the engine process, before it builds anything: the file names this process, then the thread beats."""
    path = folder / HEARTBEAT_FILE
    path.write_text(json.dumps({"pid": os.getpid()}))

    def beat() -> None:
        while True:
            time.sleep(BEAT_S)
            with contextlib.suppress(OSError):  # removed by hand: the route says "starting", never "frozen"
                os.utime(path)

    threading.Thread(target=beat, name="rlcli-engine-heartbeat", daemon=True).start()


def report(folder: Path) -> dict:
    """{"state": "starting"} before the engine's first beat; else its pid and the seconds since its last beat."""
    path = folder / HEARTBEAT_FILE
    try:
        pid = json.loads(path.read_text())["pid"]
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return {"state": "starting", "beat_s": BEAT_S}
    return {"state": "beating", "pid": pid, "beat_age_s": round(max(age, 0.0), 2), "beat_s": BEAT_S}


def describe() -> dict:
    return {"heartbeat": f"the engine process touches {HEARTBEAT_FILE} every {BEAT_S} s (a thread of its own)"}
