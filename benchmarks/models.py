"""The models benchmarks run on, the private server each benchmark starts, and how it is read and timed.

    .venv/bin/python -m benchmarks.models --size large        # build (or find) the larger model, print its folder

Sizes:
- tiny: rlcli's embedded model (~1M parameters), as `rlcli model build` makes it.
- large: a random-weight Qwen3-shaped model (hidden 512, 8 layers, 8 heads / 4 KV, vocab 2048: ~26M
  parameters) with the embedded model's tokenizer, so that on CPU a step's compute, not HTTP, dominates.
  Built here with transformers' Qwen3Config from a seed; cached under RLCLI_HOME/models/.

`bench_server` is rlcli.server.private's server (a private RLCLI_HOME, a free port, the shared server
venv, always stopped) with the benchmarks' LoRA table of 4 adapters.
`engine_timings`/`LogCursor` read the engine's own per-request times from that server's log, and
`wait_for_quiet` holds a benchmark until the (shared) machine's load average drops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rlcli.config import rlcli_home, server_venv_dir
from rlcli.model import ensure_embedded_model
from rlcli.server import private
from rlcli.server.private import RLCLI as RLCLI  # re-exported: the benchmarks import these from here
from rlcli.server.private import PrivateServer
from rlcli.server.private import free_port as free_port
from rlcli.server.private import private_env as private_env

LARGE_ARCH = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  intermediate_size=1536, max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-6)
LARGE_NAME = "bench-qwen3-h512-l8"
MARKER = "bench-model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SERVER_PACKAGES = ("skyrl", "tinker", "jax", "jaxlib", "flax", "optax", "transformers")


def model_dir(size: str, seed: int = 0) -> Path:
    """The folder of a benchmark model: 'tiny' (the embedded model) or 'large' (built here once)."""
    if size == "tiny":
        return ensure_embedded_model(quiet=True)
    if size == "large":
        return build_large(rlcli_home() / "models" / f"{LARGE_NAME}-seed{seed}", seed)
    raise SystemExit(f"unknown model size {size!r}: choose tiny or large")


def describe_model(folder: Path) -> dict:
    """What a receipt records about the model: its config's shape and its parameter count."""
    config = json.loads((folder / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "dtype")
    marker = next((folder / m for m in (MARKER, "rlcli-model.json") if (folder / m).exists()), None)
    params = json.loads(marker.read_text()).get("params") if marker else None
    return {"path": str(folder), "params": params, **{k: config.get(k) for k in keys}}


def build_large(folder: Path, seed: int = 0) -> Path:
    """Build the larger random-weight model into folder (same seed, same bytes), unless it is there."""
    marker = folder / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("arch") == LARGE_ARCH:
        return folder
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    source = ensure_embedded_model(quiet=True)
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))  # renamed into place when whole
    try:
        for name in TOKENIZER_FILES:
            shutil.copy2(source / name, staging / name)
        tokenizer = AutoTokenizer.from_pretrained(staging)
        eos, bos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
        config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos, **LARGE_ARCH)
        config.dtype = torch.float32
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
        model.save_pretrained(staging)
        params = sum(p.numel() for p in model.parameters())
        info = {"name": LARGE_NAME, "seed": seed, "arch": LARGE_ARCH, "params": params, "tokenizer_from": str(source)}
        (staging / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def server_versions(venv: Path | None = None) -> dict:
    """Versions of SkyRL, jax & co. as the server venv's own Python sees them."""
    python = (venv or server_venv_dir()) / "bin" / "python"
    script = ("import json, importlib.metadata as m\n"
              f"print(json.dumps({{p: m.version(p) for p in {list(SERVER_PACKAGES)!r}}}))")
    try:
        out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=60, check=True)
        return {"server_python": str(python), **json.loads(out.stdout)}
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"server_python": str(python), "error": str(e)}


def start_command(model: Path | str, port: int, max_lora_adapters: int = 4, processes: int = 1) -> list[str]:
    more = ("--processes", str(processes)) if processes > 1 else ()
    return private.start_command(model, port, "--backend-config", json.dumps({"max_lora_adapters": max_lora_adapters}),
                                 *more)


def bench_server(model: Path | str, max_lora_adapters: int = 4,
                 timeout: float = 900) -> contextlib.AbstractContextManager[PrivateServer]:
    """A server of our own for `model`, started under a private RLCLI_HOME; stopped (always) on exit."""
    return private.private_server(model, "--backend-config", json.dumps({"max_lora_adapters": max_lora_adapters}),
                                  timeout=timeout)


# The engine logs `(timing) process_batch_requests(forward_backward, n=1) took 0.100s` per request
# (SkyRL's log_timing), wrapped across lines by its log handler.
_TIMING = re.compile(r"\(timing\)\s+process_(?:batch_requests|single_request)"
                     r"\(\s*(\w+)(?:,\s*n=\d+)?\s*\)\s+took\s+([\d.]+)s")


def engine_timings(log_text: str) -> list[tuple[str, float]]:
    """(request type, engine seconds) for each request the engine timed, in log order."""
    joined = " ".join(line.strip() for line in log_text.splitlines())
    return [(kind, float(seconds)) for kind, seconds in _TIMING.findall(joined)]


class LogCursor:
    """The engine's request timings written to the server log since the last call (None: no log)."""

    def __init__(self, log: Path | None):
        self.log, self.offset = log, log.stat().st_size if log and log.exists() else 0

    def take(self, expected: list[str]) -> list[float] | None:
        if self.log is None:
            return None
        time.sleep(0.3)  # the launcher copies the engine's output into the log a moment later
        with self.log.open("rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
            self.offset = f.tell()
        found = engine_timings(text)
        return [s for _, s in found] if [k for k, _ in found] == expected else None


def wait_for_quiet(max_load: float = 2.5, max_wait_s: float = 600, poll_s: float = 15) -> dict:
    """Wait (up to max_wait_s) until the 1-minute load average is at most max_load; say what was found.

    The machine may be shared: timings taken while other work runs are slower and noisier. Waiting is
    the one remedy a script has; the receipt records the load either way.
    """
    start = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() - start < max_wait_s:
        time.sleep(poll_s)
    load = os.getloadavg()
    return {"threshold_1min": max_load, "waited_s": round(time.monotonic() - start, 1), "load_1_5_15": load,
            "quiet": load[0] <= max_load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large", choices=("tiny", "large"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = model_dir(args.size, args.seed)
    print(folder)
    print(json.dumps(describe_model(folder)))


if __name__ == "__main__":
    main()
