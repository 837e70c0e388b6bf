"""rlcli's launcher for SkyRL's Tinker API server (runs INSIDE the server venv: standard library and skyrl only).

`rlcli serve start` runs `launcher.py supervise --log FILE --max-log-bytes N -- <SkyRL API flags>` in a new session;
every process of the server shares its process group. Roles: supervise (starts the API and local jax workers; copies
their output into FILE, rotated at N bytes), api (SkyRL's app with rlcli_api's changes; for the jax backend it first
starts the preload), preload (the API's child: imports the jax engine's modules while the API starts, then runs the
engine with the flags and environment the API writes to its stdin), engine (the API's engine command: rlcli_engine's
class, or stock SkyRL's main() when no rlcli change applies; where the preload took the job, a stand-in for it),
worker (jax process K: distributed.py). Which changes apply comes from EXTENSIONS_ENV (shared.py); each role applies
them in one place, in the order written there, after manifest.check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared import DISTRIBUTED_ENV, EXTENSIONS_ENV, LOCAL_WORKER_ENV, PRELOAD_MODULES, RLCLI, TENANTS, WORKER_HEARTBEAT

PRELOADED_ENV = "RLCLI_PRELOADED_ENGINE"  # the API's engine command stands in for this pid (the preload)


def _features() -> set[str]:
    return {name.strip() for name in os.environ.get(EXTENSIONS_ENV, "").split(",") if name.strip()}


def _prepare_jax_imports() -> None:
    """Before a process imports SkyRL's jax backend: keep torch out of it (the import hooks come first)."""
    if RLCLI in _features():
        import rlcli_no_torch

        rlcli_no_torch.prepare()


def run_api(argv: list[str]) -> None:
    import distributed

    features = _features()
    preload = None
    if distributed.backend_of(argv)[0] == "jax":  # the others import other modules, in Ray workers
        preload = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "preload"], stdin=subprocess.PIPE)
    if RLCLI in features:  # before anything imports SkyRL's API, which imports torch at its top
        import rlcli_lazy_torch

        rlcli_lazy_torch.defer()
    import manifest

    manifest.check({manifest.API})
    import rlcli_api
    import uvicorn
    from skyrl.tinker import api
    from skyrl.utils.log import get_uvicorn_log_config

    api._build_uv_run_cmd_engine = _engine_command(preload)
    rlcli_api.install(api, features)
    api.app.state.engine_config, args = _engine_config(argv, api=True)
    uvicorn.run(
        api.app,
        host=args["host"],
        port=args["port"],
        log_config=get_uvicorn_log_config(),
        backlog=getattr(api, "SKYRL_HTTP_CONNECTION_LIMIT", 2048),
        timeout_keep_alive=getattr(api, "HTTP_KEEP_ALIVE_TIMEOUT_SECONDS", 30),
    )


def _engine_command(preload: subprocess.Popen | None):
    """SkyRL's API rebuilds `uv run ...` from its parent's command line, which fails outside a uv project
    (docs/upstream/engine-command.md): its engine runs through this venv's Python and this launcher. A preload still
    running gets the engine's flags and the API's environment (the wake id made for the engine) on its stdin, and the
    command stands in for it."""
    from skyrl.tinker.config import config_to_argv

    def build(_parent_cmd, config) -> list[str]:
        argv = config_to_argv(config)
        if preload is not None and preload.poll() is None:
            with contextlib.suppress(OSError):  # it ended meanwhile: the command runs the engine itself
                preload.stdin.write(json.dumps({"argv": argv, "env": dict(os.environ)}).encode() + b"\n")
                preload.stdin.close()
                os.environ[PRELOADED_ENV] = str(preload.pid)
        return [sys.executable, str(Path(__file__).resolve()), "engine", *argv]

    return build


def run_engine(argv: list[str]) -> int:
    pid = os.environ.get(PRELOADED_ENV)
    if not pid:
        _start_engine(argv)
        return 0
    # The preload (the API's child) runs the engine with these flags: stand in for it, for the API, until it ends.
    ended = os.pidfd_open(int(pid))
    stopping = _pass_stops_on(lambda signum: os.kill(int(pid), signum))
    select.select([ended], [], [])
    # Not our child, so no exit status: an end nobody asked for is a crash to the API, which then stops.
    return 0 if stopping else 1


def _start_engine(argv: list[str]) -> None:
    import distributed
    import ray_actors

    features, several, on_ray = _features(), distributed.settings_from_engine_argv(argv), ray_actors.on_ray(argv)
    rlcli, jax_backend = RLCLI in features, distributed.backend_of(argv)[0] == "jax"
    if rlcli:  # first: a start that freezes is seen too
        import rlcli_liveness

        rlcli_liveness.start(Path.cwd())
    if jax_backend:
        _prepare_jax_imports()
    if several:  # jax's runtime before anything computes
        distributed.initialize(*several, process_id=0)
    if on_ray and rlcli:  # the actors must run rlcli's changes: the driver joins Ray first
        ray_actors.connect()
    if not (features or several):  # stock SkyRL, as SkyRL starts its engine
        from skyrl.tinker import engine

        sys.argv = ["skyrl.tinker.engine", *argv]
        return engine.main()
    import manifest
    import rlcli_engine

    manifest.check({manifest.ENGINE} | ({manifest.JAX} if jax_backend else set())
                   | ({manifest.RAY} if on_ray and rlcli else set()))
    config = _engine_config(argv)[0]
    if rlcli:
        import rlcli_samplers
        import rlcli_wake

        rlcli_samplers.keep_count(), rlcli_samplers.cache_size()  # a bad setting stops the start, not a save
        rlcli_wake.relax_sqlite_sync()
        rlcli_wake.plain_log()
    if jax_backend and (rlcli or several):
        rlcli_engine.use_rlcli_backends(rlcli)
    if jax_backend and rlcli and not on_ray:  # on Ray the engine only proxies: the actors compute
        import rlcli_backend

        rlcli_backend.prepare(rlcli, config.backend_config)
    if several:
        distributed.agree(0, several[1], distributed.identity(features))
    rlcli_engine.engine_class(rlcli, TENANTS in features)(config).run()


def _engine_config(argv: list[str], api: bool = False):
    """The EngineConfig from SkyRL's flags, as its engine's and API's main() parse them; and every flag's value (the
    API's host and port too)."""
    from skyrl.tinker.config import EngineConfig, add_model

    parser = argparse.ArgumentParser(prog=f"rlcli-skyrl-{'api' if api else 'engine'}")
    add_model(parser, EngineConfig)
    if api:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
    flags = vars(parser.parse_args(argv))
    return EngineConfig.model_validate({k: v for k, v in flags.items() if k in EngineConfig.model_fields}), flags


def _pass_stops_on(send) -> list[int]:
    """SIGTERM and SIGINT passed on through send(signum) (a process already gone aside); the list of those that
    came, for the caller to tell a stop it was asked for from a crash."""
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            send(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return stopping


def run_preload() -> int:
    """The jax engine's imports, while the API starts; then the engine, with the flags and environment (the wake id
    the API made for it) that the API writes to stdin as it starts its engine. EOF: the API is gone."""
    import importlib

    _prepare_jax_imports()
    for name in PRELOAD_MODULES:
        importlib.import_module(name)
    job = sys.stdin.buffer.readline()
    if not job:
        return 1
    job = json.loads(job)
    os.environ.clear()
    os.environ.update(job["env"])
    _start_engine(job["argv"])
    return 0


class _RotatingLog:
    """Append-only log file that moves itself to FILE.1 when it passes max_bytes."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.file = path.open("ab", buffering=0)
        self.lock = threading.Lock()  # the API's and the workers' output arrive on several threads

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.file.tell() + len(data) > self.max_bytes:
                self.file.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self.file = self.path.open("ab", buffering=0)
            self.file.write(data)


def _spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    """This launcher in another role, its output (both streams) to a pipe the supervisor copies into the log."""
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _spawn_workers(several: tuple[str, int], local_workers: int) -> list[subprocess.Popen]:
    """The local jax workers 1..local_workers, in this folder; with rlcli's changes each beats (rlcli_liveness),
    an earlier server's heartbeat files cleared first."""
    if not local_workers:
        return []
    env = dict(os.environ)
    if RLCLI in _features():
        import rlcli_liveness

        rlcli_liveness.forget(Path.cwd(), WORKER_HEARTBEAT.format("*"))
        env[LOCAL_WORKER_ENV] = "1"
    return [_spawn("worker", several[0], str(several[1]), str(i), env=env) for i in range(1, local_workers + 1)]


def supervise(log: Path, max_log_bytes: int, api_argv: list[str], local_workers: int = 0) -> int:
    import distributed
    import ray_actors

    out = _RotatingLog(log, max_log_bytes)
    env = dict(os.environ)
    several = distributed.settings_from_engine_argv(api_argv)  # (coordinator, number of jax processes)
    workers = _spawn_workers(several, local_workers)
    if several:  # every process runs rlcli's changes: the API may say so
        env[DISTRIBUTED_ENV] = "launcher"
    elif ray_actors.on_ray(api_argv):  # so does every Ray actor (ray_actors.py)
        env[DISTRIBUTED_ENV] = "ray"
    child = _spawn("api", *api_argv, env=env)
    pipes = [child.stdout] + [worker.stdout for worker in workers]
    stopping = _pass_stops_on(child.send_signal)  # a polite stop goes to the API, which stops its engine itself

    def pump(pipe) -> None:
        # read1 returns whatever is there, so lines reach the log as they are printed.
        while chunk := pipe.read1(65536):
            out.write(chunk)

    def watch(process_id: int, worker: subprocess.Popen) -> None:
        # The engine cannot serve without every process of its device mesh: a lost worker stops the server.
        code = worker.wait()
        if not stopping:
            out.write(f"[rlcli launcher] jax worker process {process_id} exited with code {code}; "
                      "the server cannot run without it: stopping\n".encode())
            child.send_signal(signal.SIGTERM)

    threads = [threading.Thread(target=pump, args=(pipe,), daemon=True) for pipe in pipes]
    threads += [threading.Thread(target=watch, args=(i + 1, w), daemon=True) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    code = child.wait()
    stopping.append(0)
    # The API is gone (stopped, crashed or killed with -9). Its engine would live on as an orphan
    # holding the database and the CPU/GPU: end everything else in this process group.
    _end_group_except_self()
    for thread in threads:
        thread.join(timeout=5)
    out.write(f"[rlcli launcher] SkyRL API exited with code {code}; server stopped\n".encode())
    return code


def _end_group_except_self() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pgid = os.getpgid(0)
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        others = _group_others(pgid)
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_others(pgid):
            time.sleep(0.1)


def _group_others(pgid: int) -> list[int]:
    """Live processes of this process group other than this one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def main() -> int:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    rest = sys.argv[2:]
    if role == "api":
        run_api(rest)
        return 0
    if role == "engine":
        return run_engine(rest)
    if role == "worker":  # worker COORDINATOR NUM_PROCESSES PROCESS_ID
        import distributed

        if os.environ.get(LOCAL_WORKER_ENV):  # one the supervisor started: it beats in the server's folder
            import rlcli_liveness

            rlcli_liveness.start(Path.cwd(), WORKER_HEARTBEAT.format(int(rest[2])))
        _prepare_jax_imports()
        distributed.run_worker(rest[0], int(rest[1]), int(rest[2]), _features())
        return 0
    if role == "preload":
        return run_preload()
    if role == "supervise":
        parser = argparse.ArgumentParser(prog="rlcli-launcher supervise")
        parser.add_argument("--log", type=Path, required=True)
        parser.add_argument("--max-log-bytes", type=int, default=20 * 2**20)
        parser.add_argument("--local-workers", type=int, default=0)
        split = rest.index("--") if "--" in rest else len(rest)
        args = parser.parse_args(rest[:split])
        return supervise(args.log, args.max_log_bytes, rest[split + 1:], args.local_workers)
    print("usage: launcher.py supervise|api|engine|worker|preload ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
