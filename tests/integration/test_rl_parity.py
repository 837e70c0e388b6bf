"""Parity on the real server: one step of fused `ppo` and one step of ppo through the 2-pass route agree.

What "the same loss expressed through the 2-pass route" means for ppo. The 2-pass route
(rlcli.train.losses, built for GSPO) is: a forward pass for the current logprobs lp, then one
forward_backward with a loss the server does serve, its inputs rewritten with lp so that its value
and gradient are those of the loss wanted. For GSPO the rewrite is old := lp - log s_i under ppo.
Applied to ppo itself that rewrite is the identity (the token's own ratio replaces s_i, and
lp - (lp - old) = old), so it would compare ppo with ppo. The form that does test something takes
ppo's clip out of the server's hands:

    ppo per token:  -min(r A, clip(r, low, high) A),  r = exp(logp - old)
    where the clipped term wins the min (r > high with A > 0, or r < low with A < 0) the token's loss
    is the constant -clip(r) A and has no gradient; elsewhere it is -r A, importance_sampling's loss.

So pass 1 is a forward pass giving lp; the client marks the tokens where lp says the clip wins; pass 2
is the server's `importance_sampling` on the same batch with A := 0 on those tokens. Its gradient is
ppo's, token for token; its loss lacks the clipped tokens' constants, which the client adds back
(in float64, reduced as the jax backend reduces: per sequence sum / sum of weights, mean over
sequences). Both clients start from the same weights (same LoRA seed, slot gradients cleared with
a learning-rate-0, betas-0 optim_step, as in test_fused_gspo), train on the same frozen batch (some
sequences clipped, advantages of both signs) with Adam betas 0, and must give the same loss, grad
norm and post-step sampling logprobs (a sampling client of the updated weights, compute_logprobs).
rlcli's own step statistics (rlcli.train.stats.StepStats) read on the fused result give the same loss and the
clip fraction the route's client decided.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlcli.client import unload_model
from rlcli.train import metrics, stats
from tests.integration.test_fused_gspo import ADAM, CLIP, clean_client, current_logprobs, rl_data, token_batch

pytestmark = pytest.mark.server

LOW, HIGH = CLIP["clip_low_threshold"], CLIP["clip_high_threshold"]


@pytest.fixture
def service(server, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=server.url)


def reduced(token_losses: np.ndarray) -> float:
    """The jax backend's reduction with no weights sent (every token weighs 1): per-sequence mean, then mean."""
    return float(token_losses.mean(axis=-1).mean())


def elementwise(output) -> np.ndarray:
    return np.stack([o["elementwise_loss"].to_numpy() for o in output.loss_fn_outputs]).astype(np.float64)


def sampling_logprobs(client, tokens: np.ndarray) -> np.ndarray:
    """Logprobs of each token row under a sampling client of the client's current weights."""
    import tinker

    sampler = client.save_weights_and_get_sampling_client().result()
    futures = [sampler.compute_logprobs(tinker.ModelInput.from_ints(row.tolist())) for row in tokens]
    return np.array([[np.nan if v is None else v for v in f.result()] for f in futures], dtype=np.float64)


def with_advantages(data: list, adv: np.ndarray) -> list:
    import tinker

    return [tinker.Datum(model_input=d.model_input,
                         loss_fn_inputs={**d.loss_fn_inputs, "advantages": adv[i].astype(np.float32)})
            for i, d in enumerate(data)]


def fused_step(client, data):
    import tinker

    output = client.forward_backward(data, "ppo", CLIP).result()
    metrics = client.optim_step(tinker.AdamParams(**ADAM)).result().metrics
    return reduced(elementwise(output)), output, metrics


def two_pass_step(client, tokens, data, old: np.ndarray, adv: np.ndarray):
    """Forward for lp; importance_sampling without the tokens ppo's clip zeroes; their constants added back."""
    import tinker

    lp = current_logprobs(client, tokens).astype(np.float64)  # pass 1
    ratio = np.exp(lp - old)
    clipped = ((ratio > HIGH) & (adv > 0)) | ((ratio < LOW) & (adv < 0))
    output = client.forward_backward(with_advantages(data, np.where(clipped, 0.0, adv)),
                                     "importance_sampling").result()  # pass 2
    metrics = client.optim_step(tinker.AdamParams(**ADAM)).result().metrics
    constants = np.where(clipped, -np.clip(ratio, LOW, HIGH) * adv, 0.0)
    return reduced(elementwise(output) + constants), clipped, metrics


def test_fused_ppo_and_its_two_pass_form_take_the_same_step(server, service):
    clients = {name: clean_client(service, server.model, seed=11) for name in ("fused", "2-pass")}
    try:
        tokens = token_batch(2)
        lp_before = current_logprobs(clients["fused"], tokens)
        data, old, adv, _ = rl_data(tokens, lp_before)  # frozen: both steps train on exactly this
        old, adv = old.astype(np.float64), adv.astype(np.float64)
        fused_loss, fused_out, fused_m = fused_step(clients["fused"], data)
        two_loss, clipped, two_m = two_pass_step(clients["2-pass"], tokens, data, old, adv)
        after = {name: sampling_logprobs(client, tokens) for name, client in clients.items()}
        step_stats = stats.StepStats("ppo", CLIP)
        step_stats.record(data, fused_out, None)
        logged = step_stats.drain()
        active = adv != 0
        figures = {
            "loss fused": fused_loss, "loss 2-pass": two_loss,
            "loss |diff|": abs(fused_loss - two_loss),
            "grad_norm rel diff": abs(fused_m["skyrl.ai/grad_norm"] / two_m["skyrl.ai/grad_norm"] - 1),
            "post-step sampling logprobs max |diff|": float(np.nanmax(np.abs(after["fused"] - after["2-pass"]))),
            "step moved training logprobs": float(np.abs(current_logprobs(clients["fused"], tokens)
                                                         - lp_before).max()),
            "clipped tokens": int(clipped.sum()), "tokens with advantage": int(active.sum()),
            "optim/loss |diff|": abs(logged[metrics.LOSS] - fused_loss),
            "optim/clip_fraction": logged[metrics.CLIP],
        }
        print(f"\nfused ppo vs 2-pass (forward + importance_sampling, clip decided in the client): {figures}")
        assert 0 < figures["clipped tokens"] < figures["tokens with advantage"]  # both kinds of token are present
        assert figures["step moved training logprobs"] > 1e-3  # the comparison below means something
        assert figures["loss |diff|"] < 1e-5 and figures["grad_norm rel diff"] < 1e-4
        assert figures["post-step sampling logprobs max |diff|"] < 1e-5
        assert figures["optim/loss |diff|"] < 1e-6
        assert logged[metrics.CLIP] == pytest.approx(clipped.sum() / active.sum())
    finally:
        for client in clients.values():
            unload_model(server.url, client.model_id)
