"""Where a sample request's time goes on this machine, beside HF transformers' `generate` and the roofline.

    .venv/bin/python -m benchmarks.sampling_breakdown [--model embedded|26m] [--rounds 3] [--out DIR]

Shapes (batch x new tokens, prompts of PROMPT_TOKENS tokens, greedy, no stop tokens so every row runs to the end):
8 x 32, 64 x 32, 8 x 128. Arms, the same prompt for all:
- rlcli: `SamplingClient.sample` (one prompt, num_samples=batch: an RL group) against a private server, on the base
  model and on a LoRA's sampler weights; `save_weights_and_get_sampling_client` timed apart (the weight hand-over).
- hf: transformers' `generate` in this process with its KV cache, on the same weights (torch CPU, threads
  recorded), after the server stopped, with no stop token (the requests carry none): both arms make the same
  token counts.

The rlcli arm is split from its own figures: compile = the first request of a program minus the median of its
repeats; T_1 = a request with max_tokens 1 (prefill and one decode step: SkyRL's loop runs a forward after its
last sampled token too); decode per token = (T_N - T_1) / (N - 1); overhead = client wall minus the engine's
time for the request (its `(timing)` log line). Host-device transfers are not split: on CPU jax's device memory
is host memory, and what the engine copies sits inside its time. The roofline: the bytes a decode step reads
(weights, and the KV cache at the length SkyRL attends over: its padded max_length) against a measured copy
bandwidth, and its FLOPs against a measured float32 GEMM rate. Exactness: the greedy tokens of rlcli and HF on
distinct prompts (float differences may flip near-ties: reported, never failed). Writes
sampling-breakdown-<stamp>.json (benchmarks/receipts/, or --out).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from statistics import median

import fire
import numpy as np

from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
from benchmarks.models import LogCursor, describe_model, engine_timings, model_dir, server_versions, wait_for_quiet
from rlcli.client import unload_model
from rlcli.server.private import private_server

SHAPES = ((8, 32), (64, 32), (8, 128))
PROMPT_TOKENS = 32
MODELS = {"embedded": "tiny", "26m": "large"}
LORA_RANK = 8
EXACT_PROMPTS = 8


def make_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """count prompts of PROMPT_TOKENS ordinary token ids (clear of the special tokens at the vocabulary's end)."""
    rng = np.random.default_rng(seed)
    return rng.integers(10, vocab - 64, size=(count, PROMPT_TOKENS)).tolist()


# --- rlcli: SamplingClient.sample against a private server ---------------------------------------------------

class Timer:
    """Sample requests timed by the client and, from the server log, by the engine."""

    def __init__(self, server):
        self.cursor = LogCursor(server.log)

    def engine(self) -> list[tuple[str, float]]:
        time.sleep(0.3)  # the launcher copies the engine's lines into the log a moment later
        with self.cursor.log.open("rb") as f:
            f.seek(self.cursor.offset)
            text = f.read().decode(errors="replace")
            self.cursor.offset = f.tell()
        return engine_timings(text)

    def sample(self, client, prompt: list[int], batch: int, tokens: int) -> dict:
        import tinker

        params = tinker.SamplingParams(max_tokens=tokens, temperature=0.0)
        start = time.perf_counter()
        out = client.sample(prompt=tinker.ModelInput.from_ints(prompt), num_samples=batch,
                            sampling_params=params).result()
        wall = time.perf_counter() - start
        engine = [s for kind, s in self.engine() if kind == "sample"]
        return {"wall_s": wall, "engine_s": engine[0] if len(engine) == 1 else None,
                "tokens": [list(s.tokens) for s in out.sequences]}


def programs(timer: Timer, client, prompt, shapes, rounds: int) -> dict:
    """Per shape: the first request of each program (T_1 and T_N) and `rounds` repeats of both, alternating."""
    first, out = {}, {}
    for batch, tokens in shapes:
        for n in (1, tokens):
            if (batch, n) not in first:  # 8x1 is one program for 8x32 and 8x128
                first[(batch, n)] = timer.sample(client, prompt, batch, n)
        reps = {1: [], tokens: []}
        for _ in range(rounds):
            for n in (1, tokens):
                reps[n].append(timer.sample(client, prompt, batch, n))
        out[f"{batch}x{tokens}"] = {"first_t1": first[(batch, 1)], "first_tn": first[(batch, tokens)],
                                    "t1": reps[1], "tn": reps[tokens]}
    return out


def handovers(timer: Timer, training, prompt, shapes, rounds: int) -> dict:
    """save_weights_and_get_sampling_client timed, then each shape's T_N on the new weights (the RL case)."""
    saves, samples = [], {f"{b}x{n}": [] for b, n in shapes}
    for _ in range(rounds):
        start = time.perf_counter()
        client = training.save_weights_and_get_sampling_client().result()
        wall = time.perf_counter() - start
        engine = [s for kind, s in timer.engine() if kind.startswith("save_weights")]
        saves.append({"wall_s": wall, "engine_s": engine[0] if len(engine) == 1 else None})
        for batch, tokens in shapes:
            samples[f"{batch}x{tokens}"].append(timer.sample(client, prompt, batch, tokens))
    return {"save_weights_and_get_sampling_client": saves, "lora_tn": samples}


def distinct(client, prompts: list[list[int]], tokens: int) -> dict:
    """Each prompt's greedy tokens and logprobs, one request per prompt, sent together (the engine batches what it
    finds): what two servers, or rlcli and HF, are compared on."""
    import tinker

    params = tinker.SamplingParams(max_tokens=tokens, temperature=0.0)
    futures = [client.sample(prompt=tinker.ModelInput.from_ints(p), num_samples=1, sampling_params=params)
               for p in prompts]
    seqs = [f.result().sequences[0] for f in futures]  # all sent before the first is awaited
    return {"tokens": [list(s.tokens) for s in seqs], "logprobs": [list(s.logprobs or []) for s in seqs]}


def train_once(training, prompt: list[int]) -> None:
    """One optimizer step, so that the LoRA's B is no longer zero and its sampled tokens differ from the base's."""
    import tinker

    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(prompt[:-1]),
                         loss_fn_inputs={"target_tokens": prompt[1:], "weights": [1.0] * (len(prompt) - 1)})
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(tinker.AdamParams(learning_rate=5e-2)).result()


def rlcli_arm(server, model: str, prompts: list[list[int]], shapes, rounds: int) -> dict:
    import tinker

    service = tinker.ServiceClient(base_url=server.url)
    timer = Timer(server)
    base_client = service.create_sampling_client(base_model=model).result()
    base = programs(timer, base_client, prompts[0], shapes, rounds)
    n = max(n for _, n in shapes)
    training = service.create_lora_training_client(base_model=model, rank=LORA_RANK, seed=0).result()
    try:  # the slot is freed after: a shared (test session's) server has few
        train_once(training, prompts[-1])
        lora = handovers(timer, training, prompts[0], shapes, rounds + 1)  # the first hand-over meets new programs
        timer.engine()
        lora_client = training.save_weights_and_get_sampling_client().result()
        return {"base": base, "lora": lora, "distinct_greedy": distinct(base_client, prompts, n),
                "lora_distinct_greedy": distinct(lora_client, prompts, n)}
    finally:
        unload_model(server.url, training.model_id)


# --- HF transformers generate, in process -----------------------------------------------------------------

def hf_arm(folder: Path, prompts: list[list[int]], shapes, rounds: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # No stop token, as the server's requests carry none: min_new_tokens would instead forbid the end tokens and
    # change the greedy choice wherever the model picks one.
    model.generation_config.eos_token_id = None

    def generate(rows: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
        ids = torch.tensor(rows)
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 do_sample=False, use_cache=True, pad_token_id=0)
            wall = time.perf_counter() - start
        return wall, out[:, ids.shape[1]:].tolist()

    out = {}
    for batch, tokens in shapes:
        rows = [prompts[0]] * batch
        generate(rows, tokens)  # warm-up: torch's first call of a shape allocates and picks kernels
        reps = {1: [], tokens: []}
        for _ in range(rounds):
            for n in (1, tokens):
                reps[n].append(generate(rows, n)[0])
        out[f"{batch}x{tokens}"] = {"t1_s": reps[1], "tn_s": reps[tokens], "tokens_row0": generate(rows, tokens)[1][0]}
    exact_n = max(n for _, n in shapes)
    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__, "runs": out,
            "distinct_greedy_tokens": generate(prompts, exact_n)[1]}


# --- the roofline --------------------------------------------------------------------------------------------

def copy_bandwidth(mib: int = 256, tries: int = 5) -> float:
    """Bytes/s of a large array copy (read + write), best of tries: what streaming weights from memory can reach."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(tries))
    return 2 * a.nbytes / best


def gemm_peak(n: int = 1536, tries: int = 5) -> dict:
    """float32 GEMM FLOP/s, best of tries, for numpy and torch (all threads): what compute can reach."""
    import torch

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    ta = torch.from_numpy(a)
    rates = {"numpy": 2 * n**3 / min(_timed(lambda: a @ a) for _ in range(tries)),
             "torch": 2 * n**3 / min(_timed(lambda: ta @ ta) for _ in range(tries))}
    return {**rates, "peak": max(rates.values()), "n": n}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def padded_length(tokens: int) -> int:
    """SkyRL's max_length for a prompt of PROMPT_TOKENS and `tokens` new ones (its round_up_seq_len)."""
    n = PROMPT_TOKENS + tokens
    if n <= 32:
        return 32
    msb = n.bit_length() - 1
    out = n & ((1 << msb) | (1 << (msb - 1)))
    return out + (1 << (msb - 1)) if out < n else out


def step_cost(model: dict, batch: int, length: int) -> dict:
    """Bytes read and FLOPs of one decode step of `batch` rows attending over `length` cached positions."""
    layers, kv, hd, heads = (model[k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim",
                                                 "num_attention_heads"))
    weight_bytes = 4 * model["params"]  # float32; tied embeddings: the LM head reads the embedding once
    kv_bytes = 4 * layers * 2 * batch * length * kv * hd
    flops = 2 * model["params"] * batch + 4 * layers * batch * length * heads * hd
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops}


def roofline(model: dict, shapes, bandwidth: float, peak: float) -> dict:
    out = {}
    for batch, tokens in shapes:
        length = padded_length(tokens)
        c = step_cost(model, batch, length)
        c["attended_length"] = length
        c["memory_bound_s"] = (c["weight_bytes"] + c["kv_bytes"]) / bandwidth
        c["compute_bound_s"] = c["flops"] / peak
        c["bound_s"] = max(c["memory_bound_s"], c["compute_bound_s"])
        out[f"{batch}x{tokens}"] = c
    return out


# --- reading the figures -------------------------------------------------------------------------------------

def engine_or_nan(runs: list[dict]) -> list[float]:
    return [r["engine_s"] if r["engine_s"] is not None else float("nan") for r in runs]


ENGINE_CLOCK_S = 0.001  # SkyRL logs the engine's time in milliseconds


def decode_span(e1: float, en: float, t1: float, tn: float) -> tuple[float, str]:
    """The time of the N-1 decode steps, T_N - T_1: by the engine's clock where it can tell them apart, else by the
    client's, else (a tiny shape on a fast machine) the engine clock's resolution as an upper bound, never zero."""
    if en - e1 > ENGINE_CLOCK_S:  # False for NaN too: a request the log did not time
        return en - e1, "engine"
    if tn - t1 > 0:
        return tn - t1, "client"
    return ENGINE_CLOCK_S, "at most the engine clock's resolution"


def breakdown(raw: dict, hf: dict, roof: dict, shapes) -> dict:
    out = {}
    for batch, tokens in shapes:
        key = f"{batch}x{tokens}"
        b, r = raw["base"][key], roof[key]
        t1, tn = median([x["wall_s"] for x in b["t1"]]), median([x["wall_s"] for x in b["tn"]])
        e1, en = median(engine_or_nan(b["t1"])), median(engine_or_nan(b["tn"]))
        decode, source = decode_span(e1, en, t1, tn)
        decode /= tokens - 1
        lora = median([x["wall_s"] for x in raw["lora"]["lora_tn"][key]])
        saves = raw["lora"]["save_weights_and_get_sampling_client"][1:] or raw["lora"][
            "save_weights_and_get_sampling_client"]
        out[key] = {
            "compile_tn_s": b["first_tn"]["wall_s"] - tn, "compile_t1_s": b["first_t1"]["wall_s"] - t1,
            "request_wall_s": tn, "engine_s": en, "overhead_s": tn - en,
            "t1_wall_s": t1, "t1_engine_s": e1, "prefill_s": e1 - decode,
            "decode_per_token_s": decode, "decode_source": source, "decode_tokens_per_s": batch / decode,
            "lora_request_wall_s": lora, "handover_s": median([s["wall_s"] for s in saves]),
            "handover_engine_s": median(engine_or_nan(saves)),
            "rlcli_decode_over_bound": decode / r["bound_s"],
            "rlcli_decode_over_memory_bound": decode / r["memory_bound_s"],
            "rlcli_decode_over_compute_bound": decode / r["compute_bound_s"],
        }
        if hf is not None:
            h1, hn = median(hf["runs"][key]["t1_s"]), median(hf["runs"][key]["tn_s"])
            hf_decode = (hn - h1) / (tokens - 1)
            out[key].update({"hf_generate_s": hn, "hf_generate_min_s": min(hf["runs"][key]["tn_s"]),
                             "hf_prefill_s": h1, "hf_decode_per_token_s": hf_decode,
                             "rlcli_over_hf_request": tn / hn, "rlcli_over_hf_decode": decode / hf_decode,
                             "hf_decode_over_bound": hf_decode / r["bound_s"]})
    return out


def exactness(raw: dict, hf: dict | None, shapes) -> dict | None:
    def compare(a: list[list[int]], b: list[list[int]]) -> dict:
        first = [next((i for i, (x, y) in enumerate(zip(p, q, strict=True)) if x != y), None)
                 for p, q in zip(a, b, strict=True)]
        return {"identical": sum(f is None for f in first), "of": len(first), "first_difference": first}

    if hf is None:
        return None
    same_prompt = {f"{b}x{n}": compare([raw["base"][f"{b}x{n}"]["tn"][-1]["tokens"][0]],
                                       [hf["runs"][f"{b}x{n}"]["tokens_row0"]]) for b, n in shapes}
    return {"distinct_prompts": compare(raw["distinct_greedy"]["tokens"], hf["distinct_greedy_tokens"]),
            "group_prompt_row0": same_prompt}


def against(results: dict, other: dict) -> dict:
    """The greedy tokens and logprobs of this run's rlcli arm against another receipt's (a change's exactness)."""
    out = {}
    for arm in ("distinct_greedy", "lora_distinct_greedy"):
        mine, theirs = results["rlcli"][arm], other["rlcli"][arm]
        gaps = [abs(x - y) for p, q in zip(mine["logprobs"], theirs["logprobs"], strict=True)
                for x, y in zip(p, q, strict=False)]
        out[arm] = {"identical_sequences": sum(a == b for a, b in zip(mine["tokens"], theirs["tokens"], strict=True)),
                    "of": len(mine["tokens"]), "max_logprob_difference": max(gaps, default=0.0)}
    return out


def measure(server, folder: Path, rounds: int, shapes=SHAPES, exact_prompts: int = EXACT_PROMPTS) -> dict:
    """The rlcli arm against a running server of `folder` (the caller stops it before the HF arm runs); the first
    prompt is the timed one, all of them are compared (one request each)."""
    info = describe_model(folder)
    prompts = make_prompts(info["vocab_size"], exact_prompts)
    return {"model": info, "prompts": prompts, "rlcli": rlcli_arm(server, str(folder), prompts, shapes, rounds)}


def finish(measured: dict, folder: Path, rounds: int, shapes=SHAPES, hf: bool = True) -> dict:
    """The HF arm, the roofline and the reading of the figures, after the server stopped."""
    hf = hf_arm(folder, measured["prompts"], shapes, rounds) if hf else None
    bandwidth, peak = copy_bandwidth(), gemm_peak()
    roof = roofline(measured["model"], shapes, bandwidth, peak["peak"])
    return {**measured, "hf": hf,
            "machine": {"copy_bandwidth_bytes_per_s": bandwidth, "gemm_flops_per_s": peak,
                        "xla_threads": "XLA CPU's default (every core)", "cpu_count": os.cpu_count()},
            "roofline": roof, "breakdown": breakdown(measured["rlcli"], hf, roof, shapes),
            "exactness": exactness(measured["rlcli"], hf, shapes)}


def main(model: str = "embedded", rounds: int = 3, out: str | None = None, label: str = "",
         stock: bool = False, compare: str | None = None, hf: bool = True) -> None:
    """--stock: the server with --no-extensions (SkyRL as shipped); --compare RECEIPT: this run's greedy tokens and
    logprobs against an earlier receipt's (a change's exactness check); --hf False: no HF arm (an A/B of servers)."""
    if model not in MODELS:
        raise SystemExit(f"--model {model!r}: choose one of {', '.join(MODELS)}")
    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    os.environ.setdefault("TINKER_TELEMETRY", "0")  # else the client's telemetry thread calls a stopped server
    folder = model_dir(MODELS[model])
    load_before = wait_for_quiet(max_wait_s=120)
    flags = ("--no-extensions",) if stock else ()
    with private_server(folder, *flags, "--backend-config", json.dumps({"max_lora_adapters": 4})) as server:
        measured = measure(server, folder, rounds)
    results = finish(measured, folder, rounds, hf=hf)
    body = {"label": label, "versions": {**versions("tinker", "torch", "transformers"), "server": server_versions()},
            "config": {"model": model, "rounds": rounds, "shapes": [list(s) for s in SHAPES],
                       "prompt_tokens": PROMPT_TOKENS, "lora_rank": LORA_RANK, "greedy": True,
                       "server": f"4 LoRA slots, {'--no-extensions (stock SkyRL)' if stock else 'rlcli defaults'}"},
            "load": {"before": load_before, "after": os.getloadavg()}, **results}
    if compare:
        body["against"] = {"receipt": Path(compare).name, **against(results, json.loads(Path(compare).read_text()))}
    receipt = write_receipt("sampling-breakdown", body, Path(out) if out else None)
    print(json.dumps(results["breakdown"], indent=1))
    print(json.dumps(results["exactness"], indent=None))
    print(json.dumps(body.get("against"), indent=None))
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
