"""What the fault tests share: a throwaway server they may kill, a trainer they may kill, a small filesystem.

A test that kills its server gets the fault server (`fault_server`: one per session, shared by the files that kill
it, restartable: the same home and port as rlcli.server.private's servers, started again after a kill, and at the
start of a module that finds it dead); the others use the session's server from tests/conftest.py. `make test` runs
the files that take it on one worker (tests/conftest.py session_server_scope), so it starts once. Faults are real:
kill -9 by pid, SIGSTOP, a tmpfs filled to the last byte. What this machine does not permit (mount as non-root, say)
is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlcli import watchdog
from rlcli.server import private, process
from tests.conftest import (
    REPO,
    RLCLI,
    Background,
    install_embedded_model,
    popen_rlcli,
    prestarts_done,
    run_rlcli,
    shared_compile_cache,
    shared_server_venv,
    xdist_worker,
)

FIXTURES = REPO / "tests" / "fixtures"
SL_DATA = FIXTURES / "sl_small.jsonl"  # 24 chats: batch 2 gives 12 steps per epoch


class FaultServer:
    """A private server under its own RLCLI_HOME, on its own port, that a test may kill and start again."""

    def __init__(self, home: Path, model: str):
        self.home, self.model, self.port = home, model, private.free_port()
        self.env = dict(private.private_env(home, shared_server_venv()), TINKER_API_KEY="tml-faults")
        self.url = f"http://{private.HOST}:{self.port}"

    def start(self) -> None:
        run_rlcli(*private.start_command(self.model, self.port, "--slots", "3")[len(RLCLI):],
                  env=self.env, check=True, timeout=900)

    def stop(self) -> None:
        run_rlcli("serve", "stop", env=self.env, timeout=120)

    def pids(self) -> list[int]:
        state = process.read_state(self.home / "servers" / "default")
        return process.live_members(state) if state else []

    def kill9(self) -> list[int]:
        """kill -9 every process of the server (supervisor, API, engine), one pid at a time."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


_prestarted: dict[str, Background] = {}


def _start_fault_server(factory) -> None:
    srv = FaultServer(shared_compile_cache(factory.mktemp("rlcli-fault-home")), "")

    @contextlib.contextmanager
    def running():
        srv.model = install_embedded_model()
        try:
            srv.start()
            yield srv
        finally:
            srv.stop()

    _prestarted["fault_server"] = Background(running, after=prestarts_done())


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's: it starts once the session servers are up
def pytest_collection_finish(session) -> None:
    """Start the fault server in the background when a selected test uses it, as tests/conftest.py does the
    session's servers: its ~20 s start overlaps the tests before its module."""
    if session.config.option.collectonly or not (shared_server_venv() / "bin" / "python").exists():
        return
    if xdist_worker():  # this worker may never be handed the file that uses it: start it on first use
        return
    if any("fault_server" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_fault_server(session.config._tmp_path_factory)


def pytest_sessionfinish(session) -> None:
    if "fault_server" in _prestarted:  # its module never ran (deselected by -x, say)
        _prestarted.pop("fault_server").stop()


@pytest.fixture(scope="session")
def _fault_server_session(tmp_path_factory):
    if "fault_server" not in _prestarted:
        _start_fault_server(tmp_path_factory)
    server = _prestarted.pop("fault_server")
    try:
        yield server.get()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fault_server(_fault_server_session):
    """The session's fault server, answering: a module after one whose failed test left it dead starts it again
    (each module leaves it running when its tests pass: they thaw it, or start it again after a kill)."""
    srv = _fault_server_session
    if not watchdog.healthy(srv.url, 10):
        srv.stop()
        srv.start()
    return srv


def trainer(*args: str, env: dict):
    """An rlcli command in the background in its own session, its output captured (text): a subprocess.Popen or
    the zygote's Child (tests/conftest.py popen_rlcli)."""
    return popen_rlcli(*args, env=env, new_session=True)


def step_rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return [r for r in rows if "train_mean_nll" in r]


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (rc {proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of `size` (4m, 32m) mounted at mnt for the block; skips the test where mounting is not permitted."""
    mnt.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command on this machine")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not root'}): the full-disk tests need one")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs that the test may fill; skipped where mounting is not permitted."""
    with tmpfs(tmp_path / "small-fs", "4m") as mnt:
        yield mnt


def fill(folder: Path) -> Path:
    """Fill the filesystem holding folder to the last byte; returns the filler file (delete it to free)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler
