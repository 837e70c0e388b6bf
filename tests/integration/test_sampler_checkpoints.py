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

    sampler = service.create_sampling_client(model_path=path).result()
    params = tinker.SamplingParams(max_tokens=4, temperature=0.0, seed=0)
    out = sampler.sample(tinker.ModelInput.from_ints(TOKENS), 1, params, include_prompt_logprobs=True).result()
    logprobs = [float(x) for x in out.prompt_logprobs if x is not None]
    return logprobs[-(len(TOKENS) - 1):], list(out.sequences[0].tokens)


def _close(a: list[float], b: list[float], tolerance: float = TOLERANCE) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tolerance


def _sequence(service, url: str, model: str) -> dict:
    client = service.create_lora_training_client(base_model=model, rank=8, seed=0).result()
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


def _loads_of(log, model_id: str, name: str) -> int:
    """How often the engine read a sampler checkpoint's file (SkyRL logs each read)."""
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if "Loading LoRA sampler checkpoint from" in line and f"{model_id}/sampler_weights/{name}." in line)


def test_a_checkpoint_sampled_again_comes_from_memory_until_its_file_changes(server, monkeypatch):
    """The weights a borrowed slot read from s1's file are kept: sampling s1 again reads no file and answers
    bit for bit as the file did. Deleted, s1 is refused, kept weights or not; saved again under the name
    (SkyRL refuses a second save of a name that exists), s1 means the new weights; and a file replaced behind
    the server's back is read again."""
    import os
    import shutil
    import time

    import tinker

    service = _service(server.url, monkeypatch)
    client = service.create_lora_training_client(base_model=server.model, rank=8, seed=0).result()
    try:
        _train(client, 1)
        s1 = client.save_weights_for_sampler("s1").result().path
        at_s1 = _live(client)
        _train(client, 1)  # the slot now holds newer weights: s1 is sampled on a borrowed slot
        from_file = _sampled(service, s1)
        from_memory = _sampled(service, s1)
        assert from_memory == from_file and _close(from_file[0], at_s1)
        tinker.RestClient(base_url=server.url).delete_checkpoint(client.model_id, "sampler_weights/s1").result()
        with pytest.raises(Exception) as refused:  # gone, kept weights or not
            _sampled(service, s1)
        assert "s1" in str(refused.value), refused.value
        _train(client, 1)
        assert client.save_weights_for_sampler("s1").result().path == s1  # the name now means these weights
        at_new = _live(client)
        _train(client, 1)
        live = _live(client)
        assert not _close(at_new, at_s1, 1e-3), "training did not move the model: the test shows nothing"
        resaved = _sampled(service, s1)
        assert _close(resaved[0], at_new), "kept weights outlived their file"
        assert _live(client) == live  # the live weights were put back
        assert _sampled(service, s1) == resaved  # kept again
        client.save_weights_for_sampler("s2").result()
        at_s2 = _live(client)
        _train(client, 1)
        # s1's file replaced behind the server's back (here by s2's): what the file holds now is sampled
        folder = next(server.home.rglob(f"{client.model_id}/sampler_weights"))
        shutil.copyfile(folder / "s2.tar.gz", folder / "s1.tar.gz.new")
        os.replace(folder / "s1.tar.gz.new", folder / "s1.tar.gz")
        assert _close(_sampled(service, s1)[0], at_s2), "kept weights outlived their file"
        deadline = time.monotonic() + 10  # the log reaches the file through the supervisor
        while _loads_of(server.log, client.model_id, "s1") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        # read from the file: the first sample, the one after the new save, the one after the replacement
        assert _loads_of(server.log, client.model_id, "s1") == 3
    finally:
        unload_model(server.url, client.model_id)
