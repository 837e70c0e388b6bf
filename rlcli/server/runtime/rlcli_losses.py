"""GSPO served fused by SkyRL's jax backend: gspo appended to the same LOSS_FUNCTIONS list and LOSS_TYPES dict
backends/jax.py imported (a module-level registry: no class seam). lax.switch CLAMPS an out-of-range index, so a
registration that did not take would run cispo: the registry and the backend's hold on it are checked, and the process
refuses to start otherwise; gspo's values through the backend's switch are tests/integration/test_fused_gspo.py's.
docs/upstream/jax-gspo.md.
"""

import os
import sys

from shared import DISTRIBUTED_ENV

# The four losses stock SkyRL 0.4.0's jax backend serves; a different registry is a SkyRL this was not written for.
STOCK_JAX = {"cross_entropy": 0, "importance_sampling": 1, "ppo": 2, "cispo": 3}
FUSED = ("gspo",)


def gspo_loss(target_logprobs, loss_mask, sampling_logprobs, advantages, loss_fn_config):
    """GSPO-token (arXiv 2507.18071) per-token losses of one sequence, in SkyRL's loss signature: each token's ratio
    has the sequence's value (the mean log ratio over the response) and its own token's gradient."""
    import jax
    import jax.numpy as jnp

    in_response = loss_mask != 0
    # Prompt and padding tokens may hold any logprob; keep them out of the mean (and of any NaN).
    log_ratio = jnp.where(in_response, target_logprobs - sampling_logprobs, 0.0)
    weight_sum = jnp.maximum(jnp.sum(loss_mask, axis=-1, keepdims=True), 1e-9)
    log_seq_ratio = jnp.sum(loss_mask * log_ratio, axis=-1, keepdims=True) / weight_sum
    sg = jax.lax.stop_gradient
    # No clamp on log s (SkyRL's torch GSPO clamps at 10): the paper's loss, and the 2-pass route's, which cannot.
    ratio = jnp.exp(target_logprobs - sg(target_logprobs) + sg(log_seq_ratio))
    clipped = jnp.clip(ratio, loss_fn_config.clip_low_threshold, loss_fn_config.clip_high_threshold)
    surrogate = jnp.minimum(ratio * advantages, clipped * advantages)
    return -jnp.where(in_response, loss_mask * surrogate, 0.0)


def install_jax_losses() -> int:
    """Append gspo to the registry the jax backend dispatches on, in this process; its index. The registry must be
    SkyRL 0.4.0's, and the backend's own: else the switch would clamp gspo's index (RuntimeError)."""
    import skyrl.backends.jax as backend
    from skyrl.tinker import loss_fns, types

    if "gspo" in types.LOSS_TYPES:
        return types.LOSS_TYPES["gspo"]  # already installed here (or SkyRL serves it natively)
    names = [fn.__name__ for fn in loss_fns.LOSS_FUNCTIONS]
    if dict(types.LOSS_TYPES) != STOCK_JAX or names != [f"{name}_loss" for name in STOCK_JAX]:
        raise RuntimeError(f"SkyRL's jax loss registry changed: LOSS_TYPES={dict(types.LOSS_TYPES)}, "
                           f"LOSS_FUNCTIONS={names}; expected {STOCK_JAX} (skyrl 0.4.0)")
    if backend.LOSS_FUNCTIONS is not loss_fns.LOSS_FUNCTIONS or backend.LOSS_TYPES is not types.LOSS_TYPES:
        raise RuntimeError("skyrl.backends.jax no longer dispatches on loss_fns.LOSS_FUNCTIONS/types.LOSS_TYPES")
    loss_fns.LOSS_FUNCTIONS.append(gspo_loss)
    types.LOSS_TYPES["gspo"] = len(loss_fns.LOSS_FUNCTIONS) - 1
    return types.LOSS_TYPES["gspo"]


def jax_fused_blocker(backend_config: dict) -> str | None:
    """Why a registration in this process would not reach the jax backend's workers, if it would not."""
    if backend_config.get("use_ray") and os.environ.get(DISTRIBUTED_ENV) != "ray":  # set by rlcli's launcher
        return "use_ray runs the jax backend in Ray actors that rlcli's launcher did not prepare"
    several = (backend_config.get("num_processes") or 1) > 1 or backend_config.get("coordinator_address")
    if several and not os.environ.get(DISTRIBUTED_ENV):  # set where rlcli's launcher runs every process
        return "multi-process jax: the other processes are not started by rlcli's launcher"
    return None


def log(message: str) -> None:
    print(f"[rlcli losses] {message}", file=sys.stderr, flush=True)


def register(backend_config: dict) -> None:
    """In a jax process that computes (not a Ray engine, which only proxies): register gspo, or log why not."""
    blocker = jax_fused_blocker(backend_config)
    if blocker:
        log(f"gspo NOT registered ({blocker}); clients fall back to the 2-pass route")
        return
    try:
        index = install_jax_losses()
    except Exception as e:
        log(f"FAILED to register gspo with SkyRL's jax backend: {e}. The engine refuses to start; "
            "start with `rlcli serve start --no-extensions` for stock SkyRL")
        raise
    log(f"registered gspo as jax loss {index}")
