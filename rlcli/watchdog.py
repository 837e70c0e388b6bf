"""Noticing a dead server within a bounded time, in every command that waits on one.

The tinker client retries a vanished server for ever (its session heartbeat only warns), so a command
whose server died (OOM, reboot, `kill -9`) would wait until someone ended it. `watch(url, timeout_s)`
runs a thread beside the command that asks the server's health route every few seconds. SkyRL's API
answers it from its own event loop while the engine computes, so a long compile or a big batch keeps
it answering: only a server that has not answered for `timeout_s` seconds (refused, reset, or silent)
counts as gone. Its engine dying takes the API down with it (SkyRL's API exits when its engine does),
so that case is seen too. An engine frozen under a live API (SIGSTOP, a hang) is seen by its own heartbeat,
which rlcli's API reports on ENGINE_ROUTE: one that has not beaten for `timeout_s` seconds counts as gone too
(a server without the route, stock SkyRL or --no-extensions, is judged by its health alone). When the
server is gone, the command's main thread gets ServerGone raised where it waits (a signal to that thread
breaks any blocking wait); should the command not leave the watched block within GRACE_S (ServerGone
caught on the way, a wait no signal reaches), the process exits with the same line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

from rlcli.errors import EXIT_SERVER_GONE, RlcliError, UsageError

DEFAULT_TIMEOUT_S = 60.0
HEALTH_ROUTE = "/api/v1/healthz"
ENGINE_ROUTE = "/api/v1/rlcli/engine"  # runtime/shared.py's (the runtime is not importable here)
GRACE_S = 15.0  # after ServerGone is raised, how long unwinding may take before the process exits anyway
SIGNAL = signal.SIGUSR1


class ServerGone(RlcliError):
    """The server stopped answering its health route for longer than the timeout."""

    exit_code = EXIT_SERVER_GONE


def health(url: str, timeout_s: float) -> str:
    """"ok"; "absent" when nothing listens there (refused, no such host, unreachable); "silent" when something
    does but gives no healthy answer in time (frozen, reset, an error status)."""
    try:
        with urllib.request.urlopen(url + HEALTH_ROUTE, timeout=timeout_s) as resp:
            return "ok" if resp.status == 200 else "silent"
    except urllib.error.HTTPError:
        return "silent"
    except OSError as e:  # URLError (an OSError) carries the socket's error as its reason
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        absent = isinstance(reason, (ConnectionRefusedError, socket.gaierror)) or (
            isinstance(reason, OSError) and reason.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH))
        return "absent" if absent else "silent"
    except ValueError:  # not a URL at all
        return "absent"


def engine_beat(url: str, timeout_s: float) -> dict | None:
    """What rlcli's API says of its engine's heartbeat ({"pid", "beat_age_s"}, or {"state": "starting"}); None where
    the server has no such route or does not answer it (a key the tenant gate refuses included)."""
    request = urllib.request.Request(url + ENGINE_ROUTE)
    if key := os.environ.get("TINKER_API_KEY"):
        request.add_header("X-API-Key", key)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            answer = json.loads(resp.read())
    except (OSError, ValueError):  # HTTPError and URLError are OSErrors
        return None
    return answer if isinstance(answer, dict) else None


def frozen_engine(beat: dict | None, after_s: float) -> str | None:
    """'engine process PID gave no heartbeat for N s' when the engine has not beaten for after_s seconds, or 'jax
    worker process K (pid PID) gave ...' when a local worker of a multi-process engine has not (the engine waiting
    on a stopped worker beats on)."""
    beat = beat or {}
    age = beat.get("beat_age_s")
    if isinstance(age, (int, float)) and age >= after_s:
        return f"engine process {beat.get('pid')} gave no heartbeat for {age:.0f} s"
    workers = beat.get("workers")
    for worker in workers if isinstance(workers, list) else []:
        age = worker.get("beat_age_s") if isinstance(worker, dict) else None
        if isinstance(age, (int, float)) and age >= after_s:
            return (f"jax worker process {worker.get('process')} (pid {worker.get('pid')}) gave no heartbeat for "
                    f"{age:.0f} s")
    return None


def healthy(url: str, timeout_s: float) -> bool:
    return health(url, timeout_s) == "ok"


def no_server(url: str) -> str:
    return f"no server answers at {url}: start one (`rlcli serve start`), or pass --base-url with your server's address"


def stopped_answering(url: str) -> Callable[..., str]:
    """The line for a server that went silent (frozen, overloaded past the timeout, or gone after answering), or
    gone for a known cause (a frozen engine, a lost jax worker: the words after the server's address)."""
    def message(silent: float, cause: str | None = None) -> str:
        what = cause or f"stopped answering (no answer for {silent:.0f} s)"
        return f"the server at {url} {what}: restart it (`rlcli serve restart`), then run the command again"
    return message


def lost_worker(url: str) -> str | None:
    """'stopped (its jax worker process K exited with code C)' where the server of this rlcli home at url stopped
    because a jax worker of its own died (its log says so): every request after names the worker."""
    from rlcli.server.scaling import lost_worker_at

    try:
        lost = lost_worker_at(url)
    except OSError:
        return None
    return f"stopped (its {lost.split(';')[0]})" if lost else None


class Watch:
    """The health poller: `gone` once the server has not answered for timeout_s seconds."""

    def __init__(self, url: str, timeout_s: float, message: Callable[..., str]):
        self.url, self.timeout_s, self.message = url.rstrip("/"), timeout_s, message
        self.interval_s = min(5.0, max(timeout_s / 6, 0.25))
        self.gone: ServerGone | None = None
        self.closed = False  # the block has been left: the command is unwinding on its own
        self.last_ok = time.monotonic()  # the last answer from the health route
        self.answered = False  # whether the health route has answered since the watch began
        self.state = "silent"  # what the last look found
        self.noticed_after_s: float | None = None  # from the last good answer to the verdict
        self.cause: str | None = None  # "has a frozen engine (...)", once the engine has stopped beating
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, name="rlcli-server-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread() and self.gone is None:
            self._thread.join(timeout=1.0)  # not mid-request while the interpreter shuts down

    def verdict(self, silent: float) -> ServerGone:
        """The error for a server silent this long: the command's own message, except where nothing has
        answered since the watch began and nothing listens there: then no server was started (or a wrong
        --base-url was given), and the line says to start one."""
        cause = self.cause or lost_worker(self.url)
        if cause:
            return ServerGone(self.message(silent, cause))
        never = not self.answered and self.state == "absent"
        return ServerGone(no_server(self.url) if never else self.message(silent))

    def look(self, timeout_s: float) -> bool:
        """Health first; where the API answers, its engine's heartbeat (a frozen engine makes the look fail)."""
        self.state = health(self.url, timeout_s)
        if self.state == "ok":
            self.last_ok, self.answered = time.monotonic(), True
            beat = engine_beat(self.url, timeout_s)
            frozen = frozen_engine(beat, self.timeout_s)
            self.cause = f"has a frozen engine ({frozen})" if frozen else None
            if frozen:
                self.state = "frozen"
        return self.state == "ok"

    def _run(self) -> None:
        while True:  # the first look at once: a command that fails fast must know whether anyone answered
            if not self.look(min(10.0, max(self.timeout_s / 3, 1.0))):
                silent = time.monotonic() - self.last_ok
                if (self.cause or silent >= self.timeout_s) and not self._stop.is_set():
                    self.noticed_after_s = silent
                    self.gone = self.verdict(silent)
                    self._interrupt()
                    return
            if self._stop.wait(self.interval_s):
                return

    def _interrupt(self) -> None:
        signal.pthread_kill(self._main, SIGNAL)  # wakes the main thread out of select/lock waits
        time.sleep(GRACE_S)
        if self.closed:
            return
        # The block was never left: something caught ServerGone or waits where no signal reaches (a thread
        # of the tinker client on the dead server). Leave anyway, with the line.
        print(f"rlcli: error: {self.gone}", file=sys.stderr, flush=True)
        os._exit(EXIT_SERVER_GONE)


@contextlib.contextmanager
def watch(url: str, timeout_s: float | None = DEFAULT_TIMEOUT_S,
          message: Callable[..., str] | None = None) -> Iterator[Watch | None]:
    """Inside the block, a server that stops answering for timeout_s seconds raises ServerGone in the
    main thread. timeout_s None or 0: no watch (the block waits as long as the server does)."""
    if not timeout_s or threading.current_thread() is not threading.main_thread():
        yield None
        return
    w = Watch(url, timeout_s, message or stopped_answering(url))

    def on_signal(signum: int, frame: object) -> None:
        if w.gone is not None:
            raise w.gone

    previous = signal.signal(SIGNAL, on_signal)
    w.start()
    try:
        yield w
    except BaseException as e:
        if w.gone is None and isinstance(e, Exception) and not isinstance(e, UsageError) and not w.look(2.0):
            # A request of the command's own gave up first (its timeout is shorter): the same verdict, now.
            w.gone = w.verdict(time.monotonic() - w.last_ok)
        if w.gone is not None and e is not w.gone:
            raise w.gone from e  # whatever the dead server caused on the way (a failed request): one line
        raise
    finally:
        w.closed = True
        w.stop()
        signal.signal(SIGNAL, previous)
