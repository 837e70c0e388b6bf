"""The capture store's retention: what `rlcli endpoint` deletes from its store, once a minute.

- An exchange (and its feedback) every loop reading the store has drained goes once it is older than
  --capture-keep-hours (default 24: feedback on it that comes later is still joined to it by the next drain).
  Each loop's drain leaves its cursor in STORE/readers/ (capture.drain); a store no loop drains keeps everything.
- With --capture-max-hours H (default 0: none), anything older than H hours goes, drained or not: a bound the user
  asked for.
The token rows (wire_rows) of deleted exchanges go with them: every one before the newest annotation deleted (an
exchange's token rows are written just before its annotation, which holds the same tokens). SQLite reuses the freed
pages, so the file stops growing at its largest size rather than shrinking. Why these defaults: docs/decisions.md,
"The capture store keeps drained exchanges for a day".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from pathlib import Path

KEEP_HOURS = 24.0
EVERY_S = 60.0
READERS = "readers"
RUN = "rlcli-endpoint"  # capture.RUN: the store's run of rlcli's exchanges (no import: capture imports this module)


def note_reader(data_dir: Path, out_dir: Path, cursor: int) -> None:
    """A loop's drain: out_dir (its DIR/captured) has read the store up to `cursor`."""
    from rlcli.config import private_dir
    from rlcli.files import staged_file

    key = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16]
    with staged_file(private_dir(data_dir / READERS) / f"{key}.json", shared=False) as f:
        f.write(json.dumps({"folder": str(out_dir.resolve()), "cursor": cursor}).encode())


def drained(data_dir: Path) -> int:
    """The cursor every loop reading the store has drained to (0 when none reads it). A reader whose folder is
    gone reads no more: it holds nothing back."""
    cursors = []
    for path in (data_dir / READERS).glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            reader = json.loads(path.read_text())
            if Path(reader["folder"]).is_dir():
                cursors.append(int(reader["cursor"]))
    return min(cursors, default=0)


def prune(data_dir: Path, keep_hours: float = KEEP_HOURS, max_hours: float = 0.0, now: float | None = None) -> int:
    """Delete what the rules above say; how many exchanges and feedback rows went."""
    path = data_dir / "capture.sqlite"
    if not path.is_file():
        return 0
    now = time.time() if now is None else now
    drained_cutoff, hard_cutoff = now - keep_hours * 3600, now - max_hours * 3600 if max_hours else float("-inf")
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db, db:  # one transaction beside the daemon
        gone = db.execute("DELETE FROM annotations WHERE run_id = ? AND ((cursor <= ? AND created_at < ?) OR "
                          "created_at < ?) RETURNING cursor",
                          (RUN, drained(data_dir), drained_cutoff, hard_cutoff)).fetchall()
        if gone:
            db.execute("DELETE FROM wire_rows WHERE run_id = ? AND cursor < ?", (RUN, max(c for (c,) in gone)))
    return len(gone)
