"""Checkpoint retention of a run (`--keep-checkpoints N`): after each save, the run's older intermediate checkpoints
(state and sampler weights) are deleted through the tinker API's checkpoint delete, as `rlcli checkpoint delete`
does, so the server's records and its disk agree, and their rows leave checkpoints.jsonl.

Kept, whatever N: the checkpoint just saved, the newest N intermediate ones before it, the final one, and any a loop's
ledger above the run folder names (a stage's weights, a champion). While the run trains, the one just saved is kept
on top of the N: a run killed before that step's metrics row resumes from the one before it (folder.resume_point),
so a resume always finds its checkpoint. Once the run has ended with its final checkpoint (the recipe returned:
every step logged), the final supersedes the intermediate ones and they go too, so a server's intermediate
checkpoints are bounded by the runs in flight. Why: docs/decisions.md, "A run keeps its newest 2 intermediate
checkpoints".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlcli.train import folder as runs

FINAL = "final"  # the name the cookbook's recipes save their last checkpoint under
PATH_KEYS = ("state_path", "sampler_path")
LEDGER = "ledger.sqlite"  # rlcli/loop/ledger.py's FILE: read here, never written
LEDGER_DEPTH = 4  # a loop's stage runs are DIR/iterations/NNNN/run-I-KIND


def doomed(rows: list[dict[str, Any]], keep: int, referenced: set[str], ended: bool = False) -> list[dict[str, Any]]:
    """The rows whose checkpoints go: intermediate ones older than the newest `keep` of those before the newest row
    (the one just saved); once the run `ended` with its final one, every intermediate one. Never the final one, nor
    one whose paths `referenced` holds. keep 0: none go."""
    if not keep or not rows:
        return []
    intermediate = [r for r in (rows if ended else rows[:-1]) if not is_final(r)]
    named = {canonical(p) for p in referenced}
    going = intermediate if ended else intermediate[:-keep]
    return [r for r in going if not {canonical(r.get(k) or "") for k in PATH_KEYS} & named]


def is_final(row: dict[str, Any]) -> bool:
    return row.get("name") == FINAL or bool(row.get("final"))


def canonical(path: str) -> str:
    """tinker://RUN/weights/ID or tinker://RUN/sampler_weights/ID; SkyRL answers a sampler save with the short
    tinker://RUN/ID, which tinker's checkpoint delete does not parse."""
    from rlcli.client import parse_tinker_path
    from rlcli.errors import UsageError

    try:
        return "tinker://{}/{}/{}".format(*parse_tinker_path(path))
    except UsageError:
        return path


def referenced(folder: Path) -> set[str]:
    """Every tinker:// path a loop's ledger in a folder above this run names (its runs and its champion's moves)."""
    for parent in list(folder.parents)[:LEDGER_DEPTH]:
        if (parent / LEDGER).is_file():
            return ledger_paths(parent / LEDGER)
    return set()


def ledger_paths(ledger: Path) -> set[str]:
    """Every tinker:// path a loop's ledger file names: its runs' and its champion's moves (read-only)."""
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=30)) as db:
        rows = [*db.execute("SELECT state_path, sampler_path FROM runs"),
                *db.execute("SELECT state_path, sampler_path FROM aliases")]
    return {p for row in rows for p in row if p}


async def prune(folder: Path, rest_of: Callable[[], Any], keep: int, ended: bool = False) -> list[str]:
    """Delete what `doomed` names: rows out of checkpoints.jsonl first (a kill between leaves files on the server,
    never a row naming a deleted checkpoint), then each path through `rest_of()` (a tinker.RestClient, made only
    when something goes). The names."""
    rows = runs.read_jsonl(folder / "checkpoints.jsonl")
    ended = ended and bool(rows) and is_final(rows[-1])
    going = doomed(rows, keep, referenced(folder), ended)
    return await delete_rows(folder, rows, going, rest_of()) if going else []


async def delete_rows(folder: Path, rows: list[dict[str, Any]], going: list[dict[str, Any]], rest: Any) -> list[str]:
    """`going` (rows of the run folder's checkpoints.jsonl, which holds `rows`) out of the file, then off the
    server. The names of the rows that went."""
    if not going:
        return []
    runs.rewrite_jsonl(folder / "checkpoints.jsonl", [r for r in rows if r not in going])
    for row in going:
        for path in filter(None, (row.get(k) for k in PATH_KEYS)):
            try:
                await rest.delete_checkpoint_from_tinker_path(canonical(path))
            except Exception as e:  # noqa: BLE001 - a failed delete leaves a file, never ends the run
                print(f"rlcli: could not delete the checkpoint {path} ({type(e).__name__}: {e}); "
                      "`rlcli checkpoint delete` it by hand", file=sys.stderr)
    return [str(r.get("name")) for r in going]


@contextlib.contextmanager
def kept_checkpoints(folder: Path, url: str, keep: int) -> Iterator[None]:
    """Inside the block, each save the cookbook makes into this run folder (checkpoint_utils.save_checkpoint_async,
    which records it in checkpoints.jsonl once the server confirmed it) is followed by `prune`."""
    import tinker
    from tinker_cookbook import checkpoint_utils

    original = checkpoint_utils.save_checkpoint_async
    if not keep:
        yield
        return
    signature, rest = inspect.signature(original), []

    def client() -> Any:  # one per run, made when a checkpoint first goes
        rest[:] = rest or [tinker.RestClient(base_url=url)]
        return rest[0]

    @functools.wraps(original)  # failed_saves, around this, reads the cookbook's signature through it
    async def save_checkpoint_async(*args: Any, **kwargs: Any) -> Any:
        paths = await original(*args, **kwargs)
        if Path(signature.bind(*args, **kwargs).arguments["log_path"]).resolve() == folder.resolve():
            await prune(folder, client, keep)
        return paths

    checkpoint_utils.save_checkpoint_async = save_checkpoint_async
    try:
        yield
    finally:
        checkpoint_utils.save_checkpoint_async = original
    # Here only when the recipe returned (an interrupted run keeps its intermediate ones to resume from)
    asyncio.run(prune(folder, client, keep, ended=True))
