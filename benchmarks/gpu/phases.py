"""What the GPU check's training phases measure (exactness, the short RL run, the slot sweep), the engine's
compile lines, and the run's clock (gpu_check.main sets CLOCK to the budget; say() stamps its lines)."""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.fused_vs_2pass import Config, forward_only, loss_config, rollouts
from benchmarks.gpu.plans import Plan
from benchmarks.models import LogCursor

WIDE_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # most sequences unclipped: a real gradient


class Clock:
    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


CLOCK = Clock(0)


def say(message: str) -> None:
    print(f"[gpu-check {CLOCK.elapsed():6.1f}s] {message}", flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None



def per_sequence(data: list) -> tuple[list, list, list]:
    """(old logprobs, advantages, 0/1 weights) of each datum, as float64 arrays."""
    import numpy as np

    def arr(d, key):
        return np.asarray(d.loss_fn_inputs[key].tolist(), dtype=np.float64)

    return [arr(d, "logprobs") for d in data], [arr(d, "advantages") for d in data], [arr(d, "weights") for d in data]


def padded(rows: list) -> Any:
    import numpy as np

    out = np.zeros((len(rows), max(len(r) for r in rows)))
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def outputs(result, key: str) -> list:
    import numpy as np

    return [np.asarray(o[key].tolist(), dtype=np.float64) for o in result.loss_fn_outputs]


def sequence_mean_loss(result, weights: list) -> float:
    """The jax backend's reduction of the per-token losses it returned: per-sequence mean, then the mean."""
    losses = outputs(result, "elementwise_loss")
    return float(statistics.fmean(float((lo * w).sum() / max(w.sum(), 1e-9)) for lo, w in zip(losses, weights,
                                                                                                  strict=True)))


def forward_logprobs(client, data: list) -> list:
    return outputs(client.forward(forward_only(data), "cross_entropy").result(), "logprobs")


def max_abs(a: list, b: list) -> float:
    return max(float(abs(x - y).max()) for x, y in zip(a, b, strict=True))


def clipped_fraction(lp: list, old: list, weights: list, low: float, high: float) -> float:
    """Share of sequences whose ratio s_i lies outside [low, high]."""
    from rlcli.train.losses import log_sequence_ratio

    ratios = [math.exp(log_sequence_ratio(a, o, w)) for a, o, w in zip(lp, old, weights, strict=True)]
    return sum(not low <= s <= high for s in ratios) / len(ratios)


def per_token_reference(lp: list, old: list, adv: list, weights: list, low: float, high: float) -> list:
    """GSPO's per-token loss in float64: -w min(s_i A_t, clip(s_i) A_t), s_i from rlcli's float64 log s_i."""
    import numpy as np

    from rlcli.train.losses import log_sequence_ratio

    out = []
    for a, o, v, w in zip(lp, old, adv, weights, strict=True):
        s = math.exp(log_sequence_ratio(a, o, w))
        out.append(-w * np.minimum(s * v, min(max(s, low), high) * v))
    return out


def drifted(data: list, seed: int) -> list:
    """The batch with its old logprobs moved per sequence (and a little per token), so that sequence ratios
    fall inside and outside the clip range: on the sampler's own logprobs every s_i is ~1 and GSPO's loss
    is ~0 by symmetry, which would check little."""
    import numpy as np
    import tinker

    drifts = (0.0, 0.1, -0.15, 0.3, -0.3, 0.05)
    rng = np.random.default_rng(seed)
    out = []
    for i, d in enumerate(data):
        old = np.asarray(d.loss_fn_inputs["logprobs"].tolist(), dtype=np.float64)
        w = np.asarray(d.loss_fn_inputs["weights"].tolist(), dtype=np.float64)
        moved = np.where(w != 0, old - drifts[i % len(drifts)] - rng.normal(0.0, 0.02, old.shape), old)
        out.append(tinker.Datum(model_input=d.model_input,
                                loss_fn_inputs={**d.loss_fn_inputs, "logprobs": moved.astype(np.float32)}))
    return out


def exactness(service, model: str, url: str, batch: dict, cfg: Config) -> dict:
    """One fused and one 2-pass GSPO step from identical weights on the frozen batch, against float64."""
    import tinker

    from rlcli.client import unload_model
    from rlcli.train.losses import gspo_reference, two_pass_forward_backward

    data = drifted(batch["data"], cfg.seed)
    old, adv, weights = per_sequence(data)
    low, high = WIDE_CLIP["clip_low_threshold"], WIDE_CLIP["clip_high_threshold"]
    adam = tinker.AdamParams(learning_rate=1e-3, beta1=0.0, beta2=0.0, eps=1e-8)
    clients = {p: service.create_lora_training_client(base_model=model, rank=cfg.rank, seed=cfg.seed + 100)
               for p in ("fused", "two_pass")}
    try:
        before = {p: forward_logprobs(c, data) for p, c in clients.items()}
        fused = clients["fused"].forward_backward(data, "gspo", WIDE_CLIP).result()
        fused_metrics = clients["fused"].optim_step(adam).result().metrics
        two = two_pass_forward_backward(clients["two_pass"], data, WIDE_CLIP).result()
        two_metrics = clients["two_pass"].optim_step(adam).result().metrics
        after = {p: forward_logprobs(c, data) for p, c in clients.items()}
    finally:
        for client in clients.values():
            unload_model(url, client.model_id)

    def reference(lp: list) -> float:
        return gspo_reference(padded(lp), padded(old), padded(adv), padded(weights), 1 - low, high - 1)[0]

    def token_diff(result, lp: list) -> float:
        return max_abs([t * w for t, w in zip(outputs(result, "elementwise_loss"), weights, strict=True)],
                       per_token_reference(lp, old, adv, weights, low, high))

    lp_fwd, lp_fused = before["fused"], outputs(fused, "logprobs")
    fused_loss, two_loss = sequence_mean_loss(fused, weights), sequence_mean_loss(two, weights)
    grad = {p: m.get("skyrl.ai/grad_norm") for p, m in (("fused", fused_metrics), ("two_pass", two_metrics))}
    result = {
        "loss_config": WIDE_CLIP, "adam": {"learning_rate": 1e-3, "beta1": 0.0, "beta2": 0.0, "eps": 1e-8},
        "old_logprobs": "the sampler's, moved per sequence by (0, 0.1, -0.15, 0.3, -0.3, 0.05) nats and per token "
                        "by N(0, 0.02)",
        "fused": {"loss": fused_loss, "reference_loss": reference(lp_fused),
                  "reference_on": "the logprobs this forward_backward returned",
                  "per_token_max_abs_diff": token_diff(fused, lp_fused)},
        "two_pass": {"loss": two_loss, "reference_loss": reference(lp_fwd),
                     "reference_on": "the logprobs of the forward pass the route shifted by",
                     "per_token_max_abs_diff": token_diff(two, lp_fwd)},
        "fused_minus_two_pass": abs(fused_loss - two_loss),
        "start_logprobs_fused_vs_two_pass_client": max_abs(before["fused"], before["two_pass"]),
        "logprob_gap_forward_vs_forward_backward": max_abs(lp_fwd, lp_fused),
        "logprob_gap_two_forward_backwards": max_abs(lp_fused, outputs(two, "logprobs")),
        "grad_norm": grad,
        "grad_norm_rel_diff": (abs(grad["fused"] / grad["two_pass"] - 1) if grad["fused"] and grad["two_pass"]
                               else None),
        "post_step_logprobs_fused_vs_two_pass": max_abs(after["fused"], after["two_pass"]),
        "step_moved_logprobs": max_abs(after["fused"], lp_fwd),
        "clipped_sequence_fraction": clipped_fraction(lp_fwd, old, weights, low, high),
    }
    for path in ("fused", "two_pass"):
        result[path]["loss_abs_diff"] = abs(result[path]["loss"] - result[path]["reference_loss"])
    tolerance = 1e-5 * max(1.0, abs(result["fused"]["reference_loss"]))
    result["check"] = {"what": "fused GSPO's loss and per-token losses vs float64 on the same pass's logprobs",
                       "tolerance": tolerance,
                       "ok": max(result["fused"]["loss_abs_diff"], result["fused"]["per_token_max_abs_diff"])
                       <= tolerance}
    return result


class _PolicySampler:
    """What rollouts() asks of a service client, answered with the policy's current sampler."""

    def __init__(self, sampler):
        self.sampler = sampler

    def create_sampling_client(self, base_model: str):
        return self.sampler


def short_run(service, model: str, url: str, cfg: Config, steps: int) -> dict:
    """Sample from the policy, one fused GSPO step (rlcli's default clip range), repeat."""
    import tinker

    from rlcli.client import unload_model
    from rlcli.train.losses import GSPO_DEFAULTS

    client = service.create_lora_training_client(base_model=model, rank=cfg.rank, seed=cfg.seed + 200)
    adam = tinker.AdamParams(learning_rate=cfg.lr)
    rows = []
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            sampler = client.save_weights_and_get_sampling_client()
            sampler.result()  # the hand-over alone: the future resolves once the weights are saved
            t_handover = time.perf_counter()
            batch = rollouts(_PolicySampler(sampler), model, replace(cfg, seed=cfg.seed + 1 + step))
            t1 = time.perf_counter()
            fb = client.forward_backward(batch["data"], "gspo", loss_config("gspo"))
            optim = client.optim_step(adam)
            result, metrics = fb.result(), optim.result().metrics
            t2 = time.perf_counter()
            old, _, weights = per_sequence(batch["data"])
            low, high = GSPO_DEFAULTS["clip_low_threshold"], GSPO_DEFAULTS["clip_high_threshold"]
            rows.append({"step": step, "reward_mean": statistics.fmean(batch["rewards"]),
                         "loss": sequence_mean_loss(result, weights), "grad_norm": metrics.get("skyrl.ai/grad_norm"),
                         "clipped_sequence_fraction": clipped_fraction(outputs(result, "logprobs"), old, weights,
                                                                       low, high),
                         "tokens": batch["shape"]["tokens_per_step"], "sample_s": t1 - t0,
                         "handover_s": t_handover - t0, "rollouts_s": t1 - t_handover, "step_s": t2 - t1})
            say(f"run: step {step}  reward {rows[-1]['reward_mean']:.3f}  loss {rows[-1]['loss']:+.5f}  "
                f"sample {t1 - t0:.2f}s (hand-over {t_handover - t0:.2f}s)  step {t2 - t1:.2f}s")
    finally:
        unload_model(url, client.model_id)
    warm = rows[1:] or rows  # the first step compiles the sampler's and the step's shapes

    def mid(key: str) -> float | None:
        return median([r[key] for r in warm])

    split = {"sample_s": mid("sample_s"), "handover_s": mid("handover_s"), "rollouts_s": mid("rollouts_s"),
             "train_s": mid("step_s"), "first_step_sample_s": rows[0]["sample_s"] if rows else None}
    if split["sample_s"] is not None and split["train_s"] is not None:
        split["sampling_share"] = split["sample_s"] / (split["sample_s"] + split["train_s"])
    return {"loss_config": loss_config("gspo"), "lr": cfg.lr, "steps": rows, "shape": {
                "prompts": cfg.prompts, "samples": cfg.samples, "max_tokens": cfg.max_tokens, "lora_rank": cfg.rank,
                "requests_per_step": cfg.prompts, "note": "one sample request per prompt, each awaited in turn "
                                                          "(benchmarks/fused_vs_2pass.rollouts)"},
            "step_s_median": split["train_s"], "sample_s_median": split["sample_s"], "split": split}


def sft_batch(vocab: int, sequences: int, tokens: int, seed: int = 0) -> list:
    import numpy as np
    import tinker

    rows = np.random.default_rng(seed).integers(5, vocab - 1, (sequences, tokens + 1))
    return [tinker.Datum(model_input=tinker.ModelInput.from_ints(row[:-1].tolist()),
                         loss_fn_inputs={"target_tokens": row[1:].astype(np.int64),
                                         "weights": np.ones(tokens, dtype=np.float32)}) for row in rows]


def slot_point(service, model: str, url: str, log: Path, plan: Plan, slots: int, vocab: int) -> dict:
    """forward_backward + optim_step of one rank-8 LoRA on a server holding `slots` LoRA slots."""
    import tinker

    from rlcli.client import unload_model

    data = sft_batch(vocab, *plan.slot_batch)
    client = service.create_lora_training_client(base_model=model, rank=8, seed=0)
    adam = tinker.AdamParams(learning_rate=1e-4)
    fb_s, optim_s = [], []
    try:
        start = time.perf_counter()
        client.forward_backward(data, "cross_entropy").result()
        client.optim_step(adam).result()
        first = time.perf_counter() - start  # compiles this shape
        cursor = LogCursor(log)
        for _ in range(plan.slot_reps):
            t0 = time.perf_counter()
            client.forward_backward(data, "cross_entropy").result()
            t1 = time.perf_counter()
            client.optim_step(adam).result()
            fb_s.append(t1 - t0)
            optim_s.append(time.perf_counter() - t1)
        engine = cursor.take(["forward_backward", "optim_step"] * plan.slot_reps)
    finally:
        unload_model(url, client.model_id)
    point = {"max_lora_adapters": slots, "lora_rank": 8, "batch": list(plan.slot_batch), "first_step_s": first,
             "fb_client_s": fb_s, "optim_client_s": optim_s,
             "fb_engine_s": engine[0::2] if engine else None, "optim_engine_s": engine[1::2] if engine else None}
    point["fb_client_median_s"] = median(fb_s)
    point["fb_engine_median_s"] = median(point["fb_engine_s"] or [])
    say(f"slots {slots}: forward_backward median {point['fb_client_median_s']:.3f}s client, "
        f"{point['fb_engine_median_s'] or float('nan'):.3f}s engine (first step {first:.1f}s)")
    return point


_JIT = re.compile(r"JIT compilation for (train|sample) seq_len=(\d+) took ([\d.]+)s")


def compile_times(log: Path) -> list[dict]:
    """The engine's own 'JIT compilation ... took' lines (lines its handler wrapped are joined first)."""
    try:
        text = " ".join(line.strip() for line in log.read_text(errors="replace").splitlines())
    except OSError:
        return []
    return [{"mode": m, "seq_len": int(n), "s": float(s)} for m, n, s in _JIT.findall(text)]


def keep_log(log: Path, out: Path, name: str, max_bytes: int = 2 * 2**20) -> None:
    """The end of a server's log, next to the receipt (the server's own folder is removed when it stops)."""
    try:
        data = log.read_bytes()
    except OSError:
        return
    (out / name).write_bytes(data[-max_bytes:])
