"""rlcli.train.custom_loss: the surrogate SkyRL's jax backend reduces to the custom loss's exact gradient.

The server is stood in for by its reduction, written out in torch from skyrl 0.4.0 (backends/jax.py, loss_for_lora
and AccumulatedGradients; tinker/loss_fns.py): per token loss * weight, each sequence divided by max(sum of its
weights, 1e-9), the sum over sequences divided by their number. The logprobs are the leaves, so the gradient the
server would apply to them is compared with the custom loss's own. The real server's side is
tests/integration/test_train_dpo.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlcli.train.custom_loss import surrogate_inputs


def server_gradient(logprobs: list[torch.Tensor], inputs: list[dict[str, list[float]]], loss: str) -> list:
    """d(server loss)/d(logprobs) for the datums' inputs, as SkyRL's jax backend reduces `loss`."""
    leaves = [lp.detach().clone().requires_grad_(True) for lp in logprobs]
    total = torch.zeros(())
    for lp, x in zip(leaves, inputs, strict=True):
        w = torch.tensor(x["weights"])
        if loss == "cross_entropy":
            per_token = -lp * w
        else:  # importance_sampling
            per_token = -w * torch.exp(lp - torch.tensor(x["logprobs"])) * torch.tensor(x["advantages"])
        total = total + per_token.sum() / torch.clamp(w.sum(), min=1e-9)
    (total / len(leaves)).backward()
    return [lp.grad for lp in leaves]


def dpo_like(logprobs: list[torch.Tensor], masks: list[torch.Tensor], beta: float = 0.1) -> torch.Tensor:
    """The cookbook's DPO loss with a zero reference: pairs (chosen, rejected) at even and odd places."""
    sums = [torch.dot(lp, m) for lp, m in zip(logprobs, masks, strict=True)]
    x = torch.stack([sums[i] - sums[i + 1] for i in range(0, len(sums), 2)])
    return -F.logsigmoid(beta * x).mean()


def batch() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    lengths, responses = (7, 9, 5, 12), (3, 4, 2, 6)
    logprobs = [-torch.rand(n, generator=gen) * 5 for n in lengths]
    masks = [torch.cat([torch.zeros(n - r), torch.ones(r)]) for n, r in zip(lengths, responses, strict=True)]
    return logprobs, masks


def local_gradient(logprobs: list[torch.Tensor], masks: list[torch.Tensor]) -> list[torch.Tensor]:
    leaves = [lp.clone().requires_grad_(True) for lp in logprobs]
    dpo_like(leaves, masks).backward()
    return [lp.grad for lp in leaves]


def test_the_surrogate_gives_the_server_the_custom_losss_exact_gradient():
    logprobs, masks = batch()
    grads = local_gradient(logprobs, masks)
    inputs = [surrogate_inputs(lp.tolist(), g.tolist(), len(logprobs)) for lp, g in zip(logprobs, grads, strict=True)]
    for got, want in zip(server_gradient(logprobs, inputs, "importance_sampling"), grads, strict=True):
        assert torch.allclose(got, want, atol=1e-7), (got, want)


def test_tinkers_own_surrogate_is_what_the_server_cannot_reduce():
    """tinker's route (cross_entropy, weights -g): the rejected answers' weights sum below zero, and the server's
    floor multiplies them by 1e9; this is why the route above exists."""
    logprobs, masks = batch()
    grads = local_gradient(logprobs, masks)
    inputs = [{"weights": (-g).tolist()} for g in grads]
    got = server_gradient(logprobs, inputs, "cross_entropy")
    assert got[1].abs().max() > 1e6 * grads[1].abs().max()  # a rejected answer
    assert not torch.allclose(got[0], grads[0])  # a chosen one: normalised, its magnitude lost


def test_tokens_without_gradient_are_masked_out_and_an_empty_sequence_sends_nothing():
    x = surrogate_inputs([-1.0, -2.0, -3.0], [0.0, 0.5, -0.25], batch=4)
    assert x == {"logprobs": [-1.0, -2.0, -3.0], "weights": [0.0, 1.0, 1.0], "advantages": [-0.0, -4.0, 2.0]}
    assert surrogate_inputs([-1.0], [0.0], batch=2)["weights"] == [0.0]
