"""The launcher's pure parts (it runs in the server venv, but its log rotation is plain stdlib)."""

from __future__ import annotations

import importlib.util
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
    (root / "skyrl/tinker/engine.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    out = {'argv': sys.argv, 'wake': os.environ.get('RLCLI_WAKE_ID'), 'pid': os.getpid()}\n"
        "    open(os.environ['STUB_OUT'], 'w').write(json.dumps(out))\n")


@pytest.fixture
def preload():
    """Start `launcher.py preload` with a given PYTHONPATH; whatever a test asserts, none outlives it (a
    preload nobody attaches to waits for its engine command as long as its parent lives)."""
    import os
    import secrets
    import subprocess
    import sys

    started = []

    def start(pythonpath: str):
        address = f"rlcli-test-{secrets.token_hex(6)}"
        env = dict(os.environ, PYTHONPATH=pythonpath, RLCLI_SERVER_EXTENSIONS="")
        proc = subprocess.Popen([sys.executable, str(RUNTIME / "launcher.py"), "preload", address, str(os.getpid())],
                                env=env)
        started.append(proc)
        return address, proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _attach(launcher, address, argv):
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return launcher._attach(address, argv)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_preloaded_engine_runs_with_the_apis_flags_and_environment(tmp_path, monkeypatch, preload):
    import json

    launcher = _load("launcher")
    _stub_skyrl(tmp_path / "stub")
    address, proc = preload(str(tmp_path / "stub"))
    monkeypatch.setenv("RLCLI_WAKE_ID", "made-by-the-api")
    monkeypatch.setenv("STUB_OUT", str(tmp_path / "engine.json"))
    # A process outside the server's process group that found the socket's name gets no engine.
    intruder = ("import json, socket, time, sys\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                "for _ in range(600):\n"  # up to 30 s: the preload imports its stub first, slow on a busy machine
                "    try: s.connect('\\0' + sys.argv[1]); break\n"
                "    except ConnectionRefusedError: time.sleep(0.05)\n"
                "try:\n"  # the preload may hang up before the request is even written: refused too
                "    s.sendall(json.dumps({'argv': ['--evil'], 'env': {}}).encode() + b'\\n')\n"
                "    reply = s.makefile('rb').readline()\n"
                "except OSError: reply = b''\n"
                "print('refused' if not reply else reply)\n")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", intruder, address], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    assert out.stdout.strip() == "refused", out
    # The engine ended by itself (nobody asked it to stop): the stand-in reports a failure, as a crash would be.
    assert _attach(launcher, address, ["--base-model", "m", "--backend", "jax"]) == 1
    assert proc.wait(timeout=30) == 0
    ran = json.loads((tmp_path / "engine.json").read_text())
    assert ran["argv"][1:] == ["--base-model", "m", "--backend", "jax"] and ran["wake"] == "made-by-the-api"
    assert ran["pid"] == proc.pid  # the preloaded process itself, not a new one


def test_without_a_preloaded_engine_the_engine_command_runs_it_itself(tmp_path, preload):
    launcher = _load("launcher")
    launcher.PRELOAD_PATIENCE_S = 0.2
    address, proc = preload(str(tmp_path / "nothing-here"))  # its imports fail
    assert proc.wait(timeout=30) != 0
    assert _attach(launcher, address, ["--backend", "jax"]) is None
    assert _attach(launcher, "rlcli-test-nobody-listens", ["--backend", "jax"]) is None


def test_a_preload_whose_supervisor_is_gone_does_not_linger(tmp_path):
    import os
    import subprocess
    import sys
    import time

    _stub_skyrl(tmp_path / "stub")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "stub"), RLCLI_SERVER_EXTENSIONS="")
    # A parent that starts the preload and exits at once, as a supervisor killed with -9 would.
    command = f'"{sys.executable}" "{RUNTIME / "launcher.py"}" preload rlcli-test-orphan-{os.getpid()} $$'
    out = subprocess.run(["sh", "-c", command + " >/dev/null 2>&1 & echo $!"], env=env, capture_output=True,
                         text=True, timeout=30)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.2)
    alive = os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    if alive:
        os.kill(pid, 9)
    assert not alive, "the orphaned preload kept waiting for an engine command nobody will send"


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
