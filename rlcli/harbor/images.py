"""Task images: one per task content (a hash of environment/), built once and shared by every rollout.

A prebuilt `docker_image` from task.toml is preferred when it is on this machine (as Harbor prefers it);
when it is not, the task's Dockerfile is built instead (no registry to pull from here). A task whose
image cannot be made is reported with the reason and left out; the other tasks run. A base image
(FROM) that is not on this machine always gets the hint to build it offline.

The build context (environment/ as a tar stream, .dockerignore applied) is written to an anonymous
temporary file: docker-py would put it in a named file under $TMPDIR and delete it only when the upload
returns, so a run killed mid-upload (SIGKILL, the OOM killer) would leave the tarball behind. An
anonymous file has no name to leave: the kernel frees it when rlcli's last handle on it closes, however
rlcli ends. The daemon's copy of the context and the builder's intermediate containers are its own to
remove (`forcerm`: also after a failed build).
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
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


BASE_HINT = "`make base-image` builds debian:bookworm(-slim) offline; other images: `docker load` them"


def base_images(dockerfile: Path) -> list[str]:
    """The images a Dockerfile starts FROM (stage names and ${ARG} forms left out: they are not pulled)."""
    stages, found = set(), []
    for line in dockerfile.read_text(encoding="utf-8", errors="replace").splitlines():
        words = line.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
        if args[0].lower() not in stages and "$" not in args[0] and args[0].lower() != "scratch":
            found.append(args[0])
    return found


def missing_base(client: Any, task: Task) -> str | None:
    import docker

    for image in base_images(task.environment / "Dockerfile"):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            return image
        except docker.errors.APIError:
            return None
    return None


def build_image(client: Any, task: Task, tag: str) -> None:
    import docker

    if base := missing_base(client, task):
        raise RlcliError(f"building the image of task {task.name} failed: its base image {base} is not on this "
                         f"machine and no registry is reachable ({BASE_HINT})")
    with build_context(task.environment) as context:
        try:
            client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                labels={LABEL: "1", TASK_LABEL: task.name}, timeout=int(task.build_timeout_s))
        except docker.errors.BuildError as e:
            lines = [str(c.get("stream") or c.get("error") or "").strip() for c in e.build_log]
            tail = " | ".join(line for line in lines if line)[-400:]
            hint = f" ({BASE_HINT})" if any(w in tail for w in ("pull", "not found", "manifest")) else ""
            raise RlcliError(f"building the image of task {task.name} failed: {tail}{hint}") from None
        except docker.errors.APIError as e:
            raise RlcliError(f"building the image of task {task.name} failed: {e.explanation or e}") from None


def ensure_image(client: Any, task: Task) -> tuple[str, bool]:
    """(image, built now): task.toml's docker_image when it is here, else the image built from environment/."""
    import docker

    if task.docker_image:
        try:
            client.images.get(task.docker_image)
            return task.docker_image, False
        except docker.errors.ImageNotFound:
            if not task.has_dockerfile:
                raise RlcliError(f"task {task.name} uses image {task.docker_image}, which is not on this machine: "
                                 f"`docker pull {task.docker_image}` where a registry is reachable, then "
                                 "`docker save`/`docker load` it here") from None
    tag = image_tag(task)
    with _build_locks_guard:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:  # rollouts of one group ask at once: one builds, the others wait for it
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.get(tag)
            return tag, False
        build_image(client, task, tag)
    return tag, True
