"""Writing a file or a folder so that nobody ever sees it half-written, and nobody but its owner reads it.

Both are built beside their target under a hidden name and moved into its place in one rename: a crash, a
Ctrl-C or a failed step leaves the old target (or nothing) and no partial one. mkstemp and mkdtemp make the
staging copy private; `shared=True` makes the finished one readable by everyone (0644, folders 0755): only for
what holds no user data (a notebook's recorded figures).

Every rlcli command starts with `private_files()` (rlcli.cli.main): what it writes holds a user's data (traces,
imports, run folders, ledgers, weights, logs, keys), so every file and folder it, its libraries (the cookbook's
run logs, SkyRL's checkpoints) and the processes it starts create is its owner's alone, 0600 and 0700.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

PRIVATE_UMASK = 0o077  # new files 0600, new folders 0700
SHARED_FILE, SHARED_FOLDER = 0o644, 0o755


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def private_files() -> int:
    """From now on this process and its children create only owner-only files and folders (the umask, so
    that files written by code rlcli does not own are covered too); returns the umask it replaced."""
    return os.umask(PRIVATE_UMASK)


@contextlib.contextmanager
def staged_folder(target: Path, shared: bool = False) -> Iterator[Path]:
    """A new folder beside target to fill; when the block succeeds it replaces target whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if shared:
            staging.chmod(SHARED_FOLDER)
            for path in staging.iterdir():
                path.chmod(SHARED_FOLDER if path.is_dir() else SHARED_FILE)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(path: Path, shared: bool = False, buffering: int = -1) -> Iterator[IO[bytes]]:
    """A binary file to write; when the block succeeds it replaces `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
        if shared:
            os.chmod(tmp, SHARED_FILE)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
