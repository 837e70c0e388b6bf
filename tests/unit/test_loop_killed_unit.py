"""The moments where the random-kill harness (benchmarks/kill_loop.py) can leave a loop folder inconsistent,
replayed exactly: a kill is an exception (SystemExit, as SIGTERM unwinds) raised at that step, and the next command
must finish what the killed one left. No server: `rlcli export`'s download is replaced by writing the adapter files.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.loop_invariants import after_resume, at_kill
from rlcli import export
from rlcli.loop import batches, champion, commands
from rlcli.loop.ledger import Ledger, opened


def _weights(o) -> None:
    """What `rlcli export --force` leaves: the adapter folder, whole, in place of what was there."""
    out = Path(o.output)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in export.ADAPTER_FILES:
        (out / name).write_text("{}")


class Killed(SystemExit):
    pass


def _kill_once(monkeypatch, module, name: str) -> None:
    """The first call of module.name is killed before it does anything; later calls run."""
    real = getattr(module, name)
    calls = []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise Killed(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, once)


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """A loop folder with two finished, rejected iterations, each with a trained candidate; a hook that logs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inbox").mkdir()
    log = tmp_path / "hook.log"
    commands.init(commands.InitOptions(dir="loop", traces="inbox", base_url="http://127.0.0.1:9",
                                       regression=str(batches.write_regression(tmp_path / "regression.jsonl")),
                                       hook=f"echo $RLCLI_LOOP_ITERATION >> {log}"))
    monkeypatch.setattr(export, "export", _weights)
    folder = tmp_path / "loop"
    with opened(folder) as ledger, ledger.transaction() as db:
        for n in (1, 2):
            db.execute("INSERT INTO iterations VALUES (?, 't', 't', 'rejected', 'no gain', '{}')", (n,))
            db.execute("INSERT INTO runs VALUES (?, 0, 'sft', 'x', ?, ?)",
                       (n, f"tinker://r{n}/weights/final", f"tinker://r{n}/sampler_weights/final"))
            ledger.done(db, n, "evaluate", {})
    return folder, log


def promote(folder: Path, n: int) -> int:
    return commands.promote(commands.PromoteOptions(dir=str(folder), iteration=n))


def champion_named(folder: Path) -> int:
    return (champion.named(folder / champion.CHAMPION_DIR) or {}).get("iteration", -1)


def test_a_promote_killed_after_the_move_records_its_decision_when_rerun(loop, monkeypatch):
    folder, log = loop
    _kill_once(monkeypatch, Ledger, "finish")
    with pytest.raises(Killed):
        promote(folder, 1)
    assert at_kill(folder) == {}
    with opened(folder) as ledger:
        assert ledger.champion().iteration == 1 and ledger.iteration(1)["decision"] == "rejected"
    assert promote(folder, 1) == 0  # "the champion already": it used to stop there, the decision left rejected
    with opened(folder) as ledger:
        assert ledger.iteration(1)["decision"] == "promoted"
    assert log.read_text().split() == ["1"] and after_resume(folder, [], log) == {}


def test_a_kill_between_the_ledger_and_the_link_leaves_a_whole_export_and_the_next_command_catches_up(loop,
                                                                                                    monkeypatch):
    folder, log = loop
    assert promote(folder, 1) == 0
    _kill_once(monkeypatch, champion, "point")
    with pytest.raises(Killed):
        promote(folder, 2)
    assert champion_named(folder) == 1 and at_kill(folder) == {}  # the old champion's whole export
    with opened(folder) as ledger:
        assert ledger.champion().iteration == 2 and not ledger.is_hooked()
    assert commands.run(commands.RunOptions(dir=str(folder), once=True)) == 0  # nothing new; the move finished
    assert champion_named(folder) == 2 and log.read_text().split() == ["1", "2"]
    assert (folder / champion.CHAMPION_DIR).is_symlink()
    assert sorted(p.name for p in (folder / champion.CHAMPIONS).iterdir()) == ["0002-peft"]


def test_an_export_killed_halfway_is_never_pointed_at(loop, monkeypatch):
    folder, log = loop
    assert promote(folder, 1) == 0

    def half(o):
        Path(o.output).mkdir(parents=True)
        (Path(o.output) / export.ADAPTER_FILES[0]).write_text("{}")
        raise Killed("export")

    monkeypatch.setattr(export, "export", half)
    with pytest.raises(Killed):
        promote(folder, 2)
    assert champion_named(folder) == 1 and at_kill(folder) == {}
    monkeypatch.setattr(export, "export", _weights)
    assert promote(folder, 2) == 0  # the half folder (no rlcli-champion.json) is exported again, whole
    assert champion_named(folder) == 2 and after_resume(folder, [], log) == {}


def test_a_rollback_killed_before_its_hook_runs_the_hook_when_rerun(loop, monkeypatch):
    folder, log = loop
    assert promote(folder, 1) == 0 and promote(folder, 2) == 0
    _kill_once(monkeypatch, champion, "run_hook")
    with pytest.raises(Killed):
        commands.rollback(commands.RollbackOptions(dir=str(folder), iteration=1))
    assert commands.rollback(commands.RollbackOptions(dir=str(folder), iteration=1)) == 0  # "already", hook run
    assert log.read_text().split() == ["1", "2", "1"] and champion_named(folder) == 1
    assert after_resume(folder, [], log) == {}


def test_a_folder_from_before_links_and_hook_records_is_taken_over(loop):
    """A real champion/ folder and a ledger without the hooks table: no hook rerun; the next move links."""
    folder, log = loop
    assert promote(folder, 1) == 0
    target = (folder / champion.CHAMPION_DIR).resolve()
    (folder / champion.CHAMPION_DIR).unlink()
    target.rename(folder / champion.CHAMPION_DIR)
    db = sqlite3.connect(folder / "ledger.sqlite")
    db.execute("DROP TABLE hooks")
    db.commit()
    db.close()
    with opened(folder) as ledger:
        assert ledger.is_hooked()
    assert promote(folder, 2) == 0
    assert (folder / champion.CHAMPION_DIR).is_symlink() and champion_named(folder) == 2
    assert log.read_text().split() == ["1", "2"]


def test_scoring_both_models_at_once_in_a_fresh_process_imports_the_tokenizer_safely():
    """A `loop run` killed after its training stages resumes at the evaluation, whose two scoring threads were the
    first to import transformers: its lazy module failed one with `cannot import name 'AutoTokenizer'`."""
    code = ("from rlcli.loop import evaluation\n"
            "def answers(*args, **kwargs):\n"
            "    from transformers import AutoTokenizer\n"
            "    return [AutoTokenizer.__name__]\n"
            "evaluation.answers = answers\n"
            "print(evaluation.answers_of({'champion': None, 'candidate': None}, [], None, ''))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and "AutoTokenizer" in proc.stdout, proc.stderr[-2000:]


def test_the_endpoint_serves_the_champion_after_a_loop_killed_inside_a_transaction(loop):
    """A loop process killed mid-transaction (its changes already spilled into the file) leaves a hot journal:
    the endpoint read the ledger read-only, and every read of it failed (`attempt to write a readonly database`)."""
    from rlcli.endpoint.models import CHAMPION, Models

    folder, _ = loop
    assert promote(folder, 1) == 0
    code = ("import os, sqlite3, sys\n"
            "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "db.execute('PRAGMA cache_size = 1')\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "db.executemany('INSERT INTO conversations VALUES (?, 9)', [(str(i) * 40,) for i in range(20000)])\n"
            "os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", code, str(folder / "ledger.sqlite")], timeout=120)
    assert (folder / "ledger.sqlite-journal").is_file()
    answer = Models("base", {}, [folder]).resolve(CHAMPION)
    assert answer.iteration == 1 and answer.weights == "tinker://r1/sampler_weights/final"
    assert at_kill(folder) == {}


def test_an_evaluation_whose_server_is_killed_ends_in_one_line_instead_of_waiting(loop, monkeypatch, health_server):
    """The harness's kill -9 of the server while both models answered left `loop run` waiting on tinker's retries
    for 10 minutes; the evaluation now ends as a trainer does (exit 75), saying how to resume it."""
    import time

    from rlcli.loop import evaluation, settings
    from rlcli.loop.ledger import Champion
    from rlcli.watchdog import ServerGone
    from tests.unit.conftest import Health

    def answering_then_killed(*args):  # tinker, retrying a server that is gone
        time.sleep(1.5)
        Health.answering = False
        time.sleep(120)

    folder, _ = loop
    monkeypatch.setattr(evaluation, "plan", lambda *args: evaluation.Plan([], frozenset()))
    monkeypatch.setattr(evaluation, "answers_of", answering_then_killed)
    started = time.monotonic()
    with opened(folder) as ledger, pytest.raises(ServerGone) as gone:
        s = settings.read(folder)
        evaluation.evaluate(folder, ledger, 2, type(s)(**{**s.__dict__, "server_timeout": 2.0}), Champion(1),
                            Champion(2), health_server)
    assert time.monotonic() - started < 30
    assert gone.value.exit_code == 75
    assert f"iteration 2's evaluation: restart it (`rlcli serve restart`), then `rlcli loop run {folder}` resumes " \
           "iteration 2 at its evaluation" in str(gone.value)
    with opened(folder) as ledger:
        assert ledger.stage(2, "evaluate") == {}  # the fixture's record, untouched: nothing half-written
