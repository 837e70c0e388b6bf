"""Several processes behind one jax server: JAX's distributed runtime started by rlcli's launcher.

Runs INSIDE the server venv (Python 3.12): standard library, jax and skyrl only.

SkyRL's jax backend runs process 0 (the engine) as the coordinator: it calls `jax.distributed.initialize`
in `JaxBackend.__init__` and broadcasts every backend call to the other processes, which run
`skyrl.backends.jax.run_worker`. rlcli starts both ends through its launcher and brings the runtime up
itself, earlier than SkyRL would, for these reasons:

- rlcli's server extensions run jax code when they load (the fused-gspo dispatch self-test, for one), and
  `jax.distributed.initialize` refuses to run after any jax computation: so the runtime comes first, then
  the extensions, in every process alike.
- SkyRL's call binds the coordination service to every interface ([::]:PORT); rlcli binds it to the host
  the user named (loopback unless told otherwise) and notices a lost process within HEARTBEAT_S.
- A process that asks to join before process 0 has started the coordination service is not refused: jax's
  client retries with a growing back-off, and the join completes only at its next retry, up to ~30 s after
  the coordinator came up (measured: docs/decisions.md). So a worker first waits for the coordinator's port
  to take a TCP connection, looking every 50 ms, and joins then; a local worker imports SkyRL's jax backend
  before that, while process 0 imports the same.
- jax writes its persistent compilation cache from process 0 only, and a worker's keys are its own: a worker
  compiled every program at every start. rlcli's workers write their own entries (cache_worker_programs).
- Every process must trace the same programs (they meet in the collectives): each process publishes the
  extensions it loaded in the runtime's key-value store, and the coordinator and each worker compare
  theirs with it before anything is served. A mismatch stops the server at start, loudly.

On CPU the pinned jax (0.12) uses gloo for cross-process collectives by default; one CPU device per process,
so the device mesh is fsdp = number of processes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

HEARTBEAT_S = 30  # a process silent this long is declared dead by the coordination service
INIT_TIMEOUT_S = 300  # how long a process waits for all the others to join
AGREE_TIMEOUT_MS = 300_000
PORT_POLL_S = 0.05  # how often a worker looks whether the coordinator's port is open yet
MARK_ENV = "RLCLI_DISTRIBUTED"  # set once rlcli's launcher brought the runtime up in this process


def log(message: str) -> None:
    print(f"[rlcli distributed] {message}", file=sys.stderr, flush=True)


def settings_from_engine_argv(argv: list[str]) -> tuple[str, int] | None:
    """(coordinator_address, num_processes) from the engine's --backend-config, or None for one process."""
    if "--backend-config" not in argv:
        return None
    try:
        config = json.loads(argv[argv.index("--backend-config") + 1])
    except (IndexError, ValueError):
        return None
    if config.get("use_ray") or not config.get("coordinator_address"):
        return None  # on Ray the actors bring the runtime up themselves
    return config["coordinator_address"], int(config.get("num_processes") or 1)


def wait_for_port(address: str, timeout_s: float) -> float | None:
    """Seconds until HOST:PORT took a TCP connection (closed at once), or None if it did not within timeout_s."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # [::1]:PORT
    start = time.monotonic()
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
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
    pad_samples_to_mesh()
    os.environ[MARK_ENV] = f"{process_id}/{num_processes}"
    log(f"process {jax.process_index()} ready: {jax.process_count()} processes, {jax.device_count()} devices")


def cache_worker_programs() -> None:
    """Let this worker write its compiled programs to jax's persistent compilation cache, as process 0 does.

    jax writes cache entries from process 0 only (against write contention on shared filesystems) and lets every
    process read them. But a worker's cache keys are not process 0's, even for the same program over the same
    devices (docs/decisions.md): a worker never found an entry and compiled every program at every start, while
    process 0 waited for it in the next collective. Here a worker writes its own entries.
    """
    import pins
    from jax._src import compilation_cache, compiler, config

    pins.require("rlcli distributed (jax)", {
        "jax._src.compiler._cache_write": getattr(compiler, "_cache_write", None),
        "jax._src.compilation_cache.put_executable_and_time":
            getattr(compilation_cache, "put_executable_and_time", None),
    })
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


def broadcast_delete_model() -> None:
    """SkyRL 0.4.0's JaxBackend broadcasts create_model but not delete_model: process 0 freed a LoRA slot the
    workers kept, so the next model got slot 1 on one process and slot 2 on another, and the next batch failed
    (`... passed to device_put is not the same on each process`). Broadcast it like the other calls."""
    import pins
    from skyrl.backends import jax as jax_backend

    backend = getattr(jax_backend, "JaxBackend", None)
    pins.require("rlcli distributed", {
        "JaxBackend._broadcast_and_call": getattr(backend, "_broadcast_and_call", None),
        "JaxBackendImpl.delete_model": getattr(getattr(jax_backend, "JaxBackendImpl", None), "delete_model", None),
    })
    if "delete_model" in vars(backend):
        return  # a SkyRL that broadcasts it itself

    def delete_model(self, model_id: str) -> None:
        self._broadcast_and_call("delete_model", model_id=model_id)

    backend.delete_model = delete_model


def pad_samples_to_mesh() -> None:
    """SkyRL shards a sampling batch over the fsdp axis but pads it to a multiple of that axis only when
    sample_max_num_sequences is set: one prompt on 2 processes failed (`array axis 0 is partitioned 2 times,
    but the dimension size is 1`). Unless the user set a cap, each call gets the smallest one that fits its
    batch and divides by the mesh: the batch stays whole, padded like the training batches."""
    import functools

    from skyrl.backends import jax as jax_backend

    impl = jax_backend.JaxBackendImpl
    original = impl.sample

    @functools.wraps(original)
    def sample(self, prepared_batch):
        fsdp = self.mesh.shape["fsdp"]
        total = len(prepared_batch.all_model_inputs)
        if fsdp == 1 or self.config.sample_max_num_sequences > 0 or total % fsdp == 0:
            return original(self, prepared_batch)
        self.config.sample_max_num_sequences = -(-total // fsdp) * fsdp
        try:
            return original(self, prepared_batch)
        finally:
            self.config.sample_max_num_sequences = 0

    impl.sample = sample


def _client():
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None or not callable(getattr(client, "key_value_set", None)):
        raise RuntimeError("rlcli distributed: this jax has no key-value store on its distributed client")
    return client


def agree(process_id: int, num_processes: int, extensions: str) -> None:
    """Fail unless every process loaded the same server extensions (compared by name and version)."""
    mine = json.dumps(_loaded(extensions))
    client = _client()
    client.key_value_set(f"rlcli/extensions/{process_id}", mine)
    others = range(1, num_processes) if process_id == 0 else [0]
    for other in others:
        theirs = client.blocking_key_value_get(f"rlcli/extensions/{other}", AGREE_TIMEOUT_MS)
        if theirs != mine:
            raise RuntimeError(f"process {other} loaded the server extensions {theirs}, process {process_id} "
                               f"{mine}: start every process from the same rlcli, with the same --no-extensions")
    log(f"process {process_id}: every process loaded the same extensions {mine}")


QUEUE_ONLY = {"rlcli_tenants"}  # keys and the engine's queue: process 0's business, no traced program changes


def _loaded(extensions: str) -> list[str]:
    names = [name.strip() for name in extensions.split(",") if name.strip() and name.strip() not in QUEUE_ONLY]
    return [f"{name} {getattr(sys.modules.get(name), 'VERSION', '?')}" for name in names]


def run_worker(coordinator: str, num_processes: int, process_id: int, load_extensions) -> None:
    """A worker: join, load the extensions, agree with the coordinator, then serve SkyRL's command loop."""
    if process_id < 1 or process_id >= num_processes:
        raise SystemExit(f"--process-id must be 1..{num_processes - 1} (0 is the coordinator, the engine)")
    os.environ.pop("RLCLI_WARMUP_FILE", None)  # the coordinator records shapes; a worker only follows
    # SkyRL's jax backend (transformers, peft and torch with it: ~30 s of CPU on a 2-core machine) is imported
    # before joining, while process 0 imports the same: after the join, process 0 would wait for it idle.
    from skyrl.backends import jax as jax_backend

    initialize(coordinator, num_processes, process_id)
    # Extensions read the engine's flags; a worker learns the real ones from the coordinator later.
    config = json.dumps({"coordinator_address": coordinator, "num_processes": num_processes})
    sys.argv = [sys.argv[0], "engine", "--backend", "jax", "--base-model", "worker", "--backend-config", config]
    load_extensions("engine")
    agree(process_id, num_processes, os.environ.get("RLCLI_SERVER_EXTENSIONS", ""))
    jax_backend.run_worker(coordinator, num_processes, process_id)
