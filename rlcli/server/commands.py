"""`rlcli serve start|stop|status|logs|restart`: SkyRL's Tinker server, managed.

Launch:  rlcli serve start [--base-model M] [--backend jax|fsdp|megatron] [--port 8000]
         python scripts/serve.py start ...   (the same commands, the same flags)
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlcli import config
from rlcli.errors import RlcliError, UsageError
from rlcli.options import Opt, Record, option, subset
from rlcli.server import backend_config as hw
from rlcli.server import process, scaling, server_venv
from rlcli.server.runtime import shared
from rlcli.server.server_venv import Backend

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
LAUNCHER = RUNTIME_DIR / "launcher.py"
MAX_LOG_BYTES = 20 * 2**20
FROZEN_AFTER_S = 10.0  # `serve status`: ten missed heartbeats (the engine beats every second) is not a busy engine
SERVER_EXTENSIONS = shared.RLCLI  # every change rlcli makes to SkyRL (runtime/manifest.py lists them)
SNAPSHOTS_ENV, SAMPLER_CACHE_ENV = shared.SNAPSHOTS_ENV, shared.SAMPLER_CACHE_ENV
FUTURES_ENV = shared.FUTURES_RETENTION_ENV
PROGRAM_MEMORY_ENV = shared.PROGRAM_MEMORY_ENV


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resolve_model(base_model: str | None) -> str:
    if base_model is None:
        from rlcli.model import ensure_embedded_model

        return str(ensure_embedded_model())
    looks_local = base_model.startswith((".", "/", "~")) or os.sep in base_model and Path(base_model).exists()
    if looks_local:
        path = Path(base_model).expanduser().resolve()
        if not (path / "config.json").exists():
            raise UsageError(
                f"--base-model {base_model}: no model folder there (expected a Hugging Face folder with "
                "config.json); give a local folder or a hub id such as Qwen/Qwen3-4B-Instruct-2507"
            )
        return str(path)
    return base_model


def skyrl_api_args(*, base_model: str, backend: str, host: str, port: int, backend_cfg: dict,
                   state_dir: Path, checkpoints_base: str | None, database_url: str | None = None) -> list[str]:
    """SkyRL API flags with every dangerous default replaced (docs/decisions.md: megatron, 0.0.0.0, /tmp)."""
    paths = process.layout(state_dir)
    args = [
        "--base-model", base_model,
        "--backend", backend,
        "--host", host,
        "--port", str(port),
        "--database-url", database_url or f"sqlite:///{paths['database']}",
        "--checkpoints-base", checkpoints_base or str(paths["checkpoints"]),
        "--external-inference-lora-base", str(paths["lora"]),
    ]
    if backend_cfg:
        import json

        args += ["--backend-config", json.dumps(backend_cfg)]
    return args


BACKEND = Opt("jax (runs anywhere), fsdp or megatron (Linux + CUDA, on Ray)")
PYTHON = Opt("a Python 3.12 interpreter to build the server venv with")
VENV = Opt("the server venv folder (default: RLCLI_SERVER_VENV or RLCLI_HOME/server-venv); built if missing")
EXTENSIONS = Opt("load rlcli's server extensions (fused gspo on jax, clean LoRA slots, no polling waits, LoRA cost "
                 "per adapter used); --no-extensions: stock SkyRL (a worker's must match its server's)")
PROCESSES = Opt("jax processes (JAX's distributed runtime, model and batch sharded over all: fsdp); the engine is "
                "process 0, the others are workers in this server's process group", low=1)
COORDINATOR = Opt("HOST:PORT of the jax coordination service (default: a free loopback port); a non-loopback one "
                  "needs --insecure")


@dataclass(frozen=True, kw_only=True)
class StartOptions(Record):
    """`rlcli serve start`'s options: what a restart starts again with."""

    base_model: str | None = option(None, "Hugging Face id or local model folder; default: rlcli's embedded tiny "
                                          "model")
    backend: Backend = BACKEND("jax")
    host: str = process.HOST(config.DEFAULT_HOST)
    port: int = process.PORT(config.DEFAULT_PORT)
    gpus: int | None = option(None, "GPUs per node (fsdp/megatron placement; jax: devices used)", low=1)
    nodes: int = option(1, "nodes for fsdp/megatron; more than one runs on an existing Ray cluster (--ray-address)",
                        low=1)
    tp: int = option(1, "tensor-parallel size", low=1)
    backend_config: str | None = option(None, "JSON object of SkyRL backend config keys; wins over "
                                              "--gpus/--nodes/--tp")
    checkpoints_base: str | None = option(None, "where checkpoints go (default: the server's state folder)")
    wait: float = process.WAIT(600.0)
    python: str | None = PYTHON(None)
    venv: str | None = VENV(None)
    ray_address: str | None = option(None, "address of an existing Ray cluster (fsdp/megatron several nodes; jax "
                                           "with --processes N: every jax process a Ray actor)")
    name: str = process.NAME("default")
    extensions: bool = EXTENSIONS(True)
    slots: int | None = option(None, "LoRA models the jax server holds at once (default 4; each costs memory, and "
                                     "on stock SkyRL step time too); a full server refuses a new model naming this "
                                     "flag", low=1)
    tenants: bool = option(False, "check API keys (`rlcli tenant add`) and keep each tenant's models, futures and "
                                  "checkpoints its own; needed, or --insecure, for a --host other than loopback")
    insecure: bool = process.INSECURE(False)
    database_url: str | None = option(None, "SkyRL's database, e.g. postgresql://USER:PASSWORD@HOST:5432/DB "
                                            "(default: RLCLI_DATABASE_URL, else sqlite in the server's folder); the "
                                            "password goes to the server as PGPASSWORD, never argv")
    processes: int = PROCESSES(1)
    local_processes: int | None = option(None, "how many of them run on this machine (default all); the rest join "
                                               "with `rlcli serve worker`", low=1)
    coordinator: str | None = COORDINATOR(None)
    sampler_snapshots: int | None = option(None, "unnamed sampler snapshots (the RL loops' per-step "
                                                 "save_weights_and_get_sampling_client) the jax server keeps per "
                                                 "model; older ones are deleted (default: RLCLI_SAMPLER_SNAPSHOTS, "
                                                 "else 4)", low=1)
    futures_retention: int | None = option(None, "minutes a finished request's futures row is kept in SkyRL's "
                                                 "database (a tinker client reads its result within seconds); older "
                                                 "rows are deleted once a minute, 0 keeps every row (default: "
                                                 "RLCLI_FUTURES_RETENTION, else 60)", low=0)
    program_memory: int | None = option(None, "MB the jax engine's compiled programs may add to its memory (one per "
                                              "batch shape, kept in memory); past it they are dropped and each in "
                                              "use is loaded again from the disk cache, at most every ten minutes; 0 "
                                              "keeps them all (default: RLCLI_PROGRAM_MEMORY, else 2048)", low=0)

    def problems(self) -> Iterator[str]:
        if self.processes > 1 and (self.local_processes or 1) > self.processes:
            yield (f"--local-processes {self.local_processes} must be 1..{self.processes} (this machine runs "
                   "process 0)")


@dataclass(frozen=True, kw_only=True)
class Named(Record):
    name: str = process.NAME("default")


@dataclass(frozen=True, kw_only=True)
class LogsOptions(Named):
    follow: bool = option(False, "keep printing new lines until Ctrl-C", short="-f")
    lines: int = option(50, "how many of the last lines to print first", low=0, short="-n")


RestartOptions = subset(StartOptions, "wait", "name", name="RestartOptions")


@dataclass(frozen=True, kw_only=True)
class InstallOptions(Record):
    backend: Backend = BACKEND("jax")
    python: str | None = PYTHON(None)
    venv: str | None = VENV(None)
    ray: bool = option(False, "add Ray (server-ray.lock) for the jax backend on a Ray cluster; never installed "
                              "unless asked")


@dataclass(frozen=True, kw_only=True)
class WorkerOptions(Record):
    coordinator: str | None = COORDINATOR(None)
    processes: int = PROCESSES(1)
    process_id: int = option(0, "this process's number, 1..processes-1, each once", low=0)
    venv: str | None = VENV(None)
    python: str | None = PYTHON(None)
    extensions: bool = EXTENSIONS(True)

    def problems(self) -> Iterator[str]:
        if not self.coordinator or self.processes < 2:
            yield "give --coordinator HOST:PORT and --processes N (N > 1) as the server was started with"
        elif not 1 <= self.process_id < self.processes:
            yield f"--process-id {self.process_id} must be 1..{self.processes - 1} (0 is the server's engine)"


def start(o: StartOptions) -> int:
    """Start SkyRL's Tinker API server and wait until its engine serves requests."""
    if o.backend != "jax" and not hw.has_cuda():
        raise UsageError(f"the {o.backend} backend needs NVIDIA GPUs with CUDA and none was found; "
                         "use --backend jax on this machine")
    if o.nodes > 1 and o.backend != "jax" and not (o.ray_address or os.environ.get("RAY_ADDRESS")):
        raise UsageError(f"--nodes {o.nodes} runs on an existing Ray cluster: start one (`ray start --head` on "
                         "the first node, `ray start --address ...` on the others) and pass --ray-address")
    backend_cfg = hw.map_hardware(o.backend, o.gpus, o.nodes, o.tp)
    backend_cfg.update(hw.parse_backend_config(o.backend_config))
    slots = hw.slot_config(o.backend, o.slots, backend_cfg)
    snapshots_env = (_snapshots_env(o.sampler_snapshots) | _futures_env(o.futures_retention)
                     | _program_memory_env(o.program_memory))
    local_workers = scaling.processes_config(o.backend, o.processes, o.local_processes, o.coordinator, o.gpus, o.tp,
                                             o.insecure, backend_cfg, o.ray_address or os.environ.get("RAY_ADDRESS"),
                                             o.extensions)
    state_dir = config.private_dir(config.server_state_dir(o.name))
    old = process.read_state(state_dir)
    if old and process.live_members(old):
        raise UsageError(f"server {o.name!r} is already running or starting at {old.url} "
                         "(`rlcli serve status`; `rlcli serve stop` first)")
    process.check_port_free(o.host, o.port)
    model = _resolve_model(o.base_model)
    from rlcli import tenants as tenancy

    tenancy.check_exposure(o.host, o.tenants, o.insecure, _is_loopback(o.host))
    tenant_env, internal_key = tenancy.server_env() if o.tenants else ({}, None)
    from rlcli.server import database

    o = replace(o, database_url=database.keep_password(o.database_url, state_dir))  # recorded without it
    db_url, db_env = database.resolve(o.database_url, state_dir)
    tenant_env = {**tenant_env, **db_env, **snapshots_env}
    if not _is_loopback(o.host) and not o.tenants:
        print(f"rlcli: warning: binding {o.host}: SkyRL checks no credentials, so anyone who can reach "
              f"this port can train on and download from the server", file=sys.stderr)
    if o.backend == "jax":
        if warning := hw.map_count_warning(hw.read_map_count()):
            print(f"rlcli: warning: {warning}", file=sys.stderr)
    venv_dir = server_venv.ensure_server_venv(o.backend, o.python, o.venv)
    if backend_cfg.get("use_ray") and o.backend == "jax" and not server_venv.has_extra(venv_dir, "ray"):
        raise UsageError(f"the jax backend on Ray needs Ray in the server venv {venv_dir}: "
                         "`rlcli serve install --ray` adds it (server-ray.lock)")
    lock_fd = process.acquire_lock(state_dir)
    try:
        state = _spawn(venv_dir, state_dir, lock_fd, model, o.backend, o.host, o.port, backend_cfg,
                       o.checkpoints_base, o.ray_address, o.extensions, tenant_env, db_url, local_workers)
    finally:
        os.close(lock_fd)  # the launcher holds its own copy for as long as it lives
    state.settings = {k: v for k, v in asdict(o).items() if k not in RestartOptions.__dataclass_fields__} | {
        "base_model": model, "slots": slots}
    process.write_state(state_dir, state)
    sized = f", {slots} LoRA slots" if slots else ""
    sized += f", {o.processes} jax processes" if o.processes > 1 else ""
    print(f"rlcli: server {o.name!r} starting at {state.url} (backend {o.backend}{sized}, model {model}); "
          f"log: {process.layout(state_dir)['log']}", file=sys.stderr)
    if internal_key:
        os.environ["TINKER_API_KEY"] = internal_key  # this start's own key, for the readiness round trip
    if o.wait > 0:
        try:
            process.wait_ready(state, process.layout(state_dir)["log"], o.wait)
        except BaseException:
            process.stop_group(state)
            raise
        state.ready = True
        process.write_state(state_dir, state)
    print(state.url)
    return 0


def _snapshots_env(sampler_snapshots: int | None) -> dict[str, str]:
    """runtime/rlcli_samplers.py reads how many unnamed sampler snapshots to keep from RLCLI_SAMPLER_SNAPSHOTS
    (and how many sampled checkpoints' weights to keep in memory from RLCLI_SAMPLER_CACHE)."""
    value = str(os.environ.get(SNAPSHOTS_ENV, "") if sampler_snapshots is None else sampler_snapshots).strip()
    if value and (not value.isdigit() or int(value) < 1):
        raise UsageError(f"--sampler-snapshots {value} (or {SNAPSHOTS_ENV}): give a whole number of at least 1")
    cache = os.environ.get(SAMPLER_CACHE_ENV, "").strip()  # the engine inherits it; refused here, before a start
    if cache and not cache.isdigit():
        raise UsageError(f"{SAMPLER_CACHE_ENV}={cache}: give a whole number of sampled checkpoints whose weights "
                         "the server keeps in memory (0: none)")
    return {SNAPSHOTS_ENV: str(int(value))} if value else {}


def _whole_env(name: str, given: int | None, flag: str, unit: str) -> dict[str, str]:
    """A whole number the runtime reads from the environment variable `name` (`--flag` wins over an inherited one):
    refused here, before a start, in one line; {} when neither is set (the runtime's default)."""
    value = str(os.environ.get(name, "") if given is None else given).strip()
    if value and not value.isdigit():
        raise UsageError(f"{flag} {value} (or {name}): give a whole number of {unit}")
    return {name: str(int(value))} if value else {}


def _futures_env(minutes: int | None) -> dict[str, str]:
    """runtime/rlcli_futures.py reads the retention from RLCLI_FUTURES_RETENTION."""
    return _whole_env(FUTURES_ENV, minutes, "--futures-retention", "minutes (0 keeps every row)")


def _program_memory_env(mb: int | None) -> dict[str, str]:
    """runtime/rlcli_memory.py reads the cap from RLCLI_PROGRAM_MEMORY."""
    return _whole_env(PROGRAM_MEMORY_ENV, mb, "--program-memory", "MB (0 keeps every compiled program)")


def _spawn(venv_dir: Path, state_dir: Path, lock_fd: int, model: str, backend: str, host: str, port: int,
           backend_cfg: dict, checkpoints_base: str | None, ray_address: str | None,
           extensions: bool = True, tenant_env: dict | None = None,
           database_url: str | None = None, local_workers: int = 0) -> process.ServerState:
    paths = process.layout(state_dir)
    for key in ("checkpoints", "lora"):
        paths[key].mkdir(parents=True, exist_ok=True, mode=0o700)
    api_args = skyrl_api_args(base_model=model, backend=backend, host=host, port=port, backend_cfg=backend_cfg,
                              state_dir=state_dir, checkpoints_base=checkpoints_base, database_url=database_url)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if Path(model).is_dir():  # a local model needs no hub; never let a lookup hang offline
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    env.update(compilation_cache_env())
    env.update(malloc_env(backend))
    env[shared.WARMUP_FILE_ENV] = str(warmup_file(model, backend, backend_cfg))
    # rlcli's changes to SkyRL (runtime/manifest.py): the launcher applies them in every process of the server.
    env[shared.EXTENSIONS_ENV] = SERVER_EXTENSIONS if extensions else ""
    env.update(tenant_env or {})  # PGPASSWORD for --database-url; the tenants file for --tenants
    if tenant_env and shared.TENANTS_FILE_ENV in tenant_env:  # the tenant gate, even with --no-extensions
        env[shared.EXTENSIONS_ENV] = ",".join(filter(None, [env[shared.EXTENSIONS_ENV], shared.TENANTS]))
    cmd = [str(venv_dir / "bin" / "python"), str(LAUNCHER), "supervise", "--log", str(paths["log"]),
           "--max-log-bytes", str(MAX_LOG_BYTES), "--local-workers", str(local_workers), "--", *api_args]
    proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, pass_fds=(lock_fd,), env=env, cwd=state_dir,
                            umask=0o077)
    ticks = process.proc_start_ticks(proc.pid) or 0
    return process.ServerState(pid=proc.pid, pgid=proc.pid, start_ticks=ticks, host=host, port=port,
                               base_model=model, backend=backend, started_at=time.time())


def compilation_cache_env() -> dict[str, str]:
    """jax's persistent compilation cache under RLCLI_HOME, for every server of this home.

    A restart on the same model and shapes then loads its compiled programs instead of compiling
    them again. jax keys each entry by the program, the jax/XLA version and the device, so one folder
    serves any model and backend safely. Every program is kept, however fast it compiled: jax's
    default (only those over 1 s) would skip most of a small model's, and on 2 CPU cores many
    sub-second compilations add up to seconds of a start.
    """
    folder = config.private_dir(config.rlcli_home() / "cache" / "jax")
    return {"JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", str(folder)),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def warmup_file(model: str, backend: str, backend_cfg: dict) -> Path:
    """Where the engine records the batch shapes it served, for the next start on this model and config."""
    import hashlib
    import json

    key = json.dumps([model, backend, backend_cfg], sort_keys=True)
    folder = config.private_dir(config.rlcli_home() / "cache" / "warmup")
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def stop(o: Named) -> int:
    """Stop the server and every process it started (SIGTERM, then SIGKILL)."""
    name = o.name
    state_dir = config.server_state_dir(name)
    state = process.read_state(state_dir)
    if state is None:
        print(f"rlcli: no server {name!r} recorded under {state_dir}", file=sys.stderr)
        return 0
    ended = process.stop_group(state)
    from rlcli.endpoint.commands import StopOptions, running
    from rlcli.endpoint.commands import stop as stop_endpoint

    if running(name):  # the endpoint over this server answers from it: it stops with it
        stop_endpoint(StopOptions(name=name))
    print(f"rlcli: server {name!r} stopped" + (f" ({len(ended)} processes ended)" if ended else " (was not running)"),
          file=sys.stderr)
    state.ready = False
    process.write_state(state_dir, state)
    return 0


def server_status(name: str = "default") -> tuple[str, process.ServerState | None]:
    """('running'|'starting'|'unresponsive'|'dead'|'stopped'|'absent', state).

    dead: the launcher is gone although nobody stopped it (stray processes may remain);
    unresponsive: it was ready once and its API no longer answers.
    """
    state = process.read_state(config.server_state_dir(name))
    if state is None:
        return "absent", None
    members = process.live_members(state)
    launcher_alive = state.pid in members and process.proc_start_ticks(state.pid) == state.start_ticks
    if not launcher_alive:
        return ("dead" if state.ready or members else "stopped"), state
    if process.healthz(state.url):
        # Started with --wait 0, nobody confirmed readiness: the engine's start line in the log does.
        engine_up = state.ready or scaling.ENGINE_STARTS in process.tail(process.layout(
            config.server_state_dir(name))["log"], 400)
        return ("running" if engine_up else "starting"), state
    return ("unresponsive" if state.ready else "starting"), state


def status(o: Named) -> int:
    """Say whether the server is running, starting or dead (exit 0 only when running)."""
    name = o.name
    word, state = server_status(name)
    if state is None:
        print(f"absent: no server {name!r} has been started under {config.rlcli_home()}")
        return 3
    members = process.live_members(state)
    detail = f"{state.url} backend={state.backend} model={state.base_model}"
    if state.settings.get("slots"):
        detail += f" slots={state.settings['slots']} (raise with `rlcli serve start --slots N`)"
    if word == "running" and (frozen := _frozen_engine(name, state)):
        word, detail = "frozen", f"{detail}; {frozen} (stopped or hung): restart it (`rlcli serve restart`)"
    if word == "running" and (warmed := _warmup_line(name)):
        detail += f"; {warmed}"
    lost = scaling.lost_worker_line(process.tail(process.layout(config.server_state_dir(name))["log"], 200))
    if word in ("dead", "unresponsive") and lost:
        detail += f"; {lost}"
    if word == "dead" and members:
        detail += f"; leftover processes {members}: run `rlcli serve stop`"
    elif word == "dead":
        detail += "; it exited unexpectedly: see `rlcli serve logs`"
    elif members:
        detail += f" pids={members}"
    from rlcli.endpoint.commands import endpoint_url

    if url := endpoint_url(name):
        detail += f"; endpoint {url} (`rlcli endpoint status`)"
    print(f"{word}: {detail}")
    return 0 if word == "running" else 3


def _beat(path: Path, members: list[int]) -> dict | None:
    """{"pid", "beat_age_s"} of a heartbeat file of this server's; None before its first beat, or where the file is an
    earlier server's (the API and the supervisor clear them as they start)."""
    try:
        pid, age = json.loads(path.read_text())["pid"], time.time() - path.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):  # not started yet, or a server without the heartbeat
        return None
    return {"pid": pid, "beat_age_s": age} if pid in members else None


def _frozen_engine(name: str, state: process.ServerState) -> str | None:
    """'engine process PID gave no heartbeat for N s' (or 'jax worker process K ...') where the engine of this running
    server, or a local worker of it, stopped beating (runtime/rlcli_liveness.py: the heartbeat files are in the
    server's folder, its working directory)."""
    from rlcli.watchdog import frozen_engine

    folder, members = config.server_state_dir(name), process.live_members(state)
    engine = _beat(folder / shared.HEARTBEAT_FILE, members)
    if engine is None:
        return None
    workers = []
    for k in range(1, 1 + len(list(folder.glob(shared.WORKER_HEARTBEAT.format("*"))))):
        if beat := _beat(folder / shared.WORKER_HEARTBEAT.format(k), members):
            workers.append({"process": k, **beat})
    return frozen_engine({**engine, "workers": workers}, FROZEN_AFTER_S)


def _warmup_line(name: str) -> str | None:
    """What the engine's warm-up did at its last start, from the log (runtime/rlcli_warmup.py), if it is there."""
    lines = process.tail(process.layout(config.server_state_dir(name))["log"], 400).splitlines()
    found = [ln for ln in lines if ln.startswith(shared.WARMED)]
    return "start-up " + found[-1].split("] ", 1)[1] if found else None


def logs(o: LogsOptions) -> int:
    """Print the last lines of the server log; --follow keeps printing as it grows."""
    follow, lines, name = o.follow, o.lines, o.name
    log = process.layout(config.server_state_dir(name))["log"]
    if not log.exists():
        raise UsageError(f"no log at {log}: start a server first (`rlcli serve start`)")
    print(process.tail(log, lines))
    if not follow:
        return 0
    with log.open("rb") as f:
        f.seek(0, os.SEEK_END)
        inode = os.fstat(f.fileno()).st_ino
        while True:
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            elif log.exists() and os.stat(log).st_ino != inode:  # rotated: reopen the new file
                return logs(LogsOptions(follow=True, lines=0, name=name))
            else:
                time.sleep(0.5)


def restart(o: RestartOptions) -> int:  # type: ignore[valid-type]
    """Stop the server, then start it again with the settings it was started with."""
    state = process.read_state(config.server_state_dir(o.name))
    if state is None or not state.settings:
        raise RlcliError(f"no server {o.name!r} to restart: use `rlcli serve start`")
    stop(Named(name=o.name))
    return start(StartOptions(**{**state.settings, **asdict(o)}))


def install(o: InstallOptions) -> int:
    """Build (or verify) the server venv from the lock in rlcli/server/env/, without starting a server."""
    backend, python, venv, ray = o.backend, o.python, o.venv, o.ray
    if backend != "jax" and not hw.has_cuda():
        raise UsageError(f"the {backend} backend needs NVIDIA GPUs with CUDA and none was found; "
                         "use --backend jax on this machine")
    if ray and backend != "jax":
        raise UsageError(f"--ray adds Ray to the jax server venv; the {backend} backend's own extra brings Ray")
    path = server_venv.ensure_server_venv(backend, python, venv)
    if ray:
        server_venv.ensure_extra(path, "ray")
    print(path)
    return 0


def worker(o: WorkerOptions) -> int:
    """Run jax process K of a multi-process server that another machine started; ends when that server ends."""
    coordinator, processes, process_id, venv, python, extensions = (str(o.coordinator), o.processes, o.process_id,
                                                                    o.venv, o.python, o.extensions)
    scaling.split_address(coordinator, "--coordinator")
    venv_dir = server_venv.ensure_server_venv("jax", python, venv)
    # The model comes from the path (or hub id) the server names: a local folder must be at that path here too.
    env = dict(os.environ, PYTHONUNBUFFERED="1", **compilation_cache_env(), **malloc_env("jax"),
               RLCLI_SERVER_EXTENSIONS=SERVER_EXTENSIONS if extensions else "")
    cmd = [str(venv_dir / "bin" / "python"), str(scaling.LAUNCHER), "worker", coordinator, str(processes),
           str(process_id)]
    print(f"rlcli: jax process {process_id} of {processes} joining {coordinator} (Ctrl-C to leave; the server "
          "stops without it)", file=sys.stderr, flush=True)
    try:
        code = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode
    except KeyboardInterrupt:
        return 130
    # The runtime ends a worker whose coordinator went away with an abort and jax's stack dump: say it plainly.
    print(f"rlcli: jax process {process_id} ended (exit {code}): the server at {coordinator} stopped or lost "
          "a process; start this worker again after the server", file=sys.stderr)
    return 1 if code else 0


# glibc's malloc for a jax engine that computes on the host's CPU (docs/decisions.md, "A jax engine on CPU
# keeps its scratch memory, in huge pages"): one arena grown with brk instead of per-thread arenas and mmap, so
# XLA's per-step scratch block is allocated once and reused; transparent huge pages for it; and memory above
# 256 MiB free at the heap's top still goes back to the system, so a load's peak is not held for good.
CPU_ENGINE_TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
                       "glibc.malloc.trim_threshold=268435456", "glibc.malloc.hugetlb=1")


def malloc_env(backend: str) -> dict[str, str]:
    """GLIBC_TUNABLES for a server's processes: CPU_ENGINE_TUNABLES where a jax engine computes on the CPU.

    Nothing for fsdp/megatron or where jax may find a GPU (its scratch lives on the device there). Tunables the user
    already set come first and win: a name they chose is not added.
    glibc before 2.35 ignores the huge-pages tunable, and other C libraries ignore the variable.
    """
    if backend != "jax":
        return {}
    if hw.has_cuda() and os.environ.get("JAX_PLATFORMS", "").strip().lower() != "cpu":
        return {}
    current = os.environ.get("GLIBC_TUNABLES", "")
    chosen = {item.partition("=")[0] for item in current.split(":") if item}
    added = [tunable for tunable in CPU_ENGINE_TUNABLES if tunable.partition("=")[0] not in chosen]
    return {"GLIBC_TUNABLES": ":".join(filter(None, [current, *added]))} if added else {}
