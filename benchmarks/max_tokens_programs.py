"""What a new `max_tokens` costs a server: the first sample request of each value against a repeat of it.

    .venv/bin/python -m benchmarks.max_tokens_programs [--model embedded|26m] [--values 5,9,...] [--batch 8]

An endpoint's or an evaluation's clients ask for their own `max_tokens`; every value the decode program has not
been built for compiles one (seconds). Per value, in the order given, on a fresh server (its own compilation
cache): the first request's wall time, then a repeat's; first minus repeat is that value's build. Greedy, one
prompt, `num_samples=batch`, no stop token (every row runs to `max_tokens`). Writes
max-tokens-programs-<stamp>.json (benchmarks/receipts/, or --out).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from statistics import median

import fire

from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
from benchmarks.models import describe_model, model_dir, server_versions, wait_for_quiet
from benchmarks.sampling_breakdown import MODELS, make_prompts
from rlcli.server.private import private_server

VALUES = (5, 9, 13, 17, 21, 25, 29, 32, 40, 48, 64)
BUILT = 1.0  # seconds a first request must exceed its repeat by to count as a build (a step here is ~1-5 ms)


def timed(client, prompt: list[int], batch: int, max_tokens: int) -> float:
    import tinker

    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    start = time.perf_counter()
    out = client.sample(prompt=tinker.ModelInput.from_ints(prompt), num_samples=batch,
                        sampling_params=params).result()
    wall = time.perf_counter() - start
    assert all(len(s.tokens) == max_tokens for s in out.sequences), "a row stopped before max_tokens"
    return wall


def measure(url: str, model: str, prompt: list[int], batch: int, values) -> list[dict]:
    import tinker

    client = tinker.ServiceClient(base_url=url).create_sampling_client(base_model=model).result()
    timed(client, prompt, batch, 1)  # the server's own first-request costs, apart from any max_tokens
    rows = []
    for n in values:
        first = timed(client, prompt, batch, n)
        repeat = timed(client, prompt, batch, n)
        rows.append({"max_tokens": n, "first_s": first, "repeat_s": repeat, "build_s": first - repeat,
                     "built": first - repeat > BUILT})
    return rows


def main(model: str = "embedded", values: str | tuple = VALUES, batch: int = 8, out: str | None = None,
         label: str = "") -> None:
    if model not in MODELS:
        raise SystemExit(f"--model {model!r}: choose one of {', '.join(MODELS)}")
    values = [int(v) for v in (values.split(",") if isinstance(values, str) else values)]
    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    folder = model_dir(MODELS[model])
    load_before = wait_for_quiet(max_wait_s=120)
    prompt = make_prompts(describe_model(folder)["vocab_size"], 1)[0]
    with private_server(folder) as server:
        rows = measure(server.url, str(folder), prompt, batch, values)
    builds = [r for r in rows if r["built"]]
    summary = {"values": len(rows), "programs_built": len(builds),
               "build_s_total": sum(r["build_s"] for r in builds),
               "build_s_median": median(r["build_s"] for r in builds) if builds else 0.0,
               "first_requests_s_total": sum(r["first_s"] for r in rows)}
    body = {"label": label, "versions": {**versions("tinker"), "server": server_versions()},
            "config": {"model": model, "batch": batch, "values": values, "greedy": True, "built_above_s": BUILT,
                       "server": "rlcli defaults, its own compilation cache"},
            "load": {"before": load_before, "after": os.getloadavg()}, "rows": rows, "summary": summary}
    receipt = write_receipt("max-tokens-programs", body, Path(out) if out else None)
    print(json.dumps(summary, indent=1))
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
