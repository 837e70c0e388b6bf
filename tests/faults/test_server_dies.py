"""A server that dies or freezes, or whose engine freezes under a live API, is noticed within --server-timeout, with
one line and a resumable run folder; an engine busy with a step longer than the timeout is not.

Order matters within this module: the frozen-engine and frozen-server tests thaw their server; the kill test kills it
and starts it again for the resume.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rlcli import watchdog
from rlcli.errors import EXIT_SERVER_GONE
from tests.conftest import popen_rlcli, run_rlcli
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


def _long_batch(n: int = 16, length: int = 500) -> list:
    """A forward_backward that keeps the CPU engine busy for seconds, several times the test's 2 s timeout: 16 rows of
    500 tokens took 16.9 s on the loaded 2-core machine (load ~6.7) once compiled, where 32 rows took 23.1 s."""
    import tinker

    tokens = [[(7 * i + j) % 200 + 5 for j in range(length + 1)] for i in range(n)]
    return [tinker.Datum(model_input=tinker.ModelInput.from_ints(t[:-1]),
                         loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * length}) for t in tokens]


def test_an_engine_busy_longer_than_the_timeout_is_not_frozen(fault_server, monkeypatch):
    """Its first step compiles, then computes, for longer than the timeout: the engine's heartbeat thread beats
    throughout (jax releases the GIL), so the watch lets it finish."""
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", fault_server.env["TINKER_API_KEY"])
    timeout_s = 2.0
    client = tinker.ServiceClient(base_url=fault_server.url).create_lora_training_client(
        base_model=fault_server.model, rank=4, seed=0).result()
    try:
        started = time.monotonic()
        with watchdog.watch(fault_server.url, timeout_s) as watch:
            client.forward_backward(_long_batch(), "cross_entropy").result()
        took = time.monotonic() - started
    finally:
        from rlcli.client import unload_model

        unload_model(fault_server.url, client.model_id)
    record("engine busy with one long step (first compile) under a short --server-timeout", timeout_s=timeout_s,
           step_s=round(took, 2), ended=watch.gone is not None)
    assert took > timeout_s, f"the step took {took:.1f} s: not longer than the timeout, so it proves nothing"
    assert watch.gone is None


@pytest.mark.parametrize("timeout_s", FROZEN_TIMEOUTS)
def test_a_frozen_engine_under_a_live_api_ends_training_within_the_timeout(fault_server, tmp_path, timeout_s):
    """SIGSTOP the engine process only: the API answers its health route, the engine gives no heartbeat."""
    folder = tmp_path / "run"
    proc = trainer("train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--epochs", "1", "--base-url",
                   fault_server.url, "--log-path", str(folder), "--server-timeout", f"{timeout_s:g}",
                   env=fault_server.env)
    wait_for(lambda: len(step_rows(folder)) >= 2, 600, proc, "2 training steps")
    engine = watchdog.engine_beat(fault_server.url, 10)["pid"]
    os.kill(engine, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        out, err = proc.communicate(timeout=timeout_s + 120)
        took = time.monotonic() - stopped_at
        assert watchdog.healthy(fault_server.url, 5)  # the API still answers: health alone saw nothing
        wait_for(lambda: time.monotonic() - stopped_at > 11, 30)  # FROZEN_AFTER_S for `serve status`
        status = run_rlcli("serve", "status", env=fault_server.env, timeout=60)
    finally:
        os.kill(engine, signal.SIGCONT)
    line = last_line(err)
    record("engine frozen (SIGSTOP) under a live API during train sl", timeout_s=timeout_s, exit_s=round(took, 2),
           rc=proc.returncode, line=line)
    assert proc.returncode == EXIT_SERVER_GONE and "Traceback" not in err, err[-3000:]
    assert line.startswith(f"rlcli: error: the server at {fault_server.url} has a frozen engine (engine process "
                           f"{engine} gave no heartbeat for "), line
    assert ") after step " in line and f"--log-path {folder} --resume" in line, line
    assert took < timeout_s + NOTICE_BOUND_S
    assert status.returncode == 3 and status.stdout.startswith("frozen:"), status.stdout
    assert f"engine process {engine} gave no heartbeat for " in status.stdout
    wait_for(lambda: run_rlcli("serve", "status", env=fault_server.env).stdout.startswith("running:"), 30)


@pytest.mark.parametrize("timeout_s", FROZEN_TIMEOUTS)
def test_a_frozen_server_is_noticed_by_sample(fault_server, timeout_s):
    """SIGSTOP: the port still accepts connections, but nothing answers."""
    run_rlcli("sample", "--prompt", "Hi", "--max-tokens", "2", "--base-url", fault_server.url,
              env=fault_server.env, check=True, timeout=300)  # warm: the sampling shape is compiled
    pids = fault_server.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # The official tinker CLI would retry it for ever: rlcli's passthrough looks first. Beside the sample: both
        # wait out the same freeze, rather than one after the other.
        listing = popen_rlcli("run", "list", "--base-url", fault_server.url, env=fault_server.env)
        started = time.monotonic()
        proc = run_rlcli("sample", "--prompt", "Hi", "--max-tokens", "2", "--base-url", fault_server.url,
                         "--server-timeout", str(timeout_s), env=fault_server.env, timeout=timeout_s + 120)
        took = time.monotonic() - started
        try:
            listed, unlisted = listing.communicate(timeout=120)
        finally:
            if listing.poll() is None:
                listing.kill()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert listing.returncode == EXIT_SERVER_GONE and listed == "", unlisted
    assert unlisted.startswith(f"rlcli: error: the server at {fault_server.url} stopped answering (no answer "
                               "for 5 s): restart it"), unlisted
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
