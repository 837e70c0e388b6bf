"""rlcli's changes inside the Ray actors of SkyRL's jax backend (`use_ray`), and the engine's Ray proxy.

The engine joins Ray before SkyRL would (`connect`) with a runtime_env: working_dir = this folder, rlcli's settings,
and a setup hook that wraps `jax.distributed.initialize`, which SkyRL's actor calls before it builds its impl: the
runtime comes up (distributed.py), rlcli's changes apply, the actors compare. RlcliRayJaxBackend asks each actor what
it runs and stops the engine on a difference (docs/decisions.md, "jax on Ray: the actors load rlcli's extensions").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from shared import EXTENSIONS_ENV, RAY_REPORT, RLCLI, SNAPSHOTS_ENV, WARMUP_FILE_ENV

HERE = Path(__file__).resolve().parent
# The engine's jax compilation cache settings, for the actors: a Ray node's own environment has none. Applied by
# the hook only where that folder can be made (another node may have no such home).
CACHE_ENV = "RLCLI_ACTOR_JAX_CACHE"
CACHE_SETTINGS = {"JAX_COMPILATION_CACHE_DIR": ("jax_compilation_cache_dir", str),
                  "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("jax_persistent_cache_min_compile_time_secs", float),
                  "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": ("jax_persistent_cache_min_entry_size_bytes", int)}
MARK = "_rlcli_loads_extensions"
_state: dict = {"loaded": None}


def log(message: str) -> None:
    print(f"[rlcli ray actors] {message}", file=sys.stderr, flush=True)


def on_ray(argv: list[str]) -> bool:
    """The engine's flags ask for the jax backend in Ray actors."""
    import distributed

    backend, config = distributed.backend_of(argv)
    return backend == "jax" and bool(config.get("use_ray"))


# --- driver (the engine process) ------------------------------------------------------------------


def connect() -> None:
    """Join the Ray cluster (RAY_ADDRESS) with the runtime_env that makes every actor run rlcli's changes."""
    import ray

    Path(RAY_REPORT).unlink(missing_ok=True)
    env = {EXTENSIONS_ENV: RLCLI, **{k: os.environ[k] for k in (SNAPSHOTS_ENV,) if k in os.environ}}
    cache = {k: os.environ[k] for k in CACHE_SETTINGS if os.environ.get(k)}
    if "JAX_COMPILATION_CACHE_DIR" in cache:
        env[CACHE_ENV] = json.dumps(cache)
    ray.init(runtime_env={"working_dir": str(HERE), "env_vars": env,
                          "worker_process_setup_hook": f"{Path(__file__).stem}.setup"})
    log("Ray actors will run rlcli's changes (runtime_env working_dir and setup hook); gspo is registered in each "
        "Ray actor, this engine only proxies to them")


def backend_class(stock: type) -> type:
    """SkyRL's RayJaxBackend (the engine's proxy) with rlcli's overrides; the backend table hands it out.

    Ray pickles the actor class's methods with the globals they name, here: the actors build what this process's
    `ray_jax.JaxBackendImpl` is when RayJaxBackend starts them, so it is rlcli's (bring_up rebinds it there too)."""
    import ray
    import rlcli_backend
    import rlcli_samplers as samplers
    from skyrl.backends import ray_jax

    ray_jax.JaxBackendImpl = rlcli_backend.RlcliJaxImpl

    class RlcliRayJaxBackend(stock):
        def __init__(self, base_model, config):
            # The engine reads process 0's snapshot book to refuse deleted ones and drop their rows: on Ray it
            # keeps the same book here from the same calls (the actors delete their own files).
            self.snapshots = samplers.Snapshots(samplers.keep_count(), records_rows=True)
            super().__init__(base_model, config)
            check_actors(ray, self.workers)

        def save_sampler_checkpoint(self, output_path, model_id, persist=True):
            super().save_sampler_checkpoint(output_path, model_id, persist)
            self.snapshots.saved(model_id, samplers.checkpoint_name(output_path), output_path, persist)

        def delete_model(self, model_id):
            super().delete_model(model_id)
            self.snapshots.model_gone(model_id)

    return RlcliRayJaxBackend


def check_actors(ray, workers: list) -> None:
    """Every actor runs what the engine does; say so for the capabilities route, or stop with one line."""
    import distributed

    mine = distributed.identity({RLCLI})
    theirs = ray.get([worker.__ray_call__.remote(report) for worker in workers])
    for index, loaded in enumerate(theirs):
        if loaded != mine:
            raise RuntimeError(f"Ray actor {index} loaded the server extensions {loaded}, the engine {mine}: start "
                               "every Ray node from the server venv of the same rlcli (`ray start` there)")
    tmp = Path(f"{RAY_REPORT}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"actors": len(theirs), "runtime": mine}))
    tmp.chmod(0o600)
    os.replace(tmp, RAY_REPORT)
    log(f"all {len(theirs)} Ray actors loaded the same extensions as the engine: {mine}")


def describe() -> dict:
    """What the capabilities route says about the actors (API process, in the server's folder)."""
    try:
        return json.loads(Path(RAY_REPORT).read_text())
    except (OSError, ValueError):
        return {"actors": 0, "runtime": None, "state": "the engine has not set its Ray actors up yet"}


# --- actor (a Ray worker process of this job) -----------------------------------------------------


def setup() -> None:
    """Ray's worker_process_setup_hook: wrap jax.distributed.initialize, which SkyRL's actor calls in setup() before
    it builds its JaxBackendImpl: the runtime comes up as on rlcli's own processes, then rlcli's changes install."""
    import jax

    original = jax.distributed.initialize
    if getattr(original, MARK, False):
        return
    use_engines_cache(jax)

    def initialize(coordinator_address=None, num_processes=None, process_id=None, **_ignored):
        jax.distributed.initialize = original  # distributed.initialize calls it, then replaces it for good
        bring_up(coordinator_address, int(num_processes), int(process_id))

    setattr(initialize, MARK, True)
    jax.distributed.initialize = initialize


def use_engines_cache(jax) -> None:
    """Compile into the engine's cache folder (CACHE_ENV) unless this node set a cache of its own."""
    settings = json.loads(os.environ.get(CACHE_ENV) or "{}")
    folder = settings.get("JAX_COMPILATION_CACHE_DIR")
    if not folder or jax.config.jax_compilation_cache_dir:
        return
    try:
        Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"{folder} is not writable")
    except OSError as e:
        log(f"actor pid {os.getpid()}: no jax compilation cache ({e}); it compiles every program")
        return
    for variable, (option, kind) in CACHE_SETTINGS.items():
        if variable in settings:
            jax.config.update(option, kind(settings[variable]))


def bring_up(coordinator: str, num_processes: int, process_id: int) -> None:
    import distributed
    from skyrl.backends import ray_jax

    os.environ.pop(WARMUP_FILE_ENV, None)  # the engine's business; an actor only follows
    distributed.initialize(coordinator, num_processes, process_id)
    features = {RLCLI} if RLCLI in os.environ.get(EXTENSIONS_ENV, "") else set()
    distributed.join(process_id, num_processes, features, ray_jax)
    _state["loaded"] = distributed.identity(features)


def report(_actor) -> str | None:
    """Run in an actor through __ray_call__: what it runs (None: the hook never ran there)."""
    return _state["loaded"]
