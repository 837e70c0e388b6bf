"""A short real job through the tinker client: the smallest proof that training works.

Launch:  rlcli demo                      (against the managed server, or --base-url)
         make demo                       (builds everything, starts and stops the server)

Creates a LoRA training client, runs cross_entropy forward_backward + optim_step on
a fixed batch (the loss printed each step should fall), saves weights for the
sampler and samples a completion from them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rlcli.client import unload_model
from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.options import BASE_URL, SEED, Record, option
from rlcli.train.options import LR
from rlcli.train.run import resolve_model

DEMO_CHATS = [
    ("What is 2 + 3?", "2 + 3 = 5."),
    ("What is 7 + 6?", "7 + 6 = 13."),
    ("Say hello.", "Hello! How can I help you today?"),
    ("What colour is the sky?", "The sky is blue on a clear day."),
]


def chat_datum(tokenizer, prompt: str, reply: str):
    """One supervised example: the whole ChatML chat as input, loss only on the reply's tokens."""
    import tinker

    head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    head_ids = tokenizer.encode(head, add_special_tokens=False)
    reply_ids = tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
    tokens = head_ids + reply_ids
    weights = [0.0] * len(head_ids) + [1.0] * len(reply_ids)
    # Next-token prediction: position t predicts token t+1.
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )


@dataclass(frozen=True, kw_only=True)
class DemoOptions(Record):
    """`rlcli demo`'s options."""

    base_url: str | None = BASE_URL(None)
    steps: int = option(12, "forward_backward + optim_step rounds on the fixed batch", low=1)
    lr: float = LR(3e-3)
    rank: int = option(8, "LoRA rank", low=1)
    seed: int = SEED(0)


def demo(o: DemoOptions) -> int:
    """Train a LoRA for a few steps on a fixed batch, save it for the sampler, sample a completion."""
    url, steps, lr, rank, seed = resolve_base_url(o.base_url), o.steps, o.lr, o.rank, o.seed
    ensure_api_key()
    model = resolve_model(None, url, required=True)  # before the ~5 s of imports below: no server, one line
    print(f"demo: server {url}, base model {model}", file=sys.stderr)
    import tinker
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    service = tinker.ServiceClient(base_url=url)
    trainer = service.create_lora_training_client(base_model=model, rank=rank, seed=seed).result()
    try:
        return _train_and_sample(service, trainer, tokenizer, steps, lr, seed)
    finally:
        unload_model(url, trainer.model_id)


def _train_and_sample(service, trainer, tokenizer, steps: int, lr: float, seed: int) -> int:
    import tinker

    from rlcli.sample import stop_tokens

    batch = [chat_datum(tokenizer, p, r) for p, r in DEMO_CHATS]
    losses = []
    for step in range(steps):
        t0 = time.monotonic()
        fb = trainer.forward_backward(batch, "cross_entropy")
        trainer.optim_step(tinker.AdamParams(learning_rate=lr))
        out = fb.result()
        losses.append(mean_nll(out, batch))
        print(f"step {step + 1}/{steps}  loss {losses[-1]:.4f}  ({time.monotonic() - t0:.2f}s)", flush=True)
    saved = trainer.save_weights_for_sampler(name="demo-final").result()
    print(f"saved sampler weights: {saved.path}")
    sampler = service.create_sampling_client(model_path=saved.path).result()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": DEMO_CHATS[0][0]}], tokenize=False,
                                           add_generation_prompt=True)
    result = sampler.sample(
        prompt=tinker.ModelInput.from_ints(tokenizer.encode(prompt, add_special_tokens=False)),
        num_samples=1,
        sampling_params=tinker.SamplingParams(max_tokens=24, temperature=0.0, seed=seed,
                                              stop=stop_tokens(tokenizer)),  # the reply ends with its turn
    ).result()
    completion = tokenizer.decode(result.sequences[0].tokens, skip_special_tokens=True)
    print(f"sample for {DEMO_CHATS[0][0]!r}: {completion!r}")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if not losses[-1] < losses[0]:
        print("demo: the loss did not fall; something is wrong with training", file=sys.stderr)
        return 1
    return 0


def mean_nll(out, batch) -> float:
    """Token-weighted mean negative log-likelihood from the per-datum logprobs the server returns."""
    total, count = 0.0, 0.0
    for datum, record in zip(batch, out.loss_fn_outputs, strict=True):
        logprobs = record["logprobs"].tolist()
        weights = datum.loss_fn_inputs["weights"].tolist()
        total -= sum(lp * w for lp, w in zip(logprobs, weights, strict=True))
        count += sum(weights)
    return total / max(count, 1.0)
