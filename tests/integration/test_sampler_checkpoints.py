"""Sampling a saved checkpoint must never change a model that is still training (runtime/rlcli_samplers.py).

The sequence: train 2 steps, save sampler weights s1, train 2 more, sample s1. On rlcli's server the live
model's forward logprobs on a fixed batch are unchanged by it and s1's samples come from s1's weights; on
stock SkyRL the live model silently becomes s1 (the same test, run there, shows the hazard is real).
"""

from __future__ import annotations

import pytest

from rlcli.client import unload_model

pytestmark = pytest.mark.server

TOKENS = list(range(5, 37))
TOLERANCE = 1e-4  # the sampler's prompt logprobs and the trainer's forward: same weights, other kernels


def _service(url: str, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=url)


def _batch():
    import tinker

    return [tinker.Datum(model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
                         loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)})]


def _train(client, steps: int) -> None:
    import tinker

    for _ in range(steps):
        client.forward_backward(_batch(), "cross_entropy").result()
        client.optim_step(tinker.AdamParams(learning_rate=2e-2)).result()


def _live(client) -> list[float]:
    """The training model's forward logprobs of the fixed batch."""
    out = client.forward(_batch(), "cross_entropy").result()
    return [float(x) for x in out.loss_fn_outputs[0]["logprobs"].tolist()]


def _sampled(service, path: str) -> tuple[list[float], list[int]]:
    """A checkpoint's logprobs of the same tokens (as the sampler's prompt logprobs) and a greedy sample."""
    import tinker

    sampler = service.create_sampling_client(model_path=path)
    params = tinker.SamplingParams(max_tokens=4, temperature=0.0, seed=0)
    out = sampler.sample(tinker.ModelInput.from_ints(TOKENS), 1, params, include_prompt_logprobs=True).result()
    logprobs = [float(x) for x in out.prompt_logprobs if x is not None]
    return logprobs[-(len(TOKENS) - 1):], list(out.sequences[0].tokens)


def _close(a: list[float], b: list[float], tolerance: float = TOLERANCE) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tolerance


def _sequence(service, url: str, model: str) -> dict:
    client = service.create_lora_training_client(base_model=model, rank=8, seed=0)
    try:
        _train(client, 2)
        s1 = client.save_weights_for_sampler("s1").result().path
        at_s1 = _live(client)
        _train(client, 2)
        before = _live(client)
        s1_logprobs, s1_tokens = _sampled(service, s1)
        after = _live(client)
        _train(client, 1)  # then s1 again, after more training: still s1's weights, not the trained ones
        s1_again, s1_tokens_again = _sampled(service, s1)
        s2 = client.save_weights_for_sampler("s2").result().path  # the one just saved: the RL loop's case
        at_s2 = _live(client)
        s2_logprobs, _ = _sampled(service, s2)
        return {"at_s1": at_s1, "before": before, "after": after, "s1": s1_logprobs, "s1_again": s1_again,
                "s1_tokens": s1_tokens, "s1_tokens_again": s1_tokens_again, "at_s2": at_s2, "s2": s2_logprobs,
                "live_after_all": _live(client)}
    finally:
        unload_model(url, client.model_id)


def test_sampling_an_old_checkpoint_leaves_the_live_model_alone(server, monkeypatch):
    r = _sequence(_service(server.url, monkeypatch), server.url, server.model)
    assert not _close(r["at_s1"], r["before"], 1e-3), "training did not move the model: the test shows nothing"
    assert r["after"] == r["before"], (r["before"], r["after"])  # bit for bit: the live weights were put back
    assert _close(r["s1"], r["at_s1"]), (r["s1"], r["at_s1"])  # s1's samples come from s1's weights
    assert _close(r["s1_again"], r["at_s1"]) and r["s1_tokens_again"] == r["s1_tokens"]
    assert _close(r["s2"], r["at_s2"])
    assert r["live_after_all"] == r["at_s2"]


def test_stock_skyrl_overwrites_the_live_model(stock_server, embedded_model, monkeypatch):
    """The hazard the extension removes: on stock SkyRL sampling s1 replaces the live weights with s1's."""
    url, _ = stock_server
    r = _sequence(_service(url, monkeypatch), url, embedded_model)
    assert _close(r["after"], r["at_s1"]) and not _close(r["after"], r["before"], 1e-3)
