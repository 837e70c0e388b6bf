"""One tinker SDK's round trip against a server, run by that SDK's own Python (any tinker from 0.25 on: this file
imports nothing but tinker and the standard library). Prints one JSON line: which steps passed, and the first
failure's step and message.

    VENV/bin/python tests/sdk_scenario.py --base-url http://127.0.0.1:PORT --base-model MODEL

The steps are what a training client does against rlcli's server: a LoRA, forward_backward, optim_step, sampler
weights and two samples from them (the ids 0.26 and later stamp on each sequence), save_state, load_state into a
new LoRA and a training client made from the saved state (each scores the loss the saved model scored), the run's
checkpoints listed, and the models unloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import urllib.request
from importlib import metadata

PROMPT = [11, 12, 13, 14, 15, 16]  # token ids of any model with a vocabulary of more than 20 tokens
REPLY = [17, 18, 19, 20]


def datum(tinker):
    tokens = PROMPT + REPLY
    weights = [0.0] * (len(PROMPT) - 1) + [1.0] * len(REPLY)
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


def loss(tinker, client) -> float:
    out = client.forward([datum(tinker)], "cross_entropy").result()
    return nll(out)


def nll(out) -> float:
    """The summed negative log-likelihood of the reply's tokens, from the per-token logprobs."""
    return -sum(sum(o["logprobs"].tolist()) for o in out.loss_fn_outputs)


def made(tinker, client):
    """A client from a creation call: 0.25 returns the client, later SDKs a future of it (the client itself still
    answers, deprecated)."""
    return client.result() if not isinstance(client, (tinker.TrainingClient, tinker.SamplingClient)) else client


def sample(tinker, sampler) -> list[dict]:
    params = tinker.SamplingParams(max_tokens=4, temperature=1.0)
    result = sampler.sample(tinker.ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params).result()
    sequences = [{"tokens": list(s.tokens), "sequence_id": getattr(s, "sequence_id", None)} for s in result.sequences]
    assert len(sequences) == 2 and all(len(s["tokens"]) > 0 for s in sequences), sequences
    return sequences


def steps(tinker, base_url: str, model: str, report: dict) -> None:
    service = tinker.ServiceClient(base_url=base_url)
    step = report["steps"]
    trainer = made(tinker, service.create_lora_training_client(base_model=model, rank=4))
    report["models"].append(trainer.model_id)
    fb = trainer.forward_backward([datum(tinker)], "cross_entropy").result()
    step["forward_backward"] = nll(fb)
    trainer.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    step["optim_step"] = True
    path = trainer.save_weights_for_sampler("compat-sampler").result().path
    step["save_weights_for_sampler"] = path
    step["sample"] = sample(tinker, made(tinker, service.create_sampling_client(model_path=path)))
    again = made(tinker, trainer.save_weights_and_get_sampling_client("compat-sampler-2"))
    step["sample_again"] = sample(tinker, again)
    state = trainer.save_state("compat-state").result().path
    step["save_state"] = state
    saved_loss = loss(tinker, trainer)
    # SkyRL, like hosted Tinker, loads a state only as a model's first request: into a new LoRA, and as a new client.
    fresh = made(tinker, service.create_lora_training_client(base_model=model, rank=4))
    report["models"].append(fresh.model_id)
    fresh.load_state(state).result()
    step["load_state"] = {"saved": saved_loss, "loaded": loss(tinker, fresh)}
    other = made(tinker, service.create_training_client_from_state(state))
    report["models"].append(other.model_id)
    step["training_client_from_state"] = loss(tinker, other)
    for got in (step["load_state"]["loaded"], step["training_client_from_state"]):
        assert abs(got - saved_loss) <= 1e-3 * max(1.0, abs(saved_loss)), (saved_loss, got)
    listed = service.create_rest_client().list_checkpoints(trainer.model_id).result()
    step["list_checkpoints"] = sorted(c.checkpoint_id for c in listed.checkpoints)


def unload(base_url: str, model_id: str) -> None:
    """rlcli's server frees the LoRA slot (the SDK's own unload call left the client in 0.26)."""
    request = urllib.request.Request(f"{base_url}/api/v1/unload_model", data=json.dumps(
            {"model_id": model_id}).encode(), headers={"Content-Type": "application/json",
                                                       "X-API-Key": os.environ.get("TINKER_API_KEY", "")})
    urllib.request.urlopen(request, timeout=30).read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--base-model", required=True)
    args = parser.parse_args()
    os.environ.setdefault("TINKER_API_KEY", "tml-self-hosted")
    report = {"tinker": metadata.version("tinker"), "python": sys.version.split()[0], "steps": {}, "ok": False,
              "models": []}
    try:
        import tinker

        steps(tinker, args.base_url, args.base_model, report)
        report["ok"] = True
    except BaseException as e:  # the report says which step failed and why; the exit status says it too
        done = list(report["steps"])
        report["failed_after"] = done[-1] if done else "start"
        report["error"] = f"{type(e).__name__}: {e}"[:2000]
        report["traceback"] = traceback.format_exc()[-4000:]
    finally:
        for model_id in report["models"]:
            try:
                unload(args.base_url, model_id)
            except OSError as e:
                report.setdefault("unload_errors", []).append(str(e))
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
