"""The server's processes: state file, lock, port check, process group, readiness.

One folder per server holds everything it writes (see `layout`). The launcher
runs in a new session, so its process group (launcher, SkyRL API, SkyRL engine)
can be ended as a whole, even when the API was killed and left its engine behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlcli.client import request_json
from rlcli.errors import RlcliError, UsageError
from rlcli.options import Opt
from rlcli.server.runtime.shared import FORGET_ROUTE, READINESS_TAG

NAME = Opt("which managed server (one state folder each)")  # `serve --name`, `tenant list --name`
HOST = Opt("address to bind; anything but loopback needs --tenants (keys checked) or --insecure")
PORT = Opt("port to bind", low=1, high=65535)
INSECURE = Opt("allow a non-loopback --host without --tenants (a trusted network only: nobody's keys are checked)")
WAIT = Opt("seconds to wait until it serves requests; 0 returns once the processes are started", low=0)

STATE_FILE = "state.json"
LOCK_FILE = "server.lock"
LOG_FILE = "server.log"


def layout(state_dir: Path) -> dict[str, Path]:
    """Where each piece of a server's state lives."""
    return {
        "state": state_dir / STATE_FILE,
        "lock": state_dir / LOCK_FILE,
        "log": state_dir / LOG_FILE,
        "database": state_dir / "tinker.db",
        "checkpoints": state_dir / "checkpoints",
        "lora": state_dir / "lora",
    }


@dataclass
class ServerState:
    pid: int
    pgid: int
    start_ticks: int  # the launcher's start time in clock ticks, to tell a reused PID apart
    host: str
    port: int
    base_model: str
    backend: str
    started_at: float
    settings: dict = field(default_factory=dict)  # what `restart` needs to start the same server
    ready: bool = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def read_state(state_dir: Path) -> ServerState | None:
    try:
        return ServerState(**json.loads((state_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_state(state_dir: Path, state: ServerState) -> None:
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    os.replace(tmp, state_dir / STATE_FILE)


def acquire_lock(state_dir: Path) -> int:
    """An exclusive lock on the state folder, as an fd the launcher inherits and holds while it lives."""
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES):
            raise UsageError(
                f"another server already uses the state folder {state_dir}: "
                "`rlcli serve status` shows it; stop it first or use another --name"
            ) from None
        raise
    return fd


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(
                f"port {port} on {host} is already in use ({e.strerror}): pick another with --port, "
                "or stop what listens there"
            ) from None


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def group_stats(pgid: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, its /proc stat fields after the command name: state, ppid, pgrp, ...) for each process of the group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            yield int(entry.name), fields


def group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose process group is pgid."""
    return [pid for pid, fields in group_stats(pgid) if fields[0] != "Z"]


def live_members(state: ServerState) -> list[int]:
    """The server's processes still alive. A reused PID/PGID of someone else's is not ours."""
    members = group_members(state.pgid)
    if state.pid in members and proc_start_ticks(state.pid) != state.start_ticks:
        return []  # the launcher's PID now belongs to an unrelated process; the group is not ours
    return members


def stop_group(state: ServerState, grace_s: float = 15.0) -> list[int]:
    """SIGTERM the whole group, then SIGKILL whatever is left after grace_s. Returns the PIDs ended."""
    members = live_members(state)
    if not members:
        return []
    _signal_group(state.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and live_members(state):
        time.sleep(0.2)
    if live_members(state):
        _signal_group(state.pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and live_members(state):
            time.sleep(0.1)
    left = live_members(state)
    if left:
        raise RlcliError(f"processes {left} of the server survived SIGKILL; check `ps -o pid,stat,cmd -g {state.pgid}`")
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


# --- readiness: a real round trip through the engine -----------------------------------------


def healthz(url: str, timeout: float = 2.0) -> bool:
    try:
        return request_json(f"{url}/api/v1/healthz", timeout=timeout).get("status") == "ok"
    except (OSError, ValueError):
        return False


def _await_future(url: str, request_id: str, deadline: float) -> dict:
    while time.monotonic() < deadline:
        try:
            return request_json(f"{url}/api/v1/retrieve_future", {"request_id": request_id}, timeout=60)
        except urllib.error.HTTPError as e:
            if e.code != 408:  # 408: not done yet, ask again
                detail = e.read().decode(errors="replace")[:300]
                raise RlcliError(f"the server failed a readiness request: HTTP {e.code} {detail}") from None
        except TimeoutError:
            pass
    raise TimeoutError


def engine_round_trip(url: str, base_model: str, deadline: float) -> None:
    """Create a LoRA model and unload it: proves the engine, not just uvicorn, serves requests. Then, where
    rlcli's extensions run, the probe's rows are deleted so that it is not listed as a training run."""
    session = request_json(f"{url}/api/v1/create_session", {"tags": [READINESS_TAG], "sdk_version": "rlcli"},
                           timeout=10)
    created = request_json(
        f"{url}/api/v1/create_model",
        {"session_id": session["session_id"], "base_model": base_model, "lora_config": {"rank": 1, "seed": 0}},
    )
    _await_future(url, created["request_id"], deadline)
    unloaded = request_json(f"{url}/api/v1/unload_model", {"model_id": created["model_id"]}, timeout=10)
    _await_future(url, unloaded["request_id"], deadline)
    with contextlib.suppress(OSError, ValueError):  # 404: --no-extensions, stock SkyRL lists the probe
        request_json(f"{url}{FORGET_ROUTE}", {}, timeout=10)


def wait_ready(state: ServerState, log: Path, wait_s: float) -> None:
    """Block until the server completes a round trip, showing progress; fail with the log's tail."""
    start = time.monotonic()
    deadline = start + wait_s
    tty = sys.stderr.isatty()
    phase = "starting the API"
    last = 0.0
    while time.monotonic() < deadline:
        if not live_members(state):
            raise RlcliError(f"the server exited during start-up. Last lines of {log}:\n{tail(log, 15)}")
        if healthz(state.url):
            phase = "waiting for the engine (first start compiles; may take a minute)"
            try:
                engine_round_trip(state.url, state.base_model, deadline)
                _print_progress(f"server ready at {state.url} ({time.monotonic() - start:.0f}s)", tty, final=True)
                return
            except TimeoutError:
                break
            except (OSError, ValueError):
                pass  # the API went away mid-request; the liveness check above will say so
        now = time.monotonic()
        if now - last >= (1 if tty else 10):
            last = now
            _print_progress(f"{phase} ... {now - start:.0f}s", tty)
        time.sleep(0.5)
    raise RlcliError(
        f"the server did not become ready within {wait_s:.0f}s (raise --wait). Last lines of {log}:\n{tail(log, 15)}"
    )


def _print_progress(msg: str, tty: bool, final: bool = False) -> None:
    if tty:
        print(f"\r\033[Krlcli: {msg}", end="\n" if final else "", file=sys.stderr, flush=True)
    else:
        print(f"rlcli: {msg}", file=sys.stderr, flush=True)


def tail(path: Path, n: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])
