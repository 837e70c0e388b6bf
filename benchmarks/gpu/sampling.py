"""Where a sample request's time goes, from timed requests of different shapes on a running server.

One LoRA policy (the RL run's rank) hands its weights to a sampler, then samples the RL run's prompt shape
(the same few-shot sum prompts, the same stop token, temperature 1) at each (samples, max_tokens) of the plan:
a first request, which compiles that shape, then `reps` timed ones. The client times each request's wall;
the engine logs its own time for each (`(timing) process_batch_requests(sample, ...)`), so:

  hand-over        save_weights_and_get_sampling_client alone (client wall; the engine's save time beside it),
                   the median of those after the policy's first (which is kept apart: it is slower)
  weight load      the first sample after a new hand-over minus a repeated one of the same shape (engine;
                   slightly negative where the load is below the engine log's millisecond resolution)
  prefill          the engine's time at max_tokens 1: prefill, the first token, and the engine's fixed
                   per-request work (padding, transfers to and from the device, building the result)
  decode per token (engine at max_tokens N - engine at max_tokens 1) / (N - 1)
  compile          the first request of a shape minus the repeated median (client), and the engine's own
                   "JIT compilation" line for the shape
  waiting          client wall - engine time of the same request: HTTP, the API's database, the engine's
                   polling and the client's own polling for the result

prefill + (N - 1) x decode + waiting is the warm request's wall by construction; the receipt also keeps every
raw time. Host-device transfers are inside prefill here (the engine does them once per request, around the
jitted generate); telling them apart needs a profiler trace, which this check does not take.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fused_vs_2pass import Config, prompt_ids
from benchmarks.gpu import roofline
from benchmarks.models import engine_timings


@dataclass(frozen=True)
class Breakdown:
    shapes: tuple[tuple[int, int], ...] = ((8, 1), (8, 32), (64, 1), (64, 32))  # (samples, max_tokens)
    reps: int = 3
    handovers: int = 3


class EngineLog:
    """The engine's request timings logged since the last read, of one kind."""

    def __init__(self, log: Path):
        self.log, self.offset = log, log.stat().st_size if log.exists() else 0

    def read(self, kind: str) -> list[float]:
        time.sleep(0.3)  # the launcher copies the engine's output into the log a moment later
        with self.log.open("rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
            self.offset = f.tell()
        return [s for k, s in engine_timings(text) if k == kind]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _one_engine_time(found: list[float]) -> float | None:
    return found[0] if len(found) == 1 else None  # more or fewer: the request was not alone


def timed_sample(sampler, prompt, samples: int, params, log: EngineLog) -> dict:
    """One sample request: client wall, the engine's time for it, tokens generated."""
    start = time.perf_counter()
    result = sampler.sample(prompt=prompt, num_samples=samples, sampling_params=params).result()
    wall = time.perf_counter() - start
    return {"client_s": wall, "engine_s": _one_engine_time(log.read("sample")),
            "tokens": [len(s.tokens) for s in result.sequences]}


def handover(client, log: EngineLog, name: str) -> tuple[object, dict]:
    start = time.perf_counter()
    sampler = client.save_weights_and_get_sampling_client(name=name).result()
    wall = time.perf_counter() - start
    return sampler, {"client_s": wall, "engine_save_s": _one_engine_time(log.read("save_weights_for_sampler"))}


def measure(service, model: str, log: Path, cfg: Config, plan: Breakdown, stop: int, prompt_tokens: list[int]) -> dict:
    """Every raw time of the breakdown (the policy is unloaded by the caller)."""
    import tinker

    client = service.create_lora_training_client(base_model=model, rank=cfg.rank, seed=cfg.seed + 300).result()
    engine = EngineLog(log)
    prompt = tinker.ModelInput.from_ints(prompt_tokens)
    handovers, shapes = [], {}
    sampler = None
    for i in range(plan.handovers):
        sampler, row = handover(client, engine, f"breakdown-{i}")
        handovers.append(row)
    for samples, max_tokens in plan.shapes:
        params = tinker.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=cfg.seed, stop=[stop])
        first = timed_sample(sampler, prompt, samples, params, engine)
        reps = [timed_sample(sampler, prompt, samples, params, engine) for _ in range(plan.reps)]
        shapes[f"{samples}x{max_tokens}"] = {"samples": samples, "max_tokens": max_tokens, "first": first,
                                             "reps": reps}
    # a new hand-over, then the smallest shape again: the engine loads the new weights inside that request
    samples, max_tokens = plan.shapes[0]
    fresh, row = handover(client, engine, "breakdown-load")
    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=cfg.seed, stop=[stop])
    load = {"handover": row, "sample": timed_sample(fresh, prompt, samples, params, engine),
            "shape": f"{samples}x{max_tokens}"}
    return {"client": client, "handovers": handovers, "shapes": shapes, "after_new_weights": load}


def derive(raw: dict, prompt_len: int, arch: dict, vocab: int, dtype: str, peaks: dict,
           compiles: list[dict]) -> dict:
    """The per-request split for each batch size with both a 1-token and a longer shape, with the roofline."""
    shapes, out = raw["shapes"], {}
    medians = {k: {"client_s": _median([r["client_s"] for r in v["reps"]]),
                   "engine_s": _median([r["engine_s"] for r in v["reps"] if r["engine_s"] is not None])}
               for k, v in shapes.items()}
    # the first hand-over of a policy also compiles or allocates what the later ones reuse: it counts apart
    handover_s = _median([h["client_s"] for h in raw["handovers"][1:] or raw["handovers"]])
    first_handover_s = raw["handovers"][0]["client_s"] if raw["handovers"] else None
    load = raw["after_new_weights"]
    base = medians.get(load["shape"], {}).get("engine_s")
    load_s = load["sample"]["engine_s"] - base if load["sample"]["engine_s"] is not None and base else None
    for key, shape in shapes.items():
        samples, n = shape["samples"], shape["max_tokens"]
        one = medians.get(f"{samples}x1")
        if n == 1 or not one:
            continue
        warm = medians[key]
        decode = ((warm["engine_s"] - one["engine_s"]) / (n - 1)
                  if warm["engine_s"] is not None and one["engine_s"] is not None else None)
        prefill = one["engine_s"]
        waiting = warm["client_s"] - warm["engine_s"] if warm["engine_s"] is not None else None
        jit = [c["s"] for c in compiles if c["mode"] == "sample"]
        bound = roofline.decode_bound(arch, vocab, dtype, samples, roofline.cache_length(prompt_len, n), peaks)
        out[key] = {
            "request": {"samples": samples, "max_tokens": n, "prompt_tokens": prompt_len},
            "warm_request_s": warm["client_s"], "engine_s": warm["engine_s"],
            "handover_s": handover_s, "first_handover_s": first_handover_s, "weight_load_s": load_s,
            "prefill_s": prefill, "decode_per_token_s": decode,
            "decode_s": decode * (n - 1) if decode is not None else None, "waiting_s": waiting,
            "compile_s": shape["first"]["client_s"] - warm["client_s"],
            "engine_compile_logs_s": jit,
            "with_handover_s": warm["client_s"] + (handover_s or 0.0) + (load_s or 0.0),
            "tokens_per_sequence_median": _median([_median(r["tokens"]) for r in shape["reps"]]),
            "roofline": roofline.against_bound(decode, bound),
        }
    return out


def run(service, model: str, url: str, log: Path, cfg: Config, plan: Breakdown, arch: dict, dtype: str,
        peaks: dict, compiles_from) -> dict:
    """The breakdown phase: measure, unload the policy, derive. `compiles_from()` reads the engine's JIT lines."""
    from transformers import AutoTokenizer

    from rlcli.client import unload_model

    tokenizer = AutoTokenizer.from_pretrained(model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt, _ = prompt_ids(tokenizer, random.Random(cfg.seed), cfg.fewshot)  # the RL run's prompt shape
    raw = measure(service, model, log, cfg, plan, stop, prompt)
    client = raw.pop("client")
    try:
        vocab = _vocab(model)
        split = derive(raw, len(prompt), arch, vocab, dtype, peaks, compiles_from())
    finally:
        unload_model(url, client.model_id)
    return {"plan": {"shapes": [list(s) for s in plan.shapes], "reps": plan.reps, "handovers": plan.handovers,
                     "lora_rank": cfg.rank, "stop_token": stop, "temperature": 1.0},
            "peaks": peaks, "split": split, "raw": raw}


def _vocab(model: str) -> int:
    import json

    return json.loads((Path(model) / "config.json").read_text())["vocab_size"]


def summary(split: dict) -> dict:
    """The headline of each shape: the split in seconds and the decode against its bound."""
    keys = ("warm_request_s", "with_handover_s", "handover_s", "first_handover_s", "weight_load_s", "prefill_s",
            "decode_per_token_s", "decode_s", "waiting_s", "compile_s")
    out = {}
    for shape, row in split.items():
        roof = row["roofline"]
        out[shape] = {**{k: row[k] for k in keys}, "bound_per_token_s": roof.get("bound_s"),
                      "decode_times_bound": roof.get("times_bound"), "peaks_source": roof.get("peaks_source")}
    return out
