"""`rlcli train dpo` against the real SkyRL server on CPU, and the custom-loss route it rests on.

SkyRL 0.4.0's jax backend and tinker 0.38's forward_backward_custom (docs/decisions.md, "forward_backward_custom on
SkyRL"): tinker's own route sends a gradient the server multiplies by 1e9 and then fails on a missing `loss:sum`;
rlcli's route (rlcli.train.custom_loss) gives the server the loss's exact gradient. The DPO run learns: on pairs
whose chosen answer is a number and whose rejected answer is one fixed sentence, the chosen-over-rejected margin and
accuracy rise from step 1 to the last.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcli.client import request_json, unload_model, wait_future
from rlcli.train.folder import MODELS_FILE
from tests.conftest import run_rlcli

pytestmark = pytest.mark.server

GRAD_NORM = "skyrl.ai/grad_norm"


def pairs(n: int) -> str:
    """n pairs in the endpoint's shape: the chosen answer is the sum, the rejected one a fixed refusal."""
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "chosen": {"role": "assistant", "content": str(2 * i)},
             "rejected": {"role": "assistant", "content": "I do not know."}} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def dpo_run(server, tmp_path_factory):
    """16 pairs (and one that is dropped), 8 per step, 3 epochs: 6 steps at the default rate."""
    tmp = tmp_path_factory.mktemp("dpo")
    hi = {"role": "assistant", "content": "Hi"}
    same = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "chosen": hi, "rejected": hi}) + "\n"
    proc = run_rlcli("train", "dpo", "--dataset", "-", "--batch-size", "8", "--epochs", "3", "--save-every", "0",
                     "--log-path", str(tmp / "run"), "--base-url", server.url, env=server.env,
                     input=pairs(16) + same, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run", proc


def test_dpo_raises_the_margin_and_accuracy_of_chosen_over_rejected(dpo_run):
    run, proc = dpo_run
    steps = rows(run / "metrics.jsonl")
    first, last = steps[0], steps[-1]
    print(f"margin {first['margin']:.3f} -> {last['margin']:.3f}, accuracy {first['accuracy']:.2f} -> "
          f"{last['accuracy']:.2f}, dpo_loss {first['dpo_loss']:.4f} -> {last['dpo_loss']:.4f}")
    assert len(steps) == 6
    assert abs(first["margin"]) < 0.05  # step 1 measures the starting weights, which are the reference
    assert last["margin"] > 0.3 and last["accuracy"] == 1.0 and last["dpo_loss"] < first["dpo_loss"] - 0.1
    assert "17 lines read, 16 pairs kept, 1 dropped (1 chosen same as rejected)" in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(lines) == 6 and lines[-1].startswith("step 6/6") and "margin" in lines[-1]


def test_dpo_records_its_final_weights_and_frees_its_slot(dpo_run):
    run, proc = dpo_run
    final = rows(run / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["sampler_path"].startswith("tinker://") and "/weights/" in \
        final["state_path"]
    assert f"rlcli sample --checkpoint {final['sampler_path']}" in proc.stdout
    assert (run / MODELS_FILE).read_text() == ""


def _datum(tokens: list[int], response: int):
    import tinker

    weights = [0.0] * (len(tokens) - 1 - response) + [1.0] * response
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


BATCH = [_datum(list(range(5, 5 + n)), r) for n, r in ((9, 3), (12, 5), (7, 2), (15, 6))]


def _grad_norm(url: str, model_id: str) -> float:
    """The gradient the model holds, as the server's optim_step measures it (learning rate 0: no weight moves)."""
    future = request_json(f"{url}/api/v1/optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 0.0}})
    return wait_future(url, future["request_id"])["metrics"][GRAD_NORM]


def _skyrl_cross_entropy(data, logprobs_list, signs=(1, 1, 1, 1)):
    """SkyRL's own cross_entropy reduction written as a client-side loss: per sequence the mean over its weighted
    tokens, then the mean over sequences; a sign of -1 pushes that sequence down instead (as DPO does a rejected
    answer)."""
    import torch

    means = [-sign * (lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() / sum(d.loss_fn_inputs["weights"].data)
             for d, lp, sign in zip(data, logprobs_list, signs, strict=True)]
    return torch.stack(means).mean(), {}


def _pushed_down(data, logprobs_list):
    return _skyrl_cross_entropy(data, logprobs_list, signs=(1, 1, 1, -1))


def test_the_custom_loss_route_gives_the_server_the_exact_gradient_and_tinkers_does_not(server, monkeypatch):
    """The same loss through rlcli's route and as the server's own cross_entropy: the same gradient. A loss that
    pushes one sequence down, through tinker 0.38's own route: a KeyError after a gradient ~1e9 too large, where
    rlcli's route sends a sane one (the re-check of docs/decisions.md's finding)."""
    import tinker

    from rlcli.train.custom_loss import LOSS_SUM, forward_backward_custom

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    service = tinker.ServiceClient(base_url=server.url)
    norms, route_loss = {}, None
    for how in ("server", "rlcli", "rlcli, one pushed down", "tinker, one pushed down"):
        client = service.create_lora_training_client(base_model=server.model, rank=4, seed=0).result()
        try:
            if how == "server":
                client.forward_backward(BATCH, "cross_entropy").result()
            elif how == "rlcli":
                route_loss = forward_backward_custom(client, BATCH, _skyrl_cross_entropy).result().metrics[LOSS_SUM]
            elif how.startswith("rlcli"):
                forward_backward_custom(client, BATCH, _pushed_down).result()
            else:
                with pytest.raises(KeyError, match="loss:sum"):
                    client.forward_backward_custom(BATCH, _pushed_down).result()
            norms[how] = _grad_norm(server.url, client.model_id)
        finally:
            unload_model(server.url, client.model_id)
    print(f"grad norms: {norms}; the route's loss {route_loss:.4f}")
    assert norms["rlcli"] == pytest.approx(norms["server"], rel=1e-3)
    assert norms["tinker, one pushed down"] > 1e6 * norms["rlcli, one pushed down"]
