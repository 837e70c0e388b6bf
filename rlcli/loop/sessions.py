"""DIR/server-tags.txt: a tag for the server sessions of each loop command, recorded before it opens any, so the
next command frees the LoRA slots of one that was killed (docs/decisions.md, "A killed loop command's models are
found by the tag it recorded first").

A trainer records each model's id once its client exists (rlcli.train.run.server_slots), but a kill while a model
is being created (tinker 0.38 files the creation, then waits for it: seconds for a model loaded from a state, the
distill teacher's among them) leaves a model no file names, holding its slot until SkyRL's session timeout (~5 min);
the resumed stage then finds every slot taken. Each loop command therefore draws a tag, writes it here, and puts it
in TINKER_TAGS, which tinker sends with every session it opens: every model the command creates is in a session
with that tag before the creation is filed. The next command, once it holds the folder's lock (so no command that
wrote a tag here is still alive), asks the server for the models of each recorded tag's sessions that still hold a
slot (rlcli's TAGGED_MODELS_ROUTE), unloads them, and forgets the tag. A server without rlcli's extensions (or a
tenant key, which may not list sessions) cannot be asked: there such a model frees at the session timeout.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlcli.server.runtime.shared import TAGGED_MODELS_ROUTE

FILE = "server-tags.txt"  # one "<server url> <tag>" a line
TAGS_ENV = "TINKER_TAGS"  # tinker tags each session it opens with these (comma-separated)
PREFIX = "rlcli-loop-"


def read(folder: Path) -> list[tuple[str, str]]:
    try:
        lines = (folder / FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    return list(dict.fromkeys((r[0], r[1]) for r in (line.split() for line in lines) if len(r) == 2))


@contextlib.contextmanager
def tagged(folder: Path, url: str) -> Iterator[str]:
    """Inside the block, every session tinker opens carries a new tag, written to DIR/server-tags.txt first
    (appended and closed: a SIGKILL after that cannot lose it). TINKER_TAGS is put back after."""
    tag = PREFIX + uuid.uuid4().hex[:16]
    with open(folder / FILE, "a") as f:
        f.write(f"{url.rstrip('/')} {tag}\n")
    before = os.environ.get(TAGS_ENV)
    os.environ[TAGS_ENV] = ",".join(t for t in (before, tag) if t)
    try:
        yield tag
    finally:
        if before is None:
            os.environ.pop(TAGS_ENV, None)
        else:
            os.environ[TAGS_ENV] = before


def live_models(url: str, tag: str) -> list[str] | None:
    """The models of the tag's sessions that may hold a slot; None where the server cannot say (no such route).
    OSError: the server is unreachable."""
    from rlcli.client import request_json

    try:
        return list(request_json(url + TAGGED_MODELS_ROUTE, {"tag": tag}, timeout=10)["models"])
    except urllib.error.HTTPError as e:
        if e.code in (404, 405):
            return None
        raise


def free(folder: Path) -> list[str]:
    """Unload the models of every recorded tag's sessions (call it holding the folder's lock). A tag whose server
    could not be asked (down: a kill -9), or whose models would not unload, stays for the next command; one the
    server cannot list is dropped. Returns the ids unloaded."""
    from rlcli.client import unload_models

    kept, freed = [], []
    for url, tag in read(folder):
        try:
            models = live_models(url, tag)
        except (OSError, ValueError, KeyError):
            kept.append((url, tag))
            continue
        failed = unload_models(url, models or [])
        freed += [m for m in models or [] if m not in failed]
        if failed:
            kept.append((url, tag))
    _rewrite(folder, kept)
    return freed


def _rewrite(folder: Path, rows: list[tuple[str, str]]) -> None:
    path = folder / FILE
    if not rows:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text("".join(f"{url} {tag}\n" for url, tag in rows))
    tmp.replace(path)
