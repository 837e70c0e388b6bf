"""rlcli.train.losses without a server: planning, GSPO mathematics, routes, wire format."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import numpy as np
import pytest

from rlcli.errors import RlcliError, UsageError
from rlcli.train import losses
from rlcli.train.losses import (
    GSPO_DEFAULTS,
    SERVER_LOSS_FNS,
    gspo_reference,
    install_loss_route,
    plan_loss,
    served_losses,
    tinker_loss_config,
    tinker_loss_fn,
)

STOCK = set(losses.STOCK_JAX)
WITH_EXTENSION = STOCK | {"gspo"}


# --- planning --------------------------------------------------------------------------------------


def test_loss_names_are_skyrls_and_not_dro():
    assert set(SERVER_LOSS_FNS) == {"gspo", "cispo", "dppo", "ppo", "ppo_critic", "importance_sampling",
                                    "cross_entropy"}
    with pytest.raises(UsageError, match="does not serve loss dro; it is served by no SkyRL backend"):
        plan_loss("dro", None, "auto", WITH_EXTENSION)


def test_gspo_fused_where_served_with_paper_defaults():
    plan = plan_loss("gspo", None, "auto", WITH_EXTENSION)
    assert (plan.passes, plan.config) == (1, GSPO_DEFAULTS)
    assert GSPO_DEFAULTS == {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}
    plan = plan_loss("gspo", '{"clip_high_threshold": 1.001}', "1", WITH_EXTENSION)
    assert plan.config == {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1.001}


def test_auto_picks_two_passes_on_stock_jax_and_says_so():
    plan = plan_loss("gspo", None, "auto", STOCK)
    assert plan.passes == 2 and "2 passes" in plan.message and "does not serve gspo fused" in plan.message
    assert plan_loss("gspo", None, "2", WITH_EXTENSION).passes == 2  # allowed, e.g. to compare routes


def test_passes_1_for_unserved_gspo_fails_fast_in_one_line():
    with pytest.raises(UsageError) as caught:
        plan_loss("gspo", None, "1", STOCK)
    message = str(caught.value)
    assert "\n" not in message
    for word in ("fsdp", "megatron", "rlcli's extension", "--passes 2"):
        assert word in message


@pytest.mark.parametrize(("loss", "served", "words"), [
    ("dppo", STOCK, ["fsdp", "megatron"]),
    ("ppo_critic", WITH_EXTENSION, ["it is served by fsdp"]),
])
def test_unserved_losses_name_the_backends_that_serve_them(loss, served, words):
    with pytest.raises(UsageError) as caught:
        plan_loss(loss, None, "auto", served)
    assert all(w in str(caught.value) for w in words), caught.value


def test_two_passes_exist_for_gspo_only():
    with pytest.raises(UsageError, match="gspo only"):
        plan_loss("ppo", None, "2", STOCK)
    assert plan_loss("cispo", None, "auto", STOCK).passes == 1


@pytest.mark.parametrize(("loss", "config", "match"), [
    ("gspo", '{"delta_low": 0.2}', "delta_low do not apply to loss gspo; it takes clip_high_threshold"),
    ("ppo_critic", '{"clip_low_threshold": 0.8}', "it takes value_clip"),
    ("cross_entropy", '{"value_clip": 1}', "it takes none"),
    ("gspo", "{clip: 1}", "not JSON"),
    ("gspo", '{"clip_low_threshold": "0.9"}', "object of numbers"),
    ("gspo", '[0.9, 1.1]', "object of numbers"),
    ("gspo", '{"clip_low_threshold": 3e-4, "clip_high_threshold": 4e-4}', "not epsilons"),
])
def test_loss_config_is_checked_per_loss(loss, config, match):
    with pytest.raises(UsageError, match=match):
        plan_loss(loss, config, "auto", set(SERVER_LOSS_FNS))


def test_dppo_and_ppo_critic_keys_are_accepted_where_served():
    served = set(SERVER_LOSS_FNS)
    assert plan_loss("dppo", '{"delta_low": 0.1, "delta_high": 0.3}', "1", served).config == {
        "delta_low": 0.1, "delta_high": 0.3}
    assert plan_loss("ppo_critic", '{"value_clip": 0.5}', "auto", served).config == {"value_clip": 0.5}


# --- served_losses ----------------------------------------------------------------------------------


@pytest.fixture
def fake_server():
    answers: dict[str, tuple[int, dict]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            code, body = answers.get(self.path, (404, {"detail": "Not Found"}))
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits a poll
    yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    httpd.shutdown()
    httpd.server_close()


def test_served_losses_asks_the_capabilities_route(fake_server):
    url, answers = fake_server
    answers[losses.CAPABILITIES_ROUTE] = (200, {"backend": "jax", "losses": sorted(WITH_EXTENSION),
                                                "extension": "rlcli_losses 1.0"})
    description, served = served_losses(url)
    assert served == WITH_EXTENSION and description == "jax backend with rlcli_losses 1.0"


def test_served_losses_assumes_stock_jax_without_the_route(fake_server):
    url, _ = fake_server
    description, served = served_losses(url)
    assert served == STOCK and "stock SkyRL jax assumed" in description


def test_served_losses_says_when_nothing_answers():
    with pytest.raises(RlcliError, match="cannot ask"):
        served_losses("http://127.0.0.1:9", timeout=2)  # port 9 (discard): nothing listens


# --- GSPO mathematics in float64 -----------------------------------------------------------------


def random_batch(seed: int, lengths=(1, 3, 6, 9, 9, 4), width: int = 12, spread: float = 0.08):
    """Padded [N, T] arrays: a few prompt tokens (mask 0), a response, padding; advantages of both signs."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    logp, old = -rng.uniform(0.05, 3.0, (n, width)), np.zeros((n, width))
    mask, adv = np.zeros((n, width)), np.zeros((n, width))
    for i, length in enumerate(lengths):
        prompt = int(rng.integers(0, width - length + 1))
        mask[i, prompt:prompt + length] = 1.0
        drift = rng.normal(0.0, spread)  # moves the whole sequence's ratio in or out of the clip range
        old[i] = np.where(mask[i] != 0, logp[i] - drift - rng.normal(0.0, spread / 2, width), 0.0)
        adv[i] = np.where(mask[i] != 0, rng.choice([-1.0, 1.0]) * rng.uniform(0.1, 2.0), 0.0)
    return logp, old, adv, mask


def paper_gspo_autograd(logp, old, adv, mask, eps_low, eps_high):
    """The paper's GSPO-token objective, differentiated by torch in float64 (detach = sg)."""
    import torch

    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old, adv, w = (torch.tensor(x, dtype=torch.float64) for x in (old, adv, mask))
    tokens = w.sum(-1, keepdim=True).clamp(min=1e-9)
    log_s = (w * (lp - old)).sum(-1, keepdim=True) / tokens
    s_it = torch.exp(lp - lp.detach() + log_s.detach())
    objective = torch.minimum(s_it * adv, s_it.clamp(1 - eps_low, 1 + eps_high) * adv)
    loss = -(w * objective / tokens).sum() / lp.shape[0]
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


def skyrl_ppo_autograd(logp, old, adv, mask, low, high):
    """SkyRL's ppo loss and its reduction (per-sequence weighted mean, then mean), torch float64."""
    import torch

    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old, adv, w = (torch.tensor(np.asarray(x, dtype=np.float64)) for x in (old, adv, mask))
    ratio = torch.exp(lp - old)
    per_token = -w * torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    loss = (per_token.sum(-1) / w.sum(-1).clamp(min=1e-9)).mean()
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


EPS_CASES = [(0.05, 0.05), (0.2, 0.28), (3e-4, 4e-4)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("eps_low", "eps_high"), EPS_CASES)
def test_reference_gradient_is_the_papers(seed, eps_low, eps_high):
    batch = random_batch(seed)
    loss, grad = gspo_reference(*batch, eps_low, eps_high)
    want_loss, want_grad = paper_gspo_autograd(*batch, eps_low, eps_high)
    assert abs(loss - want_loss) < 1e-12 and np.abs(grad - want_grad).max() < 1e-12


def test_random_batches_cover_clipped_and_unclipped_sequences():
    logp, old, adv, mask = random_batch(0)
    _, grad = gspo_reference(logp, old, adv, mask, 0.05, 0.05)
    dead = [(grad[i][mask[i] != 0] == 0).all() for i in range(len(mask))]
    assert any(dead) and not all(dead)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("eps_low", "eps_high"), EPS_CASES)
def test_two_pass_shifted_ppo_is_gspo(seed, eps_low, eps_high):
    logp, old, adv, mask = random_batch(seed)
    shifted = np.stack([losses.shifted_logprobs(logp[i], old[i], mask[i]) for i in range(len(logp))])
    got_loss, got_grad = skyrl_ppo_autograd(logp, shifted, adv, mask, 1 - eps_low, 1 + eps_high)
    want_loss, want_grad = gspo_reference(logp, old, adv, mask, eps_low, eps_high)
    assert abs(got_loss - want_loss) < 1e-6 and np.abs(got_grad - want_grad).max() < 1e-6


# --- routes through a fake training client --------------------------------------------------------


class FakeFuture:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value

    async def result_async(self):
        return self.value

    def __await__(self):  # tinker's APIFuture: awaiting it is its result
        return self.result_async().__await__()


class FakeClient:
    """Records what would be sent; forward answers fixed current logprobs."""

    def __init__(self, current_logprobs):
        self.current, self.calls = current_logprobs, []

    def forward(self, data, loss_fn, loss_fn_config=None):
        import tinker

        self.calls.append(("forward", loss_fn, data, loss_fn_config))
        outputs = [{"logprobs": tinker.TensorData.from_numpy(lp.astype(np.float32))} for lp in self.current]
        return FakeFuture(tinker.ForwardBackwardOutput(loss_fn_output_type="x", loss_fn_outputs=outputs))

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.calls.append(("forward_backward", loss_fn, data, loss_fn_config))
        return FakeFuture("submitted")

    async def forward_backward_async(self, data, loss_fn, loss_fn_config=None):
        return self.forward_backward(data, loss_fn, loss_fn_config)


def cookbook_data(logp, old, adv, mask):
    """Data as tinker-cookbook sends it: its `mask` stripped, prompt tokens with advantage 0."""
    import tinker

    del mask
    tokens = list(range(logp.shape[1]))
    return [tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens),
                         loss_fn_inputs={"target_tokens": np.asarray(tokens), "logprobs": old[i].astype(np.float32),
                                         "advantages": adv[i].astype(np.float32)}) for i in range(len(logp))]


def test_fused_route_sends_gspo_with_response_weights_and_defaults():
    logp, old, adv, mask = random_batch(1)
    client = FakeClient(logp)
    install_loss_route(client, plan_loss("gspo", None, "auto", WITH_EXTENSION))
    assert client.forward_backward(cookbook_data(logp, old, adv, mask), "gspo").result() == "submitted"
    [(kind, loss_fn, sent, config)] = client.calls
    assert (kind, loss_fn, config) == ("forward_backward", "gspo", GSPO_DEFAULTS)
    assert np.array_equal(np.stack([d.loss_fn_inputs["weights"].to_numpy() for d in sent]), mask)


@pytest.mark.parametrize("use_async", [False, True])
def test_two_pass_route_forwards_then_sends_shifted_ppo(use_async):
    logp, old, adv, mask = random_batch(2)
    client = FakeClient(logp)
    install_loss_route(client, plan_loss("gspo", '{"clip_low_threshold": 0.9}', "auto", STOCK))
    install_loss_route(client, plan_loss("gspo", None, "auto", STOCK))  # a second install changes nothing
    data = cookbook_data(logp, old, adv, mask)
    if use_async:
        asyncio.run(client.forward_backward_async(data, loss_fn="gspo", loss_fn_config=None))
    else:
        client.forward_backward(data, "gspo")
    [forward, (kind, loss_fn, sent, config)] = client.calls
    assert forward[:2] == ("forward", "cross_entropy") and set(forward[2][0].loss_fn_inputs) == {
        "target_tokens", "weights"}
    assert (kind, loss_fn) == ("forward_backward", "ppo")
    assert config == {"clip_low_threshold": 0.9, "clip_high_threshold": GSPO_DEFAULTS["clip_high_threshold"]}
    for i, datum in enumerate(sent):
        want = losses.shifted_logprobs(logp[i].astype(np.float32), old[i].astype(np.float32), mask[i])
        assert np.array_equal(datum.loss_fn_inputs["logprobs"].to_numpy(), want)


def test_two_pass_function_works_on_a_bare_client():
    logp, old, adv, mask = random_batch(4)
    client = FakeClient(logp)
    assert losses.two_pass_forward_backward(client, cookbook_data(logp, old, adv, mask)).result() == "submitted"
    assert [call[:2] for call in client.calls] == [("forward", "cross_entropy"), ("forward_backward", "ppo")]
    assert client.calls[1][3] == GSPO_DEFAULTS


def test_route_passes_other_losses_through_untouched():
    logp, old, adv, mask = random_batch(3)
    client = FakeClient(logp)
    install_loss_route(client, plan_loss("gspo", None, "auto", STOCK))
    data = cookbook_data(logp, old, adv, mask)
    client.forward_backward(data, "ppo", {"clip_low_threshold": 0.8})
    assert client.calls == [("forward_backward", "ppo", data, {"clip_low_threshold": 0.8})]
    other = FakeClient(logp)
    original = other.forward_backward
    install_loss_route(other, plan_loss("cispo", None, "auto", STOCK))
    assert other.forward_backward == original


# --- wire format -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "config"), [
    ("gspo", GSPO_DEFAULTS),
    ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
    ("dppo", {"delta_low": 0.2, "delta_high": 0.25}),
    ("ppo_critic", {"value_clip": 0.5}),
])
def test_extended_losses_survive_the_clients_protobuf(name, config):
    import tinker
    from tinker import types
    from tinker.proto import tinker_public_pb2 as pb
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints([5, 6, 7]),
                         loss_fn_inputs={"target_tokens": np.array([6, 7, 8]),
                                         "logprobs": np.array([-1.5, -0.25, -2.0], dtype=np.float32),
                                         "advantages": np.array([0.0, 1.0, 1.0], dtype=np.float32)})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn=tinker_loss_fn(name),
                                                          loss_fn_config=tinker_loss_config(name, config)),
        model_id="m", seq_id=1)
    decoded = pb.ForwardBackwardRequest.FromString(forward_backward_request_to_proto(request).SerializeToString())
    assert decoded.loss_fn == name
    assert dict(decoded.loss_fn_config) == pytest.approx(config, abs=1e-7)  # floats travel as float32
    sent = np.frombuffer(decoded.data[0].loss_fn_inputs["logprobs"].dense, dtype=np.float32)
    assert sent.tolist() == [-1.5, -0.25, -2.0]


def test_compat_refuses_names_and_keys_skyrl_refuses():
    with pytest.raises(ValueError, match="dro"):
        tinker_loss_fn("dro")
    with pytest.raises(ValueError, match="delta_low"):
        tinker_loss_config("gspo", {"delta_low": 0.1})
    assert tinker_loss_config("ppo", {}) is None
