"""A process that imports what every `rlcli` command imports once, then forks one child per command the tests run.

Each `rlcli train|loop|eval|...` a test starts as a fresh `python -m rlcli.cli` spends ~4.5 s of CPU on 2 cores
importing torch, transformers, datasets, tinker and the cookbook before its first request; `make test` runs
~100 of them. A child forked from this process starts with those modules loaded and runs the same function
(`rlcli.cli.main`) with the test's arguments, environment, working folder and stdin, stdout and stderr, and exits
the way that command's own process would (atexit, thread joins, its exit status). `run_rlcli` in tests/conftest.py
uses it unless RLCLI_TEST_FRESH_PROCESSES=1, and falls back to a fresh process for any call whose environment
differs from this process's in a variable a module reads while it is imported (only RLCLI_* settings and the
tinker client's key and URL may differ).

Protocol (one connection per command, on a Unix socket in a private folder): the test sends one JSON line
{"argv", "env", "cwd"} with the child's stdin, stdout and stderr descriptors attached (SCM_RIGHTS); this process
answers {"pid": N} once the child runs (the child sends it, once in its session) and {"status": S}
(os.waitstatus_to_exitcode) once it has exited; a child that dies before it could send its pid sends only the status.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import threading

CLI_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rlcli", "cli.py")

# What a `train`, `eval`, `loop` or `distill` process imports before its first request (lean_imports comes with
# rlcli). No module here starts a thread or reads a file at import that a command would read differently.
PRELOAD = (
    "rlcli.cli", "rlcli.client", "rlcli.train.sl", "rlcli.train.rl", "rlcli.train.sl_data", "rlcli.problems.envs",
    "rlcli.evaluate", "tinker", "tinker_cookbook.renderers", "tinker_cookbook.supervised.data",
    "tinker_cookbook.supervised.train", "tinker_cookbook.rl.train", "transformers.models.auto.tokenization_auto",
    "datasets", "torch",
)


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def serve(path: str) -> tuple[dict, socket.socket] | None:
    """Answer commands until the parent goes away. Returns only in a forked child: its request and connection."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        for _ready in sel.select(timeout=0.02):
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not msg.endswith(b"\n") and (more := conn.recv(1 << 20)):
                msg += more
            request = json.loads(msg)
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return request, conn
            for fd in fds:
                os.close(fd)
            running[pid] = conn
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    return None


def become(request: dict) -> None:
    """Turn this forked child into the command's own process: its environment, folder, argv, session and SIGINT."""
    if request.get("new_session"):  # Popen(start_new_session=True)
        os.setsid()
    if request.get("sigint_default"):  # started with SIGINT at its default, a fresh Python makes it KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [CLI_FILE, *request["args"]]
    tempfile.tempdir = None  # chosen again from this environment's TMPDIR on first use, as in a fresh process
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS; so does this one
        sys.modules["numpy"].random.seed()
    # A child that dies of a fatal signal (SIGSEGV, SIGABRT: native code, often at exit) leaves the Python
    # stacks of its threads on its stderr, where the test's failure message shows them.
    faulthandler.enable(file=sys.stderr, all_threads=True)


def main() -> None:
    preload()
    assert threading.active_count() == 1
    # The preloaded objects move to the collector's permanent generation: a child's collections (and its exit)
    # then neither walk nor write them, so their pages stay shared instead of being copied into every child.
    gc.freeze()
    forked = serve(sys.argv[1])
    if forked is None:
        return
    request, conn = forked
    become(request)
    # The pid goes out once the child is in its session with its SIGINT set, as Popen returns after exec.
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    conn.close()
    from rlcli.cli import entry

    entry()


if __name__ == "__main__":
    main()


# --- the test's side -------------------------------------------------------------------------------------------

# The commands whose own process would spend seconds importing torch, transformers, datasets and the cookbook.
HEAVY_COMMANDS = frozenset({"train", "loop", "eval", "sample", "chat", "export", "harbor", "synth", "demo"})

# Read by a command at run time, not while a module is imported: these may differ from the zygote's environment.
# TMPDIR: tempfile's choice is reset in the child. TORCHINDUCTOR_CACHE_DIR: torch reads it (and sets its default
# into os.environ) when inductor first runs, which an in-process test may do after the zygote started. DOCKER_HOST:
# rlcli.harbor.daemon reads it when a harbor command talks to Docker (the fault tests' private daemon), and no module
# of PRELOAD imports a Docker client.
CALL_TIME_VARS = ("TINKER_API_KEY", "TINKER_BASE_URL", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "DOCKER_HOST")
IMPORT_TIME_RLCLI_VARS: tuple[str, ...] = ()  # RLCLI_ variables an import reads: none since RLCLI_STOCK_IMPORTS went


def differing(env: dict[str, str], base: dict[str, str]) -> set[str]:
    """The variables a command with environment `env` would see differently in a child of a zygote started with
    `base` than in a fresh process: those that differ and may be read while a module is imported. pytest's own
    (PYTEST_CURRENT_TEST changes with every test) are read by no command."""
    differ = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return {k for k in differ if not ((k.startswith("RLCLI_") and k not in IMPORT_TIME_RLCLI_VARS)
                                      or k in CALL_TIME_VARS or k.startswith("PYTEST_"))}


def forkable(env: dict[str, str], base: dict[str, str]) -> bool:
    return not differing(env, base)


class Zygote:
    """The test process's handle on one zygote: started with this process's environment, working folder `cwd`."""

    def __init__(self, cwd: str):
        import subprocess

        self.folder = tempfile.mkdtemp(prefix="rlcli-zygote-")  # mode 0700: nobody else reaches the socket
        self.socket = os.path.join(self.folder, "socket")
        self.env = dict(os.environ)
        self.log = open(os.path.join(self.folder, "log"), "w+b")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.cli_zygote", self.socket], cwd=cwd,
                                     env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.log)
        line = self.proc.stdout.readline().decode().split()
        if line[:1] != ["ready"]:
            self.close()
            raise RuntimeError(f"the rlcli zygote did not start: {self.tail()}")
        if self.tail() != "no output":  # a fresh process would have printed it to the command's stderr
            self.close()
            raise RuntimeError("importing the commands' modules printed output: " + self.tail())

    @classmethod
    def attach(cls, socket_path: str, env: dict[str, str]) -> Zygote:
        """A handle on a zygote that another process started and owns (a notebook kernel's handle on its test's
        zygote, tests/notebook_kernel.py): it submits commands; closing the zygote stays with its owner."""
        self = cls.__new__(cls)
        self.folder, self.socket, self.env, self.log, self.proc = None, socket_path, dict(env), None, None
        return self

    def tail(self) -> str:
        self.log.seek(0)
        return (self.log.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]

    def alive(self) -> bool:
        return os.path.exists(self.socket) if self.proc is None else self.proc.poll() is None

    def submit(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int], **options: bool) -> socket.socket:
        """Hand the zygote one command with its stdin, stdout and stderr (closed here once sent); the connection
        on which the child's pid and then its exit status come."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket)
            request = {"args": argv[argv.index("rlcli.cli") + 1:], "env": env, "cwd": cwd, **options}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
        except OSError:
            conn.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return conn

    def popen(self, argv: list[str], env: dict[str, str], cwd: str, stdout: int | None, stderr: int | None,
              new_session: bool = False, sigint_default: bool = False) -> Child:
        """subprocess.Popen(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=True,
        start_new_session=new_session), the command run in a forked child; sigint_default as a preexec_fn that
        sets SIGINT to its default would."""
        return Child(self, argv, env, cwd, stdout, stderr, new_session=new_session, sigint_default=sigint_default)

    def run(self, argv: list[str], env: dict[str, str], cwd: str, input: str | None, timeout: float):
        """subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, input=input, timeout=timeout),
        with the command run in a forked child. argv[0] is what the child sees as sys.argv[0]."""
        import locale
        import subprocess

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if input is not None else (os.dup(0), None)
        conn = self.submit(argv, env, cwd, [in_r, out_w, err_w])
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}

        def drain(fd: int) -> None:
            while data := os.read(fd, 1 << 16):
                chunks[fd].append(data)
            os.close(fd)

        def feed() -> None:
            with open(in_w, "wb") as f:
                try:
                    f.write(input.encode(locale.getpreferredencoding(False)))
                except BrokenPipeError:
                    pass

        workers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, err_r)]
        if in_w is not None:
            workers.append(threading.Thread(target=feed, daemon=True))
        for w in workers:
            w.start()
        lines = _Lines(conn)
        first = lines.next(None)
        pid = json.loads(first).get("pid") if first else None
        timed_out = False
        if pid is None:  # the child died before it sent its pid (or the zygote did)
            line = first
        else:
            try:
                line = lines.next(timeout)
            except TimeoutError:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                line = lines.next(None)
        status = json.loads(line)["status"] if line else -signal.SIGKILL
        conn.close()
        for w in workers:
            w.join()
        encoding = locale.getpreferredencoding(False)

        def text(fd: int) -> str:
            return b"".join(chunks[fd]).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, output=text(out_r), stderr=text(err_r))
        return subprocess.CompletedProcess(argv, status, text(out_r), text(err_r))

    def close(self) -> None:
        import shutil

        if self.proc is None:  # attached, not owned
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Child:
    """What the tests use of subprocess.Popen (pid, poll, wait, communicate, send_signal, kill, terminate,
    returncode, text stdout and stderr) for a command running in a zygote child. The zygote, its parent,
    reaps it and sends its exit status, which a thread here waits for."""

    def __init__(self, zygote: Zygote, argv: list[str], env: dict[str, str], cwd: str, stdout: int | None,
                 stderr: int | None, **options: bool):
        import locale
        import subprocess

        self.args, self.returncode = argv, None
        self._encoding = locale.getpreferredencoding(False)
        out = self._end(stdout, 1, subprocess)
        ends = [out, self._end(stderr, 2, subprocess, stdout_fd=out[1])]
        try:
            conn = zygote.submit(argv, env, cwd, [os.dup(0), ends[0][1], ends[1][1]], **options)
        except OSError:
            for r, _ in ends:
                if r is not None:
                    os.close(r)
            raise
        self.stdout, self.stderr = (None if r is None else open(r, encoding=self._encoding) for r, _ in ends)
        self._conn, self._lines = conn, _Lines(conn)
        first = self._lines.next(None)
        self.pid = json.loads(first).get("pid", 0) if first else 0  # 0: it died before it could say
        self._done = threading.Event()
        self._read: dict[str, tuple[threading.Thread, list[str]]] | None = None
        threading.Thread(target=self._await_status, args=(None if self.pid else first,), daemon=True).start()

    @staticmethod
    def _end(spec: int | None, default_fd: int, subprocess, stdout_fd: int | None = None) -> tuple[int | None, int]:
        """(the end this process reads or None, the descriptor the child gets). stdout_fd: the child's stdout, which
        stderr=STDOUT shares."""
        if spec == subprocess.PIPE:
            return os.pipe()
        if spec == subprocess.DEVNULL:
            return None, os.open(os.devnull, os.O_WRONLY)
        if spec is None:
            return None, os.dup(default_fd)
        if spec == subprocess.STDOUT and stdout_fd is not None:
            return None, os.dup(stdout_fd)
        if spec >= 0:  # a descriptor of this process (an open log file's fileno())
            return None, os.dup(spec)
        raise ValueError(f"stdout/stderr {spec!r}: PIPE, DEVNULL, STDOUT (stderr), a descriptor or None")

    def _await_status(self, line: bytes | None) -> None:
        import signal as signals

        line = self._lines.next(None) if line is None else line
        self._conn.close()
        self.returncode = json.loads(line)["status"] if line else -signals.SIGKILL  # the zygote itself died
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pid:  # not reaped yet, so the pid is still this child's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: None = None, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Both outputs read to their end and the exit waited for; after TimeoutExpired, call again to go on."""
        import subprocess
        import time

        if input is not None:
            raise ValueError("a zygote child reads the test's own stdin")
        if self._read is None:  # one reader per pipe, kept across calls
            self._read = {}
            for name, f in (("stdout", self.stdout), ("stderr", self.stderr)):
                if f is not None:
                    into: list[str] = []
                    reader = threading.Thread(target=lambda f=f, into=into: into.append(f.read()), daemon=True)
                    reader.start()
                    self._read[name] = (reader, into)
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        for reader, _ in self._read.values():
            reader.join(left())
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(left())
        outs = {name: into[0] for name, (_, into) in self._read.items()}  # text mode: newlines already translated
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return outs.get("stdout"), outs.get("stderr")


class _Lines:
    """JSON lines from the zygote, each read within a time limit."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer = conn, b""

    def next(self, timeout: float | None) -> bytes:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            try:
                data = self.conn.recv(4096)
            except TimeoutError:
                continue
            if not data:
                return b""
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line
