"""A server that dies or freezes is noticed within --server-timeout, with one line and a resumable run folder.

Order matters within this module: the frozen-server test thaws its server; the kill test kills it and
starts it again for the resume.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rlcli.errors import EXIT_SERVER_GONE
from tests.conftest import run_rlcli
from tests.faults.conftest import SL_DATA, step_rows, trainer, wait_for

pytestmark = [pytest.mark.server, pytest.mark.faults]

TIMEOUT_S = 5  # --server-timeout for these tests
NOTICE_BOUND_S = 30  # generous: timeout + one poll + one health request + unwinding, on a loaded 2-core machine
RECEIPT = os.environ.get("RLCLI_FAULTS_RECEIPT")  # benchmarks/faults.py collects the figures through this file
# --server-timeout values the frozen-server test tries (benchmarks/faults.py asks for more).
FROZEN_TIMEOUTS = [float(t) for t in os.environ.get("RLCLI_FAULTS_TIMEOUTS", str(TIMEOUT_S)).split(",")]


def record(name: str, **figures) -> None:
    if RECEIPT:
        with open(RECEIPT, "a") as f:
            f.write(json.dumps({"fault": name, **figures}) + "\n")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("timeout_s", FROZEN_TIMEOUTS)
def test_a_frozen_server_is_noticed_by_sample(fault_server, timeout_s):
    """SIGSTOP: the port still accepts connections, but nothing answers."""
    run_rlcli("sample", "--prompt", "Hi", "--max-tokens", "2", "--base-url", fault_server.url,
              env=fault_server.env, check=True, timeout=300)  # warm: the sampling shape is compiled
    pids = fault_server.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        proc = run_rlcli("sample", "--prompt", "Hi", "--max-tokens", "2", "--base-url", fault_server.url,
                         "--server-timeout", str(timeout_s), env=fault_server.env, timeout=timeout_s + 120)
        took = time.monotonic() - started
        # The official tinker CLI would retry it for ever: rlcli's passthrough looks first.
        listing = run_rlcli("run", "list", "--base-url", fault_server.url, env=fault_server.env, timeout=120)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert listing.returncode == EXIT_SERVER_GONE and listing.stdout == "", listing.stderr
    assert listing.stderr.startswith(f"rlcli: error: the server at {fault_server.url} stopped answering (no answer "
                                     "for 5 s): restart it"), listing.stderr
    record("server frozen (SIGSTOP) during rlcli sample", timeout_s=timeout_s, exit_s=round(took, 2),
           rc=proc.returncode, line=last_line(proc.stderr))
    assert proc.returncode == EXIT_SERVER_GONE, proc.stderr
    assert last_line(proc.stderr).startswith(f"rlcli: error: the server at {fault_server.url} stopped answering")
    assert "Traceback" not in proc.stderr
    assert took < timeout_s + NOTICE_BOUND_S  # sooner when one of its own requests times out first


def test_a_killed_server_stops_training_and_the_run_resumes(fault_server, tmp_path):
    folder = tmp_path / "run"
    args = ["train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--epochs", "1", "--save-every", "2",
            "--base-url", fault_server.url, "--log-path", str(folder), "--server-timeout", str(TIMEOUT_S)]
    proc = trainer(*args, env=fault_server.env)
    # Past the first step, whose compile takes longer than TIMEOUT_S: a busy server is not a dead one.
    wait_for(lambda: len(step_rows(folder)) >= 5, 600, proc, "5 training steps")
    killed = fault_server.kill9()
    killed_at = time.monotonic()
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - killed_at
    line = last_line(err)
    record("server killed (kill -9) during train sl", timeout_s=TIMEOUT_S, exit_s=round(took, 2),
           rc=proc.returncode, processes_killed=len(killed), line=line)
    assert killed and proc.returncode == EXIT_SERVER_GONE, err[-3000:]
    assert line.startswith(f"rlcli: error: the server at {fault_server.url} stopped answering after step "), line
    assert "the last checkpoint is 0000" in line and f"--log-path {folder} --resume" in line, line
    assert "Traceback" not in err
    assert took < NOTICE_BOUND_S
    fault_server.start()  # the same home and port: the checkpoints are still there
    done = run_rlcli(*args, "--resume", env=fault_server.env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r["step"] for r in step_rows(folder)]
    assert steps == list(range(12)), steps  # each step once, none lost (24 chats, batch 2: 12 steps, killed after 5)
