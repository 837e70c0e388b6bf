"""rlcli's hardware flags (--gpus, --nodes, --tp) and --slots as SkyRL backend config keys.

jax takes flat keys of its JaxBackendConfig; fsdp and megatron take SkyRL-Train's
dotted config paths. Keys given in --backend-config win over the mapped ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlcli.errors import UsageError


def parse_backend_config(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--backend-config is not valid JSON ({e.msg} at char {e.pos}): pass an object, "
                         "e.g. '{\"max_lora_adapters\": 8}'") from None
    if not isinstance(value, dict):
        raise UsageError("--backend-config must be a JSON object, e.g. '{\"max_lora_adapters\": 8}'")
    return value


def map_hardware(backend: str, gpus: int | None, nodes: int, tp: int) -> dict:
    """SkyRL backend-config keys for the requested GPUs per node, node count and tensor parallelism (each at least 1:
    rlcli.server.commands.StartOptions)."""
    if gpus is not None and gpus % tp:
        raise UsageError(f"--gpus {gpus} is not a multiple of --tp {tp}")
    if backend == "jax":
        if nodes > 1:
            raise UsageError(
                "--nodes > 1 is for the fsdp/megatron backends (on Ray); the jax backend spreads over "
                "processes: --processes N (and `rlcli serve worker` on other machines)"
            )
        out: dict = {}
        if tp > 1:
            out["tensor_parallel_size"] = tp
        if gpus and gpus > tp:
            out["fully_sharded_data_parallel_size"] = gpus // tp
        return out
    gpus = gpus or 1
    out = {
        "trainer.placement.policy_num_gpus_per_node": gpus,
        "trainer.placement.policy_num_nodes": nodes,
        "generator.inference_engine.tensor_parallel_size": tp,
        # Colocated inference: one vLLM engine per tp-sized slice of all GPUs.
        "generator.inference_engine.num_engines": gpus * nodes // tp,
    }
    if backend == "megatron":
        out["trainer.policy.megatron_config.tensor_model_parallel_size"] = tp
    return out


# LoRA models a jax server holds at once unless told otherwise. SkyRL's default table has 32 slots and
# every step on CPU paid for all of them (embedded model, forward_backward of 8 x 64 tokens inside the
# engine: 425-475 ms with 32 slots, 100-114 ms with 4); a single user needs a handful.
DEFAULT_SLOTS = 4


def slot_config(backend: str, slots: int | None, backend_cfg: dict) -> int | None:
    """Usable LoRA slots of a jax server, written into backend_cfg as max_lora_adapters (slot 0 is SkyRL's
    base-model slot, so N usable slots take N + 1). --backend-config's max_lora_adapters wins when given."""
    if backend != "jax":
        if slots is not None:
            raise UsageError(f"--slots sizes the jax backend's LoRA table; the {backend} backend has none")
        return None
    given = backend_cfg.get("max_lora_adapters")
    if given is not None:
        if slots is not None and given != slots + 1:
            raise UsageError(f"--slots {slots} and --backend-config max_lora_adapters {given} disagree "
                             f"(N slots = max_lora_adapters N + 1): give one of them")
        return int(given) - 1
    slots = DEFAULT_SLOTS if slots is None else slots
    backend_cfg["max_lora_adapters"] = slots + 1
    return slots


def has_cuda() -> bool:
    """A CUDA driver is present (checked without importing torch)."""
    return Path("/proc/driver/nvidia/version").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


# A long-lived jax server maps memory for every XLA program it keeps (docs/decisions.md: ~70k mappings after
# 13 minutes of the test suite, still rising; Linux's default cap is 65530, and hitting it kills the engine).
MAP_COUNT_NEEDED = 262144
MAP_COUNT_FIX = "sysctl -w vm.max_map_count=1048576"


def read_map_count(path: Path = Path("/proc/sys/vm/max_map_count")) -> int | None:
    """Linux's cap on memory mappings per process; None where there is no such setting (not Linux)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def map_count_warning(limit: int | None) -> str | None:
    """One line when the cap is below what a long-lived jax server needs, else None."""
    if limit is None or limit >= MAP_COUNT_NEEDED:
        return None
    return (f"vm.max_map_count is {limit}: a long-lived jax server maps more (~70k after 13 minutes of "
            f"compiling) and its engine dies at the cap; raise it as root: {MAP_COUNT_FIX}")
