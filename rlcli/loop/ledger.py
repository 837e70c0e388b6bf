"""`DIR/ledger.sqlite`: what a loop has done, the one record `loop run` resumes from.

Tables: files (every trace file ingested, by content hash, with its per-line accounting), conversations
(the hash of every conversation kept, so a later file cannot bring one in twice), iterations (state,
decision, why), stages (each completed stage of an iteration, with what it found), runs (the training runs
of an iteration and their final weights), problems (each held-out and regression problem's slice, by prompt hash,
and the iteration that brought it), scores (each model's score per problem set and per slice), aliases (every
move of the champion alias) and hooks (the moves whose hook has run). Each stage commits in one transaction: a
kill leaves a stage done or not done.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE = "ledger.sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (sha256 TEXT PRIMARY KEY, path TEXT NOT NULL, iteration INTEGER NOT NULL,
    lines INTEGER NOT NULL, written INTEGER NOT NULL, dropped TEXT NOT NULL, duplicate INTEGER NOT NULL,
    train INTEGER NOT NULL DEFAULT 0, heldout INTEGER NOT NULL DEFAULT 0, at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (hash TEXT PRIMARY KEY, iteration INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS iterations (n INTEGER PRIMARY KEY, started TEXT NOT NULL, finished TEXT,
    decision TEXT, why TEXT, settings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stages (iteration INTEGER NOT NULL, stage TEXT NOT NULL, at TEXT NOT NULL,
    info TEXT NOT NULL, PRIMARY KEY (iteration, stage));
CREATE TABLE IF NOT EXISTS runs (iteration INTEGER NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL,
    folder TEXT NOT NULL, state_path TEXT, sampler_path TEXT, PRIMARY KEY (iteration, idx));
CREATE TABLE IF NOT EXISTS scores (iteration INTEGER NOT NULL, model TEXT NOT NULL, problems TEXT NOT NULL,
    score REAL NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (iteration, model, problems));
CREATE TABLE IF NOT EXISTS problems (problems TEXT NOT NULL, key TEXT NOT NULL, slice TEXT NOT NULL,
    iteration INTEGER NOT NULL, PRIMARY KEY (problems, key));
CREATE TABLE IF NOT EXISTS aliases (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, iteration INTEGER,
    sampler_path TEXT, state_path TEXT, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hooks (alias INTEGER PRIMARY KEY, at TEXT NOT NULL);
"""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Champion:
    """The model the alias points at: iteration 0 is the base model (no weights of its own)."""

    iteration: int
    sampler_path: str | None = None
    state_path: str | None = None

    @property
    def is_base(self) -> bool:
        return self.sampler_path is None

    def label(self) -> str:
        return "base model" if self.is_base else f"iteration {self.iteration} ({self.sampler_path})"


class Ledger:
    def __init__(self, folder: Path):
        self.db = sqlite3.connect(folder / FILE, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        before_hooks = not self.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'hooks'")
        self.db.executescript(SCHEMA)
        if before_hooks:  # a ledger from before the hooks table: the moves it recorded had their hooks run
            self.db.execute("INSERT OR IGNORE INTO hooks SELECT id, at FROM aliases")

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return self.db.execute(sql, args).fetchall()

    # --- files and conversations --------------------------------------------------------------
    def known_file(self, sha256: str) -> bool:
        return bool(self.rows("SELECT 1 FROM files WHERE sha256 = ?", sha256))

    def seen(self, hashes: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            found |= {r[0] for r in self.rows(f"SELECT hash FROM conversations WHERE hash IN "
                                              f"({','.join('?' * len(part))})", *part)}
        return found

    def files(self, iteration: int | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE iteration = ?", (iteration,)) if iteration is not None else ("", ())
        return [dict(r, dropped=json.loads(r["dropped"]))
                for r in self.rows(f"SELECT * FROM files {where} ORDER BY iteration, path", *args)]

    # --- iterations and stages ----------------------------------------------------------------
    def open_iteration(self) -> int | None:
        row = self.rows("SELECT n FROM iterations WHERE finished IS NULL ORDER BY n LIMIT 1")
        return row[0]["n"] if row else None

    def last_iteration(self) -> int:
        return self.rows("SELECT COALESCE(MAX(n), 0) FROM iterations")[0][0]

    def iteration(self, n: int) -> dict[str, Any] | None:
        row = self.rows("SELECT * FROM iterations WHERE n = ?", n)
        return dict(row[0]) if row else None

    def iterations(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows("SELECT * FROM iterations ORDER BY n")]

    def stage(self, n: int, name: str) -> dict[str, Any] | None:
        row = self.rows("SELECT info FROM stages WHERE iteration = ? AND stage = ?", n, name)
        return json.loads(row[0]["info"]) if row else None

    def stages(self, n: int) -> list[str]:
        return [r["stage"] for r in self.rows("SELECT stage FROM stages WHERE iteration = ? ORDER BY at, rowid", n)]

    def done(self, db: sqlite3.Connection, n: int, name: str, info: dict[str, Any] | None = None) -> None:
        db.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, ?, ?)", (n, name, now(), json.dumps(info or {})))

    def finish(self, db: sqlite3.Connection, n: int, decision: str, why: str) -> None:
        db.execute("UPDATE iterations SET finished = ?, decision = ?, why = ? WHERE n = ?", (now(), decision, why, n))

    def runs(self, n: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows("SELECT * FROM runs WHERE iteration = ? ORDER BY idx", n)]

    def scores(self, n: int) -> dict[tuple[str, str], tuple[float, int]]:
        return {(r["model"], r["problems"]): (r["score"], r["n"])
                for r in self.rows("SELECT * FROM scores WHERE iteration = ?", n)}

    # --- problems and their slices -----------------------------------------------------------
    def record_problems(self, db: sqlite3.Connection, problems: str, rows: list[tuple[str, str, int]]) -> None:
        """(prompt hash, slice, iteration) of problems of a set; a prompt recorded before keeps its slice."""
        db.executemany("INSERT OR IGNORE INTO problems VALUES (?, ?, ?, ?)", [(problems, *r) for r in rows])

    def problem_slices(self, problems: str) -> dict[str, tuple[str, int]]:
        """{prompt hash: (slice, the iteration that brought it)} of a set's recorded problems."""
        return {r["key"]: (r["slice"], r["iteration"])
                for r in self.rows("SELECT key, slice, iteration FROM problems WHERE problems = ?", problems)}

    # --- the champion alias -------------------------------------------------------------------
    def champion(self) -> Champion:
        row = self.rows("SELECT * FROM aliases ORDER BY id DESC LIMIT 1")
        if not row or row[0]["iteration"] in (None, 0):
            return Champion(0)
        r = row[0]
        return Champion(r["iteration"], r["sampler_path"], r["state_path"])

    def aliases(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows("SELECT * FROM aliases ORDER BY id")]

    def is_hooked(self) -> bool:
        """Whether the hook has run for the alias's last move (True before any move)."""
        return not self.rows("SELECT 1 FROM aliases WHERE id = (SELECT MAX(id) FROM aliases) "
                             "AND id NOT IN (SELECT alias FROM hooks)")

    def hooked(self, db: sqlite3.Connection) -> None:
        db.execute("INSERT OR IGNORE INTO hooks SELECT id, ? FROM aliases ORDER BY id DESC LIMIT 1", (now(),))

    def move_alias(self, db: sqlite3.Connection, to: Champion, reason: str) -> None:
        db.execute("INSERT INTO aliases (at, iteration, sampler_path, state_path, reason) VALUES (?, ?, ?, ?, ?)",
                   (now(), to.iteration, to.sampler_path, to.state_path, reason))


@contextlib.contextmanager
def opened(folder: Path) -> Iterator[Ledger]:
    ledger = Ledger(folder)
    try:
        yield ledger
    finally:
        ledger.close()
