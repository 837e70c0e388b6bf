"""rlcli's server extension: GSPO served fused by SkyRL's jax backend, and a route that says so.

Runs INSIDE the server venv (Python 3.12): standard library, skyrl and jax only; never rlcli.
The launcher imports it when RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless
--no-extensions) and calls `register(role)` in each process before SkyRL starts there.

engine role (jax backend only): SkyRL 0.4.0's API accepts `gspo`, but the jax backend refuses it
because it checks names against `skyrl.tinker.types.LOSS_TYPES` (name -> index) and dispatches with
`jax.lax.switch(index, LOSS_FUNCTIONS, ...)` (`skyrl.tinker.loss_fns`). backends/jax.py imported
both objects by name, so the function is appended to that same list and its index added to that same
dict; rebinding the module attributes would change nothing. lax.switch CLAMPS an out-of-range index,
so a registration that did not take would silently run the last loss (cispo): after registering,
the object identities, the index and a numeric run through the switch are checked, and the engine
refuses to start (the message is in the server log) if any check fails.

api role: adds GET /api/v1/rlcli/capabilities -> {"backend", "losses", "extension", "extensions"[, "note"]}
plus one entry per other loaded extension that has a describe() (e.g. "rlcli_wake": how the request
path wakes), so a client can ask which losses this server computes in one forward_backward. A server without this
extension answers 404 there; rlcli then assumes stock SkyRL. And POST /api/v1/rlcli/forget_readiness_models:
`serve start` proves the engine serves by creating a rank-1 model in a session tagged READINESS_TAG and
unloading it; SkyRL keeps every model's row, so each start left one more "training run" in `rlcli run list`
(SkyRL lists rows in insertion order, 20 to a page). After its round trip `serve start` asks this route to
delete the rows of those sessions' unloaded models, then the sessions themselves where nothing else refers to
them: the probes of this start and of every earlier one. Their futures stay: SQLite gives a new row the
highest id + 1, so deleting the newest futures would hand their request ids to the next requests (and the
tenant gate keys ownership by request id). Nothing a client made is touched; with --tenants the route is the
internal key's alone (rlcli_tenants' ADMIN routes).

Reduction: the jax backend reduces each sequence's token losses as sum(loss)/max(sum(weights), 1e-9)
and averages over sequences. With 0/1 response weights that is GSPO's objective exactly (per-sequence
token mean, then mean over the group), and the same number SkyRL-Train's `sequence_mean` reduction
gives on fsdp (advantages scaled by 1/(batch * tokens_i), then summed). SkyRL's Tinker fsdp backend
itself sums the token losses it is sent (Tinker's convention), so callers normalise there.

dppo is not registered: its thresholds (delta_low, delta_high) cannot reach a jax loss. The backend
builds `LossFnConfig` from clip_low_threshold/clip_high_threshold only (the deltas would be dropped
and 0.8/1.2 passed instead of dppo's 0.2/0.2), and LossFnConfig is a registered pytree whose
shardings are built field by field inside `_model_pass`; carrying more fields means reworking that.
"""

import argparse
import os
import sys

NAME = "rlcli_losses"
VERSION = "1.1"
ROUTE = "/api/v1/rlcli/capabilities"
FORGET_ROUTE = "/api/v1/rlcli/forget_readiness_models"
READINESS_TAG = "rlcli-readiness"  # the session tag of `serve start`'s readiness probe (rlcli/server/process.py)
FUSED = ("gspo",)
# The four losses stock SkyRL 0.4.0's jax backend serves; a different registry means an upgrade that
# this extension was not written against.
STOCK_JAX = {"cross_entropy": 0, "importance_sampling": 1, "ppo": 2, "cispo": 3}


def log(message: str) -> None:
    # The launcher's supervisor copies this process's stderr into the server log.
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def gspo_loss(target_logprobs, loss_mask, sampling_logprobs, advantages, loss_fn_config):
    """GSPO-token (arXiv 2507.18071) per-token losses of one sequence, in SkyRL's loss signature.

    log s = weighted mean over the response of (logp - old_logp); each token's ratio is
    exp(logp - sg(logp) + sg(log s)): its value is the sequence ratio s, its gradient flows through
    that token's logp only. loss_t = -min(ratio*A, clip(ratio, low, high)*A) on response tokens.
    """
    import jax
    import jax.numpy as jnp

    in_response = loss_mask != 0
    # Prompt and padding tokens may hold any logprob; keep them out of the mean (and of any NaN).
    log_ratio = jnp.where(in_response, target_logprobs - sampling_logprobs, 0.0)
    weight_sum = jnp.maximum(jnp.sum(loss_mask, axis=-1, keepdims=True), 1e-9)
    log_seq_ratio = jnp.sum(loss_mask * log_ratio, axis=-1, keepdims=True) / weight_sum
    sg = jax.lax.stop_gradient
    # No clamp on log s (SkyRL's torch GSPO clamps at 10): this keeps the loss identical to the paper
    # and to rlcli's 2-pass route (forward + shifted ppo), which cannot clamp.
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
    """Run gspo through vmap + lax.switch as the backend does; compare with values worked out by hand.

    Row 0 is unclipped (loss and gradient -s*A per response token); row 1 is clipped (loss
    -high*A, gradient 0). cispo, the loss a clamped index would run, gives other numbers for both.
    """
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


def engine_config_from_argv(argv: list[str]):
    """The engine's EngineConfig, parsed from its command line the way SkyRL's engine parses it."""
    from skyrl.tinker.config import EngineConfig, add_model

    parser = argparse.ArgumentParser(add_help=False)
    add_model(parser, EngineConfig)
    args, _ = parser.parse_known_args(argv)
    return EngineConfig.model_validate(vars(args))


def jax_fused_blocker(backend_config: dict) -> str | None:
    """Why a registration in this process would not reach the jax backend's workers, if it would not."""
    if backend_config.get("use_ray") and os.environ.get("RLCLI_DISTRIBUTED") != "ray":  # set by rlcli's launcher
        return "use_ray runs the jax backend in Ray actors that rlcli's launcher did not prepare"
    several = (backend_config.get("num_processes") or 1) > 1 or backend_config.get("coordinator_address")
    if several and not os.environ.get("RLCLI_DISTRIBUTED"):  # set where rlcli's launcher runs every process
        return "multi-process jax: the other processes are not started by rlcli's launcher"
    return None


def capabilities(engine_config) -> dict:
    """What the capabilities route answers for a server started with this config."""
    from skyrl.tinker import types

    backend = engine_config.backend
    answer = {"backend": backend, "extension": f"{NAME} {VERSION}",
              "extensions": [e.strip() for e in os.environ.get("RLCLI_SERVER_EXTENSIONS", "").split(",") if e.strip()]}
    if backend == "jax":
        losses = set(STOCK_JAX) | set(types.LOSS_TYPES)
        blocker = jax_fused_blocker(engine_config.backend_config)
        if blocker:
            answer["note"] = f"gspo not fused: {blocker}"
        else:
            losses |= set(FUSED)
    else:
        # fsdp and megatron (SkyRL-Train) serve every Tinker loss; megatron has no critic model.
        losses = set(types.SUPPORTED_LOSS_FNS) - ({"ppo_critic"} if backend == "megatron" else set())
    answer["losses"] = sorted(losses)
    if backend == "jax" and engine_config.backend_config.get("use_ray"):
        import ray_actors  # a sibling in runtime/: what the actors reported loading

        answer["ray_actors"] = ray_actors.describe()
    # Each other loaded extension with a describe() says what it changes (request path, slots...).
    for name in answer["extensions"]:
        module = sys.modules.get(name)
        if name != NAME and callable(getattr(module, "describe", None)):
            answer[name] = module.describe()
    return answer


def register_engine(argv: list[str]) -> None:
    config = engine_config_from_argv(argv)
    if config.backend != "jax":
        log(f"backend {config.backend} serves gspo itself; nothing to register")
        return
    blocker = jax_fused_blocker(config.backend_config)
    if not blocker and config.backend_config.get("use_ray"):
        log("gspo is registered in each Ray actor (ray_actors.py); this engine only proxies to them")
        return
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


def register_api() -> None:
    import skyrl.tinker.api as api
    from skyrl.tinker import types

    # The API must already accept gspo and its clip keys (SkyRL 0.4.0 does); nothing to patch there.
    allowed = getattr(api.ForwardBackwardInput, "_ALLOWED_KEYS_BY_LOSS_FN", {})
    if "gspo" not in types.SUPPORTED_LOSS_FNS or "clip_low_threshold" not in allowed.get("gspo", ()):
        raise RuntimeError(f"{NAME}: this SkyRL's API no longer accepts gspo with clip thresholds")

    async def rlcli_capabilities() -> dict:
        return capabilities(api.app.state.engine_config)

    async def rlcli_forget_readiness_models() -> dict:
        return await forget_readiness_models(api.app.state.db_engine)

    api.app.add_api_route(ROUTE, rlcli_capabilities, methods=["GET"])
    api.app.add_api_route(FORGET_ROUTE, rlcli_forget_readiness_models, methods=["POST"])
    log(f"GET {ROUTE} and POST {FORGET_ROUTE} added")


async def forget_readiness_models(db_engine) -> dict:
    """Delete the rows of the unloaded models of readiness sessions and the sessions left with nothing
    referring to them. A model still loaded (a start whose unload has not finished) stays."""
    from skyrl.tinker.db_models import ModelDB, SamplingSessionDB, SessionDB
    from sqlalchemy import String, cast, delete
    from sqlmodel import select
    from sqlmodel.ext.asyncio.session import AsyncSession

    async with AsyncSession(db_engine) as session:
        tagged = await session.exec(select(SessionDB.session_id, SessionDB.tags)
                                    .where(cast(SessionDB.tags, String).like(f'%"{READINESS_TAG}"%')))
        sessions = [sid for sid, tags in tagged.all() if READINESS_TAG in (tags or [])]
        if not sessions:
            return {"models": 0, "sessions": 0}
        models = list((await session.exec(select(ModelDB.model_id).where(
            ModelDB.session_id.in_(sessions), ModelDB.status == "unloaded"))).all())
        if models:  # their futures stay: sqlite would hand a deleted row's request id to the next request
            await session.exec(delete(ModelDB).where(ModelDB.model_id.in_(models)))
        held = set((await session.exec(select(ModelDB.session_id).where(ModelDB.session_id.in_(sessions)))).all())
        held |= set((await session.exec(select(SamplingSessionDB.session_id)
                                        .where(SamplingSessionDB.session_id.in_(sessions)))).all())
        empty = [sid for sid in sessions if sid not in held]
        if empty:
            await session.exec(delete(SessionDB).where(SessionDB.session_id.in_(empty)))
        await session.commit()
    return {"models": len(models), "sessions": len(empty)}


def register(role: str) -> None:
    if role == "engine":
        # The launcher's engine role runs `launcher.py engine <SkyRL engine flags>`.
        argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
        register_engine(argv)
    elif role == "api":
        register_api()


if __name__ == "__main__":
    # `python rlcli_losses.py`: check the registry and the dispatch in this venv without a server.
    print(f"{NAME} {VERSION}: gspo is jax loss {install_jax_losses()}; dispatch self-test passed")
