"""Shared fixtures. Integration tests share ONE real SkyRL server per test session.

The server runs from the shared server venv (RLCLI_SERVER_VENV, else ~/.rlcli/server-venv,
built by `make server-venv`) under a private RLCLI_HOME in a temp folder, on a free port
(rlcli.server.private, the same private server the benchmarks and notebooks start).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import pytest

from rlcli.server.private import PrivateServer, private_server
from rlcli.server.private import free_port as free_port  # tests/integration import it from here
from rlcli.server.process import read_state
from tests import cli_zygote

# pytest keeps each test module's assertion-rewritten bytecode under its __pycache__ unless bytecode writing is off;
# a machine whose environment sets PYTHONDONTWRITEBYTECODE=1 would have every worker rewrite and compile every test
# module again on every run (~2 s of each worker's collection). The test modules are imported after this file. This
# process only: the commands, servers and kernels the tests start keep the environment as it is.
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parent.parent
RLCLI = [sys.executable, "-m", "rlcli.cli"]

# The tests run offline (their machines reach no model hub), so every command they start, fresh or forked from
# the zygote below, imports transformers and datasets with these set, as rlcli sets them itself before it loads
# a local model (rlcli.train.renderers.go_offline). Set once here, an in-process test that goes offline changes
# nothing later commands see.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"


def ctrl_c_works() -> None:
    """preexec_fn for a child the test will Ctrl-C: a shell without job control (a CI script running
    `make test &`) starts its background jobs with SIGINT ignored, and children inherit that. A command
    in a terminal's foreground has it at the default; give the child that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shared_server_venv() -> Path:
    return Path(os.environ.get("RLCLI_SERVER_VENV", Path.home() / ".rlcli" / "server-venv"))


def shared_model_home() -> Path:
    """Where the shipped embedded model is installed once and reused by every test session."""
    return Path(os.environ.get("RLCLI_TEST_MODEL_HOME", Path.home() / ".rlcli"))


def run_rlcli(*args: str, env: dict | None = None, timeout: float = 900, check: bool = False,
              input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m rlcli.cli ARGS` run to its end, as subprocess.run with captured text output. The commands that
    import the training stack run in a child forked from a process that imported it once (tests/cli_zygote.py),
    unless RLCLI_TEST_FRESH_PROCESSES=1 or `env` differs in a variable read at import."""
    env = dict(os.environ if env is None else env)
    zygote = _zygote_for(args, env)
    if zygote is not None:
        proc = zygote.run([*RLCLI, *args], env, str(REPO), input, timeout)
    else:
        proc = subprocess.run([*RLCLI, *args], capture_output=True, text=True, env=env, timeout=timeout,
                              input=input, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"rlcli {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def popen_rlcli(*args: str, env: dict | None = None, stdout: int | None = subprocess.PIPE,
                stderr: int | None = subprocess.PIPE, new_session: bool = False, ctrl_c: bool = False):
    """`python -m rlcli.cli ARGS` started in the background, as subprocess.Popen(text=True, cwd=REPO) with
    start_new_session=new_session and, with ctrl_c, SIGINT at its default (ctrl_c_works). Forked from the zygote
    as run_rlcli's commands are (a tests.cli_zygote.Child: pid, poll, wait, communicate, signals)."""
    env = dict(os.environ if env is None else env)
    zygote = _zygote_for(args, env)
    if zygote is not None:
        return zygote.popen([*RLCLI, *args], env, str(REPO), stdout, stderr, new_session=new_session,
                            sigint_default=ctrl_c)
    return subprocess.Popen([*RLCLI, *args], env=env, cwd=REPO, stdout=stdout, stderr=stderr, text=True,
                            start_new_session=new_session, preexec_fn=ctrl_c_works if ctrl_c else None)


HEAVY_COMMANDS = cli_zygote.HEAVY_COMMANDS
_zygote: list = []  # this process's zygote, once started (or None where it could not be)
_zygote_lock = threading.Lock()


def _zygote_for(args: tuple[str, ...], env: dict[str, str]):
    """The zygote to run `rlcli ARGS` in, or None for a fresh process."""
    if os.environ.get("RLCLI_TEST_FRESH_PROCESSES") == "1" or not args or args[0] not in HEAVY_COMMANDS:
        return None
    with _zygote_lock:
        if not _zygote:
            try:
                _zygote.append(cli_zygote.Zygote(str(REPO)))
            except (OSError, RuntimeError) as e:
                import warnings

                warnings.warn(f"rlcli commands run in fresh processes: {e}", stacklevel=2)
                _zygote.append(None)
            else:
                import atexit

                atexit.register(_zygote[0].close)
    zygote = _zygote[0]
    if zygote is None or not zygote.alive():
        return None
    differ = cli_zygote.differing(env, zygote.env)
    if os.environ.get("RLCLI_TEST_ZYGOTE_LOG"):  # which commands ran where, and why (tests/cli_zygote.py)
        with open(os.environ["RLCLI_TEST_ZYGOTE_LOG"], "a") as log:
            where = "fresh " + ",".join(sorted(differ)) if differ else "fork"
            log.write(f"{os.getpid()} {' '.join(args[:2])}: {where}\n")
    return None if differ else zygote


def _shared_jax_cache() -> Path:
    """The one jax compilation cache of every test session (beside the shared embedded model), made if new."""
    cache = shared_model_home() / "cache" / "jax-tests"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    return cache


def shared_compile_cache(home: Path) -> Path:
    """Give a test server's `home` jax's compilation cache shared by every test session (under the shared model
    home): a warm `make test` loads the programs earlier sessions compiled instead of compiling each new shape
    again (seconds each on 2 cores). jax keys an entry by the program, its jax/XLA versions and the device, so
    sessions of different rlcli trees share it safely. Every test server uses it (two jax processes and Ray
    actors too; parallel workers' servers at once: jax writes an entry in place, and a torn read is a warning
    and a compile, docs/decisions.md), except the test of the cache itself (test_serve.py), whose home keeps a
    cache of its own. Returns `home`."""
    cache = _shared_jax_cache()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "cache").mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "cache" / "jax").symlink_to(cache, target_is_directory=True)
    return home


def shared_jax_cache_env() -> dict[str, str]:
    """jax's settings for a check that runs jax directly in the server venv's Python (the extensions' self-checks,
    the loss checks): the compilation cache every test session's servers share (shared_compile_cache), every
    program kept. A warm `make test` then loads their hundreds of small op-by-op programs instead of compiling
    each (~40 ms apiece on 2 cores)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(_shared_jax_cache()), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def install_embedded_model() -> str:
    env = dict(os.environ, RLCLI_HOME=str(shared_model_home()))
    proc = run_rlcli("model", "install", env=env, check=True, timeout=120)
    return proc.stdout.splitlines()[0].strip()


@pytest.fixture(autouse=True)
def _close_tinker_sessions() -> Iterator[None]:
    """Close the sessions of the tinker clients a test made in this process when the test ends.

    A ServiceClient's session keeps a heartbeat on the client's shared event-loop thread; left open, it
    retries against a server that has stopped, for the rest of the worker's life, drawing its back-off jitter
    from `random` (Hypothesis then warns that the module changed under its strategies in a later unit test).
    Clients made by wider fixtures are made before this fixture and stay open for the tests after. Only once
    tinker is imported (collecting almost any test module imports it): no fixture pays for the import.
    """
    tinker = sys.modules.get("tinker")
    if tinker is None:
        yield
        return
    made: list[Any] = []
    original = tinker.ServiceClient.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    tinker.ServiceClient.__init__ = init
    try:
        yield
    finally:
        tinker.ServiceClient.__init__ = original
        for service in made:
            for name in ("_session_holder", "_rest_holder"):
                holder = service.__dict__.get(name)
                with contextlib.suppress(Exception):  # a client of a server already gone: nothing to keep
                    if holder is not None:
                        holder.close()


@pytest.fixture(scope="session")
def embedded_model() -> str:
    return install_embedded_model()


class Background:
    """A context manager entered in a thread and held open: a server whose ~20 s start runs alongside the tests
    before its first user. `get` waits for what it yields (or raises what it raised, in the test that asked),
    `stop` leaves it. `after`: an event to wait for first (two starts at once on 2 cores take as long as two in
    a row, and slow the tests running meanwhile)."""

    def __init__(self, enter: Callable[[], ContextManager[Any]], after: threading.Event | None = None):
        self.value: Any = None
        self.error: BaseException | None = None
        self.ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(enter, after), daemon=True)
        self._thread.start()

    def _run(self, enter: Callable[[], ContextManager[Any]], after: threading.Event | None) -> None:
        try:
            if after is not None:
                after.wait()
            with enter() as value:
                self.value = value
                self.ready.set()
                self._stop.wait()
        except BaseException as e:  # raised by get(), in the test that asked for it
            self.error = e
        finally:
            self.ready.set()

    def get(self) -> Any:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return self.value

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=300)


def prestart(factory, name: str, *flags: str, timeout: float, after: threading.Event | None = None) -> Background:
    """A session server started in the background as soon as collection shows a test will use it."""
    home = shared_compile_cache(factory.mktemp(name))
    return Background(lambda: private_server(install_embedded_model(), *flags, home=home, venv=shared_server_venv(),
                                             timeout=timeout), after)


# A handful of LoRA slots keeps the engine's memory down: 7 usable (SkyRL's table of 8, slot 0 reserved).
SESSION_SERVERS = {"server": ("rlcli-home", "--slots", "7"),
                   "stock_server": ("rlcli-stock-home", "--no-extensions", "--backend-config",
                                    '{"max_lora_adapters": 3}')}
_prestarted: dict[str, Background] = {}


def xdist_worker() -> bool:
    """Whether this session is one of `make test`'s parallel workers (pytest-xdist). A worker collects every test
    but runs only the files it is handed, so it starts ahead only what nearly every file needs."""
    return "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s --dist loadfile, except that the files using a session server other than the main one
    (the stock server, the fault tests' fault server) go to one worker together: each worker that ran such a file
    started its own (73 and 75 s of setup on the two workers of one 2-core run), while the main server is needed by
    every worker anyway."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneWorkerPerSessionServer(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return session_server_scope(super()._split_scope(nodeid))

    return OneWorkerPerSessionServer(config, log)


# The session-scoped servers a worker starts on first use, for a few files: those files share a worker (above).
# fault_server: tests/faults/conftest.py's, which its tests kill and start again.
ONE_WORKER_SERVERS = (*(name for name in SESSION_SERVERS if name != "server"), "fault_server")


@functools.cache
def session_server_scope(test_file: str) -> str:
    """The scheduling unit of a test file: the file itself, or "uses <fixture>" for a file with a function that
    takes one of the ONE_WORKER_SERVERS as a parameter (the first of them in that order)."""
    import ast

    try:
        tree = ast.parse((REPO / test_file).read_text())
    except (OSError, SyntaxError):
        return test_file
    taken = {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for a in node.args.args}
    return next((f"uses {name}" for name in ONE_WORKER_SERVERS if name in taken), test_file)


def pytest_collection_finish(session) -> None:
    """Start the session servers the selected tests use, in the background (see Background). On a parallel
    worker only the main one: the stock server starts when a file of this worker first asks for it (the cores
    are busy with the other worker's tests; a start nobody uses would only slow them)."""
    if not (shared_server_venv() / "bin" / "python").exists() or session.config.option.collectonly:
        return  # the fixture says what is missing
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    after = None
    for fixture, (home, *flags) in SESSION_SERVERS.items():
        if fixture in used and not (xdist_worker() and fixture != "server"):
            _prestarted[fixture] = prestart(session.config._tmp_path_factory, home, *flags, timeout=900,
                                            after=after)
            after = _prestarted[fixture].ready


def prestarts_done() -> threading.Event | None:
    """Set once the last session server started in the background is up (or failed): a module's own
    background start waits for it (see Background)."""
    return next(reversed(_prestarted.values())).ready if _prestarted else None


def pytest_sessionfinish(session) -> None:
    while _prestarted:
        _prestarted.popitem()[1].stop()


def _session_server(fixture: str, tmp_path_factory) -> Iterator[PrivateServer]:
    venv = shared_server_venv()
    if not (venv / "bin" / "python").exists():
        pytest.fail(f"no server venv at {venv}: run `make server-venv` first (`make test` does)")
    if fixture not in _prestarted:  # a test collected some other way: start it now
        home, *flags = SESSION_SERVERS[fixture]
        _prestarted[fixture] = prestart(tmp_path_factory, home, *flags, timeout=900)
    try:
        yield _prestarted[fixture].get()
    finally:
        _prestarted.pop(fixture).stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[PrivateServer]:
    """A real SkyRL server (jax backend, CPU, embedded model), started once, stopped at the end."""
    yield from _session_server("server", tmp_path_factory)


def server_group(srv: PrivateServer) -> int:
    """The process group of a running server: its supervisor, API and engine (`serve start` records it)."""
    state = read_state(srv.log.parent)
    if state is None:
        raise RuntimeError(f"no server state under {srv.log.parent}")
    return state.pgid


@pytest.fixture(scope="session")
def _stock_server_session(tmp_path_factory) -> Iterator[PrivateServer]:
    for srv in _session_server("stock_server", tmp_path_factory):
        try:
            yield srv
        finally:
            with contextlib.suppress(OSError, ValueError):  # paused by the last test: `serve stop` must be heard
                os.killpg(server_group(srv), signal.SIGCONT)


@pytest.fixture
def stock_server(_stock_server_session):
    """A second real server started with --no-extensions: stock SkyRL behaviour. Yields (url, env).

    Started once per session, and paused (SIGSTOP of its process group) between the tests that use it: stock
    SkyRL looks at its queue on a timer, which cost 6-21% of a core while it idled through the rest of a
    `make test` worker's files, on 2 cores shared with the tests. It is continued before each test that uses it;
    nothing of it is touched while stopped, and the client of each test is its own."""
    group = server_group(_stock_server_session)
    os.killpg(group, signal.SIGCONT)
    try:
        yield _stock_server_session.url, _stock_server_session.env
    finally:
        os.killpg(group, signal.SIGSTOP)
