"""The engine's own liveness: a thread of the engine process touches HEARTBEAT_FILE in the server's folder (its working
directory) every BEAT_S seconds, and the API reports the file's age on ENGINE_ROUTE (rlcli_api). A process stopped
with SIGSTOP, or hung with its interpreter locked, stops beating while its API still answers health checks; one that
compiles or computes keeps beating, as jax releases the GIL in both (docs/decisions.md, "The engine's heartbeat").
rlcli/watchdog.py and `rlcli serve status` read the route.

A multi-process server's local jax workers beat the same way, each its own WORKER_HEARTBEAT file: a worker stopped
while the engine waits on it for a collective leaves the engine beating, and only the worker's own file says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

from shared import HEARTBEAT_FILE, WORKER_HEARTBEAT

BEAT_S = 1.0


def forget(folder: Path, name: str = HEARTBEAT_FILE) -> None:
    """At the API's start, before it starts its engine (the workers' files: at the supervisor's, before it starts
    them): an earlier server's file says nothing about this one."""
    for path in folder.glob(name):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def start(folder: Path, name: str = HEARTBEAT_FILE) -> None:
    """In the engine process (a worker: its own name), before it builds anything: the file names this process,
    then the thread beats."""
    path = folder / name
    path.write_text(json.dumps({"pid": os.getpid()}))

    def beat() -> None:
        while True:
            time.sleep(BEAT_S)
            with contextlib.suppress(OSError):  # removed by hand: the route says "starting", never "frozen"
                os.utime(path)

    threading.Thread(target=beat, name="rlcli-engine-heartbeat", daemon=True).start()


def _beat(path: Path) -> dict | None:
    """{"pid", "beat_age_s"} of one heartbeat file; None before its first beat."""
    try:
        pid = json.loads(path.read_text())["pid"]
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"pid": pid, "beat_age_s": round(max(age, 0.0), 2)}


def report(folder: Path) -> dict:
    """{"state": "starting"} before the engine's first beat; else its pid, the seconds since its last beat, and the
    same of each local jax worker that has beaten ("workers": their process ids and beats)."""
    engine = _beat(folder / HEARTBEAT_FILE)
    if engine is None:
        return {"state": "starting", "beat_s": BEAT_S}
    prefix, suffix = WORKER_HEARTBEAT.split("{}")
    workers = []
    for path in sorted(folder.glob(WORKER_HEARTBEAT.format("*"))):
        beat, number = _beat(path), path.name[len(prefix):len(path.name) - len(suffix)]
        if beat is not None and number.isdigit():
            workers.append({"process": int(number), **beat})
    return {"state": "beating", **engine, "beat_s": BEAT_S, "workers": workers}


def describe() -> dict:
    return {"heartbeat": f"the engine process touches {HEARTBEAT_FILE} every {BEAT_S} s (a thread of its own); each "
                         f"local jax worker its own {WORKER_HEARTBEAT.format('K')}"}
