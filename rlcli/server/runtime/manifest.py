"""Every name in SkyRL, jax, tinker and tinker-cookbook that rlcli overrides or relies on, in one list.

Standard library only: the server's processes import it as `manifest` (the runtime folder), rlcli's client as
`rlcli.server.runtime.manifest` (train/hooks.py takes its PATCHES and PINS from here; `rlcli doctor --manifest`
prints it). Each entry names its target ("module:dotted.name"), what it is for, its kind, the process that checks
it (`where`), how (`check`), and when it can go. Every server process that changes SkyRL calls `check(where, ...)` at
start: a version other than PINS, or a target that moved, stops it with one line naming what was expected.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import re
from importlib import metadata
from typing import NamedTuple

VERSION = "2.0"  # rlcli's server runtime; the processes of one server compare it (with their settings)
PINS = {"skyrl": "==0.4.0", "jax": "==0.12.*", "tinker": ">=0.25,<0.26", "tinker-cookbook": "==0.5.5"}
SERVER_PINS = ("skyrl", "jax")
OVERRIDE, REBINDING, RELIED = "subclass override", "rebinding", "relied on"
API, ENGINE, JAX, RAY, WORKER, CLIENT = "api", "engine", "jax", "ray", "worker", "client"
UP = "upstream: docs/upstream/"
OWN = "rlcli's own (stays)"


class Entry(NamedTuple):
    target: str  # "module:dotted.name"
    why: str  # the feature that owns it, in a few words
    kind: str
    where: str  # the process that checks it
    goes: str = ""  # when it can go: a SkyRL release, or the upstream description that would make it unnecessary
    check: tuple = ()  # () resolves; ("fields"|"calls"|"param"|"holds", *names); ("by", who) checked where it acts

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def name(self) -> str:
        return self.target.partition(":")[2]


E = Entry
SE, BE, RB = "skyrl.tinker.engine:TinkerEngine.", "skyrl.backends.jax:JaxBackendImpl.", "skyrl.backends.ray_jax:"
ENTRIES = (
    # --- the engine (rlcli_engine.RlcliEngine, FairEngine) -------------------------------------------------------
    E(SE + "__init__", "samplers: a start deletes snapshots an earlier server left", OVERRIDE, ENGINE,
      UP + "sampler-snapshots.md", ("calls", "get_backend_classes")),
    E(SE + "run", "warmup: replay recorded batch shapes before serving", OVERRIDE, ENGINE, OWN),
    E(SE + "process_pending_requests", "wake: wait for a ring, not 100 ms", OVERRIDE, ENGINE, UP + "polling-sleeps.md"),
    E(SE + "_complete_futures", "wake: small results ride the ring before the commit", OVERRIDE, ENGINE,
      UP + "polling-sleeps.md"),
    E(SE + "process_pending_requests_once", "look: pending types first; tenants: a pass's deferrals", OVERRIDE,
      ENGINE, UP + "request-path-queries.md",
      ("calls", "find_batchable_model_passes", "find_batchable_sample", "find_single_requests")),
    E(SE + "find_batchable_model_passes", "look; tenants (round-robin)", OVERRIDE, ENGINE,
      UP + "request-path-queries.md", ("calls", "_load_requests", "_find_destructive_barriers")),
    E(SE + "find_batchable_sample", "look", OVERRIDE, ENGINE, UP + "request-path-queries.md"),
    E(SE + "find_single_requests", "look; tenants (round-robin)", OVERRIDE, ENGINE, UP + "request-path-queries.md",
      ("calls", "_load_requests", "_find_destructive_barriers")),
    E(SE + "_find_destructive_barriers", "look: no barrier query when none can be pending", OVERRIDE, ENGINE,
      UP + "request-path-queries.md"),
    E(SE + "_load_requests", "tenants: each pass takes work round-robin between tenants", OVERRIDE, ENGINE, OWN),
    E(SE + "_filter_valid_requests", "samplers: a deleted snapshot's sample is refused in one line", OVERRIDE,
      ENGINE, UP + "sampler-snapshots.md"),
    E(SE + "process_single_request", "samplers: deleted snapshots' rows go before the future completes",
      OVERRIDE, ENGINE, UP + "sampler-snapshots.md"),
    E("skyrl.tinker.engine:get_backend_classes", "the backend table hands out rlcli's backend classes", REBINDING,
      ENGINE, "when the last backend override has gone upstream"),
    E("skyrl.tinker.engine:FutureDB", "wake: the rows _complete_futures writes", RELIED, ENGINE, "",
      ("fields", "request_id", "request_type", "model_id", "request_data", "status", "result_data", "completed_at")),
    E("skyrl.tinker.engine:update", "wake: the rows' one bulk UPDATE", RELIED, ENGINE),
    E("skyrl.tinker.engine:Session", "wake: the rows' commit", RELIED, ENGINE),
    E("skyrl.tinker.engine:datetime", "wake: completed_at as SkyRL writes it", RELIED, ENGINE),
    E(SE + "process_single_requests", "samplers: single requests run one by one", RELIED, ENGINE, "",
      ("calls", "process_single_request")),
    E("skyrl.tinker.db_models:CheckpointDB", "samplers: a deleted snapshot's row", RELIED, ENGINE, "",
      ("fields", "model_id", "checkpoint_id", "checkpoint_type")),
    E("skyrl.tinker.types:SampleInput", "samplers: the refusal", RELIED, ENGINE, "", ("fields", "checkpoint_id")),
    # --- every jax process (rlcli_backend) ---------------------------------------------------------------------
    E(BE + "create_model", "slots: a new model's gradient accumulator is zeroed; one optimizer transform; "
      "a full table's message", OVERRIDE, JAX, UP + "slot-gradients.md"),
    E(BE + "delete_model", "samplers: a model's snapshots go with it", OVERRIDE, JAX, UP + "sampler-snapshots.md"),
    E(BE + "forward_backward", "warmup: records the batch shape", OVERRIDE, JAX, OWN),
    E(BE + "forward", "warmup: records the batch shape", OVERRIDE, JAX, OWN),
    E(BE + "optim_step", "samplers: the slot's checkpoint mark is cleared", OVERRIDE, JAX,
      UP + "sampler-checkpoint-slot.md"),
    E(BE + "load_checkpoint", "samplers: the slot's checkpoint mark is cleared", OVERRIDE, JAX,
      UP + "sampler-checkpoint-slot.md"),
    E(BE + "sample", "samplers: borrowed slot; warmup: padded sizes; mesh: padded to the fsdp axis", OVERRIDE, JAX,
      UP + "sampler-checkpoint-slot.md, sampling-batch-mesh.md"),
    E(BE + "save_sampler_checkpoint", "samplers: the mark; unnamed snapshots make room first", OVERRIDE, JAX,
      UP + "sampler-snapshots.md", ("param", "persist")),
    E("skyrl.backends.jax:JaxBackend.delete_model", "mesh: broadcast to every process", OVERRIDE, JAX,
      UP + "delete-model-broadcast.md"),
    E("skyrl.backends.jax:JaxBackend.save_sampler_checkpoint", "samplers: room made before SkyRL's probe file",
      OVERRIDE, JAX, UP + "sampler-snapshots.md"),
    E("skyrl.backends.jax:JaxBackendImpl", "workers build rlcli's impl (run_worker looks it up by name)", REBINDING,
      WORKER, "when the last backend override has gone upstream"),
    E("skyrl.backends.jax:run_worker", "workers: the module global above", RELIED, WORKER, "",
      ("calls", "JaxBackendImpl")),
    E("skyrl.backends.jax:JaxBackend._broadcast_and_call", "mesh: delete_model's broadcast", RELIED, JAX),
    E("skyrl.backends.jax:AccumulatedGradients.reset_adapter", "slots", RELIED, JAX),
    E("skyrl.backends.jax:JaxBackendConfig", "warmup, mesh: the user's sampling cap", RELIED, JAX, "",
      ("fields", "sample_max_num_sequences", "max_lora_adapters")),
    E("skyrl.tinker.types:ModelMetadata", "samplers: the slot's mark", RELIED, JAX, "",
      ("fields", "loaded_checkpoint_id", "adapter_index")),
    E("skyrl.tinker.types:PreparedSampleBatch", "samplers, warmup: per-sequence lists", RELIED, JAX, "",
      ("fields", "all_model_ids", "all_checkpoint_ids", "all_checkpoint_paths", "all_model_inputs")),
    E("skyrl.tinker.types:PreparedModelPassBatch", "warmup: the replayed batches", RELIED, JAX),
    E("skyrl.tx.utils.models:extract_adapter_state", "samplers: a slot set aside", RELIED, JAX),
    E("skyrl.tx.utils.models:insert_adapter_state", "samplers: a slot put back", RELIED, JAX),
    E("skyrl.tx.utils.models:round_up_seq_len", "warmup: the padded length", RELIED, JAX),
    E("skyrl.tx.layers.lora:LoRAMixin.apply_lora", "lora: each sequence with its own adapter", REBINDING, JAX,
      UP + "lora-per-sequence.md"),
    E("skyrl.tx.layers.lora:LoRAMixin._apply_lora_weight", "lora: the stock contraction it steps aside for",
      RELIED, JAX),
    E("skyrl.tx.layers.lora:LoRAEmbed._apply_lora_weight", "lora: the embedding's contraction", RELIED, JAX),
    E("skyrl.tinker.loss_fns:LOSS_FUNCTIONS", "gspo appended to the jax loss registry", REBINDING, JAX,
      UP + "jax-gspo.md", ("by", "rlcli_losses: identities, index and a run through lax.switch")),
    E("skyrl.tinker.types:LOSS_TYPES", "gspo's index in the jax loss registry", REBINDING, JAX, UP + "jax-gspo.md",
      ("by", "rlcli_losses")),
    E("transformers.utils.import_utils:is_torch_available", "no-torch: the jax engine imports without torch",
      REBINDING, JAX, UP + "engine-imports-torch.md", ("by", "rlcli_no_torch's one-shot import hook")),
    E("skyrl.tx.utils.models:peft", "no-torch: a recorded stand-in for peft's LoraConfig", REBINDING, JAX,
      UP + "engine-imports-torch.md", ("by", "rlcli_no_torch.check_peft_uses at install")),
    E("jax:distributed.initialize", "mesh: rlcli brings jax's runtime up first, bound where the user said",
      REBINDING, JAX, OWN),
    E("jax._src.compiler:_cache_write", "mesh: a worker writes its own compilation cache entries", REBINDING,
      WORKER, "a jax that writes cache entries from every process"),
    E("jax._src.compilation_cache:put_executable_and_time", "mesh: the worker's cache write", RELIED, WORKER),
    E("skyrl.utils.log:RichHandler", "wake: SkyRL's rich log handler swapped for a plain one", REBINDING, ENGINE,
      UP + "rich-log-on-request-path.md"),
    # --- the API process (rlcli_api, rlcli_wake, rlcli_tenants, rlcli_lazy_torch) ---------------------------------
    E("skyrl.tinker.api:_build_uv_run_cmd_engine", "launcher: the engine runs through the venv's Python",
      REBINDING, API, UP + "engine-command.md"),
    E("skyrl.tinker.api:poll_futures", "wake: the poller waits for the engine's ring", REBINDING, API,
      UP + "polling-sleeps.md"),
    E("skyrl.tinker.api:wait_for_future", "wake: results rung before their retrieve_future", REBINDING, API,
      UP + "polling-sleeps.md"),
    E("skyrl.tinker.api:create_future", "wake: a future filed in one statement", REBINDING, API,
      UP + "request-path-queries.md"),
    E("skyrl.tinker.api:get_model", "wake: a known model's row is not read again", REBINDING, API,
      UP + "request-path-queries.md"),
    E("skyrl.tinker.api:app", "routes /api/v1/rlcli/*; the tenant gate wraps it (add_middleware)", REBINDING, API,
      OWN),
    E("skyrl.tinker.api:lifespan", "wake: starts the poller by its module global", RELIED, API, "",
      ("calls", "poll_futures")),
    E("skyrl.tinker.api:retrieve_future", "wake: waits by its module global", RELIED, API, "",
      ("calls", "wait_for_future")),
    E("skyrl.tinker.api:forward_backward", "wake: files by the module global; drops get_model's row", RELIED, API,
      "", ("calls", "create_future", "get_model")),
    E("skyrl.tinker.api:optim_step", "wake: drops get_model's row", RELIED, API, "",
      ("by", "rlcli_wake.drops_get_model (bytecode)")),
    E("skyrl.tinker.api:TERMINAL_STATUSES", "wake: the poller's database read", RELIED, API),
    E("skyrl.tinker.api:ForwardBackwardInput._ALLOWED_KEYS_BY_LOSS_FN", "gspo: the API accepts it and its clip keys",
      RELIED, API),
    E("skyrl.tinker.proto_serialization:parse_forward_backward_request", "tenants: the gate reads protobuf bodies",
      RELIED, API),
    E("skyrl.tinker.db_models:SessionDB", "readiness probes forgotten", RELIED, API, "", ("fields", "tags")),
    E("skyrl.tinker.db_models:ModelDB", "readiness probes; tenants' quotas", RELIED, API, "",
      ("fields", "model_id", "session_id", "status")),
    E("skyrl.tinker.config:config_to_argv", "launcher: the engine's flags", RELIED, API),
    E("skyrl.backends.renderer:render_model_input", "lazy torch: torch only inside the renderer's functions", RELIED,
      API, UP + "engine-imports-torch.md", ("by", "tests/integration/server_checks.py")),
    # --- Ray (ray_actors) ---------------------------------------------------------------------------------------
    E(RB + "RayJaxBackend.__init__", "ray: every actor loaded what the engine did", OVERRIDE, RAY, OWN),
    E(RB + "RayJaxBackend.save_sampler_checkpoint", "samplers: the engine's book of snapshots", OVERRIDE, RAY,
      UP + "sampler-snapshots.md"),
    E(RB + "RayJaxBackend.delete_model", "samplers: the engine's book of snapshots", OVERRIDE, RAY,
      UP + "sampler-snapshots.md"),
    E(RB + "JaxBackendImpl", "ray: actors build rlcli's impl (setup looks it up by name)", REBINDING, RAY,
      "when the last backend override has gone upstream",
      ("holds", "self.backend = JaxBackendImpl(", "jax.distributed.initialize(")),
    E(RB + "RayJaxBackendImpl", "ray: the actors' __ray_call__ answers what they loaded", RELIED, RAY),
)
# The tinker client and tinker-cookbook (rlcli/train/hooks.py): each hook replaces one name for the length of a
# `with` block (or one client object's life) and puts it back; ("holds", ...) texts the module's source must hold.
T, TP, TS, CU = "tinker:TrainingClient.", "tinker.lib.public_interfaces.", "tinker_cookbook.supervised.train:", \
    "tinker_cookbook.utils.ml_log:"
COOKBOOK = "upstream: the cookbook and tinker are hosted Tinker's; each hook fits them to SkyRL (docs/decisions.md)"
HOOKS = tuple(E(target, why, REBINDING, CLIENT, COOKBOOK, ("holds", *texts) if texts else ())
              for target, why, *texts in (
    (T + "__init__", "on_training_client: slot records, loss route, step statistics"),
    (T + "forward_backward", "replace_forward_backward: the loss route (per client)"),
    (T + "forward_backward_async", "replace/watch_forward_backward (per client)"),
    (TP + "service_client:ServiceClient._create_lora_training_client_submit", "seeded_lora: the seed of a new LoRA",
     "seed=seed,"),
    (TP + "sampling_client:SamplingClient.__init__", "seeded_sampling: the order sampling clients are made in"),
    (TP + "sampling_client:SamplingClient.sample", "seeded_sampling: every sample call (sample_async goes through "
     "it)", "            self.sample("),
    ("tinker_cookbook.checkpoint_utils:CheckpointManager.maybe_save_async",
     "sl_checkpoints_name_the_next_batch: the SL recipe's periodic saves"),
    ("tinker_cookbook.checkpoint_utils:save_checkpoint_async", "failed_saves: every save, recorded after the server "
     "confirmed it", "await v.result_async() for k, v in futures.items()", "save_checkpoint_async(\n"),
    (T + "save_weights_and_get_sampling_client_async", "failed_saves: the RL loop's sampler weights before each step"),
    (TS + "Config.submit_ahead", "rlcli runs SL with submit_ahead=0", '"batch": submitted.batch_idx,',
     "checkpoint_mgr.maybe_save_async(", "start_batch = resume_info.batch"),
    ("tinker_cookbook.rl.train:tqdm", "quiet_rl_sampling", "tqdm(total="),
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
    (TS + "main", "the SL loop logs train_mean_nll per step", "train_mean_nll="),
    (CU + "setup_logging", "cookbook_logging: joins its MultiplexLogger", "configure_logging_module("),
    (CU + "MultiplexLogger", "cookbook_logging appends to its loggers", "self.loggers = loggers"),
    (CU + "configure_logging_module", "cookbook_logging: console to warnings"),
))
ENTRIES += HOOKS + (E("transformers.models.auto.auto_factory:add_generation_mixin_to_remote_model",
                      "lean_imports: auto_factory runs without transformers' generation module; this one function "
                      "imports it when called", REBINDING, CLIENT, "a transformers whose auto_factory imports "
                      "GenerationMixin lazily", ("by", "rlcli.lean_imports.applies (its source, at import)")),)


def overridden() -> list[str]:
    """The names rlcli replaces in other people's code (subclass overrides and rebindings), each once."""
    return sorted({e.target for e in ENTRIES if e.kind != RELIED})


def satisfies(version: str, spec: str) -> bool:
    """`version` meets a specifier of ==X (a glob: ==0.12.*), >=X and <X clauses, comma-separated."""
    def number(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text)[:3])

    for clause in spec.split(","):
        op, want = re.fullmatch(r"\s*(==|>=|<)\s*(\S+)\s*", clause).groups()
        ok = fnmatch.fnmatch(version, want) if op == "==" else (
            number(version) >= number(want) if op == ">=" else number(version) < number(want))
        if not ok:
            return False
    return True


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
    """What no longer fits among the entries checked in these processes: a target that is gone, or a check it fails."""
    found = []
    for entry in (e for e in ENTRIES if e.where in where):
        try:
            target = resolve(entry.target)
        except (ImportError, AttributeError):
            found.append(f"{entry.target} is gone ({entry.why})")
            continue
        kind, *names = entry.check or ("",)
        missing = [name for name in names if not _holds(kind, target, entry.module, name)]
        found += [f"{entry.target} no longer {kind} {name!r} ({entry.why})" for name in missing]
    return found


def resolve(target: str):
    module, _, dotted = target.partition(":")
    found = importlib.import_module(module)
    for part in dotted.split(".") if dotted else ():
        found = getattr(found, part)
    return found


def _holds(kind: str, target, module: str, name: str) -> bool:
    if kind == "fields":
        return name in getattr(target, "model_fields", {})
    if kind == "calls":
        return name in getattr(inspect.unwrap(target), "__code__", compile("", "", "exec")).co_names
    if kind == "param":
        return name in inspect.signature(target).parameters
    if kind == "holds":
        return name in inspect.getsource(importlib.import_module(module))
    return True  # ("by", who): checked where it acts


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


def lines() -> list[str]:
    """The manifest as `rlcli doctor --manifest` prints it."""
    out = [f"rlcli overrides {len(overridden())} names in SkyRL, jax, tinker and tinker-cookbook "
           f"({', '.join(f'{p}{s}' for p, s in PINS.items())}):"]
    for entry in ENTRIES:
        checked = " ".join(str(part) for part in entry.check) or "resolves"
        out.append(f"{entry.kind:<18} {entry.target}\n    for: {entry.why}\n    checked: {checked} "
                   f"({entry.where})" + (f"\n    goes: {entry.goes}" if entry.goes else ""))
    return out
