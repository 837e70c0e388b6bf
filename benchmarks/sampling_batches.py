"""What sampling costs when the batch sizes vary, with rlcli's padded sampling batches (rlcli_warmup). SkyRL's
exact ones were the second arm until RLCLI_EXACT_SAMPLING_BATCHES was retired (its receipts stay the evidence).

    .venv/bin/python -m benchmarks.sampling_batches [--rounds 1] [--label L]

Each arm starts its own server on the embedded model under a new RLCLI_HOME, so its jax compilation cache
starts empty (what a new batch shape costs the first time), with JAX_LOG_COMPILES=1. Against it, one sampling
client on the base model sends COUNTS (sample requests of 1 prompt and that many samples, one at a time), twice:
the first pass meets each count for the first time, the second has every program built. Recorded per arm:
each request's wall time, each pass's total, and how many decode programs (`_prefill_and_decode`) the engine
built and with which batch sizes. Rounds alternate the order of the arms (A B, B A, ...).
Writes benchmarks/receipts/sampling-batches-<date>.json.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import fire

from benchmarks.common import summary, versions, write_receipt
from benchmarks.models import server_versions
from rlcli.model import ensure_embedded_model
from rlcli.server.private import private_server

COUNTS = (1, 3, 2, 5, 4, 7, 6, 12, 9, 16, 14, 17, 10, 3, 5)
ARMS: dict[str, dict] = {"padded": {}}
PROGRAM = re.compile(r"Compiling jit\(_prefill_and_decode\) with global shapes and types \(([^\n]*)")


def decode_batches(log_text: str) -> list[int]:
    """The batch size of each decode program the engine built (the first dimension of its int32 [B, L] input)."""
    sizes = []
    for line in PROGRAM.findall(log_text):
        shape = re.search(r"ShapedArray\(int32\[(\d+),\d+\]", line)
        sizes.append(int(shape.group(1)) if shape else -1)
    return sizes


@contextlib.contextmanager
def arm_environment(arm: str):
    """os.environ as one arm's server must see it (private_server hands it on), put back as it was on exit."""
    saved = dict(os.environ)
    os.environ.update({"JAX_LOG_COMPILES": "1", **ARMS[arm]})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def one_arm(arm: str, model: str) -> dict:
    import tinker

    with arm_environment(arm):
        with private_server(model, "--slots", "3") as server:
            service = tinker.ServiceClient(base_url=server.url)
            sampler = service.create_sampling_client(base_model=model).result()
            prompt = tinker.ModelInput.from_ints(list(range(5, 21)))
            params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
            passes = []
            for _ in range(2):
                walls = []
                for count in COUNTS:
                    start = time.perf_counter()
                    sampler.sample(prompt=prompt, num_samples=count, sampling_params=params).result()
                    walls.append(time.perf_counter() - start)
                passes.append(walls)
                print(f"{arm}: pass {len(passes)} {sum(walls):.1f}s", flush=True)
            for holder in (getattr(service, "_session_holder", None), getattr(service, "_rest_holder", None)):
                if holder is not None:
                    holder.close()
            built = decode_batches(server.log.read_text(errors="replace"))
    return {"first_pass_s": passes[0], "second_pass_s": passes[1], "first_pass_total_s": sum(passes[0]),
            "second_pass_total_s": sum(passes[1]), "decode_programs": len(built), "decode_batch_sizes": built}


def main(rounds: int = 1, label: str = "", out: str | None = None) -> None:
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    model = str(ensure_embedded_model())
    raw: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    order = list(ARMS)
    for i in range(rounds):
        for arm in order if i % 2 == 0 else order[::-1]:
            raw[arm].append(one_arm(arm, model))
    results = {arm: {"first_pass_total_s": summary([r["first_pass_total_s"] for r in runs]),
                     "second_pass_total_s": summary([r["second_pass_total_s"] for r in runs]),
                     "decode_programs": summary([float(r["decode_programs"]) for r in runs])}
               for arm, runs in raw.items()}
    body = {"label": label, "versions": {**versions("tinker"), "server": server_versions()},
            "config": {"rounds": rounds, "counts": list(COUNTS), "prompt_tokens": 16, "max_tokens": 8,
                       "model": "rlcli-tiny-qwen3-v1", "server": "--slots 3, a new RLCLI_HOME (empty compilation "
                       "cache) per arm and round", "arms": {"padded": "as `serve start` runs it"}},
            "raw": raw, "results": results}
    receipt = write_receipt("sampling-batches", body, Path(out) if out else None)
    for arm, r in results.items():
        first, second = r["first_pass_total_s"]["median"], r["second_pass_total_s"]["median"]
        print(f"{arm}: first pass {first:.1f}s, second {second:.1f}s, "
              f"{r['decode_programs']['median']:.0f} decode programs")
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
