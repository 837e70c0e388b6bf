"""`rlcli train prune FOLDER --keep-runs N`: an opt-in retention for finished runs. Each run folder under FOLDER whose
run ended with its final checkpoint counts; the newest N of them keep their checkpoints, the older ones lose theirs on
the server (through tinker's checkpoint delete, as --keep-checkpoints deletes, rows out of checkpoints.jsonl first).

Never deleted: a run that is not finished (no final row yet, or its folder locked by a run in progress), anything a
loop's ledger names (the ledger above a stage run, and those of --loops: their runs and every champion move, so the
served champion stays), nor a run folder's own files (metrics, logs stay: only the weights on the server go).
Nothing runs this by default: a final checkpoint is what a run made. Why: docs/decisions.md, "Finished runs keep
their checkpoints unless `train prune` is asked".
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError
from rlcli.options import BASE_URL, Record, option
from rlcli.train import folder as runs
from rlcli.train import retention

CHECKPOINTS = "checkpoints.jsonl"


@dataclass(frozen=True, kw_only=True)
class Options(Record):
    folder: str = option(help="a folder of run folders (each run's --log-path beneath it, at any depth)",
                         positional=True)
    keep_runs: int = option(help="finished runs whose checkpoints stay: the newest N, by when they started",
                            low=0)
    loops: str | None = option(None, "loop folders (comma-separated) whose ledgers' checkpoints stay too (a "
                               "stage run under a loop folder is covered without it)")
    base_url: str | None = BASE_URL(None)


def prune(o: Options) -> int:
    """Delete the server checkpoints of the finished runs under FOLDER beyond the newest --keep-runs (opt-in retention;
    a loop's checkpoints, the served champion and runs in progress always stay)."""
    from rlcli.config import ensure_api_key, resolve_base_url

    top = Path(o.folder).expanduser()
    if not top.is_dir():
        raise UsageError(f"{top} is not a folder: pass the folder your runs' --log-path folders are in")
    kept = named_by_loops([Path(p).expanduser() for p in (o.loops or "").split(",") if p.strip()])
    older = finished_runs(top)[o.keep_runs:]
    ensure_api_key()
    import tinker

    total = asyncio.run(prune_runs(older, kept, tinker.RestClient(base_url=resolve_base_url(o.base_url))))
    print(f"deleted {total} checkpoint(s) of {len(older)} finished run(s) beyond the newest {o.keep_runs} under {top}")
    return 0


async def prune_runs(folders: list[Path], kept: set[str], rest: Any) -> int:
    """Each run folder's checkpoints but those `kept` or its loop's ledger names, off the server through `rest` (a
    tinker.RestClient); a folder a run holds is skipped. How many went."""
    total = 0
    for run in folders:
        with claimed(run) as free:
            if not free:  # a --resume took it since we looked: it is in flight again
                continue
            rows = runs.read_jsonl(run / CHECKPOINTS)
            total += len(await retention.delete_rows(run, rows, doomed(rows, kept | retention.referenced(run)), rest))
    return total


def doomed(rows: list[dict[str, Any]], kept: set[str]) -> list[dict[str, Any]]:
    """Every row of an older finished run, but one whose paths `kept` names (in either spelling of a path)."""
    named = {retention.canonical(p) for p in kept}
    return [r for r in rows if not {retention.canonical(r.get(k) or "") for k in retention.PATH_KEYS} & named]


def finished_runs(top: Path) -> list[Path]:
    """Run folders under `top` whose last checkpoint row is the final one, newest run first (by its run info,
    written as it starts: a prune rewriting checkpoints.jsonl must not make an old run look new)."""
    found = [p.parent for p in top.rglob(CHECKPOINTS)]
    done = [f for f in found if (rows := runs.read_jsonl(f / CHECKPOINTS)) and retention.is_final(rows[-1])]
    return sorted(done, key=started, reverse=True)


def started(run: Path) -> float:
    info = run / runs.RUN_INFO
    return (info if info.is_file() else run / CHECKPOINTS).stat().st_mtime


@contextlib.contextmanager
def claimed(run: Path):
    """Hold the run folder's lock (folder.claim's) while its rows change: True when free, False when a run holds it."""
    lock = run / ".lock"
    if not lock.exists():
        yield True
        return
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def named_by_loops(loops: list[Path]) -> set[str]:
    """The tinker:// paths the ledgers of these loop folders name."""
    out: set[str] = set()
    for loop in loops:
        if not (loop / retention.LEDGER).is_file():
            raise UsageError(f"--loops {loop}: no loop there ({retention.LEDGER} missing): pass a `loop init` folder")
        out |= retention.ledger_paths(loop / retention.LEDGER)
    return out
