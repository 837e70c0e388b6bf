"""Fast checks of the fault handling pieces: the watchdog's verdict, resume trimming, seeds, full-disk line.
The real faults (kill -9, SIGSTOP, a full tmpfs) are in tests/faults/."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time

import pytest

from rlcli import errors, watchdog
from rlcli.train import folder as runs
from rlcli.train.hooks import sample_seed
from tests.unit.conftest import Health
from tests.unit.test_tenant_fair_unit import runtime


def test_an_answering_server_is_never_declared_gone(health_server):
    with watchdog.watch(health_server, 1.0) as w:
        time.sleep(2.5)  # a long step: the health route keeps answering
    assert w.gone is None


def test_a_silent_server_raises_server_gone_in_the_main_thread(health_server):
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(health_server, 1.0,
                                                                    lambda s: f"gone after {s:.0f} s"):
        Health.answering = False
        threading.Event().wait(30)  # a blocking wait, as the tinker client's: the signal breaks it
    assert str(gone.value).startswith("gone after") and gone.value.exit_code == errors.EXIT_SERVER_GONE


def test_an_engine_that_beats_is_never_declared_gone_however_long_its_step(health_server):
    Health.beat_age_s = 0.4  # a step or a compile longer than the timeout: its heartbeat thread still beats
    with watchdog.watch(health_server, 1.0) as w:
        time.sleep(2.5)
    assert w.gone is None


def test_an_engine_that_stopped_beating_under_a_live_api_is_named_in_one_line(health_server):
    Health.beat_age_s = 31.0  # SIGSTOP: the API answers its health route, its engine gives no heartbeat
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(health_server, 30.0):
        threading.Event().wait(30)
    assert str(gone.value) == (f"the server at {health_server} has a frozen engine (engine process 4242 gave no "
                               "heartbeat for 31 s): restart it (`rlcli serve restart`), then run the command again")


def test_the_engines_heartbeat_file_ages_and_an_earlier_servers_is_forgotten(tmp_path):
    liveness = runtime("rlcli_liveness")
    assert liveness.report(tmp_path)["state"] == "starting"  # no beat yet: never "frozen"
    liveness.start(tmp_path)
    first = liveness.report(tmp_path)
    assert first["state"] == "beating" and first["pid"] == os.getpid() and first["beat_age_s"] < 1
    time.sleep(2.2)
    assert liveness.report(tmp_path)["beat_age_s"] < 1.5  # the thread touched it meanwhile
    liveness.forget(tmp_path)
    assert liveness.report(tmp_path)["state"] == "starting"


def test_a_stopped_worker_is_named_while_its_engine_beats_on(tmp_path):
    """A local jax worker's own heartbeat file: the engine waiting on a stopped worker beats on, the worker's file
    ages, and the verdict names the worker; a worker that beats (a long compile: its thread still runs) is fine."""
    liveness = runtime("rlcli_liveness")
    liveness.start(tmp_path)
    worker = tmp_path / "rlcli-worker-1-heartbeat"
    worker.write_text(json.dumps({"pid": 4243}))  # as a worker's start writes it; its beats are ours to make here
    beat = liveness.report(tmp_path)
    assert [(w["process"], w["pid"]) for w in beat["workers"]] == [(1, 4243)]
    assert watchdog.frozen_engine(beat, 30.0) is None
    old = time.time() - 40
    os.utime(worker, (old, old))
    assert liveness.report(tmp_path)["beat_age_s"] < 1.5
    assert watchdog.frozen_engine(liveness.report(tmp_path), 30.0) == (
        "jax worker process 1 (pid 4243) gave no heartbeat for 40 s")
    liveness.forget(tmp_path, "rlcli-worker-*-heartbeat")
    assert liveness.report(tmp_path)["workers"] == []


def test_a_command_that_left_the_block_is_not_ended_later(health_server, monkeypatch):
    monkeypatch.setattr(watchdog, "GRACE_S", 0.5)
    with pytest.raises(watchdog.ServerGone), watchdog.watch(health_server, 0.5):
        Health.answering = False
        threading.Event().wait(30)
    time.sleep(1.5)  # past the grace: this process (pytest) is still here


def test_a_request_that_gives_up_first_gets_the_same_verdict(health_server):
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(health_server, 60.0, lambda s: "gone"):
        Health.answering = False
        raise TimeoutError("the command's own request timed out")
    assert isinstance(gone.value.__cause__, TimeoutError)


def test_an_error_of_an_answering_server_stays_itself(health_server):
    with pytest.raises(ValueError), watchdog.watch(health_server, 60.0):
        raise ValueError("a bad answer")


def test_a_refused_connection_counts_as_silence_and_says_no_server_was_started():
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch("http://127.0.0.1:9", 0.5, lambda s: "gone"):
        threading.Event().wait(30)
    assert str(gone.value) == watchdog.no_server("http://127.0.0.1:9")  # nothing ever answered: start one


def test_a_command_failing_at_once_with_no_server_there_says_to_start_one():
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch("http://127.0.0.1:9", 60.0, lambda s: "gone"):
        raise ConnectionRefusedError("the command's first request")
    assert str(gone.value).startswith("no server answers at http://127.0.0.1:9: start one (`rlcli serve start`)")


def test_a_listener_that_never_answers_is_a_stopped_server_not_a_missing_one():
    """A frozen server (SIGSTOP) still accepts connections: restarting it is the fix, not starting one."""
    with socket.create_server(("127.0.0.1", 0)) as frozen:
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        assert watchdog.health(url, 0.3) == "silent" and watchdog.health("http://127.0.0.1:9", 0.3) == "absent"
        with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(url, 1.0, lambda s: "gone"):
            threading.Event().wait(30)
    assert str(gone.value) == "gone"


def test_a_server_that_answered_then_vanished_gets_the_commands_own_line(health_server):
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(health_server, 60.0, lambda s: "gone") as w:
        while not w.answered:
            time.sleep(0.01)
        Health.answering = False
        raise TimeoutError("the command's own request timed out")
    assert str(gone.value) == "gone"


def test_timeout_zero_watches_nothing():
    with watchdog.watch("http://127.0.0.1:9", 0) as w:
        pass
    assert w is None


def batch(row: dict) -> int:
    return row["batch"]


def write_rows(path, rows: list[dict], torn: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_resume_drops_redone_steps_and_torn_lines(tmp_path):
    write_rows(tmp_path / "metrics.jsonl", [{"step": i, "loss": 1.0} for i in range(7)], '{"step": 7, "lo')
    write_rows(tmp_path / "checkpoints.jsonl", [{"name": "000002", "batch": 3, "state_path": "s2"}], '{"name": "0')
    last, start = runs.resume_point(tmp_path, batch)
    assert (last["name"], start) == ("000002", 3)
    assert [r["step"] for r in runs.read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert runs.parsed_lines(tmp_path / "checkpoints.jsonl") == ([last], 0)


def test_a_checkpoint_past_a_missing_metrics_row_is_not_resumed_from(tmp_path):
    """The run died after saving checkpoint 000004 (ready for step 5) but before logging step 4's row."""
    write_rows(tmp_path / "metrics.jsonl", [{"step": i} for i in range(4)])
    write_rows(tmp_path / "checkpoints.jsonl", [{"name": "000002", "batch": 3, "state_path": "s2"},
                                                {"name": "000004", "batch": 5, "state_path": "s4"}])
    last, start = runs.resume_point(tmp_path, batch)
    assert (last["name"], start) == ("000002", 3)  # steps 3 and 4 run again; each gets its row once
    assert [c["name"] for c in runs.read_jsonl(tmp_path / "checkpoints.jsonl")] == ["000002"]


def test_sample_seeds_depend_on_what_is_asked_not_when():
    assert sample_seed(0, 1, [5, 6], 0) == sample_seed(0, 1, [5, 6], 0)
    seeds = {sample_seed(0, 1, [5, 6], k) for k in range(4)}  # one group: four different samples
    assert len(seeds) == 4 and sample_seed(1, 1, [5, 6], 0) != sample_seed(0, 1, [5, 6], 0)
    assert all(0 <= s < 2**31 for s in seeds)


def test_a_full_disk_during_a_copy_names_the_destination(capsys):
    def copy():
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/src.bin", None, "/data/dst.bin")

    assert errors.run_guarded(copy) == errors.EXIT_FAILED
    assert "(/data/dst.bin)" in capsys.readouterr().err


def test_a_full_disk_is_one_line(capsys):
    def write():
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.jsonl")

    assert errors.run_guarded(write) == errors.EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlcli: error: no space left on the device (/data/out.jsonl): free some space, then run "
                   "the command again (a training run: with --resume)"]
