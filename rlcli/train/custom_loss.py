"""A client-side loss (tinker's `forward_backward_custom`) whose gradient SkyRL's jax backend applies exactly.

tinker 0.38's forward_backward_custom runs a forward pass, computes the loss in local torch, and sends its gradient
g = dloss/dlogp back as a `cross_entropy` pass with weights -g, which hosted Tinker sums over every token. SkyRL 0.4.0's
jax backend does not (docs/decisions.md, "forward_backward_custom on SkyRL"): it divides each sequence's loss by the sum
of its weights, floored at 1e-9, and the accumulated gradient by the number of sequences. A sequence whose weights sum
below zero (every rejected answer of DPO) is multiplied by 1e9; one whose weights sum above zero loses its
magnitude. And the client then reads `loss:sum` from the server's metrics, which SkyRL does not send: a
KeyError after the gradient was already applied.

This route sends the same gradient through a loss whose reduction can be undone: the server's `importance_sampling`
with the forward pass's own logprobs as the sampling logprobs (ratio r_t = exp(lp_t - lp_t(forward)), value 1,
gradient dlp_t), weights the 0/1 mask m of the tokens with a gradient, and advantages A_t = -g_t * sum(m_i) * B for
a batch of B sequences. The server minimises

    (1/B) sum_i (1/sum(m_i)) sum_t m_t (-r_t A_t),  whose gradient is  sum_i sum_t g_t dlp_t = dloss/dtheta.

The same two server passes as tinker's own route, public client methods only (forward, forward_backward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

SURROGATE = "importance_sampling"
LOSS_SUM = "loss:sum"  # what tinker's own route reports: the custom loss's value


def forward_data(data: list[Any]) -> list[Any]:
    """The datums as the forward pass needs them: target tokens, and weights (zeros where none were given)."""
    import tinker

    out = []
    for datum in data:
        targets = datum.loss_fn_inputs["target_tokens"]
        weights = datum.loss_fn_inputs.get("weights") or tinker.TensorData(
            data=[0.0] * len(targets.data), dtype="float32", shape=targets.shape)
        out.append(tinker.Datum(model_input=datum.model_input,
                                loss_fn_inputs={"target_tokens": targets, "weights": weights}))
    return out


def surrogate_inputs(logprobs: list[float], grad: list[float], batch: int) -> dict[str, list[float]]:
    """One sequence's importance_sampling inputs (logprobs, weights, advantages) for gradient `grad` of the loss."""
    mask = [1.0 if g != 0 else 0.0 for g in grad]
    scale = sum(mask) * batch
    return {"logprobs": list(logprobs), "weights": mask, "advantages": [-g * scale for g in grad]}


def surrogate_data(data: list[Any], logprobs_list: list[Any], grads: list[Any]) -> list[Any]:
    import tinker

    out = []
    for datum, logprobs, grad in zip(data, logprobs_list, grads, strict=True):
        inputs = surrogate_inputs(logprobs.detach().flatten().tolist(), grad.flatten().tolist(), len(data))
        out.append(tinker.Datum(model_input=datum.model_input, loss_fn_inputs={
            "target_tokens": datum.loss_fn_inputs["target_tokens"],
            **{k: tinker.TensorData(data=v, dtype="float32", shape=[len(v)]) for k, v in inputs.items()}}))
    return out


class _Result:
    """The backward pass's future, whose result carries the custom loss's metrics and value (as tinker's does)."""

    def __init__(self, future: Any, metrics: dict[str, float]):
        self._future, self._metrics = future, metrics

    def _with_metrics(self, result: Any) -> Any:
        return dataclasses.replace(result, metrics={**result.metrics, **self._metrics})

    def result(self, timeout: float | None = None) -> Any:
        return self._with_metrics(self._future.result(timeout))

    async def result_async(self, timeout: float | None = None) -> Any:
        return self._with_metrics(await self._future.result_async(timeout))

    def __await__(self) -> Any:
        return self.result_async().__await__()


def forward_backward_custom(client: Any, data: list[Any], loss_fn: Callable[..., Any], **_: Any) -> _Result:
    """`client.forward_backward_custom(data, loss_fn)`, exact on SkyRL's jax backend (see the module docstring)."""
    import torch

    if not data:
        raise ValueError("No data provided")
    forward = client.forward(forward_data(data), "cross_entropy").result()
    logprobs_list = [torch.tensor(out["logprobs"].data).requires_grad_(True) for out in forward.loss_fn_outputs]
    loss, metrics = loss_fn(data, logprobs_list)
    loss.backward()
    grads = [lp.grad if lp.grad is not None else torch.zeros_like(lp) for lp in logprobs_list]
    future = client.forward_backward(surrogate_data(data, logprobs_list, grads), SURROGATE)
    return _Result(future, {**metrics, LOSS_SUM: float(loss.detach().sum())})
