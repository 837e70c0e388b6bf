"""The launcher's pure parts (it runs in the server venv, but its log rotation is plain stdlib)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.server import commands

RUNTIME = Path(commands.__file__).resolve().parent / "runtime"


def _load(name: str):
    if str(RUNTIME) not in sys.path:  # its siblings (shared.py), as in the launcher
        sys.path.insert(0, str(RUNTIME))
    spec = importlib.util.spec_from_file_location(f"rlcli_runtime_{name}", RUNTIME / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_log_rotates_at_the_cap_and_keeps_one_previous_part(tmp_path):
    launcher = _load("launcher")
    log = launcher._RotatingLog(tmp_path / "server.log", max_bytes=100)
    for i in range(30):
        log.write(f"line {i:03d}\n".encode())  # 9 bytes each: 270 bytes in all
    current = (tmp_path / "server.log").read_bytes()
    previous = (tmp_path / "server.log.1").read_bytes()
    assert len(current) <= 100 and len(previous) <= 100
    assert current.endswith(b"line 029\n")
    # Nothing lost at the seam: the previous part ends right before the current part begins.
    first_now = int(current.split(b"\n")[0].split()[1])
    last_before = int(previous.strip().split(b"\n")[-1].split()[1])
    assert last_before == first_now - 1
    assert not (tmp_path / "server.log.2").exists()


def test_loopback_detection():
    assert commands._is_loopback("127.0.0.1") and commands._is_loopback("::1")
    assert commands._is_loopback("localhost") and commands._is_loopback("127.0.0.2")
    assert not commands._is_loopback("0.0.0.0") and not commands._is_loopback("10.1.2.3")


def _stub_skyrl(root):
    """A stand-in `skyrl` package whose engine writes down the flags and environment it was given."""
    for pkg in ("skyrl", "skyrl/tinker", "skyrl/backends"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "skyrl/backends/jax.py").write_text("")
    (root / "skyrl/tinker/config.py").write_text("def config_to_argv(config):\n    return list(config)\n")
    (root / "skyrl/tinker/engine.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    out = {'argv': sys.argv, 'wake': os.environ.get('RLCLI_WAKE_ID'), 'pid': os.getpid()}\n"
        "    open(os.environ['STUB_OUT'], 'w').write(json.dumps(out))\n")


@pytest.fixture
def preload(monkeypatch):
    """Start `launcher.py preload` as the API does, on a given PYTHONPATH; none outlives the test."""
    started = []
    monkeypatch.setenv("RLCLI_SERVER_EXTENSIONS", "")  # stock SkyRL's engine.main(): the stub's

    def start(pythonpath: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(RUNTIME / "launcher.py"), "preload"], stdin=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=pythonpath))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_the_preloaded_engine_runs_with_the_apis_flags_and_environment(tmp_path, monkeypatch, preload):
    launcher = _load("launcher")
    _stub_skyrl(tmp_path / "stub")
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))  # the API's config_to_argv: the stub's
    proc = preload(str(tmp_path / "stub"))
    monkeypatch.setenv("RLCLI_WAKE_ID", "made-by-the-api")
    monkeypatch.setenv("STUB_OUT", str(tmp_path / "engine.json"))
    monkeypatch.delenv(launcher.PRELOADED_ENV, raising=False)
    command = launcher._engine_command(proc)(["uv", "run"], ["--base-model", "m", "--backend", "jax"])
    assert command[1:] == [str(RUNTIME / "launcher.py"), "engine", "--base-model", "m", "--backend", "jax"]
    assert os.environ[launcher.PRELOADED_ENV] == str(proc.pid)
    # The engine command stands in for the preload; the engine ended by itself (nobody asked it to stop): the
    # stand-in reports a failure, as a crash would be.
    assert subprocess.run(command, timeout=120).returncode == 1
    assert proc.wait(timeout=30) == 0
    ran = json.loads((tmp_path / "engine.json").read_text())
    assert ran["argv"][1:] == ["--base-model", "m", "--backend", "jax"] and ran["wake"] == "made-by-the-api"
    assert ran["pid"] == proc.pid  # the preloaded process itself, not a new one


def test_without_a_live_preload_the_engine_command_runs_the_engine_itself(tmp_path, monkeypatch, preload):
    launcher = _load("launcher")
    _stub_skyrl(tmp_path / "stub")
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    monkeypatch.delenv(launcher.PRELOADED_ENV, raising=False)
    proc = preload(str(tmp_path / "nothing-here"))  # its imports fail
    assert proc.wait(timeout=60) != 0
    for dead_or_none in (proc, None):
        command = launcher._engine_command(dead_or_none)(["uv", "run"], ["--backend", "jax"])
        assert command[2:] == ["engine", "--backend", "jax"]
        assert launcher.PRELOADED_ENV not in os.environ


def test_a_preload_whose_api_is_gone_does_not_linger(tmp_path, preload):
    _stub_skyrl(tmp_path / "stub")
    proc = preload(str(tmp_path / "stub"))
    proc.stdin.close()  # the API's end of the pipe, as when the API is killed with -9
    assert proc.wait(timeout=60) == 1


def test_a_worker_joins_as_soon_as_the_coordinators_port_opens_and_gives_up_after_its_timeout():
    import socket
    import threading

    distributed = _load("distributed")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a free port, nothing listening yet
    assert distributed.wait_for_port(f"127.0.0.1:{port}", timeout_s=0.3) is None

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    opened = threading.Timer(0.4, lambda: (listener.bind(("127.0.0.1", port)), listener.listen(1)))
    opened.start()
    try:
        waited = distributed.wait_for_port(f"127.0.0.1:{port}", timeout_s=60)
        assert waited is not None and waited > 0.3, waited  # it waited for the port and went on when it opened
    finally:
        opened.join()
        listener.close()
