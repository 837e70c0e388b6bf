"""Sandboxes: one Docker container per rollout, through the docker SDK (no compose, no CLI).

- Images (images.py): one per task content, built once, shared by every rollout.
- Containers carry rlcli's labels (owner = host:pid), CPU, memory and pids limits, and a lifetime: the
  image's own ENTRYPOINT runs (as in Harbor: tasks start services there) with `sleep <lifetime>` as its
  command, under docker-init with auto-remove, so a container whose entrypoint hands over to its command
  outlives no rollout by long even if rlcli is SIGKILLed. Each rollout removes its own; `remove_mine`
  does it for a whole process (Ctrl-C), `sweep` for dead owners at start.
- Network per phase (taskconfig.py): a task that is online at any moment starts attached to Docker's
  bridge, and is detached from it (loopback only) while a phase is "no-network"; a task that is never
  online starts with no network at all. The bridge is detached before the container starts when the
  environment's own policy is off, so the entrypoint never sees a network it was not given.
- A command runs as `timeout -s KILL T bash -c CMD` in [environment] workdir with [environment] env:
  timeout kills its whole process group inside the container, and the client kills that group itself
  if the exec is still running after a grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import sys
import tarfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcli.errors import RlcliError
from rlcli.harbor.daemon import (
    DockerGone,
    SandboxError,
    docker_where,
    gone_error,
    is_gone,
    quiet_lost_rollouts,
    restarted_error,
)
from rlcli.harbor.images import LABEL, TASK_LABEL, ensure_image
from rlcli.harbor.tasks import Limits, Task

OWNER = "dev.rlcli.owner"  # "<hostname>:<pid>" of the rlcli process that started the container
MAX_OUTPUT_BYTES = 16_000  # of a command's output kept (head and tail)
KILL_GRACE_S = 5.0  # after a command's timeout, before the client kills its process group itself
DOCKER_HINT = ("start one: `sudo scripts/docker_up.sh` (`make docker`) on Debian/Ubuntu, "
               "`sudo systemctl start docker`, or open Docker Desktop")


@dataclass
class ExecResult:
    exit_code: int
    output: str
    timed_out: bool
    seconds: float


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def connect(pool_size: int = 16) -> Any:
    """A docker client that answers, or a one-line error that says how to start a daemon."""
    import docker

    where = docker_where()
    try:
        client = docker.from_env(max_pool_size=pool_size, timeout=120)
        client.ping()
    except docker.errors.DockerException as e:
        text = str(e)
        known = {"No such file": "no such socket", "Permission denied": "permission denied: use sudo, or join the "
                 "docker group", "Connection refused": "connection refused"}
        reason = next((why for key, why in known.items() if key in text), text[-160:])
        raise RlcliError(f"no Docker daemon answers at {where} ({reason}): {DOCKER_HINT}") from None
    return client


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(client: Any) -> int:
    """Remove sandboxes whose rlcli process on this host is gone (a crash, SIGKILL); return how many.

    Live owners' containers are left alone: another rlcli run on this machine may be using them.
    """
    host, removed = socket.gethostname(), 0
    for container in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
        owner_host, _, pid = container.labels.get(OWNER, "").rpartition(":")
        if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
            _remove(container)
            removed += 1
    return removed


def remove_mine(client: Any, settle_s: float = 30.0) -> int:
    """Remove every sandbox this process started (the last line of defence after Ctrl-C or a crash).

    With the daemon gone there is nothing to ask: its containers carry auto-remove, which the daemon
    honours when it starts again (it does not restore containers), so none outlives the outage. A daemon just
    back may still be removing them, and refuses a second removal while its own is under way: the list is
    asked for again until none of this process's is left or settle_s has passed; what is still there then is
    named in one line (nothing left behind silently). One listed and gone before the SDK inspects it is
    skipped (ignore_removed), where it used to end a finished run with a 404.
    """
    seen: set[str] = set()
    deadline = time.monotonic() + settle_s
    while True:
        try:
            mine = client.containers.list(all=True, filters={"label": f"{OWNER}={owner_id()}"},
                                          ignore_removed=True)
        except Exception as e:
            if is_gone(e):
                return len(seen)
            raise
        if not mine:
            return len(seen)
        if time.monotonic() >= deadline:
            ids = " ".join(c.short_id for c in mine)
            print(f"rlcli: warning: {len(mine)} sandbox container(s) of this run could not be removed within "
                  f"{settle_s:g}s: remove them with `docker rm -f {ids}`", file=sys.stderr, flush=True)
            return len(seen)
        for container in mine:
            seen.add(container.id)
            _remove(container)
        time.sleep(0.5)


def _remove(container: Any) -> None:
    import docker

    try:
        container.remove(force=True)
    except (docker.errors.NotFound, docker.errors.APIError):  # gone, or removal in progress
        pass
    except Exception as e:  # the daemon is gone: it removes auto-remove containers when it starts again
        if not is_gone(e):
            raise


def run_options(limits: Limits, lifetime_s: float, online: bool = False,
                host_cpus: int | None = None) -> dict[str, Any]:
    """docker SDK `containers.create` keywords for a task's limits (pure, so the mapping is testable)."""
    cpus = min(limits.cpus, float(host_cpus or os.cpu_count() or 1))  # Docker refuses more CPUs than the host has
    memory = f"{limits.memory_mb}m"
    return {
        "nano_cpus": int(cpus * 1e9),
        "mem_limit": memory,
        "memswap_limit": memory,  # no swap on top: the limit is the limit
        "pids_limit": limits.pids,
        "network_mode": "bridge" if online else "none",
        "init": True,  # docker-init as PID 1 reaps what killed commands leave behind
        "auto_remove": True,
        # The image's ENTRYPOINT is kept (Harbor keeps it); its CMD is replaced: the agent's commands are the work.
        "command": ["sleep", str(int(lifetime_s))],
        "hostname": "sandbox",
    }


@dataclass
class Sandbox:
    container: Any
    shell: str  # bash, else sh
    has_timeout: bool
    workdir: str  # where the verifier runs: [environment] workdir, else the image's WORKDIR, else /root
    env: dict[str, str] = field(default_factory=dict)  # [environment] env: every command sees it
    command_workdir: str | None = None  # [environment] workdir for every command (None: the image's WORKDIR)
    online: bool = False  # attached to the bridge now
    can_connect: bool = False  # started on the bridge: phases may switch it on and off
    closed: bool = field(default=False)
    killed: str = ""  # why rlcli killed the container itself, for the error that follows

    @classmethod
    def start(cls, client: Any, image: str, task: Task, lifetime_s: float) -> Sandbox:
        import docker

        labels = {LABEL: "1", OWNER: owner_id(), TASK_LABEL: task.name}
        online = task.needs_network
        try:
            container = client.containers.create(image, labels=labels, **run_options(task.limits, lifetime_s, online))
        except docker.errors.APIError as e:
            raise SandboxError(f"cannot start a container for task {task.name}: {e.explanation or e}") from None
        try:
            if online and not task.network.public:  # off while the entrypoint starts; phases switch it on
                client.networks.get("bridge").disconnect(container)
            container.start()
            container.reload()
        except docker.errors.APIError as e:
            _remove(container)
            raise SandboxError(f"cannot start a container for task {task.name}: {e.explanation or e}") from None
        try:
            probe = "command -v bash; command -v timeout" + (f"; mkdir -p '{task.workdir}'" if task.workdir else "")
            found = container.exec_run(["sh", "-c", probe]).output.decode()
        except (docker.errors.APIError, UnicodeDecodeError) as e:
            _remove(container)
            raise SandboxError(f"the container of task {task.name} cannot run `sh` ({e})") from None
        workdir = task.workdir or (container.attrs.get("Config") or {}).get("WorkingDir") or ""
        return cls(container, "bash" if "bash" in found else "sh", "timeout" in found,
                   workdir if workdir not in ("", "/") else "/root", dict(task.env), task.workdir,
                   online=task.network.public, can_connect=online)

    def set_network(self, public: bool) -> None:
        """Attach to or detach from the bridge for the next phase (no-op when already so)."""
        import docker

        if public == self.online:
            return
        if not self.can_connect:
            raise SandboxError(f"sandbox {self.short_id} started without a network and cannot get one")
        bridge = self.container.client.networks.get("bridge")
        try:
            (bridge.connect if public else bridge.disconnect)(self.container)
        except docker.errors.APIError as e:
            self.check_alive()
            raise SandboxError(f"sandbox {self.short_id}: cannot switch its network ({e.explanation or e})") from None
        self.online = public

    @property
    def short_id(self) -> str:
        return self.container.short_id

    def check_alive(self) -> None:
        import docker

        try:
            self.container.reload()
        except docker.errors.NotFound:
            why = self.killed or "removed, its lifetime ran out, or the Docker daemon restarted"
            raise SandboxError(f"sandbox {self.short_id} is gone ({why})") from None
        except Exception as e:
            if is_gone(e):
                raise gone_error(f" (sandbox {self.short_id})") from None
            raise
        state = self.container.attrs.get("State") or {}
        if self.killed or state.get("Status") != "running":
            why = ", killed for memory" if state.get("OOMKilled") else f": {self.killed}" if self.killed else ""
            raise SandboxError(f"sandbox {self.short_id} died ({state.get('Status')}, exit {state.get('ExitCode')}"
                               f"{why})")

    def exec(self, command: str, timeout_s: float, workdir: str | None = None,
             limit: int = MAX_OUTPUT_BYTES, env: dict[str, str] | None = None) -> ExecResult:
        """Run a shell command; kill it (and everything it started) inside the container at timeout_s."""
        import docker

        self.check_alive()
        seconds = max(1, int(timeout_s + 0.999))
        inner = [self.shell, "-c", command]
        if self.has_timeout:  # timeout makes its own process group and KILLs all of it
            inner = ["timeout", "-s", "KILL", str(seconds), *inner]
        api, start = self.container.client.api, time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, ["sh", "-c", 'echo "$$"; exec "$@"', "sh", *inner],
                                      workdir=workdir or self.command_workdir,
                                      environment={**self.env, **(env or {})} or None)["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except docker.errors.APIError as e:
            self.check_alive()
            raise SandboxError(f"sandbox {self.short_id}: cannot run a command ({e.explanation or e})") from None
        output, pgid = _Capped(limit), []
        # Fallbacks for an exec still running after its timeout: kill its process group from here, and
        # if even that does not end it (a process stuck in the kernel), the container.
        guards = [threading.Timer(seconds + KILL_GRACE_S, self._kill_group, (pgid,)),
                  threading.Timer(seconds + 3 * KILL_GRACE_S, self._kill_container)]
        for guard in guards:
            guard.daemon = True
            guard.start()
        try:
            for out, err in stream:
                if out and not pgid:  # the first stdout line is the wrapper's pid: the process group to kill
                    first, _, out = out.partition(b"\n")
                    pgid.append(first.decode(errors="replace").strip())
                output.add(out or b"")
                output.add(err or b"")
            code = api.exec_inspect(exec_id).get("ExitCode")
        except Exception as e:  # the stream broke or the exec vanished: say so if the container died with it
            dropped = is_gone(e)  # the daemon closed the connection under the command
            try:
                self.check_alive()
            except DockerGone:
                raise
            except SandboxError:
                if dropped and not self.killed:  # gone, yet the daemon answers: it went away and came back
                    raise restarted_error(self.short_id) from None
                raise
            if dropped:
                raise SandboxError(f"sandbox {self.short_id}: the connection to the Docker daemon broke during a "
                                   "command (its outcome is unknown)") from None
            raise
        finally:
            for guard in guards:
                guard.cancel()
        elapsed = time.monotonic() - start
        if code is None:
            self.check_alive()
            code = -1
        timed_out = elapsed >= seconds - 0.05 and code in (124, 137, -1)
        return ExecResult(int(code), output.text(), timed_out, elapsed)

    def _kill_group(self, pgid: list[str]) -> None:
        """The exec outlived its timeout (no `timeout` in the image, or a stuck process): kill it from here."""
        if pgid and pgid[0].isdigit():
            with contextlib.suppress(Exception):
                self.container.exec_run(["sh", "-c", f"kill -KILL -- -{pgid[0]} 2>/dev/null || kill -KILL {pgid[0]}"])

    def _kill_container(self) -> None:
        self.killed = "rlcli killed it: a command outlived its timeout even after its process group was killed"
        with contextlib.suppress(Exception):
            self.container.kill()

    def put_folder(self, local: Path, target: str, clear: bool = True) -> None:
        """Copy local's contents into target (created; emptied first when clear) as root."""
        self.exec(f"rm -rf {target} && mkdir -p {target}" if clear else f"mkdir -p {target}", 30, "/")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(local.rglob("*")):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(local)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                with open(path, "rb") if path.is_file() else contextlib.nullcontext() as f:
                    tar.addfile(info, f)
        if not self.container.put_archive(target, buffer.getvalue()):
            raise SandboxError(f"sandbox {self.short_id}: could not copy {local} to {target}")

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        """A file's bytes, or None when it does not exist."""
        import docker

        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            self.check_alive()
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None and member.isfile() else None
            return f.read(max_bytes) if f else None

    def remove(self) -> None:
        _remove(self.container)


def script_command(path: str) -> str:
    """Run a task's script as Harbor does: made executable and run directly, so its shebang chooses the
    interpreter (a script without one runs in the shell, which falls back to reading it)."""
    return f"chmod +x {path} 2>/dev/null; {path}"


class _Capped:
    """A command's output, its first and last limit/2 bytes: errors tend to be at the end."""

    def __init__(self, limit: int):
        self.half, self.head, self.tail, self.total = limit // 2, bytearray(), deque(), 0
        self.tail_size = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        self.head += data[:room]
        rest = data[room:] if room > 0 else data
        if rest:
            self.tail.append(rest)
            self.tail_size += len(rest)
            while self.tail_size - len(self.tail[0]) >= self.half:
                self.tail_size -= len(self.tail.popleft())

    def text(self) -> str:
        tail = b"".join(self.tail)
        dropped = self.total - len(self.head) - min(len(tail), self.half)
        if dropped > 0:
            return (bytes(self.head).decode(errors="replace") + f"\n[... {dropped} bytes cut ...]\n"
                    + tail[-self.half:].decode(errors="replace"))
        return (bytes(self.head) + tail).decode(errors="replace")


class SandboxPool:
    """The sandboxes of one run: at most `size` alive at once (--max-sandboxes), each removed after use."""

    def __init__(self, client: Any, size: int,
                 on_gone: Callable[[str, BaseException | None], Awaitable[None]] | None = None):
        """on_gone(task name, error): called when the daemon is gone as a sandbox starts or a rollout ends with
        DockerGone; returns once it is back (a start is tried once more), raises when it is not."""
        self.client, self.size, self.on_gone = client, size, on_gone
        self._slots: asyncio.Semaphore | None = None  # made inside the running event loop

    async def open(self, task: Task, lifetime_s: float) -> Sandbox:
        quiet_lost_rollouts()
        try:
            return await self._open(task, lifetime_s)
        except DockerGone as e:
            if self.on_gone is None:
                raise
            await self.on_gone(task.name, e)  # nothing ran yet: once the daemon is back, start afresh
            return await self._open(task, lifetime_s)

    async def _open(self, task: Task, lifetime_s: float) -> Sandbox:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        await self._slots.acquire()
        try:
            image, _ = await asyncio.to_thread(ensure_image, self.client, task)
            sandbox = await asyncio.to_thread(Sandbox.start, self.client, image, task, lifetime_s)
        except BaseException as e:
            self._slots.release()
            if isinstance(e, Exception) and not isinstance(e, DockerGone) and is_gone(e):
                raise gone_error(f" (starting a sandbox for task {task.name})") from None
            raise
        try:
            if image == task.docker_image and not task.has_dockerfile and task.environment.is_dir() \
                    and any(task.environment.iterdir()):  # as Harbor: a prebuilt image gets environment/ in workdir
                await asyncio.to_thread(sandbox.put_folder, task.environment, sandbox.workdir, False)
            return sandbox
        except BaseException:
            await self.close(sandbox)
            raise

    async def close(self, sandbox: Sandbox | None) -> None:
        """Remove the sandbox and free its slot; safe to call twice."""
        if sandbox is None or sandbox.closed or self._slots is None:
            return
        sandbox.closed = True
        try:
            await asyncio.shield(asyncio.to_thread(sandbox.remove))  # a cancelled rollout still removes it
        finally:
            self._slots.release()


def prepare_images(tasks: list[Task]) -> tuple[Any, dict[str, str]]:
    """Connect to Docker, sweep dead runs' sandboxes, build each task image once.

    Returns (client, {task name: why its image could not be made}): those tasks are left out, the rest run.
    """
    client = connect()
    if removed := sweep(client):
        print(f"removed {removed} sandbox(es) left by earlier runs that died", file=sys.stderr)
    failed: dict[str, str] = {}
    for task in {t.path: t for t in tasks}.values():
        started = time.monotonic()
        try:
            image, built = ensure_image(client, task)
        except RlcliError as e:
            failed[task.name] = str(e)
            print(f"rlcli: warning: skipped task {task.name}: {e}", file=sys.stderr)
            continue
        if built:
            print(f"image {image} for {task.name}: built in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return client, failed
