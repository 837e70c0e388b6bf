"""Every name in SkyRL, jax, tinker and tinker-cookbook that rlcli overrides or relies on, in one list (stdlib imports).

Imported as `manifest` by the server's processes, which call `check(where)` at start (a version other than PINS or
a moved target stops the process with one line), and as `rlcli.server.runtime.manifest` by the client (hooks.py's
PINS and PATCHES; `rlcli doctor --manifest`).
"""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata
from typing import NamedTuple

VERSION = "2.0"  # rlcli's server runtime; the processes of one server compare it (with their settings)
PINS = {"skyrl": "==0.4.0", "jax": "==0.12.*", "tinker": ">=0.38,<0.39", "tinker-cookbook": "==0.5.8"}
SERVER_PINS = ("skyrl", "jax")
# The tinker SDKs rlcli's server answers (rlcli_sdk; tests/integration/test_sdk_compat.py runs the oldest and newest).
SERVED_SDKS = ">=0.25,<0.39"
OVERRIDE, REBINDING, RELIED = "subclass override", "rebinding", "relied on"
API, ENGINE, JAX, RAY, WORKER, CLIENT = "api", "engine", "jax", "ray", "worker", "client"
UP, OWN, SEAM = "upstream: docs/upstream/", "rlcli's own (stays)", "when no backend override is left"


class Entry(NamedTuple):
    target: str  # "module:dotted.name"
    why: str  # the feature that owns it, in a few words
    kind: str
    where: str  # the process that checks it
    goes: str = ""  # a SkyRL release, or the upstream description whose acceptance makes it unnecessary
    check: tuple = ()  # () resolves; ("fields"|"calls"|"param"|"holds", *names); ("by", who): checked where it acts

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def name(self) -> str:
        return self.target.partition(":")[2]


def _entries(kind: str, where: str, rows: tuple) -> tuple[Entry, ...]:
    return tuple(Entry(target, why, kind, where, goes, tuple(check)) for target, why, goes, *check in rows)


TE, JB, JI = "skyrl.tinker.engine:TinkerEngine.", "skyrl.backends.jax:JaxBackend.", "skyrl.backends.jax:JaxBackendImpl."
RJ, TA, LOOK = "skyrl.backends.ray_jax:", "skyrl.tinker.api:", UP + "request-path-queries.md"
ENTRIES = _entries(OVERRIDE, ENGINE, (  # rlcli_engine.RlcliEngine, FairEngine
    (TE + "__init__", "samplers: a start deletes snapshots an earlier server left", UP + "sampler-snapshots.md",
     "calls", "get_backend_classes"),
    (TE + "run", "warmup: the recorded batch shapes replayed before serving", OWN),
    (TE + "process_pending_requests", "wake: wait for the API's ring, not 100 ms; futures: the pruner after a look; "
     "memory: the heap trimmed after the first look and then once a minute, each with a line of RSS and jax arrays; "
     "past --program-memory, jax's in-memory program caches cleared (jax.clear_caches, a public API)",
     UP + "polling-sleeps.md"),
    (TE + "_complete_futures", "wake: small results ride the ring before the commit", UP + "polling-sleeps.md"),
    (TE + "process_pending_requests_once", "look: pending types first; tenants: a pass's deferrals", LOOK,
     "calls", "find_batchable_model_passes", "find_batchable_sample", "find_single_requests"),
    (TE + "find_batchable_model_passes", "look; tenants", LOOK, "calls", "_load_requests",
     "_find_destructive_barriers"),
    (TE + "find_batchable_sample", "look", LOOK),
    (TE + "find_single_requests", "look; tenants", LOOK, "calls", "_load_requests", "_find_destructive_barriers"),
    (TE + "_find_destructive_barriers", "look: no barrier query when none can be pending", LOOK),
    (TE + "_load_requests", "tenants: each pass takes work round-robin between tenants", OWN),
    (TE + "_filter_valid_requests", "samplers: a deleted snapshot's sample is refused", UP + "sampler-snapshots.md"),
    (TE + "process_single_request", "samplers: deleted snapshots' rows go first; slots: a load into a model "
     "whose creation failed says why", UP + "sampler-snapshots.md"),
)) + _entries(OVERRIDE, JAX, (  # rlcli_backend: every jax process (impl), process 0 (JaxBackend)
    (JI + "create_model", "slots: the accumulator zeroed; one optimizer transform; a full table's message",
     UP + "slot-gradients.md, optimizer-transform.md"),
    (JI + "delete_model", "samplers: a model's snapshots go with it", UP + "sampler-snapshots.md"),
    (JI + "forward_backward", "warmup: records the batch shape", OWN),
    (JI + "forward", "warmup: records the batch shape", OWN),
    (JI + "optim_step", "samplers: the slot's checkpoint mark cleared", UP + "sampler-checkpoint-slot.md"),
    (JI + "load_checkpoint", "samplers: the slot's checkpoint mark cleared", UP + "sampler-checkpoint-slot.md"),
    (JI + "sample", "samplers: borrowed slot; warmup: padded sizes; mesh: the fsdp axis",
     UP + "sampler-checkpoint-slot.md, sampling-batch-mesh.md"),
    (JI + "save_sampler_checkpoint", "samplers: the mark; unnamed snapshots make room", UP + "sampler-snapshots.md",
     "param", "persist"),
    (JB + "delete_model", "mesh: broadcast to every process", UP + "delete-model-broadcast.md"),
    (JB + "save_sampler_checkpoint", "samplers: room made before SkyRL's probe file", UP + "sampler-snapshots.md"),
)) + _entries(OVERRIDE, RAY, (  # ray_actors.backend_class: the engine's proxy
    (RJ + "RayJaxBackend.__init__", "ray: every actor runs what the engine does", OWN),
    (RJ + "RayJaxBackend.save_sampler_checkpoint", "samplers: the engine's snapshot book", UP + "sampler-snapshots.md"),
    (RJ + "RayJaxBackend.delete_model", "samplers: the engine's snapshot book", UP + "sampler-snapshots.md"),
)) + _entries(REBINDING, ENGINE, (
    ("skyrl.tinker.engine:get_backend_classes", "the backend table hands out rlcli's backend classes", SEAM),
    ("skyrl.utils.log:RichHandler", "wake: SkyRL's rich log handler swapped for a plain one",
     UP + "rich-log-on-request-path.md"),
)) + _entries(REBINDING, JAX, (
    ("skyrl.tx.layers.lora:LoRAMixin.apply_lora", "lora: each sequence its own adapter", UP + "lora-per-sequence.md"),
    ("skyrl.tx.utils.generator:GeneratorMixin._prefill_and_decode", "decode: a greedy batch draws no sample",
     UP + "greedy-decode.md", "holds", "self._prefill_and_decode(", "prompt_logprobs=prompt_logprobs,",
     "end_positions = jnp.where(has_stop, stop_pos, max_tokens)"),
    ("skyrl.tinker.loss_fns:LOSS_FUNCTIONS", "gspo appended to the jax loss registry", UP + "jax-gspo.md",
     "by", "rlcli_losses: the stock registry, the backend's own objects"),
    ("skyrl.tinker.types:LOSS_TYPES", "gspo's index in the jax loss registry", UP + "jax-gspo.md", "by",
     "rlcli_losses"),
    ("transformers.utils.import_utils:is_torch_available", "no-torch: the jax engine imports without torch",
     UP + "engine-imports-torch.md", "by", "rlcli_no_torch's one-shot import hook"),
    ("skyrl.tx.utils.models:peft", "no-torch: a recorded stand-in for peft's LoraConfig",
     UP + "engine-imports-torch.md", "by", "rlcli_no_torch.check_peft_uses at install"),
    ("jax:distributed.initialize", "mesh: rlcli brings jax's runtime up first, bound where the user said", OWN),
    ("sys:modules['torch']", "lazy torch (API), no-torch (jax engine): a stand-in imports torch on first use",
     UP + "engine-imports-torch.md", "by", "rlcli_lazy_torch.defer"),
)) + _entries(REBINDING, WORKER, (
    ("skyrl.backends.jax:JaxBackendImpl", "workers build rlcli's impl (run_worker looks it up by name)", SEAM),
    ("jax._src.compiler:_cache_write", "mesh: a worker writes its own compilation cache entries",
     "a jax that writes cache entries from every process"),
)) + _entries(REBINDING, RAY, (
    (RJ + "JaxBackendImpl", "ray: the actors build rlcli's impl (their setup looks it up by name)", SEAM,
     "holds", "self.backend = JaxBackendImpl(", "jax.distributed.initialize("),
)) + _entries(REBINDING, API, (  # rlcli_api, rlcli_wake, rlcli_tenants: SkyRL's API is functions and an app
    (TA + "_build_uv_run_cmd_engine", "launcher: the engine runs through the venv's Python", UP + "engine-command.md"),
    (TA + "poll_futures", "wake: the poller waits for the engine's ring", UP + "polling-sleeps.md"),
    (TA + "wait_for_future", "wake: results rung before their retrieve_future", UP + "polling-sleeps.md"),
    (TA + "create_future", "wake: a future filed in one statement", LOOK),
    (TA + "get_model", "wake: a known model's row is not read again", LOOK),
    (TA + "app", "routes /api/v1/rlcli/* (the engine's heartbeat among them); the tenant gate and the body cap "
     "wrap it (add_middleware)", OWN),
    (TA + "asample", "sdk: its route's future carries sample_sequence_ids (tinker >= 0.26)",
     UP + "sample-sequence-ids.md", "param", "request", "req", "session"),
    (TA + "load_weights", "sdk: a load naming a session, not a model, creates it (tinker 0.38)",
     UP + "create-by-load.md", "param", "request", "req", "session"),
    (TA + "retrieve_future", "guards: a request_id that is no 64-bit integer is a 422, not a 500; wake: waits by "
     "its module global", UP + "int64-inputs.md", "calls", "wait_for_future"),
    (TA + "create_sampling_session", "guards: a model_path that is no tinker path is a 422, not a later 500",
     UP + "int64-inputs.md", "param", "request", "session"),
    (TA + "list_training_runs", "guards: a limit or offset past 64 bits is a 422, not a 500", UP + "int64-inputs.md",
     "param", "limit", "offset", "session"),
)) + _entries(RELIED, ENGINE, (
    ("skyrl.tinker.engine:FutureDB", "wake: the rows _complete_futures writes", "", "fields", "request_id",
     "request_type", "model_id", "request_data", "status", "result_data", "completed_at"),
    ("skyrl.tinker.engine:update", "wake: the rows' one bulk UPDATE", ""),
    ("skyrl.tinker.engine:Session", "wake: the rows' commit", ""),
    ("skyrl.tinker.engine:datetime", "wake: completed_at as SkyRL writes it", ""),
    (TE + "process_single_requests", "samplers: single requests run one by one", "", "calls", "process_single_request"),
    ("skyrl.tinker.db_models:CheckpointDB", "samplers: a deleted snapshot's row", "", "fields", "model_id",
     "checkpoint_id", "checkpoint_type"),
    ("skyrl.tinker.types:SampleInput", "samplers: the refusal", "", "fields", "checkpoint_id"),
    ("skyrl.tinker.db_models:FutureDB", "futures: the rows the pruner deletes", "", "fields", "request_id",
     "status", "completed_at"),
    ("skyrl.tinker.db_models:RequestStatus.PENDING", "futures: a pending row is never deleted", ""),
)) + _entries(RELIED, JAX, (
    (JB + "_broadcast_and_call", "mesh: delete_model's broadcast", ""),
    ("skyrl.backends.jax:AccumulatedGradients.reset_adapter", "slots", ""),
    ("skyrl.backends.jax:JaxBackendConfig", "warmup, mesh: the user's sampling cap", "", "fields",
     "sample_max_num_sequences", "max_lora_adapters"),
    ("skyrl.tinker.types:ModelMetadata", "samplers: the slot's mark", "", "fields", "loaded_checkpoint_id",
     "adapter_index"),
    ("skyrl.tinker.types:PreparedSampleBatch", "samplers, warmup: per-sequence lists", "", "fields", "all_model_ids",
     "all_checkpoint_ids", "all_checkpoint_paths", "all_model_inputs"),
    ("skyrl.tinker.types:PreparedModelPassBatch", "warmup: the replayed batches", ""),
    ("skyrl.tx.utils.models:extract_adapter_state", "samplers: a slot set aside", ""),
    ("skyrl.tx.utils.models:insert_adapter_state", "samplers: a slot put back", ""),
    ("skyrl.tx.utils.models:round_up_seq_len", "warmup: the padded length; decode: the max_tokens bucket", ""),
    ("skyrl.tx.layers.lora:LoRAMixin._apply_lora_weight", "lora: the contraction it steps aside from", ""),
    ("skyrl.tx.layers.lora:LoRAEmbed._apply_lora_weight", "lora: the embedding's contraction", ""),
    ("skyrl.tx.utils.generator:DecodeState", "decode: the loop's state", "", "fields", "kv_cache", "rngs",
     "attention_mask", "last_positions", "logits", "stop_pos", "step", "generated_tokens", "generated_logprobs"),
    ("skyrl.tx.utils.generator:KVCache.pad_to_length", "decode: the prompt's cache padded to max_length", ""),
    ("skyrl.tx.utils.generator:apply_top_k_batch", "decode: a drawn batch's top-k", "", "param", "max_k"),
    ("skyrl.tx.utils.generator:apply_top_p_batch", "decode: a drawn batch's top-p", "", "param", "p_values"),
    ("jax._src.distributed:global_state", "mesh: the processes compare what they run in its key-value store", ""),
)) + _entries(RELIED, WORKER, (
    ("skyrl.backends.jax:run_worker", "workers: the module global above", "", "calls", "JaxBackendImpl"),
    ("jax._src.compilation_cache:put_executable_and_time", "mesh: the worker's cache write", ""),
)) + _entries(RELIED, RAY, (
    (RJ + "RayJaxBackendImpl", "ray: the actors' __ray_call__ answers what they run", ""),
)) + _entries(RELIED, API, (
    (TA + "lifespan", "wake: starts the poller by its module global", "", "calls", "poll_futures"),
    (TA + "forward_backward", "wake: files by the module global; drops get_model's row", "", "calls", "create_future",
     "get_model"),
    (TA + "optim_step", "wake: drops get_model's row (server_checks reads its bytecode)", "", "calls", "get_model"),
    (TA + "TERMINAL_STATUSES", "wake: the poller's database read", ""),
    (TA + "ForwardBackwardInput._ALLOWED_KEYS_BY_LOSS_FN", "gspo: the API accepts it and its clip keys", ""),
    ("skyrl.tinker.proto_serialization:parse_forward_backward_request", "tenants: the gate reads protobuf bodies", ""),
    ("skyrl.tinker.db_models:SessionDB", "readiness probes forgotten", "", "fields", "tags"),
    ("skyrl.tinker.db_models:ModelDB", "readiness probes; tenants' quotas; sdk: the row a load creates", "", "fields",
     "model_id", "session_id", "status", "base_model", "lora_config", "request_id"),
    (TA + "FutureResponse", "sdk: the future both routes answer, with their fields added", "", "fields", "future_id",
     "request_id"),
    (TA + "SampleRequest", "sdk: one sequence id per requested sample", "", "fields", "num_samples"),
    (TA + "LoadWeightsRequest", "sdk: a load naming its model goes to SkyRL's handler", "", "fields", "model_id",
     "path", "optimizer", "seq_id"),
    (TA + "get_session", "sdk: the routes' database session", ""),
    (TA + "validate_checkpoint", "sdk: the checkpoint a load creates a model from", ""),
    (TA + "ID_MAX_LENGTH", "sdk: the checkpoint routes naming a model ({unique_id}) served again for a created id", ""),
    ("skyrl.tinker.config:config_to_argv", "launcher: the engine's flags", ""),
    ("skyrl.backends.renderer:render_model_input", "lazy torch: torch only inside the renderer's functions",
     UP + "engine-imports-torch.md", "by", "tests/integration/server_checks.py"),
))
# The tinker client and tinker-cookbook (rlcli/train/hooks.py): each hook replaces one name for a `with` block (or a
# client object's life) and puts it back; "holds": texts the module's source must hold for the hook to work.
T, TP, TS, CU = ("tinker:TrainingClient.", "tinker.lib.public_interfaces.", "tinker_cookbook.supervised.train:",
                 "tinker_cookbook.utils.ml_log:")
CP = "tinker_cookbook.capture.proxy.app:"
COOKBOOK = "hosted Tinker's client and recipes, fitted to SkyRL (docs/decisions.md): when SkyRL answers as hosted"
HOOKS = tuple(Entry(target, why, REBINDING, CLIENT, COOKBOOK, ("holds", *texts) if texts else ())
              for target, why, *texts in (
    (T + "__init__", "on_training_client: slot records, loss route, step statistics"),
    (T + "forward_backward", "replace_forward_backward: the loss route (per client)"),
    (T + "forward_backward_async", "replace/watch_forward_backward (per client)"),
    (TP + "service_client:ServiceClient._create_lora_training_client_submit", "seeded_lora: the seed of a new LoRA",
     "seed=seed,"),
    (TP + "sampling_client:SamplingClient.__init__", "seeded_sampling: the order sampling clients are made in"),
    (TP + "sampling_client:SamplingClient.sample", "seeded_sampling: every sample call (sample_async goes through "
     "it)", "        return await self.sample("),
    ("tinker_cookbook.checkpoint_utils:CheckpointManager.maybe_save_async",
     "sl_checkpoints_name_the_next_batch: the SL recipe's periodic saves"),
    ("tinker_cookbook.checkpoint_utils:save_checkpoint_async", "failed_saves: every save, recorded after the server "
     "confirmed it; kept_checkpoints (rlcli/train/retention.py): the older ones deleted after it",
     "await v.result_async() for k, v in futures.items()", "save_checkpoint_async(\n"),
    (T + "save_weights_and_get_sampling_client_async", "failed_saves: the RL loop's sampler weights before each step"),
    (TS + "Config.submit_ahead", "rlcli runs SL with submit_ahead=0", '"batch": submitted.batch_idx,',
     "checkpoint_mgr.maybe_save_async(", "start_batch = resume_info.batch"),
    ("tinker_cookbook.rl.train:tqdm", "quiet_rl_sampling", "tqdm(total="),
    ("tinker_cookbook.rl.train:RLTestSetEvaluator", "capped_evaluation: main builds the held-out evaluator by this "
     "name", "RLTestSetEvaluator(\n"),
    ("tinker_cookbook.rl.train:main", "the RL loop submits through forward_backward_async and logs one row per step "
     "with progress/batch", "training_client.forward_backward_async(", '"progress/batch"'),
    ("tinker:SamplingClient.compute_logprobs_async", "hosted_prompt_logprobs: pads SkyRL's N-1 answer"),
    ("tinker_cookbook.distillation.train_on_policy:incorporate_kl_penalty", "hosted_prompt_logprobs: the teacher KL "
     "slices the hosted shape", "teacher_logprobs[1:]", "compute_logprobs_async("),
    ("tinker_cookbook.rl.metrics:incorporate_kl_penalty", "hosted_prompt_logprobs: the KL penalty slices the hosted "
     "shape", "base_logprobs[1:]", "compute_logprobs_async("),
    ("tinker_cookbook.distillation.train_on_policy:do_sync_training", "rlcli's distill loop hands it the teacher "
     "clients and logs one row per step with progress/batch", "teacher_clients", '"progress/batch"', "train_step("),
    ("tinker_cookbook.rl.train:_remove_mask", "response_weights: the mask becomes weights", "_remove_mask(d) for d in"),
    (TS + "main", "the SL loop logs train_mean_nll per step; its test NLL goes through compute_logprobs_async",
     "train_mean_nll=", "SamplerNLLEvaluator.from_dataset("),
    (CU + "setup_logging", "cookbook_logging: joins its MultiplexLogger", "configure_logging_module("),
    (CU + "MultiplexLogger", "cookbook_logging appends to its loggers", "self.loggers = loggers"),
    (CU + "configure_logging_module", "cookbook_logging: console to warnings"),
    (T + "forward_backward_custom", "exact_custom_losses: the gradient SkyRL's jax reduction applies exactly"),
)) + _entries(RELIED, CLIENT, (  # what the hooks call instead of the _async methods tinker 0.38 deprecates
    ("tinker:SamplingClient.compute_logprobs", "hosted_prompt_logprobs: the answer it pads", ""),
    ("tinker:TrainingClient.save_weights_and_get_sampling_client", "failed_saves: the save it watches", ""),
    ("tinker:RestClient.delete_checkpoint_from_tinker_path", "kept_checkpoints: a run's older checkpoints deleted "
     "as `rlcli checkpoint delete` does", ""),
    ("tinker_cookbook.supervised.nll_evaluator:SamplerNLLEvaluator._compute_logprobs", "hosted_prompt_logprobs: the "
     "SL recipe's test NLL slices the hosted shape", "", "holds", "logprobs[1:]", "compute_logprobs_async("),
    ("tinker_cookbook.preference.train_dpo:do_update", "exact_custom_losses, hosted_prompt_logprobs: the DPO "
     "recipe's loss and its reference logprobs", "", "holds", "forward_backward_custom(data, dpo_loss_fn)",
     "logprobs[1:]", "compute_logprobs_async("),
)) + _entries(RELIED, CLIENT, (  # rlcli/endpoint: the capture proxy composed through its seams
    (CP + "make_app", "endpoint: the app rlcli adds routes and middleware to", "", "param", "auth_token"),
    (CP + "ProxyDeps", "endpoint: its renderer and sampling client are rlcli's", "", "fields", "renderer",
     "sampling_client", "model_label", "default_max_tokens"),
    (CP + "_complete", "endpoint: the one sample call per choice goes to the sampling client it is given, and string "
     "stops are the renderer's plus the client's", "", "holds", "deps.sampling_client.sample_async(",
     "isinstance(stop[0], str)"),
    ("tinker_cookbook.capture:capture", "endpoint: the exchange id in every token row's scope", ""),
    ("tinker_cookbook.capture:instrument_tinker", "endpoint: token rows of every sample", ""),
    ("tinker_cookbook.capture.exporter:CaptureExporter", "endpoint: exchanges and feedback to the store", "", "holds",
     "def enqueue(", "def force_flush(", "def shutdown("),
    ("tinker_cookbook.capture.store.client:StoreSink", "endpoint: the exporter's sink", ""),
    ("tinker_cookbook.capture.store.client:ensure_daemon", "endpoint: the store's URL", "", "param",
     "idle_shutdown_minutes"),
    ("tinker_cookbook.capture.store.db:CaptureDB.query_annotations", "the loop's drain reads the store's file", "",
     "param", "run_id", "cursor", "limit"),
    ("tinker_cookbook.capture.store.daemon:main", "endpoint: the store daemon started as its child", "", "holds",
     '"--data-dir"'),
    ("aiohttp.web_request:BaseRequest.clone", "endpoint: n choices, each a clone given the body with n removed",
     "", "holds", "self._read_bytes"),
))
ENTRIES += HOOKS + (Entry("transformers.models.auto.auto_factory:add_generation_mixin_to_remote_model",
                          "lean_imports: auto_factory imports without transformers' generation module", REBINDING,
                          CLIENT, "a transformers whose auto_factory imports GenerationMixin lazily",
                          ("by", "rlcli.lean_imports.applies (its source, at import)")),)


def overridden() -> list[str]:
    """The names rlcli replaces in other people's code (subclass overrides and rebindings), each once."""
    return sorted({e.target for e in ENTRIES if e.kind != RELIED})


def satisfies(version: str, spec: str) -> bool:
    """`version` meets the pip specifier `spec` (packaging is in both venvs: pip's and transformers' own)."""
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(spec)


def version_drift(packages=SERVER_PINS) -> list[str]:
    drift = []
    for package in packages:
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            found = "none"
        if found == "none" or not satisfies(found, PINS[package]):
            drift.append(f"{package} {found} (rlcli expects {package}{PINS[package]})")
    return drift


def problems(where: set[str]) -> list[str]:
    """What no longer fits among the entries these processes check: a target that is gone, or a check it fails."""
    found = []
    for entry in (e for e in ENTRIES if e.where in where and e.check[:1] != ("by",)):  # "by": where it acts
        try:
            target = resolve(entry.target)
        except (ImportError, AttributeError):
            found.append(f"{entry.target} is gone ({entry.why})")
            continue
        kind, *names = entry.check or ("",)
        found += [f"{entry.target} no longer {kind} {name!r} ({entry.why})" for name in names
                  if not _holds(kind, target, entry.module, name)]
    return found


def resolve(target: str):
    module, _, dotted = target.partition(":")
    found = importlib.import_module(module)
    for part in dotted.split(".") if dotted else ():
        found = getattr(found, part)
    return found


def _holds(kind: str, target, module: str, name: str) -> bool:
    if kind == "fields":
        return name in getattr(target, "model_fields", {}) or name in getattr(target, "__dataclass_fields__", {})
    if kind == "calls":
        return name in getattr(inspect.unwrap(target), "__code__", compile("", "", "exec")).co_names
    if kind == "param":
        return name in inspect.signature(target).parameters
    if kind == "holds":
        return name in inspect.getsource(importlib.import_module(module))
    return True


def check(where: set[str]) -> None:
    """At a server process's start: SkyRL and jax as pinned, every target there. SystemExit with one line if not."""
    drift = version_drift()
    if drift:
        raise SystemExit(f"rlcli's server runtime {VERSION} does not fit this server venv: {'; '.join(drift)}: "
                         "rebuild it with `rlcli serve install`")
    found = problems(where)
    if found:
        raise SystemExit(f"rlcli's server runtime {VERSION} does not fit this SkyRL: {'; '.join(found)}: "
                         "rebuild the server venv with `rlcli serve install`")
