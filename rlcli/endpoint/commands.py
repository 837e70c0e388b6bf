"""`rlcli endpoint start|run|stop|status`: the inference endpoint's processes.

`run` serves in the foreground (Ctrl-C stops it). `start` runs the same in the background and waits until it
answers; over a server `rlcli serve start` manages, the endpoint and its capture store daemon join that
server's process group, so `rlcli serve stop` ends them with it. The store daemon is the endpoint's child
(never a detached session) and its folder is private: 0700, files 0600 (umask 077 before it starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from rlcli import config
from rlcli.data.import_cmd import REDACT
from rlcli.errors import UsageError
from rlcli.options import BASE_URL, MAX_TOKENS, MODEL, Record, option
from rlcli.server import process

DEFAULT_PORT = 8100


@dataclass(frozen=True, kw_only=True)
class EndpointOptions(Record):
    """`rlcli endpoint run` and `start`: what the endpoint serves and records."""

    port: int = process.PORT(DEFAULT_PORT)
    host: str = process.HOST(config.DEFAULT_HOST)
    name: str = process.NAME("default")
    base_url: str | None = BASE_URL(None)
    model: str | None = MODEL(None)
    loops: str | None = option(None, "loop folders whose champions it serves as loop:NAME (comma-separated); "
                                     "the first is also `champion`")
    models: str | None = option(None, "more names: NAME=tinker://.../sampler_weights/... pairs, comma-separated")
    capture: str | None = option(None, "the capture store's folder (default: RLCLI_HOME/capture/NAME); the "
                                       "loop reads it with `loop init --traces capture:DIR`")
    record: bool = option(True, "record every exchange in the capture store (--no-record: nothing; feedback is "
                                "then refused)")
    capture_keep_hours: float = option(24.0, "hours an exchange stays in the capture store after every loop reading "
                                             "the store drained it (later feedback still joins it); a store no "
                                             "loop drains keeps everything", low=0)
    capture_max_hours: float = option(0.0, "delete exchanges older than this many hours whether a loop drained "
                                           "them or not (0: never)", low=0)
    redact: bool = REDACT(False)
    max_tokens: int = MAX_TOKENS(512)
    insecure: bool = process.INSECURE(False)
    wait: float = process.WAIT(120.0)


@dataclass(frozen=True, kw_only=True)
class StopOptions(Record):
    name: str = process.NAME("default")


def state_file(server: str) -> Path:
    return config.private_dir(config.rlcli_home() / "endpoints") / f"{server}.json"


def _server_state(name: str) -> process.ServerState | None:
    return process.read_state(config.server_state_dir(name))


def capture_dir(o: EndpointOptions) -> Path:
    if o.capture:
        return Path(o.capture).expanduser().resolve()
    return config.rlcli_home() / "capture" / o.name


def start(o: EndpointOptions) -> int:
    """Start the endpoint in the background and wait until it answers."""
    old = _read(o.name)
    if old and _alive(old):
        raise UsageError(f"an endpoint for server {o.name!r} runs already at {old['url']} "
                         "(`rlcli endpoint stop` first)")
    process.check_port_free(o.host, o.port)
    log = config.private_dir(config.rlcli_home() / "endpoints") / f"{o.name}.log"
    argv = [sys.executable, "-m", "rlcli", "endpoint", "run", *_flags(o)]
    with open(log, "ab") as out:
        os.chmod(log, 0o600)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, umask=0o077,
                                start_new_session=True)  # its own group: the store daemon, its child, is in it
    url = f"http://{'127.0.0.1' if o.host in ('0.0.0.0', '::') else o.host}:{o.port}"
    record = {"pid": proc.pid, "url": url, "log": str(log), "start_ticks": process.proc_start_ticks(proc.pid)}
    tmp = state_file(o.name).with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, state_file(o.name))
    if o.wait == 0:
        print(url)
        return 0
    deadline = time.monotonic() + o.wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
            raise UsageError(f"the endpoint stopped while starting: {tail[0]} (log: {log})")
        if _answers(url):
            print(url)
            return 0
        time.sleep(0.2)
    proc.terminate()
    raise UsageError(f"the endpoint did not answer within {o.wait:.0f} s (log: {log})")


def _flags(o: EndpointOptions) -> list[str]:
    out = []
    for name, value in asdict(o).items():
        if name == "wait" or value is None or value is False:  # a 0 is passed on: it may not be the default
            continue
        flag = "--" + name.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _alive(rec: dict) -> bool:
    """The endpoint recorded is alive (a reused PID of someone else's is not it)."""
    return bool(process.group_members(rec["pid"])) and process.proc_start_ticks(rec["pid"]) == rec.get("start_ticks")


def _read(server: str) -> dict | None:
    try:  # read without making the folder: `serve status` asks on every call
        return json.loads((config.rlcli_home() / "endpoints" / f"{server}.json").read_text())
    except (OSError, ValueError):
        return None


def running(server: str) -> bool:
    rec = _read(server)
    return bool(rec and _alive(rec))


def endpoint_url(server: str) -> str | None:
    """Where the endpoint over this server answers, if it runs."""
    rec = _read(server)
    return rec["url"] if rec and _alive(rec) else None


def stop(o: StopOptions) -> int:
    """Stop the endpoint and its capture store daemon (`rlcli serve stop` does it too)."""
    rec = _read(o.name)
    if not rec or not _alive(rec):
        print(f"rlcli: no endpoint running for server {o.name!r}", file=sys.stderr)
        return 0
    group = process.ServerState(pid=rec["pid"], pgid=rec["pid"], start_ticks=rec["start_ticks"], host="", port=0,
                                base_model="", backend="", started_at=0)
    process.stop_group(group)
    print(f"rlcli: endpoint at {rec['url']} stopped", file=sys.stderr)
    return 0


def status(o: StopOptions) -> int:
    """Whether the endpoint runs, where, and what it serves."""
    rec = _read(o.name)
    if not rec or not _alive(rec):
        print(f"endpoint for server {o.name!r}: not running")
        return 3
    try:
        with urllib.request.urlopen(rec["url"] + "/v1/models", timeout=5) as r:
            names = [m["id"] + " -> " + m["weights"] for m in json.loads(r.read())["data"]]
    except OSError as e:
        names = [f"(does not answer: {e})"]
    print(f"endpoint for server {o.name!r}: running at {rec['url']} (pid {rec['pid']}); log {rec['log']}")
    for n in names:
        print("  " + n)
    return 0
