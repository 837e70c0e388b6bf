"""rlcli's launcher for SkyRL's Tinker API server (runs INSIDE the server venv: standard library and skyrl only).

`rlcli serve start` runs `launcher.py supervise --log FILE --max-log-bytes N -- <SkyRL API flags>` in a new session;
every process of the server shares its process group. Roles: supervise (starts the API, the preload and local jax
workers; copies their output into FILE, rotated at N bytes), api (SkyRL's app with rlcli_api's changes), engine
(started by the API's engine command: rlcli_engine's class, or stock SkyRL's main() when no rlcli change applies),
worker (jax process K: distributed.py), preload (imports the jax engine's modules while the API starts, then runs
the engine the API asks for; the engine role stands in for it). Which changes apply comes from EXTENSIONS_ENV
(shared.py); each role applies them in one place, in the order written there, after manifest.check.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared import DISTRIBUTED_ENV, EXTENSIONS_ENV, PRELOAD_MODULES, RLCLI, TENANTS


def _features() -> set[str]:
    return {name.strip() for name in os.environ.get(EXTENSIONS_ENV, "").split(",") if name.strip()}


def _prepare_jax_imports() -> None:
    """Before a process imports SkyRL's jax backend: keep torch out of it (the import hooks come first)."""
    if RLCLI in _features():
        import rlcli_no_torch

        rlcli_no_torch.prepare()


def run_api(argv: list[str]) -> None:
    features = _features()
    if RLCLI in features:  # before anything imports SkyRL's API, which imports torch at its top
        import rlcli_lazy_torch

        rlcli_lazy_torch.defer()
    import manifest

    manifest.check({manifest.API})
    import rlcli_api
    import uvicorn
    from skyrl.tinker import api
    from skyrl.utils.log import get_uvicorn_log_config

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


PRELOAD_ENV = "RLCLI_ENGINE_PRELOAD"  # the preloaded engine's socket name, set for the API by the supervisor
PRELOAD_PATIENCE_S = 5.0  # how long the engine command waits for the preload's socket to appear


def run_engine(argv: list[str]) -> int:
    address = os.environ.get(PRELOAD_ENV)
    if address:
        code = _attach(address, argv)
        if code is not None:
            return code
        print("[rlcli launcher] no preloaded engine answered; starting the engine here", file=sys.stderr, flush=True)
    _start_engine(argv)
    return 0


def _start_engine(argv: list[str]) -> None:
    import distributed
    import ray_actors

    features, several, on_ray = _features(), distributed.settings_from_engine_argv(argv), ray_actors.on_ray(argv)
    rlcli, jax_backend = RLCLI in features, distributed.backend_of(argv)[0] == "jax"
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


def _attach(address: str, argv: list[str]) -> int | None:
    """Hand argv and this environment to the preloaded engine and stand in for it until it ends.

    None: no preloaded engine took the job (the caller runs the engine itself)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The supervisor starts the preload before the API, but a loaded machine may run the API's engine command
    # before the preload has bound its socket. A preload that died is never there.
    deadline = time.monotonic() + PRELOAD_PATIENCE_S
    try:
        while (refused := conn.connect_ex("\0" + address)) == errno.ECONNREFUSED and time.monotonic() < deadline:
            time.sleep(0.05)
        if refused or not _same_server(conn):
            return None  # none there, or not our preload: it gets neither our flags nor our environment
        conn.sendall(json.dumps({"argv": argv, "env": dict(os.environ)}).encode() + b"\n")
        reply = conn.makefile("rb").readline()  # the engine's pid, once it has its imports and the job
    except OSError:
        return None
    if not reply:
        return None  # it died before taking the job (its imports failed; the log says why)
    pid = json.loads(reply)["pid"]
    stopping = _pass_stops_on(lambda signum: os.kill(pid, signum))
    with contextlib.suppress(OSError):
        while conn.recv(4096):  # the engine never writes again: EOF means it has ended
            pass
    # Not our child, so no exit status: an end nobody asked for is a crash to the API, which then stops.
    return 0 if stopping else 1


def _same_server(conn: socket.socket) -> bool:
    """The other end is a process of this server: same user, same process group (the abstract socket's
    name is visible to every local user in /proc/net/unix)."""
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    try:
        return uid == os.getuid() and os.getpgid(pid) == os.getpgid(0)
    except ProcessLookupError:
        return False


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


def run_preload(address: str, supervisor: int) -> int:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(1)
    import importlib

    _prepare_jax_imports()
    for name in PRELOAD_MODULES:
        importlib.import_module(name)
    listener.settimeout(1.0)
    while True:
        try:
            conn, _ = listener.accept()  # the API's engine command, when the API starts its engine
        except TimeoutError:
            if os.getppid() != supervisor:
                return 1  # the supervisor is gone and nobody will ask for this engine: do not linger
            continue
        conn.settimeout(None)
        if _same_server(conn):
            break
        conn.close()  # anyone else who found the name: it must not choose what this engine runs
    listener.close()
    job = json.loads(conn.makefile("rb").readline())
    os.environ.clear()
    os.environ.update(job["env"])  # e.g. the wake id the API made for its engine
    os.environ.pop(PRELOAD_ENV, None)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    _start_engine(job["argv"])  # conn stays open in this frame: the kernel closes it as this process ends,
    return 0  # which ends the stand-in


class _RotatingLog:
    """Append-only log file that moves itself to FILE.1 when it passes max_bytes."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.file = path.open("ab", buffering=0)
        self.lock = threading.Lock()  # the API's and the preloaded engine's output arrive on two threads

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


def supervise(log: Path, max_log_bytes: int, api_argv: list[str], local_workers: int = 0) -> int:
    import distributed
    import ray_actors

    out = _RotatingLog(log, max_log_bytes)
    env = dict(os.environ)
    pipes = []
    if distributed.backend_of(api_argv)[0] == "jax":  # the others import other modules, in Ray workers
        env[PRELOAD_ENV] = f"rlcli-engine-{secrets.token_hex(8)}"
        pipes.append(_spawn("preload", env[PRELOAD_ENV], str(os.getpid())).stdout)
    workers = _start_workers(api_argv, local_workers)
    if distributed.settings_from_engine_argv(api_argv):  # every process runs rlcli's changes: the API may say so
        env[DISTRIBUTED_ENV] = "launcher"
    elif ray_actors.on_ray(api_argv):  # so does every Ray actor (ray_actors.py)
        env[DISTRIBUTED_ENV] = "ray"
    pipes += [worker.stdout for worker in workers]
    child = _spawn("api", *api_argv, env=env)
    pipes.append(child.stdout)
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


def _start_workers(api_argv: list[str], count: int) -> list[subprocess.Popen]:
    """jax processes 1..count on this machine, for the coordinator named in the API's --backend-config."""
    if not count:
        return []
    import distributed

    coordinator, num_processes = distributed.settings_from_engine_argv(api_argv)
    env = {k: v for k, v in os.environ.items() if k != PRELOAD_ENV}
    return [_spawn("worker", coordinator, str(num_processes), str(i), env=env) for i in range(1, count + 1)]


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

        _prepare_jax_imports()
        distributed.run_worker(rest[0], int(rest[1]), int(rest[2]), _features())
        return 0
    if role == "preload":  # preload ADDRESS SUPERVISOR_PID
        return run_preload(rest[0], int(rest[1]))
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
