"""Fused GSPO on SkyRL's jax backend (runtime/rlcli_losses.py) and the exact 2-pass route, for real.

The registry and the jax loss run in the server venv's Python; the routes run against the session's
CPU server (started with rlcli's extension, the default) and a second small stock server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from rlcli.client import request_json, unload_model
from rlcli.errors import UsageError
from rlcli.server.runtime import manifest
from rlcli.train.losses import (
    GSPO_DEFAULTS,
    gspo_reference,
    install_loss_route,
    plan_loss,
    served_losses,
    shifted_logprobs,
)
from tests.conftest import REPO, run_rlcli, shared_jax_cache_env, shared_server_venv
from tests.unit.test_losses import random_batch

pytestmark = pytest.mark.server

RUNTIME = REPO / "rlcli" / "server" / "runtime"
CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
# beta 0: Adam's moments are this step's gradient alone, whatever an earlier tenant of the slot left.
ADAM = dict(learning_rate=0.05, beta1=0.0, beta2=0.0, eps=1e-3)


def server_python(script: str, stdin: str = "", timeout: float = 240, check: bool = True):
    """Run `script` with the server venv's Python, rlcli's runtime folder importable; its stdout."""
    python = shared_server_venv() / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(RUNTIME), **shared_jax_cache_env())
    proc = subprocess.run([str(python), "-c", script], input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=RUNTIME, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout if check else proc


REGISTRY_CHECK = """
import rlcli_losses as ext
from skyrl.tinker import loss_fns, types
import skyrl.tinker.api as api
assert types.LOSS_TYPES == {"cross_entropy": 0, "importance_sampling": 1, "ppo": 2, "cispo": 3}, types.LOSS_TYPES
assert [f.__name__ for f in loss_fns.LOSS_FUNCTIONS] == [
    "cross_entropy_loss", "importance_sampling_loss", "ppo_loss", "cispo_loss"], loss_fns.LOSS_FUNCTIONS
assert {f.name for f in __import__("dataclasses").fields(loss_fns.LossFnConfig)} == {
    "clip_low_threshold", "clip_high_threshold"}
assert "gspo" in types.SUPPORTED_LOSS_FNS
assert api.ForwardBackwardInput._ALLOWED_KEYS_BY_LOSS_FN["gspo"] == {"clip_low_threshold", "clip_high_threshold"}
import skyrl.backends.jax as backend
backend.LOSS_FUNCTIONS = list(loss_fns.LOSS_FUNCTIONS)  # a registration that would not reach the backend's switch,
try:  # which clamps index 4 to cispo: refused before anything is appended
    ext.install_jax_losses()
except RuntimeError as e:
    print("clamp caught:", e)
else:
    raise SystemExit("the registration did not notice a backend dispatching on another list")
backend.LOSS_FUNCTIONS = loss_fns.LOSS_FUNCTIONS
assert ext.install_jax_losses() == 4 and loss_fns.LOSS_FUNCTIONS[4] is ext.gspo_loss
"""


def test_skyrl_jax_loss_registry_is_the_one_rlcli_extends():
    """Fails loudly when a SkyRL upgrade changes LOSS_TYPES, LOSS_FUNCTIONS or LossFnConfig."""
    assert "clamp caught" in server_python(REGISTRY_CHECK)


CAPABILITIES_AND_FAILURE = """
import rlcli_api, rlcli_losses as ext
from skyrl.tinker.config import EngineConfig
def caps(backend, **backend_config):
    return rlcli_api.capabilities(EngineConfig(base_model="m", backend=backend, backend_config=backend_config))
assert "gspo" in caps("jax")["losses"] and "note" not in caps("jax")
assert "gspo" not in caps("jax", use_ray=True)["losses"] and "Ray" in caps("jax", use_ray=True)["note"]
assert "gspo" not in caps("jax", num_processes=2)["losses"]
assert set(caps("fsdp")["losses"]) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "gspo", "dppo",
                                       "ppo_critic"}
assert "ppo_critic" not in caps("megatron")["losses"] and "dppo" in caps("megatron")["losses"]
ext.STOCK_JAX = {"cross_entropy": 0}  # as if SkyRL's registry had changed under the extension
ext.register({})
"""


def test_engine_refuses_to_start_when_registration_fails_and_capabilities_follow_the_backend():
    proc = server_python(CAPABILITIES_AND_FAILURE, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "FAILED to register gspo" in proc.stderr and "engine refuses to start" in proc.stderr, proc.stderr


JAX_LOSSES = """
import json, sys
import jax
job = json.load(sys.stdin)
jax.config.update("jax_enable_x64", job["x64"][0])
import jax.numpy as jnp
import rlcli_losses as ext
from skyrl.tinker import loss_fns, types
ext.install_jax_losses()

def run(name, logp, old, adv, mask, low, high, dtype):
    logp, old, adv, mask = (jnp.asarray(x, dtype) for x in (logp, old, adv, mask))
    n = logp.shape[0]
    config = loss_fns.LossFnConfig(clip_low_threshold=jnp.full((n,), low, dtype),
                                   clip_high_threshold=jnp.full((n,), high, dtype))
    kinds = jnp.full((n,), types.LOSS_TYPES[name], jnp.int32)
    def total(lp):  # the backend's dispatch and reduction (backends/jax.py, loss_for_lora)
        per_token = jax.vmap(lambda k, a, m, o, v, c: jax.lax.switch(k, loss_fns.LOSS_FUNCTIONS, a, m, o, v, c))(
            kinds, lp, mask, old, adv, config)
        return (per_token.sum(-1) / jnp.maximum(mask.sum(-1), 1e-9)).mean()
    loss, grad = jax.value_and_grad(total)(logp)
    return [float(loss), grad.tolist()]

found = {}
for x64 in job["x64"]:  # both precisions in one interpreter: SkyRL and jax are imported once
    jax.config.update("jax_enable_x64", x64)
    dtype = jnp.float64 if x64 else jnp.float32
    found[str(x64)] = [{name: run(name, *case[name], case["low"], case["high"], dtype) for name in ("gspo", "ppo")}
                       for case in job["cases"]]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def jax_losses() -> tuple[dict[str, list], list]:
    """SkyRL's switch dispatch on rlcli's gspo and on ppo with shifted logprobs, in float32 then float64, against
    the float64 reference: (jax's answers by str(x64), the reference's)."""
    cases, expected = [], []
    for seed in range(3):
        for eps_low, eps_high in ((0.05, 0.05), (0.2, 0.28), (3e-4, 4e-4)):
            logp, old, adv, mask = random_batch(seed)
            shifted = np.stack([shifted_logprobs(logp[i], old[i], mask[i]) for i in range(len(logp))])
            cases.append({"gspo": [x.tolist() for x in (logp, old, adv, mask)],
                          "ppo": [x.tolist() for x in (logp, shifted, adv, mask)],
                          "low": 1 - eps_low, "high": 1 + eps_high})
            expected.append(gspo_reference(logp, old, adv, mask, eps_low, eps_high))
    return json.loads(server_python(JAX_LOSSES, json.dumps({"x64": [False, True], "cases": cases}))), expected


@pytest.mark.parametrize("x64", [True, False])
def test_fused_jax_gspo_and_shifted_ppo_match_the_reference(jax_losses, x64):
    """SkyRL's own switch dispatch runs rlcli's gspo, and SkyRL's ppo on shifted logprobs; both = the paper."""
    found, expected = jax_losses
    got = found[str(x64)]
    tolerance = 1e-6 if x64 else 1e-5
    worst = {"gspo": [0.0, 0.0], "ppo": [0.0, 0.0]}
    for answer, (want_loss, want_grad) in zip(got, expected, strict=True):
        for name, (loss, grad) in answer.items():
            worst[name][0] = max(worst[name][0], abs(loss - want_loss))
            worst[name][1] = max(worst[name][1], float(np.abs(np.asarray(grad) - want_grad).max()))
    print(f"\njax {'float64' if x64 else 'float32'} vs float64 reference, max |diff| [loss, grad]: {worst}")
    assert all(diff < tolerance for pair in worst.values() for diff in pair), worst


# --- against the session's server (rlcli's extension loaded) ---------------------------------------


@pytest.fixture
def service(server, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=server.url)


def clean_client(service, model: str, seed: int):
    """A LoRA training client whose slot holds no gradients from an earlier, unloaded tenant.

    SkyRL's jax backend keeps a slot's accumulated gradients across unload/create (docs/decisions.md); an
    optim_step with learning rate 0 resets them and changes no weight.
    """
    import tinker

    client = service.create_lora_training_client(base_model=model, rank=8, seed=seed).result()
    client.optim_step(tinker.AdamParams(learning_rate=0.0, beta1=0.0, beta2=0.0)).result()
    return client


def token_batch(seed: int, n: int = 4, prompt: int = 8, response: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 900, (n, prompt + response + 1))


def current_logprobs(client, tokens: np.ndarray) -> np.ndarray:
    import tinker

    data = [tinker.Datum(model_input=tinker.ModelInput.from_ints(row[:-1].tolist()),
                         loss_fn_inputs={"target_tokens": row[1:].astype(np.int64)}) for row in tokens]
    out = client.forward(data, "cross_entropy").result()
    return np.stack([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def rl_data(tokens: np.ndarray, lp: np.ndarray, prompt: int = 8):
    """Cookbook-shaped data (no weights): sequence ratios inside and outside [0.8, 1.2], advantages +/-."""
    import tinker

    drifts, advantages = (0.0, 0.5, -0.5, 0.1), (1.0, 1.0, 0.5, -0.7)  # unclipped, clipped, unclipped, unclipped
    noise = np.random.default_rng(1).normal(0.0, 0.05, lp.shape)
    mask = np.zeros(lp.shape)
    mask[:, prompt - 1:] = 1.0  # targets from the first response token on
    n = len(lp)
    old = np.where(mask != 0, lp - np.asarray(drifts)[:n, None] - noise, 0.0)
    adv = mask * np.asarray(advantages)[:n, None]
    old, adv = old.astype(np.float32), adv.astype(np.float32)
    data = [tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[i, :-1].tolist()),
                         loss_fn_inputs={"target_tokens": tokens[i, 1:].astype(np.int64), "logprobs": old[i],
                                         "advantages": adv[i]}) for i in range(len(tokens))]
    return data, old, adv, mask


async def cookbook_step(client, data, adam):
    """One step the way tinker-cookbook's RL loop makes it: forward_backward_async, optim_step_async queued."""
    fb = await client.forward_backward_async(data, loss_fn="gspo", loss_fn_config=None)
    optim = await client.optim_step_async(adam)
    return await fb.result_async(), (await optim.result_async()).metrics


def sequence_mean_loss(output, mask: np.ndarray) -> float:
    token_losses = np.stack([o["elementwise_loss"].to_numpy() for o in output.loss_fn_outputs])
    return float(((token_losses * mask).sum(-1) / mask.sum(-1)).mean())


def test_capabilities_route_says_gspo_is_fused(server):
    description, served = served_losses(server.url)
    assert served == {"cross_entropy", "importance_sampling", "ppo", "cispo", "gspo"}
    assert description == f"jax backend with rlcli runtime {manifest.VERSION}"
    assert plan_loss("gspo", None, "auto", served).passes == 1


def test_extended_losses_are_accepted_by_the_real_server(server, service):
    """cispo (stock jax) and gspo (rlcli's extension) run; dppo and ppo_critic pass the API's checks
    (no 422) and are refused by the jax engine itself, which names them."""
    import tinker

    client = clean_client(service, server.model, seed=3)
    try:
        tokens = token_batch(5, n=2)
        data, *_ = rl_data(tokens, current_logprobs(client, tokens))
        client.forward_backward(data, "cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}).result()
        out = client.forward_backward(data, "gspo", GSPO_DEFAULTS).result()
        assert len(out.loss_fn_outputs) == 2
        for name, config in (("dppo", {"delta_low": 0.2, "delta_high": 0.2}), ("ppo_critic", {"value_clip": 0.5})):
            with pytest.raises(Exception, match=f"Loss functions \\['{name}'\\] are not supported by the JAX"):
                client.forward_backward(data, name, config).result()
    finally:
        client.optim_step(tinker.AdamParams(learning_rate=0.0)).result()  # leave no gradients in the slot
        unload_model(server.url, client.model_id)


def test_fused_and_two_pass_gspo_take_the_same_step(server, service):
    import tinker

    served = served_losses(server.url)[1]
    clients = {name: clean_client(service, server.model, seed=11) for name in ("fused", "2-pass")}
    try:
        tokens = token_batch(2)
        lp = current_logprobs(clients["fused"], tokens)
        data, old, adv, mask = rl_data(tokens, lp)
        results = {}
        for (name, client), passes in zip(clients.items(), ("1", "2"), strict=True):
            install_loss_route(client, plan_loss("gspo", json.dumps(CLIP), passes, served))
            start = time.monotonic()
            output, metrics = asyncio.run(cookbook_step(client, data, tinker.AdamParams(**ADAM)))
            results[name] = (output, metrics, current_logprobs(client, tokens), time.monotonic() - start)
        (fused, fused_m, fused_after, _), (two, two_m, two_after, _) = results["fused"], results["2-pass"]
        want_loss, _ = gspo_reference(lp, old, adv, mask, 0.2, 0.2)
        diffs = {
            "loss fused-2pass": abs(sequence_mean_loss(fused, mask) - sequence_mean_loss(two, mask)),
            "loss fused-reference": abs(sequence_mean_loss(fused, mask) - want_loss),
            "grad_norm rel": abs(fused_m["skyrl.ai/grad_norm"] / two_m["skyrl.ai/grad_norm"] - 1),
            "post-step logprobs": float(np.abs(fused_after - two_after).max()),
            "step moved logprobs": float(np.abs(fused_after - lp).max()),
        }
        print(f"\nfused vs 2-pass on the server: {diffs}; step seconds "
              f"{ {k: round(v[3], 2) for k, v in results.items()} }")
        assert diffs["step moved logprobs"] > 1e-3  # the comparison below means something
        assert diffs["loss fused-2pass"] < 1e-5 and diffs["loss fused-reference"] < 1e-5
        # float32 rounding after the step grows with how far the step moved the logprobs (~15 nats here on
        # the pretrained model: 1.0e-5 apart, 7e-7 of the move).
        assert diffs["grad_norm rel"] < 1e-4
        assert diffs["post-step logprobs"] < max(1e-5, 2e-6 * diffs["step moved logprobs"])
    finally:
        for client in clients.values():
            unload_model(server.url, client.model_id)


# --- a second, stock server (--no-extensions) ------------------------------------------------------


def test_stock_server_refuses_fused_gspo_fast_and_clearly(stock_server, embedded_model, monkeypatch):
    import tinker

    url, env = stock_server
    runs_before = request_json(f"{url}/api/v1/training_runs")
    description, served = served_losses(url)
    with pytest.raises(UsageError) as caught:
        plan_loss("gspo", None, "1", served)
    print(f"\nstock server: asked and refused: {caught.value}")
    assert "stock SkyRL jax assumed" in description
    assert "--passes 2" in str(caught.value) and "rlcli's extension" in str(caught.value)
    assert plan_loss("gspo", None, "auto", served).passes == 2
    # The same through the command, before any data is read or model made.
    cli = run_rlcli("train", "rl", "--loss", "gspo", "--passes", "1", "--dataset", "arithmetic",
                    "--base-url", url, env=env, timeout=120)
    assert cli.returncode == 2 and "--passes 2" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1, cli
    # Refused before any model was made: the server holds the runs it held before.
    assert request_json(f"{url}/api/v1/training_runs") == runs_before
    # What the route saves users from: the stock engine refuses gspo only once a model exists.
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    client = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model=embedded_model, rank=4).result()
    try:
        data, *_ = rl_data(token_batch(3, n=1), np.full((1, 32), -2.0))
        with pytest.raises(Exception, match="not supported by the JAX backend"):
            client.forward_backward(data, "gspo").result()
    finally:
        unload_model(url, client.model_id)
    assert "[rlcli losses]" not in (Path(env["RLCLI_HOME"]) / "servers" / "default" / "server.log").read_text()


def test_torch_free_engine_computes_and_saves_as_the_stock_engine(server, service, stock_server, embedded_model,
                                                                   tmp_path):
    """runtime/rlcli_no_torch.py: the session server's engine imported SkyRL without torch (transformers saw none,
    peft was the venv's record), the stock server's with it. A new LoRA adds exactly zero, so both give the base
    model's logprobs; a dtype or configuration read differently would move them by far more than 1e-5. A saved
    adapter's adapter_config.json is the same text as the real peft's in the stock engine."""
    import tinker

    from rlcli.export import download_archive, extract_adapter, parse_tinker_path

    caps = request_json(f"{server.url}/api/v1/rlcli/capabilities")
    assert caps["rlcli_no_torch"]["engine_imports"].startswith("without torch"), caps.get("rlcli_no_torch")
    assert "the jax engine imports without torch" in server.log.read_text()
    url, _env = stock_server
    stock_log = (Path(_env["RLCLI_HOME"]) / "servers" / "default" / "server.log").read_text()
    assert "rlcli_no_torch" not in stock_log

    tokens = token_batch(11, n=2)
    lean = clean_client(service, server.model, seed=5)
    stock = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model=embedded_model, rank=8,
                                                                          seed=5).result()
    try:
        lean_lp, stock_lp = current_logprobs(lean, tokens), current_logprobs(stock, tokens)
        assert np.isfinite(lean_lp).all() and np.abs(lean_lp).max() > 1.0
        np.testing.assert_allclose(lean_lp, stock_lp, rtol=0, atol=1e-5)
        texts = []
        for base_url, client in ((server.url, lean), (url, stock)):
            run_id, _kind, ckpt = parse_tinker_path(client.save_weights_for_sampler("same-config").result().path)
            folder = tmp_path / run_id
            folder.mkdir()
            download_archive(base_url, run_id, ckpt, folder / "archive.tar.gz")
            texts.append((extract_adapter(folder / "archive.tar.gz", folder) / "adapter_config.json").read_text())
        lean_config, stock_config = (json.loads(text) for text in texts)
        assert lean_config["peft_type"] == "LORA" and lean_config["r"] == 8, lean_config
        assert lean_config["base_model_name_or_path"] == stock_config["base_model_name_or_path"] == server.model
        assert texts[0] == texts[1]
    finally:
        unload_model(server.url, lean.model_id)
        unload_model(url, stock.model_id)
