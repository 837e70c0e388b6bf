"""Shared fixtures. Integration tests share ONE real SkyRL server per test session.

The server runs from the shared server venv (RLCLI_SERVER_VENV, else ~/.rlcli/server-venv,
built by `make server-venv`) under a private RLCLI_HOME in a temp folder, on a free port
(rlcli.server.private, the same private server the benchmarks and notebooks start).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlcli.server.private import PrivateServer, private_server
from rlcli.server.private import free_port as free_port  # tests/integration import it from here

REPO = Path(__file__).resolve().parent.parent
RLCLI = [sys.executable, "-m", "rlcli.cli"]


def ctrl_c_works() -> None:
    """preexec_fn for a child the test will Ctrl-C: a shell without job control (a CI script running
    `make test &`) starts its background jobs with SIGINT ignored, and children inherit that. A command
    in a terminal's foreground has it at the default; give the child that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shared_server_venv() -> Path:
    return Path(os.environ.get("RLCLI_SERVER_VENV", Path.home() / ".rlcli" / "server-venv"))


def shared_model_home() -> Path:
    """Where the shipped embedded model is installed once and reused by every test session."""
    return Path(os.environ.get("RLCLI_TEST_MODEL_HOME", Path.home() / ".rlcli"))


def run_rlcli(*args: str, env: dict | None = None, timeout: float = 900, check: bool = False,
              input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*RLCLI, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          input=input, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"rlcli {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def shared_compile_cache(home: Path) -> Path:
    """Give a test server's `home` jax's compilation cache shared by every test session (under the shared model
    home): a warm `make test` loads the programs earlier sessions compiled instead of compiling each new shape
    again (seconds each on 2 cores). jax keys an entry by the program, its jax/XLA versions and the device, so
    sessions of different rlcli trees share it safely. Tests of the cache itself start servers with homes of
    their own. Returns `home`."""
    cache = shared_model_home() / "cache" / "jax-tests"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "cache").mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "cache" / "jax").symlink_to(cache, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def embedded_model() -> str:
    env = dict(os.environ, RLCLI_HOME=str(shared_model_home()))
    proc = run_rlcli("model", "install", env=env, check=True, timeout=120)
    return proc.stdout.splitlines()[0].strip()


@pytest.fixture(scope="session")
def server(tmp_path_factory, embedded_model) -> Iterator[PrivateServer]:
    """A real SkyRL server (jax backend, CPU, embedded model), started once, stopped at the end."""
    venv = shared_server_venv()
    if not (venv / "bin" / "python").exists():
        pytest.fail(f"no server venv at {venv}: run `make server-venv` first (`make test` does)")
    # A handful of LoRA slots keeps the engine's memory down: 7 usable (SkyRL's table of 8, slot 0 reserved).
    home = shared_compile_cache(tmp_path_factory.mktemp("rlcli-home"))
    with private_server(embedded_model, "--slots", "7", home=home, venv=venv, timeout=900) as srv:
        yield srv


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory, embedded_model):
    """A second real server started with --no-extensions: stock SkyRL behaviour. Yields (url, env)."""
    with private_server(embedded_model, "--no-extensions", "--backend-config", '{"max_lora_adapters": 3}',
                        home=shared_compile_cache(tmp_path_factory.mktemp("rlcli-stock-home")),
                        venv=shared_server_venv(),
                        timeout=600) as srv:
        yield srv.url, srv.env
