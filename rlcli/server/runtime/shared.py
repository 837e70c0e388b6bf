"""Strings both sides of the process boundary use: rlcli's client (`rlcli.server.runtime.shared`) and the server
processes (`shared`, from the runtime folder). Standard library only, no imports at all: each is written once.
"""

# The environment `rlcli serve start` gives the server's processes.
EXTENSIONS_ENV = "RLCLI_SERVER_EXTENSIONS"  # comma-separated: RLCLI and/or TENANTS below
RLCLI = "rlcli"  # every change rlcli makes to SkyRL (absent with --no-extensions)
TENANTS = "tenants"  # the tenant gate and the engine's round-robin (--tenants, with or without --no-extensions)
SNAPSHOTS_ENV = "RLCLI_SAMPLER_SNAPSHOTS"  # unnamed sampler snapshots kept per model (--sampler-snapshots)
SAMPLER_CACHE_ENV = "RLCLI_SAMPLER_CACHE"  # sampled checkpoints whose weights stay in memory (0: none)
FUTURES_RETENTION_ENV = "RLCLI_FUTURES_RETENTION"  # minutes a finished futures row is kept (--futures-retention)
PROGRAM_MEMORY_ENV = "RLCLI_PROGRAM_MEMORY"  # MB the engine's compiled programs may grow it by (--program-memory)
MEMORY_EVERY_ENV = "RLCLI_MEMORY_EVERY_S"  # seconds between the engine's heap trims (default 60)
WARMUP_FILE_ENV = "RLCLI_WARMUP_FILE"  # where the engine records the batch shapes it served
TENANTS_FILE_ENV = "RLCLI_TENANTS_FILE"  # the tenants' key hashes (rlcli/tenants.py writes it)
TENANTS_INTERNAL_ENV = "RLCLI_TENANTS_INTERNAL"  # hash of the one-start key `serve start` proves readiness with
INTERNAL_TENANT = "_rlcli"  # that key's tenant; no user name can take it (names start with a letter or digit)
DISTRIBUTED_ENV = "RLCLI_DISTRIBUTED"  # set where rlcli's launcher brought jax's multi-process runtime up

# Routes rlcli adds to SkyRL's API, and the session tag of `serve start`'s readiness probe.
CAPABILITIES_ROUTE = "/api/v1/rlcli/capabilities"
FORGET_ROUTE = "/api/v1/rlcli/forget_readiness_models"
ENGINE_ROUTE = "/api/v1/rlcli/engine"  # the engine process's heartbeat: its pid, seconds since its last beat
TAGGED_MODELS_ROUTE = "/api/v1/rlcli/tagged_models"  # the models of the sessions with one tag that may hold a slot
READINESS_TAG = "rlcli-readiness"

# Files in the server's state folder (its working directory) and in the server venv.
OWNERS_FILE = "tenant-owners.jsonl"  # which tenant created each id
HEARTBEAT_FILE = "rlcli-engine-heartbeat"  # the engine process touches it every second (rlcli_liveness)
WORKER_HEARTBEAT = "rlcli-worker-{}-heartbeat"  # a local jax worker's (its process id), likewise
LOCAL_WORKER_ENV = "RLCLI_LOCAL_WORKER"  # set for the jax workers the supervisor starts in the server's folder
RAY_REPORT = "rlcli-ray-actors.json"  # what the Ray actors loaded, for the capabilities route
PEFT_RECORD = "rlcli-peft-lora-config.json"  # peft's LoraConfig as recorded for the torch-free engine (sys.prefix)

# SkyRL 0.4.0's messages, as the tinker client passes them on inside its exceptions' text.
NO_FREE_SLOT = "Maximum number of LoRA adapters"  # create_model when every jax LoRA slot is taken
NOT_LOADED = "not loaded"  # sampling from a sampler checkpoint whose model was unloaded

# What the preloaded engine imports before it reads its flags (benchmarks/engine_imports.py times the same).
PRELOAD_MODULES = ("skyrl.tinker.engine", "skyrl.backends.jax")

# The server log's line that says what the engine's warm-up did at its start (`serve status` reads it).
WARMED = "[rlcli warmup] warmed"
