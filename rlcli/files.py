"""Writing a file or a folder so that nobody ever sees it half-written.

Both are built beside their target under a hidden name and moved into its place in one rename: a crash, a
Ctrl-C or a failed step leaves the old target (or nothing) and no partial one. mkstemp and mkdtemp make the
staging copy private; `shared=True` gives the finished one the permissions an ordinary new file gets.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged_folder(target: Path, shared: bool = False) -> Iterator[Path]:
    """A new folder beside target to fill; when the block succeeds it replaces target whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if shared:
            mask = umask()
            staging.chmod(0o777 & ~mask)
            for path in staging.iterdir():
                path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(path: Path, shared: bool = True, buffering: int = -1) -> Iterator[IO[bytes]]:
    """A binary file to write; when the block succeeds it replaces `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
        if shared:
            os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
