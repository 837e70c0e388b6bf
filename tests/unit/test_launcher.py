"""The launcher's pure parts (it runs in the server venv, but its log rotation is plain stdlib)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rlcli.server import commands

RUNTIME = Path(commands.__file__).resolve().parent / "runtime"


def _load(name: str):
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
