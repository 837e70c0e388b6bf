"""Step time of a loss computed in one forward_backward (fused) against its 2-pass client route.

    .venv/bin/python -m benchmarks.fused_vs_2pass --size large --losses gspo,ppo --pairs 12
    .venv/bin/python -m benchmarks.fused_vs_2pass --size tiny --pairs 2 --warmup 1 --receipt-dir /tmp/r   # smoke

Starts its own server for the model (benchmarks/models.py), samples one frozen batch of real rollouts
(arithmetic prompts, several samples each; reward: 1 when the reply's last number is the sum, else half the
share of its characters that are ASCII letters, digits or spaces, a format reward on which a random-weight
model's samples still differ; advantages (r - mean) / std within each group of samples of one prompt),
then for each loss times, on the same server and the same batch:
    A (fused)   forward_backward(loss) + optim_step
    B (2-pass)  gspo: rlcli.train.losses.two_pass_forward_backward (forward, then ppo on shifted logprobs,
                exact); ppo: a forward whose logprobs come back to the client, then forward_backward(ppo):
                the extra pass and round trip any client-side loss pays, with the same update as A.
Both paths start from the same weights: two LoRA clients made with the same seed (bit-identical LoRA
init), each taking the same update every step, so at every pair they hold the same weights; the receipt
records their logprobs' max difference before and after. Warm-up steps compile; then A, B, A, B ...
Every raw time goes in the receipt, with the engine's own per-request times read from the server log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import summary, versions
from benchmarks.models import LogCursor, bench_server, describe_model, model_dir, server_versions, wait_for_quiet

STEP_REQUESTS = {"fused": ["forward_backward", "optim_step"], "two_pass": ["forward", "forward_backward", "optim_step"]}


@dataclass
class Config:
    size: str = "tiny"  # tiny (embedded model) or large (26M-parameter Qwen3 shape), see models.py
    prompts: int = 4
    samples: int = 4  # per prompt: one group
    fewshot: int = 2  # solved examples before each question: sets the prompt's length
    max_tokens: int = 32
    warmup: int = 2  # steps of each path before timing (compiles every shape)
    pairs: int = 12
    floor_reps: int = 6
    lr: float = 1e-4
    rank: int = 32
    seed: int = 0


def spread(values: list[float]) -> dict[str, float]:
    """common.summary plus the quartiles: the spread a reader needs to trust a median."""
    out = summary(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values * 3)
    return {**out, "q1": q1, "q3": q3, "iqr": q3 - q1}


# --- the frozen batch -----------------------------------------------------------------------------


def reward(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)
    if numbers and int(numbers[-1]) == answer:
        return 1.0
    # A format term that a random-weight model's samples differ on (they never hold the sum).
    return 0.5 * sum(c.isascii() and (c.isalnum() or c == " ") for c in text) / max(len(text), 1)


def group_advantages(rewards: list[float]) -> list[float]:
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-6) if std > 0 else 0.0 for r in rewards]


def prompt_ids(tokenizer, rng: random.Random, fewshot: int) -> tuple[list[int], int]:
    chat = []
    for _ in range(fewshot + 1):
        x, y = rng.randint(0, 99), rng.randint(0, 99)
        chat += [{"role": "user", "content": f"What is {x} + {y}?"},
                 {"role": "assistant", "content": f"{x} + {y} = {x + y}. The answer is {x + y}."}]
    text = tokenizer.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return tokenizer.encode(text, add_special_tokens=False), x + y


def rollouts(service, model: str, cfg: Config) -> dict[str, Any]:
    """Sample the batch once: data (with 0/1 response weights), rewards, advantages and its shape."""
    import numpy as np
    import tinker
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampler = service.create_sampling_client(base_model=model).result()
    rng, data, rewards, advantages, lengths = random.Random(cfg.seed), [], [], [], []
    params = tinker.SamplingParams(max_tokens=cfg.max_tokens, temperature=1.0, seed=cfg.seed, stop=[stop])
    for _ in range(cfg.prompts):
        prompt, answer = prompt_ids(tokenizer, rng, cfg.fewshot)
        result = sampler.sample(prompt=tinker.ModelInput.from_ints(prompt), num_samples=cfg.samples,
                                sampling_params=params).result()
        group = [reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer) for s in result.sequences]
        for seq, adv in zip(result.sequences, group_advantages(group), strict=True):
            tokens, n = prompt + list(seq.tokens), len(seq.tokens)
            pad = len(prompt) - 1  # targets start at the first response token
            inputs = {"target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                      "logprobs": np.asarray([0.0] * pad + list(seq.logprobs), dtype=np.float32),
                      "advantages": np.asarray([0.0] * pad + [adv] * n, dtype=np.float32),
                      "weights": np.asarray([0.0] * pad + [1.0] * n, dtype=np.float32)}
            data.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs))
            lengths.append((len(prompt), n))
        rewards += group
        advantages += group_advantages(group)
    shape = {"sequences": len(data), "prompt_tokens": [p for p, _ in lengths],
             "response_tokens": [r for _, r in lengths], "tokens_per_step": sum(p + r - 1 for p, r in lengths)}
    return {"data": data, "rewards": rewards, "advantages": advantages, "shape": shape}


# --- the two paths --------------------------------------------------------------------------------


def forward_only(data: list) -> list:
    import tinker

    return [tinker.Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in
                                                                    ("target_tokens", "weights")}) for d in data]


def step(path: str, client, data: list, loss: str, adam) -> float:
    """One timed step, forward_backward + optim_step, queued the way a training loop queues them."""
    from rlcli.train.losses import two_pass_forward_backward

    start = time.perf_counter()
    if path == "fused":
        fb = client.forward_backward(data, loss, loss_config(loss))
    elif loss == "gspo":
        fb = two_pass_forward_backward(client, data, loss_config(loss))
    else:  # the client-side-loss shape: current logprobs down first, then the server's loss
        client.forward(forward_only(data), "cross_entropy").result()
        fb = client.forward_backward(data, loss, loss_config(loss))
    optim = client.optim_step(adam)
    fb.result()
    optim.result()
    return time.perf_counter() - start


def loss_config(loss: str) -> dict[str, float] | None:
    """rlcli's defaults (gspo: the paper's clip range), else None: the server's own (ppo: 0.8/1.2)."""
    from rlcli.train.losses import DEFAULT_CONFIGS

    return DEFAULT_CONFIGS.get(loss)


def logprobs(client, data: list):
    import numpy as np

    out = client.forward(forward_only(data), "cross_entropy").result()
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_loss(service, model: str, url: str, log: Path | None, batch: dict, loss: str, cfg: Config) -> dict:
    """Warm-up, then A, B, A, B ... pairs, then the floor; every LoRA slot used is freed at the end."""
    import tinker

    from rlcli.client import unload_model

    adam = tinker.AdamParams(learning_rate=cfg.lr)
    clients = {p: service.create_lora_training_client(base_model=model, rank=cfg.rank, seed=cfg.seed).result()
               for p in ("fused", "two_pass", "floor")}
    data = batch["data"]
    try:
        for client in clients.values():  # lr 0 zeroes any gradient a slot's earlier tenant left (docs/decisions.md)
            client.optim_step(tinker.AdamParams(learning_rate=0.0)).result()
        start = {p: logprobs(clients[p], data) for p in ("fused", "two_pass")}
        warmup = {p: [step(p, clients[p], data, loss, adam) for _ in range(cfg.warmup)] for p in ("fused", "two_pass")}
        cursor = LogCursor(log)
        raw: dict[str, list[float]] = {"fused": [], "two_pass": []}
        for _ in range(cfg.pairs):
            for path in ("fused", "two_pass"):
                raw[path].append(step(path, clients[path], data, loss, adam))
        engine = cursor.take((STEP_REQUESTS["fused"] + STEP_REQUESTS["two_pass"]) * cfg.pairs)
        end = {p: logprobs(clients[p], data) for p in ("fused", "two_pass")}
        floor = measure_floor(clients["floor"], data, loss, cfg, LogCursor(log))
    finally:
        for client in clients.values():
            unload_model(url, client.model_id)
    # Same weights at every pair: both clients start equal and take the same update; "moved" shows the
    # updates were not all zero (which would make that check empty).
    same = {"start_logprob_max_abs_diff": float(abs(start["fused"] - start["two_pass"]).max()),
            "end_logprob_max_abs_diff": float(abs(end["fused"] - end["two_pass"]).max()),
            "moved_logprob_max_abs": float(abs(end["fused"] - start["fused"]).max())}
    return summarize(loss, batch, warmup, raw, engine, floor, same)


def measure_floor(client, data: list, loss: str, cfg: Config, cursor: LogCursor) -> dict:
    """forward, forward_backward and optim_step each waited for alone, floor_reps times."""
    import tinker

    config = loss_config(loss)
    adam = tinker.AdamParams(learning_rate=0.0)  # the floor client's weights never move
    raw: dict[str, list[float]] = {"forward": [], "forward_backward": [], "optim_step": []}
    for _ in range(cfg.floor_reps + 1):  # the first round compiles this client's first calls: dropped
        raw["forward"].append(timed(lambda: client.forward(forward_only(data), "cross_entropy").result()))
        raw["forward_backward"].append(timed(lambda: client.forward_backward(data, loss, config).result()))
        raw["optim_step"].append(timed(lambda: client.optim_step(adam).result()))
    raw = {k: v[1:] for k, v in raw.items()}
    found = cursor.take(list(raw) * (cfg.floor_reps + 1))
    engine = None if found is None else {k: found[i::3][1:] for i, k in enumerate(raw)}
    return {"client_s": raw, "engine_s": engine}


def floor_figures(floor: dict, ratio_median: float) -> dict:
    """fb / (fwd + fb) from the engine's own times (else the client's), and how near the measurement came."""
    source = "engine" if floor["engine_s"] else "client"
    med = {k: statistics.median(v) for k, v in floor[f"{source}_s"].items()}
    fwd, fb, opt = med["forward"], med["forward_backward"], med["optim_step"]
    client = {k: statistics.median(v) for k, v in floor["client_s"].items()}
    round_trip = client["forward"] - fwd if source == "engine" else None
    out = {"source": source, "median_s": med, "fb_over_fwd": fb / fwd,
           "meaning": "floor = fb / (fwd + fb): the ratio if the 2-pass route's only extra cost were one more "
                      "forward; the measured ratio falls below it by what the second request round trip costs "
                      "(model_with_round_trip adds optim_step and one round trip per request)",
           "floor_fb_over_fwd_plus_fb": fb / (fwd + fb),
           "floor_with_optim_step": (fb + opt) / (fwd + fb + opt),
           "measured_ratio_median": ratio_median,
           "measured_minus_floor": ratio_median - fb / (fwd + fb)}
    if round_trip is not None:  # what one request costs beyond the engine's compute (queue poll, HTTP)
        out["round_trip_s"] = round_trip
        out["model_with_round_trip"] = (fb + opt + round_trip) / (fwd + fb + opt + 2 * round_trip)
    return out


def summarize(loss, batch, warmup, raw, engine, floor, same) -> dict:
    ratios = [a / b for a, b in zip(raw["fused"], raw["two_pass"], strict=True)]
    tokens = batch["shape"]["tokens_per_step"]
    engine_steps = None
    if engine is not None:
        per_pair = len(STEP_REQUESTS["fused"]) + len(STEP_REQUESTS["two_pass"])
        pairs = [engine[i:i + per_pair] for i in range(0, len(engine), per_pair)]
        engine_steps = {"fused": [sum(p[:2]) for p in pairs], "two_pass": [sum(p[2:]) for p in pairs],
                        "raw_per_request": engine}
        engine_steps["pair_ratio"] = [a / b for a, b in zip(engine_steps["fused"], engine_steps["two_pass"],
                                                             strict=True)]
    result = {
        "loss": loss, "loss_config": loss_config(loss),
        "batch": batch["shape"], "rewards": batch["rewards"], "advantages": batch["advantages"],
        "warmup_s": warmup, "raw_s": raw, "pair_ratio_fused_over_two_pass": ratios, "engine_step_s": engine_steps,
        "summary": {"fused": spread(raw["fused"]), "two_pass": spread(raw["two_pass"]), "ratio": spread(ratios)},
        "tokens_per_s": {p: tokens / statistics.median(v) for p, v in raw.items()},
        "floor_raw": floor, "floor": floor_figures(floor, statistics.median(ratios)),
        "same_weights": same,
    }
    return result


def run(cfg: Config, losses: list[str], base_url: str | None = None, server_log: str | None = None) -> dict:
    """The whole benchmark as a receipt body; starts (and stops) a server of its own unless base_url is given."""
    import tinker

    from rlcli.client import server_base_model
    from rlcli.config import ensure_api_key

    ensure_api_key()
    load_before = os.getloadavg()
    body: dict[str, Any] = {"config": asdict(cfg), "losses": losses,
                            "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()}}
    if base_url is None:
        folder = model_dir(cfg.size, cfg.seed)
        with bench_server(folder) as srv:
            body["server"] = {"url": srv.url, "start_command": " ".join(srv.start_command), "start_s": srv.start_s}
            body["runs"] = _runs(tinker.ServiceClient(base_url=srv.url), srv.model, srv.url, srv.log, cfg, losses)
    else:
        folder = Path(server_base_model(base_url))
        body["server"] = {"url": base_url, "start_command": None}
        log = Path(server_log) if server_log else None
        body["runs"] = _runs(tinker.ServiceClient(base_url=base_url), str(folder), base_url, log, cfg, losses)
    body["model"] = describe_model(folder)
    body["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    return body


def _runs(service, model: str, url: str, log: Path | None, cfg: Config, losses: list[str]) -> dict:
    batch = rollouts(service, model, cfg)
    return {loss: bench_loss(service, model, url, log, batch, loss, cfg) for loss in losses}


def headline(body: dict) -> dict:
    """The medians a notebook prints and a test checks: one flat dict per loss."""
    return {loss: {"fused_median_s": r["summary"]["fused"]["median"],
                   "two_pass_median_s": r["summary"]["two_pass"]["median"],
                   "ratio_median": r["summary"]["ratio"]["median"],
                   "floor": r["floor"]["floor_fb_over_fwd_plus_fb"]} for loss, r in body["runs"].items()}


def save(body: dict, folder: str | None = None) -> Path:
    """common.write_receipt, into `folder` when given (tests and notebook smoke runs keep receipts out of git)."""
    return common.write_receipt("fused-vs-2pass", body, Path(folder) if folder else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field, default in asdict(Config()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    parser.add_argument("--losses", default="gspo,ppo", help="comma-separated: gspo, ppo")
    parser.add_argument("--base-url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--receipt-dir", default=None, help="write the receipt here (default: benchmarks/receipts)")
    parser.add_argument("--max-load", type=float, default=2.5, help="wait for this 1-minute load average first")
    parser.add_argument("--max-wait", type=float, default=600, help="seconds to wait for it at most")
    args = vars(parser.parse_args())
    losses, base_url, folder = args.pop("losses").split(","), args.pop("base_url"), args.pop("receipt_dir")
    quiet = wait_for_quiet(args.pop("max_load"), args.pop("max_wait"))
    body = {**run(Config(**args), losses, base_url), "load_wait": quiet}
    body["headline"] = headline(body)  # what `make bench`'s summary and the notebook read
    print(json.dumps(body["headline"], indent=1))
    print(f"receipt: {save(body, folder)}")


if __name__ == "__main__":
    main()
