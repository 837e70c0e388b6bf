"""The loss names SkyRL's Tinker API accepts, typed for the tinker client.

tinker 0.25 types `loss_fn` as Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"].
SkyRL's API accepts a different set (gspo, dppo and ppo_critic too; dro is refused with 422), and the
client checks nothing at run time: the name travels as a plain string in the protobuf request. This
module names SkyRL's set explicitly so rlcli's code is typed against what the server accepts, and
hands the client its own type through one checked cast instead of `# type: ignore` everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast, get_args

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
