"""The jax backend past one process: `rlcli serve start --processes N` and `rlcli serve worker`.

SkyRL's jax backend runs several processes with JAX's distributed runtime: process 0 is the engine (the
coordinator), processes 1..N-1 run SkyRL's worker loop and receive every backend call from it; the device
mesh shards the model and the batch over all their devices (fsdp). rlcli's launcher starts the runtime and
the workers (runtime/distributed.py); this module turns the flags into SkyRL's backend config and runs a
worker that joins from another machine.

    rlcli serve start --processes 2                         # coordinator + 1 worker, both here, on loopback
    rlcli serve start --processes 3 --local-processes 1 --coordinator 10.0.0.5:7777 --insecure
    rlcli serve worker --coordinator 10.0.0.5:7777 --processes 3 --process-id 1   # on each other machine
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from rlcli.errors import UsageError

LAUNCHER = Path(__file__).resolve().parent / "runtime" / "launcher.py"
WORKER_LOST = "[rlcli launcher] jax worker process"  # the launcher's line when a worker of its own dies
ENGINE_STARTS = "Starting background engine"  # SkyRL's API, as it starts its engine (a new start of the server)


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_address(address: str, flag: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {address!r} is not HOST:PORT, e.g. 10.0.0.5:7777")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def processes_config(backend: str, processes: int, local_processes: int | None, coordinator: str | None,
                     gpus: int | None, tp: int, insecure: bool, backend_cfg: dict,
                     ray_address: str | None = None, extensions: bool = True) -> int:
    """Write the multi-process keys into backend_cfg; returns how many worker processes start on this machine
    (processes and local_processes are in range: rlcli.server.commands.StartOptions)."""
    if backend == "jax" and ray_address and processes > 1:
        return _on_ray(processes, local_processes, coordinator, gpus, tp, backend_cfg, extensions)
    local = processes if local_processes is None else local_processes
    if processes == 1:
        if local_processes not in (None, 1) or coordinator:
            raise UsageError("--local-processes and --coordinator go with --processes N (N > 1)")
        return 0
    if backend != "jax":
        raise UsageError(f"--processes is for the jax backend; the {backend} backend spreads over Ray "
                         "(--nodes, --gpus, --ray-address)")
    if backend_cfg.get("use_ray"):
        raise UsageError("--processes starts jax processes itself; with use_ray Ray starts them "
                         "(give num_processes in --backend-config instead)")
    if coordinator is None:
        if local < processes:
            raise UsageError("workers on other machines need an address they can reach: pass --coordinator HOST:PORT")
        coordinator = f"127.0.0.1:{_free_loopback_port()}"
    host, _port = split_address(coordinator, "--coordinator")
    if not _is_loopback(host) and not insecure:
        raise UsageError(f"--coordinator {coordinator}: JAX's coordination service checks no credentials, so "
                         "any host that reaches it can join or stall the server; on a trusted network pass --insecure")
    devices = (gpus or 1) * processes  # one CPU device per process; with GPUs, --gpus per process
    backend_cfg.setdefault("coordinator_address", coordinator)
    backend_cfg.setdefault("num_processes", processes)
    if backend_cfg.get("fully_sharded_data_parallel_size", 1) in (1, (gpus or 1) // tp):  # not set by hand
        backend_cfg["fully_sharded_data_parallel_size"] = devices // tp
    return local - 1


def _on_ray(processes: int, local_processes: int | None, coordinator: str | None, gpus: int | None, tp: int,
            backend_cfg: dict, extensions: bool = True) -> int:
    """SkyRL's use_ray: every jax process is a Ray actor of the cluster at --ray-address; nothing starts here.

    The engine only proxies; the actors load rlcli's extensions through the runtime_env the engine joins Ray
    with (runtime/ray_actors.py), the padding of sampling batches to the mesh included. Without extensions
    sampling batches are capped at one sequence per process instead, which keeps every batch a multiple of
    the mesh (stock SkyRL pads to the cap only)."""
    if local_processes is not None or coordinator:
        raise UsageError("on Ray, Ray places the jax processes and picks the coordinator: drop --local-processes "
                         "and --coordinator")
    backend_cfg.setdefault("use_ray", True)
    backend_cfg.setdefault("num_processes", processes)
    if not extensions:
        backend_cfg.setdefault("sample_max_num_sequences", processes)
    if backend_cfg.get("fully_sharded_data_parallel_size", 1) in (1, (gpus or 1) // tp):
        backend_cfg["fully_sharded_data_parallel_size"] = (gpus or 1) * processes // tp
    if gpus:
        backend_cfg.setdefault("ray_pg_bundles", [{"CPU": 1, "GPU": gpus}] * processes)
        backend_cfg.setdefault("ray_actor_options", {"num_gpus": gpus})
    return 0


def lost_worker_line(log_tail: str) -> str | None:
    """The launcher's line saying a worker of its own died, if the log's tail has one since the engine last started
    (an earlier run's, before a restart, says nothing of this one)."""
    lines = log_tail.splitlines()
    starts = [i for i, line in enumerate(lines) if ENGINE_STARTS in line]
    found = [line for line in lines[starts[-1] if starts else 0:] if line.startswith(WORKER_LOST)]
    return found[-1].removeprefix("[rlcli launcher] ") if found else None


def lost_worker_at(url: str) -> str | None:
    """lost_worker_line of the server of this rlcli home that serves url (None where none of its servers does)."""
    from rlcli import config
    from rlcli.server import process

    servers = config.rlcli_home() / "servers"
    for state_dir in sorted(servers.iterdir()) if servers.is_dir() else ():
        state = process.read_state(state_dir)
        if state is not None and state.url.rstrip("/") == url.rstrip("/"):
            return lost_worker_line(process.tail(process.layout(state_dir)["log"], 400))
    return None


def doctor_check(site_packages) -> tuple[str, str]:
    """(status, detail) for `rlcli doctor`: what a multi-process jax server needs on this machine."""
    from rlcli.server.server_venv import installed_version

    cores = os.cpu_count() or 1
    try:
        _free_loopback_port()
    except OSError as e:
        return "fail", f"cannot open a loopback port for the jax coordinator ({e}): --processes needs TCP on 127.0.0.1"
    jax = installed_version(site_packages, "jax") if site_packages else None
    ray = installed_version(site_packages, "ray") if site_packages else None
    detail = (f"{cores} cores: `serve start --processes N` runs best with N <= {cores} (one core or GPU each); "
              f"jax {jax or 'not installed'} (gloo collectives on CPU); "
              + (f"ray {ray} in the server venv (jax on Ray usable)" if ray else
                 "no ray in the server venv (jax on Ray: `rlcli serve install --with ray`)"))
    return ("ok" if jax else "warn"), detail
