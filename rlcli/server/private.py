"""A private SkyRL server for tests, benchmarks and notebooks: started, used, stopped, its home removed.

    with private_server(model, "--slots", "7") as srv:   # `rlcli serve start` under its own RLCLI_HOME
        run_things(srv.url, env=srv.env)                  # srv.env: that home, the shared venv, no stray URL

It is `rlcli serve start` as a person runs it, on a free loopback port, under an RLCLI_HOME of its own (a
new 0700 temp folder, or `home`), reusing the server venv (RLCLI_SERVER_VENV, else RLCLI_HOME/server-venv
of the caller) so that nothing is built. The server is stopped however the block ends; a home it made is
removed. The test session's fixtures, the benchmarks and `rlcli.lab` all start theirs here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlcli.config import server_venv_dir
from rlcli.errors import RlcliError

RLCLI = [sys.executable, "-m", "rlcli.cli"]
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the working folder of `-m rlcli.cli`: this very rlcli
HOST = "127.0.0.1"


@dataclass
class PrivateServer:
    url: str
    port: int
    model: str
    home: Path
    env: dict[str, str]
    start_command: list[str]
    start_s: float  # wall time of `rlcli serve start` until the engine served a round trip

    @property
    def log(self) -> Path:
        return self.home / "servers" / "default" / "server.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def private_env(home: Path, venv: Path | None = None) -> dict[str, str]:
    """The environment of a private server: its own RLCLI_HOME, the shared server venv, no stray base URL."""
    env = dict(os.environ, RLCLI_HOME=str(home), RLCLI_SERVER_VENV=str(venv or server_venv_dir()))
    env.pop("TINKER_BASE_URL", None)
    return env


def start_command(model: Path | str, port: int, *flags: str) -> list[str]:
    return [*RLCLI, "serve", "start", "--base-model", str(model), "--port", str(port), *flags]


@contextlib.contextmanager
def private_server(model: Path | str, *flags: str, home: Path | None = None, venv: Path | None = None,
                   timeout: float = 900) -> Iterator[PrivateServer]:
    """A server of our own for `model` (extra `rlcli serve start` flags after it); stopped, always, on exit."""
    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="rlcli-private-home-")) if home is None else home  # mkdtemp: mode 0700
    env = private_env(home, venv)
    port = free_port()
    cmd = start_command(model, port, *flags)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=PACKAGE_PARENT)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:  # its output goes along: the home and its log are removed below
            raise RlcliError(f"`rlcli serve start` for a private server exited {proc.returncode}:\n"
                             f"{proc.stdout[-1000:]}{proc.stderr[-3000:]}")
        yield PrivateServer(f"http://{HOST}:{port}", port, str(model), home, env, cmd, elapsed)
    finally:
        subprocess.run([*RLCLI, "serve", "stop"], env=env, capture_output=True, timeout=120, cwd=PACKAGE_PARENT)
        if own_home:
            shutil.rmtree(home, ignore_errors=True)
