"""Each RL step's loss and clip fraction, from the per-token outputs the server returns.

The cookbook logs no loss and no clip fraction (SkyRL returns per-token losses and no loss metric),
so each forward_backward future is watched (rlcli.train.hooks); when the recipe reads its result:
    optim/loss           the server's objective as it reduces it: per sequence sum(loss_t) / sum(w_t),
                         then the mean over sequences (w: the weights the server used)
    optim/clip_fraction  among tokens with a non-zero advantage (those with gradient), the share the
                         clip acted on: ppo and gspo where the clipped term wins the min (ratio > high
                         with A > 0, ratio < low with A < 0: no gradient), cispo where the importance
                         weight was truncated, importance_sampling never; gspo's ratio is the
                         sequence's s_i. dppo has no ratio clip: no clip fraction.
They join the step's row in the cookbook's own logger call: one metrics.jsonl row per step.
"""

from __future__ import annotations

import math
from typing import Any

from rlcli.train.metrics import CLIP, LOSS

CLIPPED_LOSSES = ("ppo", "gspo", "cispo", "importance_sampling")
SERVER_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # SkyRL jax's (backends/jax.py)


def clip_acted(loss: str, ratio_T, adv_T, low: float, high: float):
    """Per token: did the clip act (see the module docstring)?"""
    import numpy as np

    if loss in ("ppo", "gspo"):
        return ((ratio_T > high) & (adv_T > 0)) | ((ratio_T < low) & (adv_T < 0))
    if loss == "cispo":
        return (ratio_T > high) | (ratio_T < low)
    return np.zeros_like(ratio_T, dtype=bool)


def datum_statistics(loss: str, config: dict[str, float], datum: Any, output: dict[str, Any]):
    """(this sequence's loss as the server reduces it, clipped tokens, tokens with an advantage), or None."""
    import numpy as np

    from rlcli.train.losses import log_sequence_ratio, with_response_weights

    if loss == "gspo":  # both gspo routes send the response weights (losses.with_response_weights)
        datum = with_response_weights(datum)
    inputs = datum.loss_fn_inputs
    if not {"elementwise_loss", "logprobs"} <= set(output):  # a backend that returns no per-token losses
        return None
    loss_T, lp_T = (np.asarray(output[k].tolist(), dtype=np.float64) for k in ("elementwise_loss", "logprobs"))
    w_T = np.asarray(inputs["weights"].tolist(), dtype=np.float64) if "weights" in inputs else np.ones_like(lp_T)
    seq_loss = float(loss_T.sum() / max(w_T.sum(), 1e-9))
    if loss not in CLIPPED_LOSSES or "advantages" not in inputs:
        return seq_loss, 0, 0
    adv_T, old_T = (np.asarray(inputs[k].tolist(), dtype=np.float64) for k in ("advantages", "logprobs"))
    if loss == "gspo":
        ratio_T = np.full_like(lp_T, math.exp(log_sequence_ratio(lp_T, old_T, w_T)))
    else:
        ratio_T = np.exp(lp_T - old_T)
    limits = {**SERVER_CLIP_DEFAULTS, **config}
    active_T = (adv_T != 0) & (w_T != 0)
    clipped_T = clip_acted(loss, ratio_T, adv_T, limits["clip_low_threshold"], limits["clip_high_threshold"])
    return seq_loss, int((clipped_T & active_T).sum()), int(active_T.sum())


class StepStats:
    """Collects the statistics of each forward_backward result; `drain` hands over one step's worth."""

    def __init__(self, loss: str, config: dict[str, float] | None):
        self.loss, self.config = loss, dict(config or {})
        self._seq_losses: list[float] = []
        self._clipped = self._active = 0

    def record(self, data: list, result: Any, config: dict[str, float] | None) -> None:
        for datum, output in zip(data, result.loss_fn_outputs, strict=True):
            if figures := datum_statistics(self.loss, {**self.config, **(config or {})}, datum, output):
                self._seq_losses.append(figures[0])
                self._clipped, self._active = self._clipped + figures[1], self._active + figures[2]

    def drain(self) -> dict[str, float]:
        if not self._seq_losses:
            return {}
        out = {LOSS: sum(self._seq_losses) / len(self._seq_losses)}
        if self.loss in CLIPPED_LOSSES:
            out[CLIP] = self._clipped / self._active if self._active else 0.0  # nothing with gradient: nothing clipped
        self._seq_losses, self._clipped, self._active = [], 0, 0
        return out

    def watch(self, client: Any) -> None:
        """Record every forward_backward result of `client` as the recipe reads it."""
        from rlcli.train.hooks import watch_forward_backward

        watch_forward_backward(client, self.record)
