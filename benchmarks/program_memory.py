"""What compiled programs cost a jax server's memory, and what `serve start --program-memory` bounds it to.

    .venv/bin/python -m benchmarks.program_memory [--rows 1,3,6,12] [--lengths 10,40,70,130,260,520] [--cap 256]

Every sampling batch shape (rows x padded prompt length x max_tokens bucket) is a program jax compiles and keeps in
the engine's memory. One sweep of new shapes, twice over, on two fresh servers of the embedded model, one after
the other:
- `keep` (`--program-memory 0`, its own empty compilation cache): each shape's first request compiles; the
  engine's RSS after each (its heap trimmed once a second, read from its `[rlcli memory]` lines) grows by a
  program's size; the second pass finds every program in memory.
- `capped` (`--program-memory CAP`, the disk cache `keep` filled): its first requests load each program from disk
  instead of compiling (what a program dropped past the cap costs at its next call); RSS stays near its first
  reading plus CAP; the log counts its drops.
Greedy, one prompt per shape, max_tokens 8. Writes program-memory-<stamp>.json (benchmarks/receipts/, or --out).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from statistics import median

import fire

from benchmarks import soak_probe as probe
from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
from benchmarks.models import server_versions, wait_for_quiet
from rlcli.model import ensure_embedded_model
from rlcli.server.private import private_server

ROWS = (1, 3, 6, 12)  # sampling batches padded to 1, 4, 8, 12 rows
LENGTHS = (10, 40, 70, 130, 260, 520)  # prompts padded to 32, 48, 96, 192, 384, 768 tokens
MAX_TOKENS = 8
EVERY_S = 1.0  # the engine's trim interval here (RLCLI_MEMORY_EVERY_S): a reading after each request


def reading(log: Path, after: float) -> dict:
    """The engine's first memory line written after `after` (time.time()), waiting up to 10 trims for it."""
    deadline = time.monotonic() + 10 * EVERY_S + 5
    while time.monotonic() < deadline:
        if log.stat().st_mtime > after + EVERY_S and (found := probe.engine_memory(log)):
            return found
        time.sleep(EVERY_S / 4)
    return probe.engine_memory(log)


def sweep(url: str, model: str, log: Path, shapes: list[tuple[int, int]], passes: int = 2) -> list[dict]:
    import tinker

    client = tinker.ServiceClient(base_url=url).create_sampling_client(base_model=model).result()
    params = tinker.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    rows = []
    for n in range(passes):
        for k, (batch, length) in enumerate(shapes):
            prompt = tinker.ModelInput.from_ints([(17 * i + k) % 900 + 10 for i in range(length)])
            start = time.perf_counter()
            client.sample(prompt=prompt, num_samples=batch, sampling_params=params).result()
            seconds = time.perf_counter() - start
            memory = reading(log, time.time())
            rows.append({"pass": n + 1, "rows": batch, "prompt_tokens": length, "seconds": round(seconds, 3),
                         "engine_rss_mb": memory.get("engine_trimmed_rss_mb"),
                         "arrays_mb": memory.get("engine_arrays_mb"), "drops": memory.get("program_drops", 0)})
            print(f"pass {n + 1} rows {batch:2d} prompt {length:3d}: {seconds:5.2f} s, engine "
                  f"{rows[-1]['engine_rss_mb']} MB, drops {rows[-1]['drops']}", flush=True)
    return rows


def summary(keep: list[dict], capped: list[dict], cap: int) -> dict:
    first_keep = [r for r in keep if r["pass"] == 1]
    rss = [r["engine_rss_mb"] for r in first_keep if r["engine_rss_mb"] is not None]
    per_program = (rss[-1] - rss[0]) / (len(rss) - 1) if len(rss) > 1 else None
    return {"shapes": len(first_keep),
            "keep_engine_rss_mb_first_last": [rss[0], rss[-1]] if rss else None,
            "keep_mb_per_program": round(per_program, 1) if per_program is not None else None,
            "keep_engine_rss_mb_max": max((r["engine_rss_mb"] or 0) for r in keep),
            "capped_engine_rss_mb_max": max((r["engine_rss_mb"] or 0) for r in capped),
            "capped_engine_rss_mb_first": capped[0]["engine_rss_mb"], "cap_mb": cap,
            "capped_drops": max(r["drops"] for r in capped),
            "compile_s_median": median(r["seconds"] for r in first_keep),
            "in_memory_s_median": median(r["seconds"] for r in keep if r["pass"] == 2),
            "load_from_disk_s_median": median(r["seconds"] for r in capped if r["pass"] == 1)}


def main(rows: str | tuple = ROWS, lengths: str | tuple = LENGTHS, cap: int = 256, out: str | None = None,
         label: str = "") -> None:
    def ints(v):
        return [int(x) for x in (v.split(",") if isinstance(v, str) else v)]

    shapes = [(r, n) for n in ints(lengths) for r in ints(rows)]
    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # each home's own cache: the first server compiles
    os.environ["RLCLI_MEMORY_EVERY_S"] = str(EVERY_S)
    model = str(ensure_embedded_model())
    load_before = wait_for_quiet(max_wait_s=120)
    with tempfile.TemporaryDirectory(prefix="rlcli-program-memory-") as tmp:
        homes = Path(tmp) / "keep", Path(tmp) / "capped"
        for home in homes:
            (home / "cache").mkdir(parents=True, mode=0o700)
        (homes[1] / "cache" / "jax").symlink_to(homes[0] / "cache" / "jax", target_is_directory=True)
        (homes[0] / "cache" / "jax").mkdir(mode=0o700)
        results = {}
        for name, home, flag in (("keep", homes[0], 0), ("capped", homes[1], cap)):
            print(f"{name}: --program-memory {flag}", flush=True)
            with private_server(model, "--program-memory", str(flag), home=home) as server:
                results[name] = sweep(server.url, model, server.log, shapes)
    body = {"label": label, "versions": {**versions("tinker"), "server": server_versions()},
            "config": {"model": "rlcli-tiny-qwen3-v1", "shapes": shapes, "max_tokens": MAX_TOKENS, "greedy": True,
                       "cap_mb": cap, "trim_every_s": EVERY_S,
                       "servers": "keep: --program-memory 0, its own empty compilation cache; capped: "
                                  f"--program-memory {cap}, keep's cache"},
            "load": {"before": load_before, "after": os.getloadavg()},
            "rows": results, "summary": summary(results["keep"], results["capped"], cap)}
    receipt = write_receipt("program-memory", body, Path(out) if out else None)
    print(json.dumps(body["summary"], indent=1))
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
