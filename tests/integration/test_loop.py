"""`rlcli loop` against the real SkyRL server on CPU, one loop folder through three trace batches (kept small:
48 chats a batch, 8 SFT steps, at most 16 problems a set, 8 answer tokens).

In order: batch 1 is learned and promoted by the per-slice gate (its door-code slice gained; exported, hook run);
a rerun with nothing new is a no-op; batch 2 trained on shuffled answers is rejected by the gate, after the power
check said its new chest slice (4 held-out problems) cannot show a gain; batch 3's run (manual gate) is killed after
its first checkpoint, a second `loop run` meanwhile refused, and the next run resumes it with the trainer's
--resume and leaves it pending; `loop promote` makes it champion and `loop rollback` restores the earlier one, the
export and the hook following; every trace line is accounted for. And the scoring itself: one request at a time,
then every request at once, which the engine samples in batches.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rlcli.loop import batches, settings
from rlcli.loop.ledger import opened
from tests.conftest import popen_rlcli, run_rlcli

pytestmark = pytest.mark.server
# The embedded model learns a constant answer in 8 steps at lr 1e-2 but forgets its sums doing so (measured:
# regression 0.75 -> 0.25), so these runs leave the regression rule off (margin 1); unit tests cover it.
SETTINGS = dict(match="number", steps=8, lr=1e-2, save_every=2, max_tokens=8, eval_limit=16, regression_margin=1.0,
                heldout_share=0.2)  # the split these tests count problems of (the default is 0.25)
DOORS, SUMS, CHESTS = "Door #: code please.", "What is # + #?", "Chest #: how many coins?"  # the batches' slices


@pytest.fixture(scope="module")
def loop(server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    made = batches.write_all(str(tmp / "batches"), n=48)
    (tmp / "inbox").mkdir()
    hook = f"echo $RLCLI_LOOP_ITERATION >> {tmp / 'hook.log'}"
    run_rlcli("loop", "init", str(tmp / "loop"), "--traces", str(tmp / "inbox" / "*.jsonl"), "-f", "openai",
              "--regression", str(made[-1]), "--hook", hook, "--base-url", server.url, env=server.env, check=True)
    folder = tmp / "loop"
    settings.write(folder, replace(settings.read(folder), **SETTINGS))
    return tmp, folder, server


def deliver(tmp: Path, batch: int) -> None:
    shutil.copy(tmp / "batches" / f"batch-{batch}.openai.jsonl", tmp / "inbox")


def loop_run(folder: Path, server, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = run_rlcli("loop", "run", str(folder), "--once", env=server.env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def iteration(folder: Path, n: int) -> dict:
    with opened(folder) as ledger:
        return ledger.iteration(n)


def champion(folder: Path) -> dict:
    return json.loads((folder / "champion" / "rlcli-champion.json").read_text())


def test_first_iteration_learns_and_is_promoted(loop):
    tmp, folder, server = loop
    deliver(tmp, 1)
    proc = loop_run(folder, server)
    it = iteration(folder, 1)
    assert it["decision"] == "promoted", proc.stderr[-2000:]
    assert it["why"].startswith(f"gained: '{DOORS}'") and "2 slices at 97.50% each, 95% together" in it["why"]
    assert "power: 2 slices at 97.50% each" in proc.stderr
    with opened(folder) as ledger:
        result = ledger.stage(1, "evaluate")
        assert ledger.champion().iteration == 1
        assert {name for name, _ in ledger.problem_slices("heldout").values()} == {DOORS, SUMS}
    slices = {x["name"]: x for x in result["slices"]}
    assert slices[DOORS]["new"] and slices[DOORS]["low"] > 0 and slices[DOORS]["n"] == 10
    assert slices[SUMS]["n"] == 4 + 8  # held-out sums and the regression set's: one slice
    assert result["heldout"]["low"] > 0 and result["heldout"]["n"] >= 5
    written = [json.loads(line) for line in (folder / "iterations" / "0001" / "eval.jsonl").read_text().splitlines()]
    assert {r["name"] for r in written if r["kind"] == "slice"} == {DOORS, SUMS}
    assert champion(folder)["iteration"] == 1 and (folder / "champion" / "adapter_config.json").is_file()
    assert (tmp / "hook.log").read_text().split() == ["1"]


def test_rerun_with_nothing_new_is_a_noop(loop):
    tmp, folder, server = loop
    shutil.copy(tmp / "inbox" / "batch-1.openai.jsonl", tmp / "inbox" / "again.jsonl")  # same bytes, new name
    proc = loop_run(folder, server)
    assert "nothing new" in proc.stderr
    with opened(folder) as ledger:
        assert ledger.last_iteration() == 1 and len(ledger.files()) == 1


def test_candidate_trained_on_shuffled_answers_is_rejected(loop):
    tmp, folder, server = loop
    good = settings.read(folder)
    settings.write(folder, replace(good, shuffle_answers=True))
    deliver(tmp, 2)
    try:
        proc = loop_run(folder, server)
    finally:
        settings.write(folder, good)
    it = iteration(folder, 2)
    assert it["decision"] == "rejected" and "no new slice gained beyond its interval" in it["why"], proc.stderr[-2000:]
    assert f"slice '{CHESTS}' (new, 4 problems): cannot show a gain: it needs 7 problems to improve" in proc.stderr
    assert "fix: more held-out problems of those slices (heldout_share = 0.2 now" in proc.stderr
    assert proc.stderr.index("power:") < proc.stderr.index("iteration 2: sft from")  # before any training
    assert champion(folder)["iteration"] == 1
    with opened(folder) as ledger:
        assert ledger.champion().iteration == 1 and ledger.stage(2, "promote") is None


def _first_state(run: Path, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        path = run / "checkpoints.jsonl"
        if path.is_file() and any('"state_path"' in line and line.endswith("\n")
                                  for line in path.read_text().splitlines(keepends=True)):
            return True
        time.sleep(0.2)
    return False


def test_killed_iteration_resumes_and_a_second_run_is_refused(loop):
    tmp, folder, server = loop
    settings.write(folder, replace(settings.read(folder), gate="manual"))  # iteration 3 waits for a person
    deliver(tmp, 3)
    first = popen_rlcli("loop", "run", str(folder), "--once", env=server.env, stdout=subprocess.DEVNULL)
    try:
        assert _first_state(folder / "iterations" / "0003" / "run-0-sft", 240), "no checkpoint was written"
        # Held where it is (the lock with it) while the second command starts: on a loaded machine that start took
        # long enough for the first to finish its sft, and the kill then landed after the stage was recorded.
        first.send_signal(signal.SIGSTOP)
        second = run_rlcli("loop", "run", str(folder), "--once", env=server.env, timeout=60)
        assert second.returncode == 2 and "another `rlcli loop` command is using" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    with opened(folder) as ledger:
        assert ledger.open_iteration() == 3 and ledger.stage(3, "train:0:sft") is None
        files = len(ledger.files())
    proc = loop_run(folder, server)
    assert "iteration 3: resuming after power" in proc.stderr and "resuming " in proc.stderr
    steps = [json.loads(line)["step"] for line in
             (folder / "iterations" / "0003" / "run-0-sft" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(8))  # each step once: the resume took up where the checkpoint left off
    with opened(folder) as ledger:
        assert iteration(folder, 3)["decision"] == "pending" and ledger.champion().iteration == 1
        assert len(ledger.files()) == files == 3  # never ingested twice
    status = run_rlcli("loop", "status", str(folder), env=server.env, check=True).stdout
    assert "waiting for `rlcli loop promote`: iterations [3]" in status and "new trace files waiting: 0" in status


def test_promote_by_hand_then_rollback_restores_the_earlier_champion(loop):
    tmp, folder, server = loop
    run_rlcli("loop", "promote", str(folder), "3", env=server.env, check=True, timeout=120)
    assert champion(folder)["iteration"] == 3 and iteration(folder, 3)["decision"] == "promoted"
    proc = run_rlcli("loop", "rollback", str(folder), env=server.env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with opened(folder) as ledger:
        assert ledger.champion().iteration == 1
        assert [a["iteration"] for a in ledger.aliases()] == [1, 3, 1]
    assert champion(folder)["iteration"] == 1 and (folder / "champion" / "adapter_config.json").is_file()
    assert (tmp / "hook.log").read_text().split() == ["1", "3", "1"]
    again = run_rlcli("loop", "rollback", str(folder), "7", env=server.env, timeout=60)
    assert again.returncode == 2 and "iteration 7 was never champion" in again.stderr


def test_history_accounts_for_every_line(loop):
    tmp, folder, server = loop
    proc = run_rlcli("loop", "history", str(folder), env=server.env, check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("iter") and len([x for x in lines if x[:1].isdigit()]) == 3
    with opened(folder) as ledger:
        for f in ledger.files():
            raw = [x for x in Path(f["path"]).read_text().splitlines() if x.strip()]
            assert f["lines"] == len(raw) == f["written"] + sum(f["dropped"].values())
            assert f["written"] == f["duplicate"] + f["train"] + f["heldout"]
            assert f["dropped"].pop("no_assistant_reply") == f["dropped"].pop("truncated") == 1
            assert set(f["dropped"]) <= {"duplicate"}  # import's --dedupe: sums repeat within a batch


def test_scoring_sends_every_request_at_once(loop, monkeypatch):
    """One model answers 16 loop problems one request at a time, then all at once: the engine's log shows only
    single-request sample batches for the first and batches of several for the second, and the greedy replies
    agree (batched numerics may move a near tie, so nearly all)."""
    from rlcli.loop import evaluation
    from rlcli.loop.ledger import Champion
    from rlcli.problems.traces import first_problems

    tmp, folder, server = loop
    for key in ("RLCLI_HOME", "TINKER_API_KEY"):
        if key in server.env:
            monkeypatch.setenv(key, server.env[key])
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in batches.chats(3, 32, seed=5)]
    problems, s = first_problems(rows, 16, "scoring"), settings.read(folder)

    def score(one_at_a_time: bool) -> tuple[list[int], list[str]]:
        """The sample batches the engine logged (requests in each) while one model answered, and its replies."""
        start = server.log.stat().st_size
        replies = [g.reply for g in evaluation.answers(Champion(0), problems, s, server.url, one_at_a_time)]
        with open(server.log, "rb") as f:
            f.seek(start)
            return [int(n) for n in re.findall(rb"process_batch_requests\(sample, n=(\d+)\)", f.read())], replies

    (one, first), (together, second) = score(True), score(False)
    assert len(problems) == 16 and set(one) == {1} and max(together) > 1 and len(together) < len(one), (one, together)
    assert sum(a == b for a, b in zip(first, second, strict=True)) >= 14
