"""RL losses: names, where a server computes them, GSPO's float64 reference and its exact 2-pass route.

Where each loss is computed (one forward_backward, "fused"), by SkyRL 0.4.0 backend:
    jax (stock)                 cross_entropy, importance_sampling, ppo, cispo
    jax + rlcli's extension     + gspo          (runtime/rlcli_losses.py; `rlcli serve start` loads it)
    fsdp                        + gspo, dppo, ppo_critic
    megatron                    + gspo, dppo
A server with rlcli's extension says what it serves at GET /api/v1/rlcli/capabilities.

GSPO-token (arXiv 2507.18071), per sequence i with response tokens t and 0/1 weights w:
    log s_i = sum_t w_t (logp_t - old_t) / sum_t w_t
    ratio_t = exp(logp_t - sg(logp_t) + sg(log s_i))      value s_i, gradient through logp_t only
    loss_i  = -sum_t w_t min(ratio_t A_t, clip(ratio_t, low, high) A_t) / sum_t w_t
    loss    = mean_i loss_i      (the jax backend's reduction: per-sequence mean, then over sequences)
Exact 2-pass route for a server without fused gspo: a forward pass gives the current logprobs lp;
the server's ppo with old logprobs := lp - log s_i and weights := w then has ratio_t =
exp(logp_t - lp_t + log s_i), whose value is s_i and whose gradient is s_i dlogp_t: the same loss
and the same gradient. The cookbook strips its action mask before forward_backward, and SkyRL then
weights every token 1, prompt included; the route restores the response weights from the
advantages (the cookbook gives prompt tokens advantage 0; a sequence whose advantages are all 0
has no gradient either way).

Not through the client's forward_backward_custom (a loss computed in local torch, its gradient sent back as
cross_entropy weights): SkyRL's jax backend divides each sequence by the sum of those weights, and the
gradient explodes (grad norms ~5e8: docs/decisions.md).

Names. tinker 0.25 types `loss_fn` as Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"];
SkyRL's API accepts a different set (gspo, dppo and ppo_critic too; dro is refused with 422), and the client
checks nothing at run time: the name travels as a plain string. ServerLossFn names SkyRL's set, and one
checked cast (tinker_loss_fn) hands the client its own type.
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from rlcli.client import CAPABILITIES_ROUTE, request_json
from rlcli.errors import RlcliError, UsageError

if TYPE_CHECKING:
    from tinker.types import LossFnType

ServerLossFn = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "gspo", "dppo", "ppo_critic"]
SERVER_LOSS_FNS: tuple[ServerLossFn, ...] = get_args(ServerLossFn)

# The loss_fn_config keys SkyRL's API accepts per loss (skyrl 0.4.0, tinker/api.py); others are a 422.
CONFIG_KEYS: dict[str, frozenset[str]] = {
    "cross_entropy": frozenset(),
    "importance_sampling": frozenset(),
    "ppo": frozenset({"clip_low_threshold", "clip_high_threshold", "value_clip"}),
    "cispo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "gspo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "dppo": frozenset({"delta_low", "delta_high"}),
    "ppo_critic": frozenset({"value_clip"}),
}


def tinker_loss_fn(name: str) -> LossFnType:
    """`name` as the tinker client's loss type, after checking that SkyRL's API accepts it."""
    if name not in SERVER_LOSS_FNS:
        raise ValueError(f"loss {name!r} is not one SkyRL's API accepts: {', '.join(SERVER_LOSS_FNS)}")
    return cast("LossFnType", name)


def tinker_loss_config(name: str, config: dict[str, float] | None) -> dict[str, float] | None:
    """The loss config as the client sends it (floats), after checking its keys against SkyRL's table."""
    if not config:
        return None
    unknown = sorted(set(config) - CONFIG_KEYS[name])
    if unknown:
        raise ValueError(f"loss {name!r} takes no config keys {unknown}; it takes {sorted(CONFIG_KEYS[name])}")
    return {key: float(value) for key, value in config.items()}


Passes = Literal["auto", "1", "2"]  # --passes: auto, 1 (the server computes the loss), 2 (gspo's exact route)
GSPO_DEFAULTS: dict[str, float] = {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}
DEFAULT_CONFIGS: dict[str, dict[str, float]] = {"gspo": GSPO_DEFAULTS}

STOCK_JAX = frozenset({"cross_entropy", "importance_sampling", "ppo", "cispo"})
SERVED_BY_BACKEND: dict[str, frozenset[str]] = {
    "jax": STOCK_JAX,
    "jax+rlcli": STOCK_JAX | {"gspo"},
    "fsdp": STOCK_JAX | {"gspo", "dppo", "ppo_critic"},
    "megatron": STOCK_JAX | {"gspo", "dppo"},
}
BACKEND_NAMES = {"jax": "stock jax", "jax+rlcli": "jax with rlcli's extension (`rlcli serve start`)",
                 "fsdp": "fsdp", "megatron": "megatron"}


@dataclass(frozen=True)
class LossPlan:
    loss: str
    config: dict[str, float] = field(default_factory=dict)  # defaults applied
    passes: int = 1  # 1: the server computes the loss; 2: forward + shifted ppo (gspo only)
    message: str = ""


def served_losses(base_url: str, timeout: float = 10.0) -> tuple[str, set[str]]:
    """(description, losses the server computes in one forward_backward), asked of the server itself."""
    url = base_url.rstrip("/") + CAPABILITIES_ROUTE
    try:
        caps = request_json(url, timeout=timeout)
    except urllib.error.HTTPError as e:
        if 400 <= e.code < 500:  # no such route: a server without rlcli's extension
            return (f"stock SkyRL jax assumed ({base_url} has no {CAPABILITIES_ROUTE}: HTTP {e.code})",
                    set(STOCK_JAX))
        raise RlcliError(f"{url} answered HTTP {e.code}; see the server's log (`rlcli serve logs`)") from e
    except (OSError, ValueError) as e:
        raise RlcliError(f"cannot ask {base_url} which losses it serves ({e}); is it running? "
                         "(`rlcli serve status`)") from e
    description = f"{caps['backend']} backend with {caps['extension']}"
    if caps.get("note"):
        description += f" ({caps['note']})"
    return description, set(caps["losses"])


def servers_of(loss: str) -> str:
    names = [BACKEND_NAMES[b] for b, served in SERVED_BY_BACKEND.items() if loss in served]
    return ", ".join(names) if names else "no SkyRL backend"


def plan_loss(loss: str, loss_config_json: str | None, passes: Passes, served: set[str]) -> LossPlan:
    """Decide how `loss` runs on a server that serves `served`; fail in one line if it cannot."""
    config = {**DEFAULT_CONFIGS.get(loss, {}), **parse_loss_config(loss, loss_config_json)}
    wanted = parse_passes(passes)
    if wanted == 2 and loss != "gspo":
        raise UsageError(f"--passes 2 exists for gspo only (forward + shifted ppo); {loss} runs in one pass")
    if loss in served and wanted != 2:
        return LossPlan(loss, config, 1, f"loss {loss}: computed by the server in one forward_backward")
    if loss != "gspo":
        raise UsageError(f"this server does not serve loss {loss}; it is served by {servers_of(loss)}")
    if wanted == 1:
        raise UsageError(f"--passes 1: this server does not serve gspo fused; it is served by {servers_of('gspo')}; "
                         "or use --passes 2 (exact: a forward pass, then the server's ppo on shifted logprobs)")
    if "ppo" not in served:
        raise UsageError("the 2-pass gspo route needs the server's ppo loss, and this server does not serve ppo")
    why = "--passes 2 asked for" if wanted == 2 else "the server does not serve gspo fused"
    return LossPlan(loss, config, 2, f"loss gspo: 2 passes per step (forward, then ppo on logprobs "
                                     f"shifted by log s_i; exact) because {why}")


def parse_passes(passes: Passes | int) -> int | None:
    """1, 2, or None for auto (the records check the choice: rlcli.options)."""
    return {"auto": None, "1": 1, "2": 2}[str(passes)]


def parse_loss_config(loss: str, text: str | None) -> dict[str, float]:
    """The --loss-config JSON object, checked against the keys SkyRL accepts for `loss`."""
    if not text:
        return {}
    try:
        config = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--loss-config is not JSON ({e}); e.g. '{json.dumps(GSPO_DEFAULTS)}'") from e
    if not isinstance(config, dict) or not all(_is_number(v) for v in config.values()):
        raise UsageError(f"--loss-config must be a JSON object of numbers, got {text!r}")
    allowed = sorted(CONFIG_KEYS[loss])
    unknown = sorted(set(config) - CONFIG_KEYS[loss])
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
        raise UsageError(f"--loss-config keys {', '.join(unknown)} do not apply to loss {loss}; {takes}")
    low, high = config.get("clip_low_threshold", 0.0), config.get("clip_high_threshold", 2.0)
    if loss in ("ppo", "gspo") and not low <= 1.0 <= high:
        raise UsageError(f"--loss-config clip thresholds are ratios around 1 (e.g. {GSPO_DEFAULTS}), "
                         f"not epsilons: got low {low}, high {high}")
    return {key: float(value) for key, value in config.items()}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- GSPO mathematics (float64, pure) ----------------------------------------------------------


def gspo_reference(logp, old_logp, adv, mask, eps_low: float, eps_high: float):
    """GSPO-token loss and dloss/dlogp per token, in float64, from the paper's equations.

    Arrays are [N, T] (pad with mask 0). The clip range is [1 - eps_low, 1 + eps_high]. The loss is
    -1/N sum_i 1/|y_i| sum_t min(s_it A_it, clip(s_it) A_it); s_it has the value s_i and
    d s_it / d logp_it = s_i, so a token's gradient is -s_i A_it / (N |y_i|) where the unclipped
    term is the smaller one (or both are equal), and 0 where the constant clipped term is.
    """
    import numpy as np

    lp, old, a, w = (np.asarray(x, dtype=np.float64) for x in (logp, old_logp, adv, mask))
    tokens = np.maximum(w.sum(axis=-1, keepdims=True), 1e-9)  # |y_i| with a 0/1 mask
    s = np.exp((w * np.where(w != 0, lp - old, 0.0)).sum(axis=-1, keepdims=True) / tokens)
    low, high = 1.0 - eps_low, 1.0 + eps_high
    objective = np.minimum(s * a, np.clip(s, low, high) * a)
    n = lp.shape[0]
    loss = -(w * objective / tokens).sum() / n
    unclipped = ((s >= low) & (s <= high)) | ((s > high) & (a < 0)) | ((s < low) & (a > 0))
    grad = -(w / tokens) * s * a * unclipped / n
    return float(loss), grad


def log_sequence_ratio(lp: Sequence[float], old: Sequence[float], weights: Sequence[float]) -> float:
    """log s_i: the weighted mean of (logp - old_logp) over the response, in float64."""
    import numpy as np

    lp_T, old_T, w_T = (np.asarray(x, dtype=np.float64) for x in (lp, old, weights))
    return float((w_T * np.where(w_T != 0, lp_T - old_T, 0.0)).sum() / max(w_T.sum(), 1e-9))


def shifted_logprobs(lp: Sequence[float], old: Sequence[float], weights: Sequence[float]):
    """The old logprobs that make ppo compute GSPO: lp - log s_i on the response, lp elsewhere (ratio 1)."""
    import numpy as np

    lp_T, w_T = np.asarray(lp, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    return np.where(w_T != 0, lp_T - log_sequence_ratio(lp, old, weights), lp_T).astype(np.float32)


# --- routes through the tinker client ----------------------------------------------------------


def with_response_weights(datum):
    """The datum with `weights` = the tokens GSPO averages over, and without the cookbook's `mask`.

    Explicit weights win, then the cookbook's mask, then advantage != 0 (what the cookbook's mask
    is, once its `mask` key has been stripped).
    """
    import numpy as np
    import tinker

    inputs = dict(datum.loss_fn_inputs)
    mask = inputs.pop("mask", None)
    if "weights" not in inputs:
        source = mask.to_numpy() if mask is not None else inputs["advantages"].to_numpy() != 0
        inputs["weights"] = np.asarray(source, dtype=np.float32)
    return tinker.Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def _forward_data(data: list) -> list:
    import tinker

    keep = ("target_tokens", "weights")
    return [tinker.Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in keep})
            for d in data]


def _shifted_ppo_data(data: list, forward_output) -> list:
    import tinker

    shifted = []
    for datum, out in zip(data, forward_output.loss_fn_outputs, strict=True):
        inputs = dict(datum.loss_fn_inputs)
        inputs["logprobs"] = shifted_logprobs(out["logprobs"].tolist(), inputs["logprobs"].tolist(),
                                              inputs["weights"].tolist())
        shifted.append(tinker.Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    return shifted


def _gspo_config(loss_fn_config: dict[str, float] | None) -> dict[str, float] | None:
    return tinker_loss_config("gspo", {**GSPO_DEFAULTS, **(loss_fn_config or {})})


def two_pass_forward_backward(training_client, data: list, loss_fn_config: dict[str, float] | None = None):
    """GSPO exactly on a server without fused gspo: forward, then ppo on shifted logprobs.

    Blocks for the forward pass, then submits the ppo pass and returns its future (whose result
    holds the current logprobs and GSPO's per-token losses, as a fused gspo's would).
    """
    data = [with_response_weights(d) for d in data]
    ahead = training_client.forward(_forward_data(data), tinker_loss_fn("cross_entropy")).result()
    return training_client.forward_backward(_shifted_ppo_data(data, ahead), tinker_loss_fn("ppo"),
                                            _gspo_config(loss_fn_config))


def install_loss_route(training_client, plan: LossPlan) -> None:
    """Route the client's gspo forward_backward(_async) calls the way `plan` says; others pass through.

    tinker-cookbook's RL loop calls `training_client.forward_backward_async(data, loss_fn=...,
    loss_fn_config=...)` and has no other hook; wrapping it here covers every training mode. Both
    wrappers submit through the client's own forward_backward (which never waits), so requests
    keep the order the caller made them in; the 2-pass route waits for its forward pass first.
    """
    if plan.loss != "gspo" or getattr(training_client, "_rlcli_loss_plan", None) is not None:
        return
    submit = training_client.forward_backward

    def prepare(data, loss_fn_config):
        return [with_response_weights(d) for d in data], {**plan.config, **(loss_fn_config or {})}

    def forward_backward(data, loss_fn, loss_fn_config=None):
        if loss_fn != "gspo":
            return submit(data, loss_fn, loss_fn_config)
        data, config = prepare(data, loss_fn_config)
        if plan.passes == 1:
            return submit(data, tinker_loss_fn("gspo"), _gspo_config(config))
        ahead = training_client.forward(_forward_data(data), tinker_loss_fn("cross_entropy")).result()
        return submit(_shifted_ppo_data(data, ahead), tinker_loss_fn("ppo"), _gspo_config(config))

    async def forward_backward_async(data, loss_fn, loss_fn_config=None):
        if loss_fn != "gspo" or plan.passes == 1:
            return forward_backward(data, loss_fn, loss_fn_config)
        data, config = prepare(data, loss_fn_config)
        ahead = await training_client.forward(_forward_data(data), tinker_loss_fn("cross_entropy"))
        return submit(_shifted_ppo_data(data, ahead), tinker_loss_fn("ppo"), _gspo_config(config))

    from rlcli.train.hooks import replace_forward_backward

    replace_forward_backward(training_client, forward_backward, forward_backward_async)
    training_client._rlcli_loss_plan = plan
