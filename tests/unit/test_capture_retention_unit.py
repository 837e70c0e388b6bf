"""rlcli/endpoint/retention.py on a real capture store (the cookbook's CaptureDB): drained and old goes, undrained
stays unless a bound was asked for, every reader counts (the endpoint runs it in tests/integration/test_endpoint.py's
server tests' store; this is the policy)."""

from __future__ import annotations

import time
from pathlib import Path

from rlcli.endpoint import capture, retention

DAY = 86400.0


def _store(folder: Path, ages_s: list[float]) -> list[int]:
    """One exchange per age (seconds old), each after its token row; the exchanges' cursors."""
    from tinker_cookbook.capture.store.db import CaptureDB

    db, now, cursors = CaptureDB(folder / "capture.sqlite"), time.time(), []
    try:
        for i, age in enumerate(ages_s):
            db.ingest_wire([{"run_id": capture.RUN, "sampling_session_id": "s", "seq_id": i, "sample_idx": 0,
                             "created_at": now - age, "prompt_tokens": [1], "sampled_tokens": [2], "logprobs": [0.0]}])
            db.ingest_annotations([{"kind": capture.EXCHANGE, "event_id": f"e{i}", "run_id": capture.RUN,
                                    "created_at": now - age, "payload": {"exchange": f"x{i}"}}])
            cursors.append(db.query_annotations(capture.RUN, cursor=0, limit=1000)[-1]["cursor"])
    finally:
        db.close()
    return cursors


def _left(folder: Path) -> list[str]:
    return [r["payload"]["exchange"] for r in capture.read_all(folder)]


def _wire(folder: Path) -> int:
    import sqlite3

    return sqlite3.connect(folder / "capture.sqlite").execute("SELECT count(*) FROM wire_rows").fetchone()[0]


def test_a_store_no_loop_drains_keeps_everything_unless_a_bound_was_asked(tmp_path):
    _store(tmp_path, [3 * DAY, 2 * DAY, 60])
    assert retention.prune(tmp_path) == 0 and _left(tmp_path) == ["x0", "x1", "x2"]
    assert retention.prune(tmp_path, max_hours=60) == 1  # the user's bound: 60 hours, drained or not
    assert _left(tmp_path) == ["x1", "x2"] and _wire(tmp_path) == 2


def test_drained_by_every_reader_and_older_than_the_keep_goes(tmp_path):
    cursors = _store(tmp_path, [3 * DAY, 2 * DAY, 2 * DAY, 60])
    loop_a, loop_b = tmp_path / "a" / "captured", tmp_path / "b" / "captured"
    loop_a.mkdir(parents=True)
    loop_b.mkdir(parents=True)
    retention.note_reader(tmp_path, loop_a, cursors[3])  # a drained everything
    retention.note_reader(tmp_path, loop_b, cursors[1])  # b only the first two
    assert retention.prune(tmp_path) == 2 and _left(tmp_path) == ["x2", "x3"]
    retention.note_reader(tmp_path, loop_b, cursors[3])
    assert retention.prune(tmp_path) == 1 and _left(tmp_path) == ["x3"]  # x3 is drained but younger than a day
    assert _wire(tmp_path) == 1  # the token rows went with their exchanges
    assert retention.prune(tmp_path, keep_hours=0) == 1 and _left(tmp_path) == []


def test_a_reader_whose_loop_folder_is_gone_holds_nothing_back(tmp_path):
    cursors = _store(tmp_path, [2 * DAY, 2 * DAY])
    live = tmp_path / "live" / "captured"
    live.mkdir(parents=True)
    retention.note_reader(tmp_path, live, cursors[1])
    retention.note_reader(tmp_path, tmp_path / "deleted" / "captured", 0)
    assert retention.drained(tmp_path) == cursors[1]
    assert retention.prune(tmp_path) == 2


def test_a_drain_records_its_reader_and_continues_after_a_prune(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    _store(store, [2 * DAY, 2 * DAY])
    out = tmp_path / "loop" / "captured"
    capture.drain(store, out)  # the test rows are no chats: nothing to write, but the cursor moves
    assert retention.drained(store) > 0
    assert retention.prune(store) == 2
    assert capture.drain(store, out) is None  # nothing read twice


def test_the_endpoint_passes_its_retention_on_a_zero_included():
    from rlcli.endpoint.commands import EndpointOptions, _flags

    flags = _flags(EndpointOptions(capture_keep_hours=0, capture_max_hours=2.5))
    assert flags[flags.index("--capture-keep-hours") + 1] == "0.0" and "--capture-max-hours" in flags
    assert "--capture-keep-hours" in _flags(EndpointOptions())  # its default, 24, passed on as given
