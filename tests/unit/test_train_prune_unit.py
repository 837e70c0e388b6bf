"""`rlcli train prune`'s choices (rlcli/train/prune.py) on made-up run folders: which runs count as finished, which
are the older ones, what stays (the real server deletes in tests/integration/test_train_prune.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from rlcli.errors import UsageError
from rlcli.loop import ledger
from rlcli.train import folder as runs
from rlcli.train import prune


def _run(top: Path, name: str, rows: list[str], started: float) -> Path:
    run = top / name
    run.mkdir(parents=True)
    (run / "checkpoints.jsonl").write_text("".join(json.dumps(
        {"name": r, "state_path": f"tinker://{name}/weights/{r}", "sampler_path": f"tinker://{name}/sampler_weights/"
         f"{r}", **({"final": True} if r == "final" else {})}) + "\n" for r in rows))
    (run / runs.RUN_INFO).write_text("{}")
    os.utime(run / runs.RUN_INFO, (started, started))
    return run


class Rest:
    """tinker.RestClient's checkpoint delete, recorded."""

    def __init__(self):
        self.deleted: list[str] = []

    async def delete_checkpoint_from_tinker_path(self, path: str) -> None:
        self.deleted.append(path)


def test_finished_runs_are_those_ending_with_a_final_newest_started_first(tmp_path):
    old = _run(tmp_path, "a", ["000002", "final"], 100)
    new = _run(tmp_path / "deeper", "b", ["final"], 300)
    _run(tmp_path, "training", ["000002"], 400)  # no final yet: in flight, or stopped to be resumed
    _run(tmp_path, "empty", [], 500)
    assert prune.finished_runs(tmp_path) == [new, old]


def test_older_runs_lose_every_checkpoint_but_what_a_loop_names(tmp_path):
    run = _run(tmp_path, "a", ["000002", "final"], 100)
    other = _run(tmp_path, "b", ["final"], 200)
    rest = Rest()
    kept = {"tinker://a/final"}  # the short spelling SkyRL answers a sampler save with names the final's weights
    assert asyncio.run(prune.prune_runs([run, other], kept, rest)) == 2
    assert [r["name"] for r in runs.read_jsonl(run / "checkpoints.jsonl")] == ["final"]
    assert runs.read_jsonl(other / "checkpoints.jsonl") == []
    assert rest.deleted == ["tinker://a/weights/000002", "tinker://a/sampler_weights/000002",
                            "tinker://b/weights/final", "tinker://b/sampler_weights/final"]


def test_a_run_folder_a_run_holds_is_left_alone(tmp_path):
    import fcntl

    run = _run(tmp_path, "a", ["final"], 100)
    with open(run / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with prune.claimed(run) as free:
            assert not free
    with prune.claimed(run) as free:
        assert free


def test_loops_name_what_stays_and_a_folder_without_a_ledger_is_one_line(tmp_path):
    (tmp_path / "loop").mkdir()
    book = ledger.Ledger(tmp_path / "loop")
    with book.transaction() as db:
        db.execute("INSERT INTO aliases (at, iteration, sampler_path, state_path, reason) VALUES "
                   "('now', 1, 'tinker://b/sampler_weights/final', NULL, 'promote')")
    book.close()
    assert prune.named_by_loops([tmp_path / "loop"]) == {"tinker://b/sampler_weights/final"}
    with pytest.raises(UsageError, match="no loop there"):
        prune.named_by_loops([tmp_path])
