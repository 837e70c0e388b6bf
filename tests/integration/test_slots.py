"""The SkyRL jax slot hazard: a new model must never inherit an unloaded model's gradients."""

from __future__ import annotations

import pytest

from rlcli.client import unload_model
from rlcli.slots import ensure_clean_next_slot, server_cleans_slots

pytestmark = pytest.mark.server


def _service(url: str, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=url)


def _batch(weight: float):
    import tinker

    tokens = list(range(5, 45))
    return [tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [weight] * (len(tokens) - 1)})]


def _leave_gradients_behind(service, url: str, model: str) -> None:
    """A model that ran forward_backward and was unloaded before any optim_step (a crashed run)."""
    victim = service.create_lora_training_client(base_model=model, rank=4, seed=0).result()
    victim.forward_backward(_batch(1.0), "cross_entropy").result()
    unload_model(url, victim.model_id)


def _first_step_grad_norm(service, url: str, model: str) -> float:
    """A fresh model's first step on a zero-weight batch: any gradient it applies is someone else's."""
    import tinker

    fresh = service.create_lora_training_client(base_model=model, rank=4, seed=1).result()
    try:
        fresh.forward_backward(_batch(0.0), "cross_entropy").result()
        metrics = fresh.optim_step(tinker.AdamParams(learning_rate=0.0)).result().metrics
        return float(metrics["skyrl.ai/grad_norm"])
    finally:
        unload_model(url, fresh.model_id)


def test_rlcli_server_zeroes_the_slot_on_create(server, monkeypatch):
    service = _service(server.url, monkeypatch)
    assert server_cleans_slots(server.url)
    _leave_gradients_behind(service, server.url, server.model)
    assert _first_step_grad_norm(service, server.url, server.model) == 0.0


def test_stock_server_leaks_and_the_client_scrub_prevents_it(stock_server, embedded_model, monkeypatch):
    url, _ = stock_server
    service = _service(url, monkeypatch)
    assert not server_cleans_slots(url)
    # The hazard is real on stock SkyRL: without the scrub the fresh model applies leaked gradients.
    _leave_gradients_behind(service, url, embedded_model)
    assert _first_step_grad_norm(service, url, embedded_model) > 1e-3
    # With rlcli's scrub before creating the model, its first step is clean.
    _leave_gradients_behind(service, url, embedded_model)
    ensure_clean_next_slot(url, embedded_model)
    assert _first_step_grad_norm(service, url, embedded_model) == 0.0


def test_a_full_server_names_the_flag_that_raises_its_slots(server, monkeypatch):
    """conftest starts the server with --slots 7: the model after the 7th is refused with the flag named."""
    service = _service(server.url, monkeypatch)
    created = []
    try:
        with pytest.raises(Exception) as refused:  # noqa: PT011 - the tinker client's error type varies by version
            for _ in range(8):  # other tests hold none now, but a leftover would only make it refuse sooner
                created.append(service.create_lora_training_client(base_model=server.model, rank=4).result().model_id)
        message = str(refused.value)
        assert "Maximum number of LoRA adapters (8)" in message and "rlcli serve start --slots N" in message, message
        assert "all 7 LoRA slots" in message, message
    finally:
        for model_id in created:
            unload_model(server.url, model_id)
