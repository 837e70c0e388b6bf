"""The weight-decay hazard on SkyRL's jax backend, on the real server: one model's optim_step with
weight_decay > 0 changes ANOTHER model's adapter (adamw runs over the whole LoRA table). This is why a
server with --tenants refuses weight_decay > 0 (tests/integration/test_tenants.py checks the refusal)."""

from __future__ import annotations

import pytest

from rlcli.client import unload_model

pytestmark = pytest.mark.server


def _datum(weight: float):
    import tinker

    tokens = list(range(5, 25))
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [weight] * (len(tokens) - 1)})


def _loss(client) -> float:
    """The other model's loss on a fixed batch: a forward only, so it changes nothing itself."""
    out = client.forward([_datum(1.0)], "cross_entropy").result()
    return float(sum(sum(o["logprobs"].tolist()) for o in out.loss_fn_outputs))


def test_one_models_weight_decay_changes_another_model(server, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    service = tinker.ServiceClient(base_url=server.url)
    victim = service.create_lora_training_client(base_model=server.model, rank=2, seed=0).result()
    other = service.create_lora_training_client(base_model=server.model, rank=2, seed=1).result()
    try:
        victim.forward_backward([_datum(1.0)], "cross_entropy").result()
        victim.optim_step(tinker.AdamParams(learning_rate=5e-2)).result()  # a non-zero adapter to decay
        before = _loss(victim)
        other.forward_backward([_datum(0.0)], "cross_entropy").result()
        other.optim_step(tinker.AdamParams(learning_rate=1.0, weight_decay=0.0)).result()
        assert _loss(victim) == before  # control: without decay the other model's step leaves it alone
        other.forward_backward([_datum(0.0)], "cross_entropy").result()
        other.optim_step(tinker.AdamParams(learning_rate=1.0, weight_decay=0.5)).result()
        assert _loss(victim) != before  # the hazard: the other model's step decayed this one's adapter
    finally:
        unload_model(server.url, victim.model_id)
        unload_model(server.url, other.model_id)
