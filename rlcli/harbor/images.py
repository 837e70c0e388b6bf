"""Task images: one per task content (a hash of environment/), built once and shared by every rollout.

The build context (environment/ as a tar stream, .dockerignore applied) is written to an anonymous
temporary file: docker-py would put it in a named file under $TMPDIR and delete it only when the upload
returns, so a run killed mid-upload (SIGKILL, the OOM killer) would leave the tarball behind. An
anonymous file has no name to leave: the kernel frees it when rlcli's last handle on it closes, however
rlcli ends. The daemon's copy of the context and the builder's intermediate containers are its own to
remove (`forcerm`: also after a failed build).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from rlcli.errors import RlcliError
from rlcli.harbor.tasks import Task, folder_hash

LABEL = "dev.rlcli.harbor"  # on every image and container rlcli makes: how sweeps and tests find them
TASK_LABEL = "dev.rlcli.task"

_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


def image_tag(task: Task) -> str:
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in task.name.lower()).strip("-._")[:60] or "task"
    return f"rlcli-harbor/{slug}:{folder_hash(task.environment)[:16]}"


def dockerignore_patterns(folder: Path) -> list[str]:
    """.dockerignore's patterns, read as `docker build` (and docker-py) read them."""
    ignore = folder / ".dockerignore"
    if not ignore.is_file():
        return []
    lines = (line.strip() for line in ignore.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def build_context(folder: Path) -> IO[bytes]:
    """folder as the tar stream `docker build` sends, in an anonymous file positioned at its start."""
    from docker.utils import tar

    context = tempfile.TemporaryFile()  # O_TMPFILE on Linux (else unlinked at once): it never has a name
    try:
        tar(str(folder), exclude=dockerignore_patterns(folder), fileobj=context)
    except BaseException:
        context.close()
        raise
    return context


def build_image(client: Any, task: Task, tag: str) -> None:
    import docker

    with build_context(task.environment) as context:
        try:
            client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                labels={LABEL: "1", TASK_LABEL: task.name}, timeout=int(task.build_timeout_s))
        except docker.errors.BuildError as e:
            lines = [str(c.get("stream") or c.get("error") or "").strip() for c in e.build_log]
            tail = " | ".join(line for line in lines if line)[-400:]
            hint = " (FROM debian:bookworm(-slim) offline: `make base-image` builds it)" if "pull" in tail else ""
            raise RlcliError(f"building the image of task {task.name} failed: {tail}{hint}") from None
        except docker.errors.APIError as e:
            raise RlcliError(f"building the image of task {task.name} failed: {e.explanation or e}") from None


def ensure_image(client: Any, task: Task) -> tuple[str, bool]:
    """(image, built now): the task's image, built from environment/ unless this content has an image."""
    import docker

    if not task.has_dockerfile:
        try:
            client.images.get(task.docker_image)
        except docker.errors.ImageNotFound:
            raise RlcliError(f"task {task.name} uses image {task.docker_image}, which is not on this machine: "
                             f"`docker pull {task.docker_image}` where a registry is reachable") from None
        return str(task.docker_image), False
    tag = image_tag(task)
    with _build_locks_guard:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:  # rollouts of one group ask at once: one builds, the others wait for it
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.get(tag)
            return tag, False
        build_image(client, task, tag)
    return tag, True


def prepare_images(tasks: list[Task]) -> Any:
    """Connect to Docker, sweep dead runs' sandboxes, build each task image once; return the client."""
    from rlcli.harbor.sandbox import connect, sweep

    client = connect()
    if removed := sweep(client):
        print(f"removed {removed} sandbox(es) left by earlier runs that died", file=sys.stderr)
    for task in {t.path: t for t in tasks}.values():
        started = time.monotonic()
        image, built = ensure_image(client, task)
        if built:
            print(f"image {image} for {task.name}: built in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return client
