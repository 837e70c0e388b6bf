"""rlcli's per-step overhead: the same steps through rlcli's loss route and through a bare tinker client.

    .venv/bin/python -m benchmarks.overhead --pairs 20
    .venv/bin/python -m benchmarks.overhead --pairs 2 --warmup 1 --receipt-dir /tmp/r      # smoke

On its own server with the embedded model (HTTP dominates there, so any overhead shows most), two LoRA
clients with the same seed run forward_backward + optim_step on the same batch, alternating bare, rlcli,
bare, rlcli ... "rlcli" is a client with rlcli.train.losses.install_loss_route (the wrapper
`rlcli train rl` installs on every training client) for a gspo plan:
- cross_entropy: the call passes through the wrapper untouched (what SFT and non-gspo losses pay);
- gspo: the wrapper rebuilds each datum with its response weights before submitting (what fused GSPO
  pays); the bare client sends the same data, weights already in place, straight to forward_backward.
Server noise (tens of ms) hides microseconds, so the wrapper is also timed with no server at all: the
same calls against a stand-in client whose forward_backward returns at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import versions
from benchmarks.fused_vs_2pass import spread
from benchmarks.models import bench_server, describe_model, model_dir, server_versions, wait_for_quiet

LOSSES = ("cross_entropy", "gspo")


def batch(tokenizer, copies: int):
    """The demo's chats as SFT data, plus the RL fields gspo needs (old logprobs, advantages +/-1)."""
    import numpy as np
    import tinker

    from rlcli.demo import DEMO_CHATS, chat_datum

    data = []
    for i, (prompt, reply) in enumerate(DEMO_CHATS * copies):
        sft = chat_datum(tokenizer, prompt, reply)
        weights = np.asarray(sft.loss_fn_inputs["weights"].tolist(), dtype=np.float32)
        inputs = {**sft.loss_fn_inputs, "weights": weights, "logprobs": np.full(len(weights), -7.0, np.float32),
                  "advantages": weights * (1.0 if i % 2 else -1.0)}
        data.append(tinker.Datum(model_input=sft.model_input, loss_fn_inputs=inputs))
    return data


def payload(data: list, loss: str) -> tuple[list, dict[str, float] | None]:
    """The data and config both clients send; the wrapper merges the same config into its gspo plan."""
    from rlcli.train.losses import GSPO_DEFAULTS

    return (data, dict(GSPO_DEFAULTS)) if loss == "gspo" else (sft_only(data), None)


def step(client, sent: tuple[list, dict | None], loss: str, adam) -> float:
    start = time.perf_counter()
    fb = client.forward_backward(sent[0], loss, sent[1])
    optim = client.optim_step(adam)
    fb.result()
    optim.result()
    return time.perf_counter() - start


def sft_only(data: list) -> list:
    import tinker

    return [tinker.Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in
                                                                    ("target_tokens", "weights")}) for d in data]


def route_plan():
    from rlcli.train.losses import plan_loss

    return plan_loss("gspo", None, "auto", {"cross_entropy", "ppo", "gspo"})  # fused: what our server serves


def on_server(url: str, model: str, args) -> dict:
    import tinker
    from transformers import AutoTokenizer

    from rlcli.client import unload_model
    from rlcli.train.losses import install_loss_route

    service = tinker.ServiceClient(base_url=url)
    data = batch(AutoTokenizer.from_pretrained(model), args.copies)
    clients = {name: service.create_lora_training_client(base_model=model, rank=args.rank, seed=0).result()
               for name in ("bare", "rlcli")}
    install_loss_route(clients["rlcli"], route_plan())
    adam = tinker.AdamParams(learning_rate=1e-4)
    results = {}
    try:
        for loss in LOSSES:
            sent = payload(data, loss)
            for _ in range(args.warmup):
                for client in clients.values():
                    step(client, sent, loss, adam)
            raw: dict[str, list[float]] = {"bare": [], "rlcli": []}
            for _ in range(args.pairs):
                for name, client in clients.items():
                    raw[name].append(step(client, sent, loss, adam))
            diffs = [r - b for b, r in zip(raw["bare"], raw["rlcli"], strict=True)]
            results[loss] = {"raw_s": raw, "bare": spread(raw["bare"]), "rlcli": spread(raw["rlcli"]),
                             "pair_diff_rlcli_minus_bare_s": spread(diffs)}
    finally:
        for client in clients.values():
            unload_model(url, client.model_id)
    tokens = sum(len(d.model_input.to_ints()) for d in data)
    return {"batch": {"sequences": len(data), "tokens_per_step": tokens}, "results": results}


class StandIn:
    """A training client whose requests cost nothing: what is left is the wrapper's own Python."""

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        return None

    def forward(self, data, loss_fn, loss_fn_config=None):
        raise AssertionError("a fused plan never runs a forward pass")


def without_server(data: list, calls: int) -> dict:
    """Microseconds per forward_backward call: bare stand-in vs stand-in wrapped by install_loss_route."""
    from rlcli.train.losses import install_loss_route

    bare, wrapped = StandIn(), StandIn()
    install_loss_route(wrapped, route_plan())
    out = {}
    for loss in LOSSES:
        sent, config = payload(data, loss)
        per_call: dict[str, list[float]] = {"bare": [], "rlcli": []}
        for _ in range(5):  # rounds, alternating
            for name, client in (("bare", bare), ("rlcli", wrapped)):
                start = time.perf_counter()
                for _ in range(calls):
                    client.forward_backward(sent, loss, config)
                per_call[name].append((time.perf_counter() - start) / calls * 1e6)
        out[loss] = {"us_per_call": per_call, "median_us": {k: statistics.median(v) for k, v in per_call.items()}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--copies", type=int, default=2, help="copies of the 4 demo chats in the batch")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round with no server")
    parser.add_argument("--receipt-dir", default=None, help="write the receipt here (default: benchmarks/receipts)")
    parser.add_argument("--max-load", type=float, default=2.5, help="wait for this 1-minute load average first")
    parser.add_argument("--max-wait", type=float, default=600, help="seconds to wait for it at most")
    args = parser.parse_args()

    from rlcli.config import ensure_api_key

    ensure_api_key()
    quiet = wait_for_quiet(args.max_load, args.max_wait)
    load_before = os.getloadavg()
    folder = model_dir("tiny")
    with bench_server(folder) as srv:
        body = on_server(srv.url, srv.model, args)
        body["server"] = {"start_command": " ".join(srv.start_command), "start_s": srv.start_s}
    from transformers import AutoTokenizer

    body["without_server"] = without_server(batch(AutoTokenizer.from_pretrained(str(folder)), args.copies), args.calls)
    body.update(versions={**versions("tinker", "tinker-cookbook"), "server": server_versions()},
                config=vars(args), model=describe_model(folder),
                load_average_1_5_15={"before": load_before, "after": os.getloadavg()}, load_wait=quiet)
    print(json.dumps({loss: {"bare_median_s": r["bare"]["median"], "rlcli_median_s": r["rlcli"]["median"],
                             "pair_diff_median_ms": r["pair_diff_rlcli_minus_bare_s"]["median"] * 1e3,
                             "wrapper_us": body["without_server"][loss]["median_us"]}
                      for loss, r in body["results"].items()}, indent=1))
    folder = Path(args.receipt_dir) if args.receipt_dir else None
    print(f"receipt: {common.write_receipt('overhead', body, folder)}")


if __name__ == "__main__":
    main()
