"""rlcli's server extensions inside the Ray actors of SkyRL's jax backend (`use_ray`).

Runs INSIDE the server venv (Python 3.12): standard library, jax, ray and skyrl only; on the engine's machine
(the Ray driver) and in every actor, on whichever node of the cluster Ray places it.

With use_ray, SkyRL's engine only proxies: each jax process is a `RayJaxBackendImpl` actor started by the
cluster's own Python (`ray start` from the server venv on every node), so the launcher's hooks never run there
and the actors served stock SkyRL (gspo not fused, slot gradients left over, an old checkpoint's weights over
the live ones). The driver now joins the cluster itself, before SkyRL would, with a job-wide runtime_env:

- working_dir = rlcli's runtime folder: Ray ships it to every node and puts it first on the actors' path, so
  the actors import the same extension files as the engine, whatever is installed on the other nodes;
- env_vars: the extension list (RLCLI_SERVER_EXTENSIONS) and the engine's jax compilation cache settings;
- worker_process_setup_hook = `ray_actors.setup`: runs in each worker process before it takes work.

The hook cannot load the extensions right away: they run jax code as they load (the fused-gspo self-test) and
the actor's later `jax.distributed.initialize` would then refuse to run. So the hook wraps that call: the
runtime comes up first (through distributed.py, as for --processes: bound to the node's address, heartbeats,
the padding fix), then the extensions load, then every actor compares what it loaded with the others through
the runtime's key-value store. SkyRL's actor builds its JaxBackendImpl after that, from the patched classes.
Back in the driver, once SkyRL's RayJaxBackend is up, each actor is asked what it loaded: anything other
than the engine's own list stops the engine with one line. The answer is written for the API's
capabilities route (REPORT, in the server's folder).

`python ray_actors.py` checks in this venv that the pieces this relies on still exist.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NAME = "rlcli ray actors"
HERE = Path(__file__).resolve().parent
EXTENSIONS_ENV = "RLCLI_SERVER_EXTENSIONS"
FORWARDED_ENV = ("RLCLI_SAMPLER_SNAPSHOTS",)  # settings the extensions read (and compare, through VERSION)
# The engine's jax compilation cache settings (RLCLI_HOME/cache/jax), for the actors: a Ray node's own
# environment has none, so every actor compiled every program at every start. Forwarded under rlcli's name and
# applied by the hook only where that folder can be made (another node may have no such home).
CACHE_ENV = "RLCLI_ACTOR_JAX_CACHE"
CACHE_SETTINGS = {"JAX_COMPILATION_CACHE_DIR": ("jax_compilation_cache_dir", str),
                  "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("jax_persistent_cache_min_compile_time_secs", float),
                  "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": ("jax_persistent_cache_min_entry_size_bytes", int)}
REPORT = "rlcli-ray-actors.json"  # in the server's folder (the API's and the engine's working directory)
MARK = "_rlcli_loads_extensions"
# Loaded in the actors too (every process loads the same list) but acting in the engine or the API only: what
# they change is the API's start (lazy torch), the engine's request loop (wake) or needs the engine's own passes
# (warmup records and replays shapes).
ENGINE_ONLY = {"rlcli_lazy_torch": "acts in the API process only (its torch import), not in the engine or actors",
               "rlcli_no_torch": "acts on the imports of the engine and its jax worker processes; actors import "
                                 "as stock SkyRL does",
               "rlcli_wake": "the request path is the engine's: API and engine wake each other as without Ray",
               "rlcli_warmup": "batch shapes are neither recorded nor replayed on Ray (the actors run the passes); "
                               "the actors pad sampling batches to its sizes, as the engine would"}
_state: dict = {"loaded": None}


def log(message: str) -> None:
    print(f"[{NAME}] {message}", file=sys.stderr, flush=True)


def on_ray(argv: list[str]) -> bool:
    """The engine's flags ask for the jax backend in Ray actors."""
    if "--backend-config" not in argv or ("--backend" in argv and argv[argv.index("--backend") + 1] != "jax"):
        return False
    try:
        return bool(json.loads(argv[argv.index("--backend-config") + 1]).get("use_ray"))
    except (IndexError, ValueError, AttributeError):
        return False


def _targets():
    import pins
    import ray
    from skyrl.backends import ray_jax

    actor = getattr(getattr(ray_jax.RayJaxBackendImpl, "__ray_metadata__", None), "modified_class", None)
    pins.require(NAME, {
        "ray_jax.RayJaxBackend.__init__": getattr(ray_jax.RayJaxBackend, "__init__", None),
        "RayJaxBackendImpl.setup": getattr(actor, "setup", None),
        # The actor must bring jax's runtime up itself, in setup, before it builds its JaxBackendImpl.
        "RayJaxBackendImpl.setup calls jax.distributed.initialize": _calls_initialize(actor),
        "RayJaxBackendImpl.__ray_call__ (Ray)": getattr(actor, "__ray_call__", None),
    })
    return ray, ray_jax


def _calls_initialize(actor) -> bool:
    import inspect

    try:
        return "jax.distributed.initialize(" in inspect.getsource(actor.setup)
    except (OSError, TypeError, AttributeError):
        return False


# --- driver (the engine process) ------------------------------------------------------------------


def connect() -> None:
    """Join the Ray cluster (RAY_ADDRESS) with the runtime_env that makes every actor load the extensions."""
    import distributed

    Path(REPORT).unlink(missing_ok=True)
    # The tenants' extensions act on the engine's queue and the API only: not in the actors.
    extensions = ",".join(name.strip() for name in os.environ.get(EXTENSIONS_ENV, "").split(",")
                          if name.strip() and name.strip() not in distributed.QUEUE_ONLY)
    if not extensions:
        return  # --no-extensions: stock SkyRL in the actors too
    ray, ray_jax = _targets()
    env = {EXTENSIONS_ENV: extensions, **{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}}
    cache = {k: os.environ[k] for k in CACHE_SETTINGS if os.environ.get(k)}
    if "JAX_COMPILATION_CACHE_DIR" in cache:
        env[CACHE_ENV] = json.dumps(cache)
    ray.init(runtime_env={"working_dir": str(HERE), "env_vars": env,
                          "worker_process_setup_hook": f"{Path(__file__).stem}.setup"})
    backend = ray_jax.RayJaxBackend
    original = backend.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        check_actors(ray, self.workers, extensions)

    backend.__init__ = __init__
    if "rlcli_samplers" in extensions.split(","):
        mirror_snapshots(backend)
    log("Ray actors will load rlcli's server extensions (runtime_env working_dir and setup hook)")


def check_actors(ray, workers: list, extensions: str) -> None:
    """Every actor loaded what the engine loaded; say so for the capabilities route, or stop with one line."""
    import distributed

    mine = distributed._loaded(extensions)
    theirs = ray.get([worker.__ray_call__.remote(report) for worker in workers])
    for index, loaded in enumerate(theirs):
        if loaded != mine:
            raise RuntimeError(f"Ray actor {index} loaded the server extensions {loaded}, the engine {mine}: start "
                               "every Ray node from the server venv of the same rlcli (`ray start` there)")
    tmp = Path(f"{REPORT}.{os.getpid()}.tmp")
    names = [entry.split()[0] for entry in mine]
    tmp.write_text(json.dumps({"actors": len(theirs), "extensions": mine,
                               "live": [name for name in names if name not in ENGINE_ONLY],
                               "engine_only": {name: why for name, why in ENGINE_ONLY.items() if name in names}}))
    tmp.chmod(0o600)
    os.replace(tmp, REPORT)
    log(f"all {len(theirs)} Ray actors loaded the same extensions as the engine: {mine}")


def mirror_snapshots(backend) -> None:
    """rlcli_samplers keeps a book of each process's unnamed sampler snapshots on its backend object; the engine
    reads process 0's to refuse samples of deleted ones and to drop their database rows. On Ray the engine's
    backend is RayJaxBackend, the proxy: keep the same book there from the same calls (the actors delete their
    files; the proxy's deletes find them gone, or delete the engine's copy on a shared disk)."""
    original_save, original_delete = backend.save_sampler_checkpoint, backend.delete_model

    def save_sampler_checkpoint(self, output_path, model_id, persist=True):
        import rlcli_samplers as samplers

        original_save(self, output_path, model_id, persist)
        samplers.snapshots(self).saved(model_id, samplers.checkpoint_name(output_path), output_path, persist)

    def delete_model(self, model_id):
        import rlcli_samplers as samplers

        original_delete(self, model_id)
        samplers.snapshots(self).model_gone(model_id)

    backend.save_sampler_checkpoint, backend.delete_model = save_sampler_checkpoint, delete_model


def describe(cwd: Path | None = None) -> dict:
    """What the capabilities route says about the actors (API process)."""
    path = (cwd or Path.cwd()) / REPORT
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"actors": 0, "extensions": None, "state": "the engine has not set its Ray actors up yet"}


# --- actor (a Ray worker process of this job) -----------------------------------------------------


def setup() -> None:
    """Ray's worker_process_setup_hook: wrap jax.distributed.initialize (see the module's docstring)."""
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
    import launcher

    os.environ.pop("RLCLI_WARMUP_FILE", None)  # the engine's business; an actor only follows
    distributed.initialize(coordinator, num_processes, process_id)
    # Extensions read the engine's flags (as in a --processes worker): the jax backend, several processes.
    config = json.dumps({"coordinator_address": coordinator, "num_processes": num_processes})
    sys.argv = [sys.argv[0], "engine", "--backend", "jax", "--base-model", "actor", "--backend-config", config]
    extensions = os.environ.get(EXTENSIONS_ENV, "")
    launcher._load_extensions("engine")
    distributed.agree(process_id, num_processes, extensions)
    _state["loaded"] = distributed._loaded(extensions)


def report(_actor) -> list[str] | None:
    """Run in an actor through __ray_call__: the extensions it loaded (None: the hook never ran there)."""
    return _state["loaded"]


if __name__ == "__main__":
    _targets()
    print(f"{NAME}: RayJaxBackend.__init__, RayJaxBackendImpl.setup (calling jax.distributed.initialize) and "
          "the actors' __ray_call__ present")
