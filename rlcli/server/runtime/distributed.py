"""Several processes behind one jax server: JAX's distributed runtime, brought up by rlcli's launcher first in every
process (jax refuses to after any computation), bound where the user said; a worker joins once the coordinator
listens and writes its own compilation cache entries; every process compares what it runs with the others through
the runtime's key-value store (docs/decisions.md, "Several jax processes").
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from shared import DISTRIBUTED_ENV as MARK_ENV  # set once rlcli's launcher brought the runtime up in this process
from shared import RLCLI, WARMUP_FILE_ENV

HEARTBEAT_S = 30  # a process silent this long is declared dead by the coordination service
INIT_TIMEOUT_S = 300  # how long a process waits for all the others to join
AGREE_TIMEOUT_MS = 300_000
PORT_POLL_S = 0.05  # how often a worker looks whether the coordinator's port is open yet


def log(message: str) -> None:
    print(f"[rlcli distributed] {message}", file=sys.stderr, flush=True)


def backend_of(argv: list[str]) -> tuple[str, dict]:
    """SkyRL's --backend (its default: jax) and --backend-config ({} where absent or unreadable) in argv."""
    def flag(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv[:-1] else default

    try:
        config = json.loads(flag("--backend-config", "{}"))
    except ValueError:
        config = None
    return flag("--backend", "jax"), config if isinstance(config, dict) else {}


def settings_from_engine_argv(argv: list[str]) -> tuple[str, int] | None:
    """(coordinator_address, num_processes) from the engine's --backend-config, or None for one process."""
    config = backend_of(argv)[1]
    if config.get("use_ray") or not config.get("coordinator_address"):
        return None  # on Ray the actors bring the runtime up themselves
    return config["coordinator_address"], int(config.get("num_processes") or 1)


def wait_for_port(address: str, timeout_s: float) -> float | None:
    """Seconds until HOST:PORT took a TCP connection (closed at once), or None if it did not within timeout_s."""
    host, _, port = address.rpartition(":")  # [::1]:PORT too
    start = time.monotonic()
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return time.monotonic() - start
        except OSError:
            if time.monotonic() - start >= timeout_s:
                return None
            time.sleep(PORT_POLL_S)


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join (or, as process 0, start) the distributed runtime; SkyRL's own later call becomes a no-op."""
    import jax

    if process_id != 0:  # join once the coordinator listens, not at jax's next back-off retry (module docstring)
        waited = wait_for_port(coordinator, INIT_TIMEOUT_S)
        if waited is None:
            raise SystemExit(f"[rlcli distributed] process {process_id}: nothing answered at {coordinator} within "
                             f"{INIT_TIMEOUT_S} s; start the server (process 0) first, or check the address")
        if waited >= 1.0:
            log(f"process {process_id}: the coordinator at {coordinator} answered after {waited:.1f} s")
    log(f"process {process_id} of {num_processes} joining coordinator {coordinator} "
        f"(jax {jax.__version__}, cpu collectives: {jax.config.jax_cpu_collectives_implementation or 'default'})")
    original = jax.distributed.initialize
    original(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
             coordinator_bind_address=coordinator if process_id == 0 else None,
             initialization_timeout=INIT_TIMEOUT_S, heartbeat_timeout_seconds=HEARTBEAT_S)

    def already_initialized(coordinator_address=None, num_processes=None, process_id=None, **_ignored):
        if (coordinator_address, num_processes) != (coordinator, jax.process_count()):
            raise RuntimeError(f"rlcli started jax's runtime for {coordinator} with {jax.process_count()} processes; "
                               f"SkyRL asked for {coordinator_address} with {num_processes}")

    jax.distributed.initialize = already_initialized
    if process_id != 0:
        cache_worker_programs()
    os.environ[MARK_ENV] = f"{process_id}/{num_processes}"
    log(f"process {jax.process_index()} ready: {jax.process_count()} processes, {jax.device_count()} devices")


def cache_worker_programs() -> None:
    """A worker writes its compiled programs to jax's persistent cache, as process 0 does: jax writes from process 0
    only, and a worker's keys are its own, so it compiled every program at every start (docs/decisions.md)."""
    from jax._src import compilation_cache, compiler, config

    if getattr(compiler._cache_write, "rlcli", False):
        return
    failed = []

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable):
        if compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
            return
        try:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                      int(compile_time_secs))
        except Exception as ex:  # as in jax: an entry that cannot be written costs a compile later, nothing more
            if not failed:  # once: an unwritable folder would fail for every program
                log(f"cache entries not written (first: {module_name!r}, {type(ex).__name__}: {ex})")
            failed.append(module_name)

    cache_write.rlcli = True
    compiler._cache_write = cache_write


def identity(features: set[str]) -> str:
    """What every process of one server must run alike: the runtime, rlcli's changes or not, the kept snapshots."""
    import manifest
    import rlcli_samplers

    if RLCLI not in features:
        return f"rlcli runtime {manifest.VERSION}, stock SkyRL"
    return f"rlcli runtime {manifest.VERSION}, keep={rlcli_samplers.keep_count()}"


def agree(process_id: int, num_processes: int, mine: str) -> None:
    """Fail unless every process runs the same (identity above)."""
    from jax._src import distributed

    client = distributed.global_state.client  # jax's own, up since initialize()
    client.key_value_set(f"rlcli/runtime/{process_id}", mine)
    for other in range(1, num_processes) if process_id == 0 else [0]:
        theirs = client.blocking_key_value_get(f"rlcli/runtime/{other}", AGREE_TIMEOUT_MS)
        if theirs != mine:
            raise RuntimeError(f"process {other} runs {theirs!r}, process {process_id} {mine!r}: start every process "
                               "from the same rlcli, with the same --no-extensions and --sampler-snapshots")
    log(f"process {process_id}: every process loaded the same extensions ({mine})")


def join(process_id: int, num_processes: int, features: set[str], module) -> None:
    """A worker or Ray actor, its runtime up: check SkyRL, apply rlcli's changes, build rlcli's impl through `module`'s
    global (SkyRL's), and agree with the others."""
    import manifest
    import rlcli_backend

    manifest.check({manifest.JAX, manifest.WORKER} | ({manifest.RAY} if "ray_jax" in module.__name__ else set()))
    config = {"coordinator_address": "set", "num_processes": num_processes}  # what decides whether gspo fuses
    rlcli_backend.prepare(RLCLI in features, config, module)
    agree(process_id, num_processes, identity(features))


def run_worker(coordinator: str, num_processes: int, process_id: int, features: set[str]) -> None:
    """A worker: import SkyRL's jax backend while process 0 does the same, join, then serve SkyRL's command loop."""
    if process_id < 1 or process_id >= num_processes:
        raise SystemExit(f"--process-id must be 1..{num_processes - 1} (0 is the coordinator, the engine)")
    os.environ.pop(WARMUP_FILE_ENV, None)  # the coordinator records shapes; a worker only follows
    from skyrl.backends import jax as jax_backend

    initialize(coordinator, num_processes, process_id)
    join(process_id, num_processes, features, jax_backend)
    jax_backend.run_worker(coordinator, num_processes, process_id)
