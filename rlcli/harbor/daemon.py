"""The Docker daemon going away mid-run: telling it from one container's failure, and waiting for it.

A rollout whose daemon vanishes fails with that reason (DockerGone); the run then asks the daemon once
(DockerWatch) and, if it does not answer, waits up to --docker-timeout for it: back in time, the run goes on
(sandboxes not yet started are started afresh), else it stops with one line. Containers carry auto-remove,
which a restarted daemon honours, so none outlives the outage (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import weakref

from rlcli.errors import RlcliError

DEFAULT_DOCKER_TIMEOUT_S = 60.0  # --docker-timeout: how long a run waits for a daemon that went away


class SandboxError(RlcliError):
    """The container died or Docker failed: the rollout cannot go on (not the agent's fault)."""


class DockerGone(SandboxError):
    """The Docker daemon itself stopped answering (stopped, crashed, restarted): every sandbox is affected."""


class DockerRestarted(DockerGone):
    """The daemon dropped a command's connection and, asked at once, no longer knew its container: it went away
    and came back in between (a restart removes every running sandbox). It answers, so nothing is waited for."""


# The verdicts of every DockerWatch that gave up in this process. The cookbook's RL loop counts a rollout that
# raised as failed and trains on without it, so `train harbor` looks here after each step and stops.
LOST: list[DockerGone] = []


def docker_where() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def is_gone(error: BaseException) -> bool:
    """Whether an error from the docker SDK means the daemon is unreachable (not one container's failure)."""
    import docker
    import requests
    import urllib3

    if isinstance(error, DockerGone | requests.exceptions.ConnectionError | urllib3.exceptions.ProtocolError
                  | requests.exceptions.ChunkedEncodingError | ConnectionError):
        return True
    return isinstance(error, docker.errors.DockerException) and not isinstance(error, docker.errors.APIError) \
        and any(key in str(error) for key in ("Connection refused", "No such file or directory", "Connection aborted"))


_QUIET_LOOPS: weakref.WeakSet = weakref.WeakSet()


def quiet_lost_rollouts() -> None:
    """Drop asyncio's "Task exception was never retrieved" report, a traceback, for DockerGone only.

    The cookbook gives up on a rollout it retried or skipped without awaiting the task that still runs it; when
    the daemon stays away that task ends later with DockerGone, which the run's one line already reports. Every
    other unretrieved exception is reported as before. Called from inside the running loop (SandboxPool.open).
    """
    loop = asyncio.get_running_loop()
    if loop in _QUIET_LOOPS:
        return
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if isinstance(context.get("exception"), DockerGone) and "never retrieved" in context.get("message", ""):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    _QUIET_LOOPS.add(loop)


def gone_error(what: str = "") -> DockerGone:
    return DockerGone(f"the Docker daemon at {docker_where()} stopped answering{what}")


def restarted_error(sandbox: str) -> DockerRestarted:
    return DockerRestarted(f"the Docker daemon at {docker_where()} dropped a command in sandbox {sandbox} and came "
                           "back without it (it restarted; a restart removes every sandbox)")


def daemon_answers(timeout_s: float = 5.0) -> bool:
    """One quick ping on a fresh connection (a short timeout: a frozen daemon counts as gone)."""
    import docker

    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def wait_for_daemon(timeout_s: float, poll_s: float = 0.5) -> bool:
    """Whether the daemon answers again within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if daemon_answers(min(5.0, max(1.0, deadline - time.monotonic()))):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


class DockerWatch:
    """After a failed rollout: is the daemon there? If not, wait up to timeout_s for it (one waiter for all
    rollouts); back in time, the run goes on (the failed rollouts keep their reason), else it stops."""

    RESTART_NOTICE_S = 30.0  # one line for the rollouts a restart took at once, not one per rollout

    def __init__(self, timeout_s: float):
        self.timeout_s, self.lock, self.lost = timeout_s, asyncio.Lock(), ""
        self.restart_told = -float("inf")

    async def check(self, task: str, error: BaseException | None = None) -> None:
        """After rollout `task` failed (with `error`, where known): wait for a daemon that is away; say so when
        the daemon went and came back before anyone asked (a restart), since nobody waited for it then."""
        async with self.lock:
            if isinstance(error, DockerRestarted) and not self.lost \
                    and time.monotonic() - self.restart_told > self.RESTART_NOTICE_S:
                self.restart_told = time.monotonic()
                print(f"the Docker daemon at {docker_where()} restarted during the rollout of {task} (its sandbox "
                      "went with it); it answers again: going on", file=sys.stderr, flush=True)
            if not self.lost and not await asyncio.to_thread(daemon_answers):
                print(f"the Docker daemon at {docker_where()} stopped answering (rollout of {task}); waiting up to "
                      f"{self.timeout_s:g}s for it to come back", file=sys.stderr, flush=True)
                if await asyncio.to_thread(wait_for_daemon, self.timeout_s):
                    print("the Docker daemon answers again: going on", file=sys.stderr, flush=True)
                else:
                    self.lost = task
                    LOST.append(self.verdict())
        if self.lost:
            raise self.verdict()

    def verdict(self) -> DockerGone:
        return gone_error(f" during rollout of {self.lost} and did not come back within {self.timeout_s:g}s "
                          "(--docker-timeout)")


