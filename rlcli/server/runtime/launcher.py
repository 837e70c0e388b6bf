"""rlcli's launcher for SkyRL's Tinker API server.

Runs INSIDE the server venv (Python 3.12): standard library and skyrl only,
never rlcli's client dependencies. `rlcli serve start` runs it as

    <server-venv>/bin/python launcher.py supervise --log FILE --max-log-bytes N -- <SkyRL API flags>

in a new session, so the supervisor, SkyRL's API and SkyRL's engine share one
process group that `rlcli serve stop` ends as a whole. Three roles:

- supervise: starts the API as a child and copies its output (and the
  engine's, which inherits it) into FILE, rotating it at N bytes (FILE.1 keeps
  the previous part) so a long-lived server never fills the disk.
- api: applies rlcli's shims (skyrl_shims.py) and runs SkyRL's FastAPI app
  under uvicorn, as `python -m skyrl.tinker.api` would.
- engine: runs SkyRL's engine (`python -m skyrl.tinker.engine`); started by
  the API through the shimmed engine command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load_extensions(role: str) -> None:
    """Import rlcli's server-side extensions listed in RLCLI_SERVER_EXTENSIONS (comma-separated)."""
    import importlib

    for name in filter(None, os.environ.get("RLCLI_SERVER_EXTENSIONS", "").split(",")):
        module = importlib.import_module(name.strip())
        register = getattr(module, "register", None)
        if register is not None:
            register(role)


def run_api(argv: list[str]) -> None:
    import skyrl_shims

    skyrl_shims.apply_api_shims()
    _load_extensions("api")

    import uvicorn
    from skyrl.tinker import api
    from skyrl.tinker.config import EngineConfig, add_model
    from skyrl.utils.log import get_uvicorn_log_config

    parser = argparse.ArgumentParser(prog="rlcli-skyrl-api")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k in EngineConfig.model_fields}
    api.app.state.engine_config = EngineConfig.model_validate(fields)
    uvicorn.run(
        api.app,
        host=args.host,
        port=args.port,
        log_config=get_uvicorn_log_config(),
        backlog=getattr(api, "SKYRL_HTTP_CONNECTION_LIMIT", 2048),
        timeout_keep_alive=getattr(api, "HTTP_KEEP_ALIVE_TIMEOUT_SECONDS", 30),
    )


def run_engine(argv: list[str]) -> None:
    _load_extensions("engine")
    from skyrl.tinker import engine

    sys.argv = ["skyrl.tinker.engine", *argv]
    engine.main()


class _RotatingLog:
    """Append-only log file that moves itself to FILE.1 when it passes max_bytes."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.file = path.open("ab", buffering=0)

    def write(self, data: bytes) -> None:
        if self.file.tell() + len(data) > self.max_bytes:
            self.file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.file = self.path.open("ab", buffering=0)
        self.file.write(data)


def supervise(log: Path, max_log_bytes: int, api_argv: list[str]) -> int:
    out = _RotatingLog(log, max_log_bytes)
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "api", *api_argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )

    def forward(signum, _frame):
        # Pass a polite stop on to the API, which stops its engine itself.
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def pump() -> None:
        assert child.stdout is not None
        # read1 returns whatever is there, so lines reach the log as they are printed.
        while chunk := child.stdout.read1(65536):
            out.write(chunk)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    code = child.wait()
    # The API is gone (stopped, crashed or killed with -9). Its engine would live on as an orphan
    # holding the database and the CPU/GPU: end everything else in this process group.
    _end_group_except_self()
    pumper.join(timeout=5)
    out.write(f"[rlcli launcher] SkyRL API exited with code {code}; server stopped\n".encode())
    return code


def _end_group_except_self() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pgid = os.getpgid(0)
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        others = _group_others(pgid)
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_others(pgid):
            time.sleep(0.1)


def _group_others(pgid: int) -> list[int]:
    """Live processes of this process group other than this one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def main() -> int:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    rest = sys.argv[2:]
    if role == "api":
        run_api(rest)
        return 0
    if role == "engine":
        run_engine(rest)
        return 0
    if role == "supervise":
        parser = argparse.ArgumentParser(prog="rlcli-launcher supervise")
        parser.add_argument("--log", type=Path, required=True)
        parser.add_argument("--max-log-bytes", type=int, default=20 * 2**20)
        split = rest.index("--") if "--" in rest else len(rest)
        args = parser.parse_args(rest[:split])
        return supervise(args.log, args.max_log_bytes, rest[split + 1:])
    print("usage: launcher.py supervise|api|engine ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
