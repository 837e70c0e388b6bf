"""SFT step time of the jax backend on 1 vs 2 processes (`rlcli serve start --processes N`), same model and batch.

    .venv/bin/python -m benchmarks.processes [--size large] [--steps 8] [--batch 8] [--length 128]

One private server per process count (the 26M-parameter 'large' model of benchmarks/models.py by default,
a LoRA table of 4), the same seeded LoRA and batch on each: the first step (compilation) is recorded apart,
then the wall time of each later forward_backward + optim_step, and each step's loss, which must agree
between the two (the receipt says by how much). On a 2-core machine two processes share the same two cores
and add a gloo all-reduce per step: they are not expected to be faster here. The receipt is about the wiring
and its cost; a speed-up needs a core (or a GPU) per process. Writes benchmarks/receipts/processes-<time>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.common import summary, versions, write_receipt
from benchmarks.models import describe_model, model_dir, server_versions, wait_for_quiet
from rlcli.server.private import private_server


def batch(n: int, length: int):
    import tinker

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        tokens = rng.integers(5, 900, size=length).tolist()
        out.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (length - 1)}))
    return out


def run(model: str, processes: int, args) -> dict:
    import tinker

    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    with private_server(model, "--processes", str(processes), "--slots", "4") as srv:
        client = tinker.ServiceClient(base_url=srv.url).create_lora_training_client(base_model=model, rank=8,
                                                                            seed=0).result()
        data, losses, steps_s, first_s = batch(args.batch, args.length), [], [], None
        for step in range(args.steps + 1):
            t0 = time.perf_counter()
            out = client.forward_backward(data, "cross_entropy").result()
            client.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
            elapsed = time.perf_counter() - t0
            losses.append(float(np.mean([-o["logprobs"].to_numpy().mean() for o in out.loss_fn_outputs])))
            if step == 0:
                first_s = elapsed
            else:
                steps_s.append(elapsed)
            print(f"processes {processes} step {step} loss {losses[-1]:.4f} {elapsed:.3f}s", file=sys.stderr)
        return {"processes": processes, "start_s": srv.start_s, "first_step_s": first_s,
                "step_s": steps_s, "step": summary(steps_s), "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large", choices=("tiny", "large"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--max-load", type=float, default=2.5)
    args = parser.parse_args()
    folder = model_dir(args.size)
    load = wait_for_quiet(args.max_load)
    runs = [run(str(folder), n, args) for n in (1, 2)]
    drift = float(np.max(np.abs(np.array(runs[0]["losses"]) - np.array(runs[1]["losses"]))))
    ratio = runs[1]["step"]["median"] / runs[0]["step"]["median"]
    path = write_receipt("processes", {
        "versions": {**versions("tinker"), **server_versions()}, "model": describe_model(folder),
        "config": vars(args), "load_before": load, "load_after": os.getloadavg()[0], "runs": runs,
        "max_loss_difference": drift, "median_step_ratio_2_vs_1": ratio,
        "note": "2 processes share the machine's cores; on 2 cores they are not expected to be faster",
    })
    print(f"median step: 1 process {runs[0]['step']['median']:.3f}s, 2 processes {runs[1]['step']['median']:.3f}s "
          f"(x{ratio:.2f}); max loss difference {drift:.2e}; receipt {path}")


if __name__ == "__main__":
    main()
