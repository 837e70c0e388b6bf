"""`rlcli loop` killed at a seeded handful of points (benchmarks/kill_loop.py, the full run: `make kill-test`):
4 kill points of seed 8, drawn up front and landed on two rounds' commands (`loop run`, `loop promote`,
`loop rollback`): the server kill -9'd during sft, and SIGKILL or SIGTERM to the loop at the gate, in a rollback and
in the split. After each kill the folder must be sound as a reader finds it, and after each round every ledger
invariant must hold (benchmarks/loop_invariants.py). A failure replays: same seed, same points, same order.

And the kill the harness found: `loop run` SIGKILLed while its distill teacher was being created (filed, the client
not yet built, so no run folder names the model) held a LoRA slot until SkyRL's session timeout; the resumed loop
must free it itself (rlcli/loop/sessions.py).

The harness's commands are forked from the suite's zygote (tests/conftest.py popen_rlcli), not started fresh as
`make kill-test` starts them: each would spend seconds importing the training stack, and these two tests run ~15.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.kill_loop import Harness
from benchmarks.loop_invariants import after_resume
from rlcli.loop import sessions
from tests.conftest import popen_rlcli, run_rlcli

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.faults]
SEED = 8  # its first 4 points: server at train:sft, loop at gate, rollback and split (server_share 0.5)


def forked(args: list[str], env: dict[str, str]):
    """The harness's way to start a command (benchmarks/kill_points.py fresh), from the zygote."""
    return popen_rlcli(*args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, new_session=True)


def test_the_loop_survives_a_seeded_handful_of_kills(fault_server, tmp_path):
    h = Harness(tmp_path, fault_server, SEED, server_share=0.5, overrides={"train": "sft"}, spawn=forked)
    h.init()
    h.draw_points(4)
    assert [p.target for p in h.points].count("server") == 1
    for r in (1, 2):
        h.round(r, kills=0)
    landed = [p for p in h.points if p.landed is not None]
    report = "\n".join(f"{p.label()} -> {p.landed}: {p.outcome}" for p in h.points)
    assert all(row["invariants"] == "all hold" for row in h.rounds), h.rounds
    assert all(p.outcome["at_kill"] == "all hold" and p.outcome.get("resumed") for p in landed), report
    assert len(landed) >= 3 and any(p.target == "server" for p in landed), report


def _named_models(folder: Path) -> set[str]:
    """Every model id a run folder of the loop recorded (rlcli.train.run.server_slots)."""
    return {m for path in folder.rglob("server-models.txt") for m in path.read_text().split()}


def _run_until_a_model_is_filed_after(h: Harness, line: str) -> tuple[str, list[str]]:
    """`loop run --once` SIGKILLed (its process group) the moment the server holds a model of its sessions, once
    `line` was printed: the model is filed, its creation not finished. Returns the command's tag and those models."""
    proc = h.spawn(["loop", "run", str(h.folder), "--once"], h.server.env)
    assert proc.stderr is not None
    said = []
    for said_line in proc.stderr:
        said.append(said_line)
        if line in said_line:
            break
    else:
        pytest.fail(f"`loop run` never said {line!r}:\n{''.join(said[-20:])}")
    tag = sessions.read(h.folder)[-1][1]  # this command's, written before it opened any session
    deadline, models = time.monotonic() + 300, []
    while not models and time.monotonic() < deadline and proc.poll() is None:
        models = sessions.live_models(h.server.url, tag) or []
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert models, f"no model was filed after {line!r}"
    return tag, models


def test_a_loop_killed_while_its_distill_teacher_is_created_frees_the_slot_when_it_resumes(fault_server, tmp_path):
    """Round 1 trains sft and is promoted by hand (the champion: a trained state); round 2's distill re-creates
    that state as its teacher, first of its models: SIGKILL while the server creates it. The model holds a slot
    no run folder names; the next `loop run` frees it (said in one line) and the loop completes, sound."""
    h = Harness(tmp_path, fault_server, 0, overrides={"train": "sft,distill"}, spawn=forked)
    h.init()
    h.round(1, kills=0)
    h.deliver(2)
    tag, teacher = _run_until_a_model_is_filed_after(h, "distill from the previous stage")
    assert not set(teacher) & _named_models(h.folder)  # the leak: only the session's tag can find it
    assert sessions.live_models(h.server.url, tag) == teacher  # still holding its slot after the kill
    resumed = run_rlcli("loop", "run", str(h.folder), "--once", env=h.server.env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"freed 1 server LoRA slot a killed command left ({teacher[0]})" in resumed.stderr, resumed.stderr[-3000:]
    assert sessions.live_models(h.server.url, tag) == []  # the slot is back
    assert after_resume(h.folder, h.delivered, h.hook_log) == {}
