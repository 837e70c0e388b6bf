"""rlcli/train/retention.py's policy: which checkpoints of a run go (the real server deletes them in
tests/integration/test_checkpoint_retention.py)."""

from __future__ import annotations

import sqlite3

from rlcli.loop import ledger
from rlcli.train import options
from rlcli.train.retention import canonical, doomed, referenced


def _row(name: str, **more) -> dict:
    return {"name": name, "state_path": f"tinker://m/weights/{name}", "sampler_path": f"tinker://m/sampler_weights/"
            f"{name}", **more}


def _names(rows: list[dict]) -> list[str]:
    return [r["name"] for r in rows]


def test_while_training_the_one_just_saved_and_the_newest_n_before_it_stay():
    rows = [_row(f"{i:06d}") for i in range(1, 6)]
    assert _names(doomed(rows, 2, set())) == ["000001", "000002"]  # 000005 just saved; 000003, 000004 before it
    assert _names(doomed(rows, 1, set())) == ["000001", "000002", "000003"]
    assert doomed(rows[:3], 2, set()) == []


def test_at_the_end_the_final_one_and_the_newest_n_intermediate_ones_stay():
    rows = [*(_row(f"{i:06d}") for i in range(1, 6)), _row("final", final=True)]
    assert _names(doomed(rows, 2, set())) == ["000001", "000002", "000003"]


def test_once_the_run_ended_the_final_one_supersedes_every_intermediate_one_but_a_loops():
    rows = [*(_row(f"{i:06d}") for i in range(1, 6)), _row("final", final=True)]
    assert _names(doomed(rows, 2, set(), ended=True)) == ["000001", "000002", "000003", "000004", "000005"]
    assert _names(doomed(rows, 2, {"tinker://m/weights/000004"}, ended=True)) == ["000001", "000002", "000003",
                                                                                    "000005"]
    assert doomed(rows, 0, set(), ended=True) == []  # keep 0 keeps every one, at the end too


def test_keep_zero_keeps_everything_and_the_final_row_is_never_a_candidate():
    rows = [_row("final"), *(_row(f"{i:06d}") for i in range(1, 4))]
    assert doomed(rows, 0, set()) == []
    assert _names(doomed(rows, 1, set())) == ["000001"]  # "final" out of order still stays


def test_a_checkpoint_a_loop_names_stays_in_either_spelling_of_its_path():
    rows = [_row(f"{i:06d}") for i in range(1, 6)]
    assert _names(doomed(rows, 1, {"tinker://m/000002"})) == ["000001", "000003"]  # SkyRL's short sampler path
    assert canonical("tinker://m/000002") == "tinker://m/sampler_weights/000002"
    assert canonical("not a path") == "not a path"


def test_the_ledger_above_a_stage_run_is_read(tmp_path):
    book = ledger.Ledger(tmp_path)
    with book.transaction() as db:
        db.execute("INSERT INTO runs VALUES (1, 0, 'sft', 'x', 'tinker://a/weights/final', "
                   "'tinker://a/sampler_weights/final')")
        db.execute("INSERT INTO aliases (at, iteration, sampler_path, state_path, reason) VALUES "
                   "('now', 1, 'tinker://b/sampler_weights/s', NULL, 'promote')")
    book.close()
    run = tmp_path / "iterations" / "0001" / "run-0-sft"
    run.mkdir(parents=True)
    assert referenced(run) == {"tinker://a/weights/final", "tinker://a/sampler_weights/final",
                               "tinker://b/sampler_weights/s"}
    assert referenced(tmp_path.parent / "elsewhere") == set()
    assert sqlite3.connect(tmp_path / ledger.FILE).execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_every_trainer_takes_the_option_with_its_default():
    assert options.TrainOptions().keep_checkpoints == options.KEEP_CHECKPOINTS_DEFAULT == 2
    assert ledger.FILE == "ledger.sqlite"  # retention.LEDGER reads it by name
