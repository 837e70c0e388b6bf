"""What a request's `model` names, resolved per request to the weights that answer it.

Names: `base` (or the server's base model id), NAME from `--models NAME=tinker://...`, a `tinker://` path
itself, and `loop:NAME` for each `--loops` folder (NAME: the folder's name), whose champion is read from the
loop's ledger at every request, so a promotion or rollback changes what answers from the next request on,
with no restart; a request keeps the weights it resolved. `champion` names the first loop's champion.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError

BASE = "base"
CHAMPION = "champion"
LOOP_PREFIX = "loop:"
LEDGER = "ledger.sqlite"  # rlcli.loop.ledger.FILE (not imported: the endpoint stays below the loop's layer)


class UnknownModel(Exception):
    """A request named no model this endpoint serves."""


@dataclass(frozen=True)
class Answerer:
    """The weights one request is answered by: its name as asked, the sampler path (None: the base model) and,
    for a loop's champion, its iteration (0: the loop has promoted nothing yet, the base model answers)."""

    name: str
    sampler_path: str | None
    iteration: int | None = None
    state_path: str | None = None  # the training state saved with the weights (a loop records it)

    @property
    def weights(self) -> str:
        return self.sampler_path or BASE


def parse_pairs(text: str | None, flag: str) -> dict[str, str]:
    """`NAME=VALUE,NAME=VALUE` -> {NAME: VALUE}."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"{flag} {part!r}: give NAME=tinker://... pairs, comma-separated")
        pairs[name.strip()] = value.strip()
    return pairs


class Models:
    def __init__(self, base_model: str, named: dict[str, str], loops: list[Path]):
        self.base_model = base_model
        self.named = dict(named)
        self.loops: dict[str, Path] = {}
        for folder in loops:
            if not (folder / LEDGER).is_file():
                raise UsageError(f"--loops {folder}: not a loop folder (no {LEDGER}); `rlcli loop init` makes one")
            self.loops[LOOP_PREFIX + folder.name] = folder
        for name, path in self.named.items():
            if not path.startswith("tinker://"):
                raise UsageError(f"--models {name}={path}: the weights are a tinker:// sampler path "
                                 "(`rlcli checkpoint list` shows them)")
        self._ledgers: dict[Path, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    def listing(self) -> list[dict[str, Any]]:
        """The names /v1/models lists, with what each answers from now."""
        rows = [{"id": BASE, "weights": BASE}]
        rows += [{"id": name, "weights": path} for name, path in self.named.items()]
        for i, name in enumerate(self.loops):
            a = self.resolve(name)
            rows.append({"id": name, "weights": a.weights, "iteration": a.iteration})
            if i == 0:
                rows.append({"id": CHAMPION, "weights": a.weights, "iteration": a.iteration})
        return rows

    def resolve(self, name: str | None) -> Answerer:
        if not name or name in (BASE, self.base_model):
            return Answerer(name or BASE, None)
        if name in self.named:
            return Answerer(name, self.named[name])
        if name.startswith("tinker://"):
            return Answerer(name, name)
        loop = next(iter(self.loops)) if name == CHAMPION and self.loops else name
        if loop in self.loops:
            iteration, path, state = self._champion(self.loops[loop])
            return Answerer(name, path, iteration, state)
        raise UnknownModel(name)

    def _champion(self, folder: Path) -> tuple[int, str | None, str | None]:
        """The loop's champion now: the ledger's last alias move (iteration 0: the base model)."""
        with self._lock:
            db = self._ledgers.get(folder)
            if db is None:
                # Read-write but query-only, not mode=ro: a `loop run` killed inside a transaction leaves a hot
                # journal that only a writable connection may roll back; a read-only one fails every read.
                db = sqlite3.connect(f"file:{folder / LEDGER}?mode=rw", uri=True, timeout=30,
                                     check_same_thread=False)
                db.execute("PRAGMA query_only = ON")
                self._ledgers[folder] = db
            row = db.execute("SELECT iteration, sampler_path, state_path FROM aliases ORDER BY id DESC LIMIT 1"
                             ).fetchone()
        if not row or not row[0] or not row[1]:
            return 0, None, None
        return int(row[0]), str(row[1]), row[2]
