"""GSPO served fused by SkyRL's jax backend: gspo appended to the same LOSS_FUNCTIONS list and LOSS_TYPES dict
backends/jax.py imported (a module-level registry: no class seam). lax.switch CLAMPS an out-of-range index, so a
registration that did not take would run cispo: identities, index and a run through the switch are checked, and the
process refuses to start otherwise. docs/upstream/jax-gspo.md.
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


def check_stock_registry() -> None:
    """Raise unless SkyRL's jax loss registry is the one this extension extends (skyrl 0.4.0)."""
    from skyrl.tinker import loss_fns, types

    found = dict(types.LOSS_TYPES)
    if found != STOCK_JAX or not isinstance(loss_fns.LOSS_FUNCTIONS, list) or len(loss_fns.LOSS_FUNCTIONS) != 4:
        raise RuntimeError(f"SkyRL's jax loss registry changed: LOSS_TYPES={found}, "
                           f"{len(loss_fns.LOSS_FUNCTIONS)} LOSS_FUNCTIONS; expected {STOCK_JAX} (skyrl 0.4.0)")
    names = [fn.__name__ for fn in loss_fns.LOSS_FUNCTIONS]
    if names != ["cross_entropy_loss", "importance_sampling_loss", "ppo_loss", "cispo_loss"]:
        raise RuntimeError(f"SkyRL's jax LOSS_FUNCTIONS changed order or names: {names}")


def install_jax_losses() -> int:
    """Append gspo to the jax backend's registry in this process, verify it, return its index."""
    from skyrl.tinker import loss_fns, types

    if "gspo" in types.LOSS_TYPES:
        return types.LOSS_TYPES["gspo"]  # already installed here (or SkyRL serves it natively)
    check_stock_registry()
    index = len(loss_fns.LOSS_FUNCTIONS)
    loss_fns.LOSS_FUNCTIONS.append(gspo_loss)
    types.LOSS_TYPES["gspo"] = index
    verify_registration(index)
    return index


def verify_registration(index: int) -> None:
    """Check that what backends/jax.py dispatches on is what was extended, then run the switch."""
    import skyrl.backends.jax as backend
    from skyrl.tinker import loss_fns, types

    if backend.LOSS_FUNCTIONS is not loss_fns.LOSS_FUNCTIONS or backend.LOSS_TYPES is not types.LOSS_TYPES:
        raise RuntimeError("skyrl.backends.jax no longer dispatches on loss_fns.LOSS_FUNCTIONS/types.LOSS_TYPES")
    if backend.LOSS_TYPES.get("gspo") != index or index != len(backend.LOSS_FUNCTIONS) - 1:
        raise RuntimeError(f"gspo index {backend.LOSS_TYPES.get('gspo')} is not the last of "
                           f"{len(backend.LOSS_FUNCTIONS)} jax losses")
    if backend.LOSS_FUNCTIONS[index] is not gspo_loss:
        raise RuntimeError(f"jax loss {index} is {backend.LOSS_FUNCTIONS[index]}, not rlcli's gspo")
    self_test(backend.LOSS_FUNCTIONS, index)


def self_test(functions: list, index: int) -> None:
    """gspo through vmap + lax.switch as the backend runs it, against values worked out by hand: row 0 unclipped,
    row 1 clipped. cispo, what a clamped index would run, gives other numbers for both."""
    import math

    import jax
    import jax.numpy as jnp
    from skyrl.tinker.loss_fns import LossFnConfig

    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0], [-1.0, -2.0, -0.5, -3.0]])
    old = jnp.array([[-1.2, -1.9, -0.7, 0.0], [-1.2, -1.9, -0.7, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    adv = jnp.full((2, 4), 0.5)
    config = LossFnConfig(clip_low_threshold=jnp.array([0.5, 0.8]), clip_high_threshold=jnp.array([2.0, 1.05]))
    kinds = jnp.array([index, index], dtype=jnp.int32)

    def total(lp):
        per_token = jax.vmap(lambda k, a, m, o, v, c: jax.lax.switch(k, functions, a, m, o, v, c))(
            kinds, lp, mask, old, adv, config)
        return per_token.sum(), per_token

    (_, per_token), grad = jax.value_and_grad(total, has_aux=True)(logp)
    s = math.exp((0.2 - 0.1 + 0.2) / 3)  # exp(mean of logp - old over the three response tokens)
    want_loss = [[-s * 0.5] * 3 + [0.0], [-1.05 * 0.5] * 3 + [0.0]]
    want_grad = [[-s * 0.5] * 3 + [0.0], [0.0] * 4]
    for got, want, what in ((per_token, want_loss, "loss"), (grad, want_grad, "gradient")):
        if float(jnp.max(jnp.abs(got - jnp.array(want)))) > 1e-5:
            raise RuntimeError(f"gspo self-test through lax.switch: {what} {got.tolist()} != {want}")


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
    log(f"registered gspo as jax loss {index}; dispatch checked through lax.switch")
