"""The GPU check: rlcli's jax route on one NVIDIA GPU, with Qwen3-4B- and 1.7B-shaped models, in one command and
one receipt.

    bash benchmarks/gpu/run.sh OUT_DIR                                   # on the GPU machine (README.md)
    .venv/bin/python -m benchmarks.gpu.gpu_check --size tiny --out DIR   # dry run on CPU, against the server venv
    .venv/bin/python -m benchmarks.gpu.gpu_check --plan                  # what the GPU run would do

A size is a list of stages, each a model and a server with its phases in order (most wanted first); the
default, 4b, samples and trains a Qwen3-4B-shaped model (breakdown, RL run, then fused vs 2-pass), then
measures the 1.7B shape's sampling at batch 64 while the budget lasts. Phases; the receipt
OUT_DIR/gpu-check-<UTC time>.json is rewritten as each ends, so a run cut short still leaves one; optional
phases start only while the time budget lasts:
  preflight  the server's Python imports SkyRL's API, engine and jax backend, names jax's devices, says which
             jax ran against the lock's, and probes the device (a copy and a bf16 matmul: roofline.py)
             (a GPU check whose jax sees no GPU stops here, in seconds)
  model      a random-weight Qwen3-shaped model with rlcli's embedded tokenizer; its vocabulary is the real
             model's (151,936 for the 4B) when that is larger than the tokenizer's (README.md says why)
  server     `rlcli serve start` on it (rlcli's launcher with its extensions: fused gspo on the jax backend),
             through benchmarks/models.bench_server
  breakdown  where a sample request's time goes (sampling.py), with the roofline beside the decode
  run        a short on-policy fused GSPO run: hand the weights over, sample, one step, again; each step
             split into hand-over, sampling and training
  batch      one frozen batch of sampled rollouts (benchmarks/fused_vs_2pass.rollouts)
  pairs      fused vs 2-pass GSPO steps on that batch, alternating pairs, and the floor
             (fused_vs_2pass.bench_loss: same weights on both paths, every raw time, engine times from the log)
  exactness  one fused and one 2-pass GSPO step from the same weights, each against the float64 reference
             (rlcli.train.losses.gspo_reference)
  slots      forward_backward of one rank-8 LoRA (SFT, 8 x 64 tokens) with max_lora_adapters = each of --slots,
             on the main server and on one more server per count, while the time budget lasts

dtype: bfloat16. Qwen3-1.7B ships in bf16, and SkyRL's jax backend computes in the checkpoint's dtype
(weights, activations and logprobs), so bf16 is what a user's GPU server runs: tensor-core matmuls and half
the bytes of float32. The exactness phase is built for it: the fused loss is checked against the float64
reference evaluated on the logprobs of the same pass (the loss itself is float32 arithmetic on them), and
the gap between a forward pass's logprobs and a forward_backward's (which the 2-pass route relies on being
zero) is measured and reported rather than assumed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.fused_vs_2pass import Config, bench_loss, forward_only, headline, loss_config, rollouts
from benchmarks.gpu import roofline, sampling
from benchmarks.gpu.sampling import Breakdown
from benchmarks.models import MARKER, TOKENIZER_FILES, LogCursor, bench_server, describe_model
from rlcli.config import portable, server_venv_dir

REPO = common.REPO

EMBEDDED = "rlcli-tiny-qwen3-v1"
DEFAULT_TOKENIZER = REPO / "rlcli" / "assets" / EMBEDDED
EXTRA_TOKENIZER_FILES = ("special_tokens_map.json", "chat_template.jinja")
QWEN3_1_7B = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=6144, max_position_embeddings=40960, tie_word_embeddings=True,
                  rms_norm_eps=1e-6)
# Qwen/Qwen3-4B's config.json on the Hugging Face hub (and its model card: 36 layers, 32 query / 8 KV heads,
# 4.0B parameters of which 3.6B non-embedding; roofline.param_count gives 4.02B / 3.63B for this shape).
QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, intermediate_size=9728, max_position_embeddings=40960, tie_word_embeddings=True,
                rms_norm_eps=1e-6)
QWEN3_VOCAB = 151_936  # the LM head's real width: a 2,048-token head hides most of its cost
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-6)
WIDE_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # most sequences unclipped: a real gradient
SERVER_PACKAGES = ("skyrl", "tinker", "jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "transformers", "peft",
                   "torch", "numpy", "safetensors", "fastapi", "pydantic", "uvicorn", "sqlalchemy")


@dataclass
class Plan:
    size: str
    arch: dict
    dtype: str
    bench: Config  # fused_vs_2pass's workload: batch shape, warm-up, pairs, floor, LoRA rank, lr
    main_slots: int = 4  # the main server: bench_loss holds three LoRA slots at once (slot 0 is SkyRL's)
    run_steps: int = 4
    slots: tuple[int, ...] = (32, 8, 2)  # the sweep, most wanted first; the main server's count is free
    slot_reps: int = 5
    slot_batch: tuple[int, int] = (8, 64)  # sequences x tokens of the sweep's SFT batch
    budget_s: float = 470.0  # optional phases start only while they fit in it (leave a margin under any limit)
    vocab: int | None = None  # the model's vocabulary when larger than the tokenizer's (None: the tokenizer's)
    phases: tuple[str, ...] = ("batch", "pairs", "exactness", "run", "slots")  # on this stage's server, in order
    breakdown: Breakdown = Breakdown()
    then: str | None = None  # the next stage: another size's plan, its own model and server
    notes: list[str] = field(default_factory=list)


# The RL run's shape: 8 prompts x 8 samples x 32 tokens, rank-32 LoRA (64 sequences of ~92 tokens a step)
RL_SHAPE = Config(size="1.7b", prompts=8, samples=8, fewshot=1, max_tokens=32, warmup=2, pairs=10, floor_reps=4,
                  lr=1e-4, rank=32, seed=0)
TINY_SHAPE = Config(size="tiny", prompts=2, samples=4, fewshot=1, max_tokens=16, warmup=1, pairs=3, floor_reps=2,
                    lr=1e-4, rank=32, seed=0)
PLANS = {
    # The headline: the 4B's sampling breakdown and RL step split first, then its fused-vs-2-pass exactness
    # and a short pairs timing on the same server (no second start), then, while the budget lasts, the 1.7B's
    # breakdown at batch 64: the shape of issue 48's targets.
    "4b": Plan("4b", QWEN3_4B, "bfloat16", replace(RL_SHAPE, size="4b", pairs=4, floor_reps=2), run_steps=3,
               slots=(), budget_s=530.0, vocab=QWEN3_VOCAB, phases=("breakdown", "run", "batch", "exactness", "pairs"),
               then="1.7b-target"),
    "1.7b-target": Plan("1.7b-target", QWEN3_1_7B, "bfloat16", RL_SHAPE, run_steps=0, slots=(), vocab=QWEN3_VOCAB,
                        phases=("breakdown",), breakdown=Breakdown(shapes=((64, 1), (64, 32)), reps=3, handovers=3)),
    # The 1.7B alone (the first receipt's check, with the real vocabulary), its target shape measured first.
    "1.7b": Plan("1.7b", QWEN3_1_7B, "bfloat16", RL_SHAPE, run_steps=3, budget_s=470.0, vocab=QWEN3_VOCAB,
                 phases=("breakdown", "run", "batch", "pairs", "exactness", "slots")),
    # The dry run on CPU: both stages of the 4b size and every phase (the slot sweep too), a 2-layer model whose
    # vocabulary (4,096) is wider than the tokenizer's (2,048), as the 4B's is.
    "tiny": Plan("tiny", TINY, "bfloat16", TINY_SHAPE, run_steps=2, slots=(), budget_s=900.0, vocab=4096,
                 phases=("breakdown", "run", "batch", "exactness", "pairs"), then="tiny-target",
                 breakdown=Breakdown(shapes=((4, 1), (4, 8), (8, 1), (8, 8)), reps=2, handovers=3)),
    "tiny-target": Plan("tiny-target", TINY, "bfloat16", TINY_SHAPE, run_steps=0, slots=(8,), slot_reps=2,
                        vocab=4096, phases=("breakdown", "slots"),
                        breakdown=Breakdown(shapes=((8, 1), (8, 8)), reps=2, handovers=2)),
}
SIZES = ("4b", "1.7b", "tiny")  # what --size offers; the others are later stages


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The size's (first stage's) plan with the command line's overrides applied."""
    return override(PLANS[args.size], args)


def stages_from_args(args: argparse.Namespace) -> list[Plan]:
    """The size's stages in order, each with the command line's overrides (the budget is the whole run's)."""
    out = [plan_from_args(args)]
    while out[-1].then:
        out.append(override(PLANS[out[-1].then], args))
    return out


def override(plan: Plan, args: argparse.Namespace) -> Plan:
    bench = plan.bench
    if args.pairs is not None:
        bench = replace(bench, pairs=args.pairs)
    changes: dict[str, Any] = {"bench": bench}
    if args.slots is not None:
        changes["slots"] = parse_slots(args.slots)
    for name in ("run_steps", "budget_s", "dtype"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    return replace(plan, **changes)


def parse_slots(text: str) -> tuple[int, ...]:
    """'32,8,2' -> (32, 8, 2); '' -> none. A server needs slot 0 (SkyRL's) and one LoRA: at least 2."""
    counts = tuple(int(s) for s in text.split(",") if s.strip())
    if any(c < 2 for c in counts):
        raise SystemExit(f"--slots {text!r}: each count must be at least 2 (slot 0 is SkyRL's own)")
    return counts


def find_tokenizer(given: str | None) -> Path:
    """--tokenizer, else the shipped embedded model's folder in this working tree; one line if neither."""
    folder = Path(given) if given else DEFAULT_TOKENIZER
    if not all((folder / name).is_file() for name in TOKENIZER_FILES):
        where = f"--tokenizer {given}" if given else f"{DEFAULT_TOKENIZER.relative_to(REPO)}/ (the shipped model)"
        raise SystemExit(f"gpu-check: no tokenizer at {where}: pass --tokenizer DIR, a folder with "
                         f"{' and '.join(TOKENIZER_FILES)} (e.g. what `rlcli model build` wrote)")
    return folder


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


# --- the machine ----------------------------------------------------------------------------------


def gpu_snapshot() -> dict | None:
    """Memory in use and utilisation of GPU 0 now (None without nvidia-smi)."""
    query = "name,memory.used,memory.total,utilization.gpu,driver_version,compute_cap"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not line:
        return None
    keys = ("name", "memory_used_mib", "memory_total_mib", "utilization_pct", "driver", "compute_capability")
    return dict(zip(keys, (v.strip() for v in line[0].split(",")), strict=False))


def image_venv(python: str, folder: Path) -> Path:
    """A server 'venv' that is the given interpreter (the GPU image's, with PYTHONPATH holding the wheels).

    `rlcli serve start` runs <venv>/bin/python and skips building a venv marked complete for the current
    env/server-jax.txt, so a wrapper script plus that marker make rlcli's own start path use the image.
    """
    from rlcli.server import server_venv

    exe = shutil.which(python) or python
    exe = str(Path(exe).absolute())  # not resolved: a venv's interpreter must keep its own path
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    wrapper = folder / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{exe}" "$@"\n')
    wrapper.chmod(0o755)
    digest = __import__("hashlib").sha256(server_venv.pins_file("jax").read_bytes()).hexdigest()[:16]
    (folder / server_venv.MARKER).write_text(f"jax:{digest}\n")
    if not server_venv.is_complete(folder, "jax"):
        raise RuntimeError("rlcli does not take the image's interpreter as a complete server venv")
    return folder


PREFLIGHT = """
import importlib, json, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "executable": sys.executable, "versions": {}}
for name in PACKAGES:
    try:
        out["versions"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["versions"][name] = None
for module in ("skyrl.tinker.api", "skyrl.tinker.engine", "skyrl.backends.jax", "tinker"):
    importlib.import_module(module)
import jax
devices = jax.devices()
out["jax_backend"] = jax.default_backend()
out["jax_devices"] = [{"platform": d.platform, "kind": d.device_kind, "id": d.id} for d in devices]
PROBE
out["probe"] = _probe(out["jax_backend"] == "gpu")
print("PREFLIGHT " + json.dumps(out))
"""


def preflight(venv: Path, size: str) -> dict:
    """Import the server's stack in the server's Python and ask jax for its devices."""
    script = PREFLIGHT.replace("PACKAGES", repr(list(SERVER_PACKAGES))).replace("PROBE", roofline.PROBE)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=300,
                          env=env)
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("PREFLIGHT ")]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"the server's Python cannot import SkyRL's stack:\n{proc.stderr[-3000:]}")
    info = json.loads(found[-1].split(" ", 1)[1])
    info["jax_vs_lock"] = jax_vs_lock(info["versions"].get("jax"))
    if not info["jax_vs_lock"]["same"]:
        say(f"WARNING: {info['jax_vs_lock']['note']}")
    if size != "tiny" and info["jax_backend"] != "gpu":
        raise RuntimeError(f"jax's backend is {info['jax_backend']!r}, not gpu: the {size} check would run on CPU")
    return info


def locked_jax() -> str | None:
    """The jax version the server venv's lock pins (rlcli/server/env/server-jax.lock)."""
    from rlcli.server import server_venv

    found = re.search(r"^jax==([^\s;\\]+)", server_venv.pins_file("jax").read_text(), re.M)
    return found.group(1) if found else None


def jax_vs_lock(ran: str | None) -> dict:
    """Which jax the server ran against the lock's: the image's own CUDA build runs (the wheels never carry
    jax: README.md), so a figure from another jax is flagged rather than taken as the lock's."""
    locked = locked_jax()
    same = ran is not None and ran == locked
    note = (f"the server ran jax {ran}, the lock pins {locked}" + ("" if same else
            ": the image's jax, not the locked one; its figures may differ from what the lock runs"))
    return {"ran": ran, "locked": locked, "same": same, "note": note}


# --- the model ------------------------------------------------------------------------------------


def build_model(folder: Path, tokenizer_dir: Path, arch: dict, dtype: str, seed: int, vocab: int | None = None) -> dict:
    """A random-weight Qwen3 of shape `arch` with the given tokenizer, saved in Hugging Face format.

    `vocab` larger than the tokenizer's widens the embedding and the LM head to the real model's (what a
    decode step reads and computes); the tokenizer's ids stay valid, and ids it does not know are sampled
    but only ever decoded by the rollouts' reward, where the tokenizer skips them."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for name in (*TOKENIZER_FILES, *EXTRA_TOKENIZER_FILES):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos, bos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    width = max(len(tokenizer), vocab or 0)
    config = Qwen3Config(vocab_size=width, bos_token_id=bos, eos_token_id=eos, **arch)
    torch_dtype = getattr(torch, dtype)
    config.dtype = torch_dtype
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU makes 1.7B random weights in a second
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch_dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the engine's jax takes the GPU's memory next
    info = {"name": f"gpu-check-qwen3-{dtype}", "seed": seed, "arch": arch, "dtype": dtype, "params": params,
            "vocab": width, "tokenizer_vocab": len(tokenizer), "initialised_on": device,
            "safetensors_bytes": sum(p.stat().st_size for p in folder.glob("*.safetensors"))}
    (folder / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return info


# --- what the phases measure ----------------------------------------------------------------------


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


# --- the check ------------------------------------------------------------------------------------


class Receipt:
    def __init__(self, out: Path, body: dict):
        self.stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.path = out / f"gpu-check-{self.stamp}.json"
        self.body = {"benchmark": "gpu-check", "created_utc": self.stamp,
                     "command": common.command_line(), "hardware": common.hardware(),
                     "gpu": gpu_snapshot(), **body, "phases": {}}

    def save(self) -> None:
        self.body["elapsed_s"] = CLOCK.elapsed()
        text = json.dumps(self.body, indent=2, default=str)
        self.path.write_text(portable(text, REPO) + "\n")

    def phase(self, name: str, fn, critical: bool = True) -> Any:
        """Run one phase, record its result or its error, and rewrite the receipt."""
        say(f"{name} ...")
        start = time.monotonic()
        try:
            result = fn()
            entry = {"status": "ok", "seconds": time.monotonic() - start, "gpu": gpu_snapshot()}
            if isinstance(result, dict):
                entry["result"] = result
        except Exception as e:  # the receipt says what failed; the traceback goes to the log
            traceback.print_exc()
            entry = {"status": "failed", "seconds": time.monotonic() - start, "error": f"{type(e).__name__}: {e}"}
            result = None
        self.body["phases"][name] = entry
        self.save()
        say(f"{name}: {entry['status']} in {entry['seconds']:.1f}s")
        if entry["status"] == "failed" and critical:
            raise SystemExit(f"gpu-check: phase {name} failed: {entry['error']} (receipt: {self.path})")
        return result


def skip(receipt: Receipt, name: str, why: str) -> None:
    receipt.body["phases"][name] = {"status": "skipped", "why": why}
    receipt.save()
    say(f"{name}: skipped ({why})")


# Seconds of the budget an optional phase needs left to start: rough H200 figures for the 4B, each shape a
# sampler compile; a later stage also needs its model built and its server started (stage_need).
PHASE_NEED_S = {"run": 60.0, "batch": 0.0, "pairs": 60.0, "exactness": 30.0, "slots": 45.0}


def phase_need(plan: Plan, name: str) -> float:
    return 10.0 + 25.0 * len(plan.breakdown.shapes) if name == "breakdown" else PHASE_NEED_S[name]


def stage_need(receipt: Receipt, plan: Plan, first: Plan) -> float:
    """A later stage's model and server, from the first stage's times scaled by the weights' bytes (at least
    half: importing and starting the engine does not shrink with the model), and its first phase."""
    phases = receipt.body["phases"]
    took = sum(phases.get(k, {}).get("seconds", 60.0) for k in ("model", "server"))
    scale = max(0.5, min(1.0, describe_stage(plan)["weight_bytes"] / describe_stage(first)["weight_bytes"]))
    return took * scale + phase_need(plan, plan.phases[0])


class Stage:
    """One stage's server and what its phases hand each other (the frozen batch, the slot sweep)."""

    def __init__(self, receipt: Receipt, plan: Plan, prefix: str, peaks: dict):
        self.receipt, self.plan, self.prefix, self.peaks = receipt, plan, prefix, peaks
        self.batch: dict | None = None
        self.sweep: dict[int, dict] = {}

    def phase_fn(self, name: str, service, srv, vocab: int):
        plan, cfg = self.plan, self.plan.bench
        return {
            "breakdown": lambda: sampling.run(service, srv.model, srv.url, srv.log, cfg, plan.breakdown, plan.arch,
                                              plan.dtype, self.peaks, lambda: compile_times(srv.log)),
            "run": lambda: short_run(service, srv.model, srv.url, cfg, plan.run_steps),
            "batch": lambda: rollouts(service, srv.model, cfg),
            "pairs": lambda: bench_loss(service, srv.model, srv.url, srv.log, self.batch, "gspo", cfg),
            "exactness": lambda: exactness(service, srv.model, srv.url, self.batch, cfg),
            "slots": lambda: slot_point(service, srv.model, srv.url, srv.log, plan, plan.main_slots, vocab),
        }[name]

    def record(self, name: str, result: Any) -> None:
        """A phase's figures in the receipt's headline (keyed by the stage's size where sizes differ)."""
        body, size = self.receipt.body, self.plan.size
        head = body.setdefault("headline", {})
        if result is None:
            return
        if name == "breakdown":
            head.setdefault("sampling", {})[size] = sampling.summary(result["split"])
        elif name == "run":
            head.setdefault("rl_step", {})[size] = result["split"]
            head.setdefault("run", {"step_s_median": result["step_s_median"], "size": size,
                                    "reward_mean": [r["reward_mean"] for r in result["steps"]]})
        elif name == "batch":
            self.batch = result
            body["batch"] = {"shape": result["shape"], "rewards": result["rewards"], "size": size}
        elif name == "pairs":
            head["pairs"] = {**headline({"runs": {"gspo": result}})["gspo"], "size": size}
            body["model"] = body["models"][size]  # the model report.py's row names is the pairs' model
        elif name == "slots":
            self.sweep[self.plan.main_slots] = result

    def serve(self, folder: Path, out: Path, vocab: int) -> None:
        """The stage's server and its phases in order; a phase that does not fit the budget is skipped."""
        import tinker

        plan, receipt, prefix = self.plan, self.receipt, self.prefix
        with bench_server(folder, max_lora_adapters=plan.main_slots) as srv:
            try:
                server = {"start_s": srv.start_s, "start_command": " ".join(srv.start_command[1:]),
                          "max_lora_adapters": plan.main_slots}
                receipt.body.setdefault("servers", {})[plan.size] = server
                receipt.body.setdefault("server", server)
                receipt.body["phases"][prefix + "server"] = {"status": "ok", "seconds": srv.start_s,
                                                             "gpu": gpu_snapshot()}
                say(f"server ready in {srv.start_s:.1f}s at {srv.url}")
                service = tinker.ServiceClient(base_url=srv.url)
                for name in plan.phases:
                    label = prefix + (f"slots-{plan.main_slots}" if name == "slots" else name)
                    if name in ("pairs", "exactness") and self.batch is None:
                        skip(receipt, label, "no frozen batch")
                    elif name == "run" and not plan.run_steps:
                        continue
                    elif CLOCK.left() < phase_need(plan, name):
                        skip(receipt, label, f"needs ~{phase_need(plan, name):.0f}s, {CLOCK.left():.0f}s of the "
                                             f"budget left")
                    else:
                        critical = name == "batch" and not prefix  # a later stage never ends the check
                        self.record(name, receipt.phase(label, self.phase_fn(name, service, srv, vocab),
                                                        critical=critical))
            finally:
                receipt.body.setdefault("compile_s", {})[plan.size] = compile_times(srv.log)
                receipt.save()
                keep_log(srv.log, out, f"server-{plan.size}.log")

    def sweep_servers(self, folder: Path, out: Path, vocab: int) -> None:
        """forward_backward of one LoRA on one more server per slot count, while the budget lasts."""
        import tinker

        plan, receipt = self.plan, self.receipt
        main_start = receipt.body["servers"][plan.size]["start_s"]
        first_step = self.sweep.get(plan.main_slots, {}).get("first_step_s", 60.0)
        for slots in plan.slots:
            if slots == plan.main_slots:
                continue
            label = f"{self.prefix}slots-{slots}"
            need = 1.3 * (main_start + first_step) + plan.slot_reps * 2 + 15
            if CLOCK.left() < need:
                skip(receipt, label, f"needs ~{need:.0f}s, {CLOCK.left():.0f}s of the budget left")
                continue

            def one_server(slots: int = slots) -> dict:
                with bench_server(folder, max_lora_adapters=slots) as other:
                    try:
                        point = slot_point(tinker.ServiceClient(base_url=other.url), other.model, other.url,
                                           other.log, plan, slots, vocab)
                        return {**point, "server_start_s": other.start_s}
                    finally:
                        keep_log(other.log, out, f"server-{plan.size}-slots-{slots}.log", max_bytes=2**20)

            point = receipt.phase(label, one_server, critical=False)
            if point:
                self.sweep[slots] = point


def run_stage(receipt: Receipt, plan: Plan, prefix: str, work: Path, out: Path, tokenizer: Path,
              peaks: dict) -> None:
    """Build the stage's model, serve it through its phases, sweep its slot counts; remove the model after."""
    folder = (work / f"model-{plan.size}").resolve()
    info = receipt.phase(prefix + "model", lambda: build_model(folder, tokenizer, plan.arch, plan.dtype,
                                                               plan.bench.seed, plan.vocab), critical=not prefix)
    if info is None:
        return
    model = {**describe_model(folder), "path": "(temporary)", "tokenizer_vocab": info["tokenizer_vocab"],
             "safetensors_bytes": info["safetensors_bytes"], "dtype": plan.dtype}
    receipt.body.setdefault("models", {})[plan.size] = model
    receipt.body.setdefault("model", model)
    vocab = model["vocab_size"]
    stage = Stage(receipt, plan, prefix, peaks)
    try:
        stage.serve(folder, out, vocab)
        stage.sweep_servers(folder, out, vocab)
    except SystemExit as e:  # `rlcli serve start` failed: bench_server says why in one message
        if prefix + "server" not in receipt.body["phases"]:
            receipt.body["phases"][prefix + "server"] = {"status": "failed", "error": str(e)[-4000:]}
            receipt.save()
        if not prefix:
            raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the 4B's weights are 8 GB of the machine's disk
    if stage.sweep:
        receipt.body.setdefault("headline", {}).setdefault("slots", {}).update({
            str(k): {"fb_client_median_s": v["fb_client_median_s"], "fb_engine_median_s": v["fb_engine_median_s"],
                     "size": plan.size} for k, v in sorted(stage.sweep.items())})


def device_name(receipt: Receipt, info: dict) -> str | None:
    """The GPU's name from nvidia-smi, else jax's first device kind (a CPU dry run: 'cpu')."""
    gpu = receipt.body.get("gpu") or {}
    devices = info.get("jax_devices") or [{}]
    return gpu.get("name") or devices[0].get("kind")


def run_check(stages: list[Plan], out: Path, tokenizer: Path, python: str | None) -> Receipt:
    from rlcli.config import ensure_api_key

    ensure_api_key()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rlcli-gpu-check-"))
    receipt = Receipt(out, {"plan": [describe_stage(p) for p in stages], "headline": {},
                            "versions": common.versions("tinker", "transformers", "torch", "numpy")})
    receipt.save()
    venv = image_venv(python, work / "server-venv") if python else server_venv_dir()
    os.environ["RLCLI_SERVER_VENV"] = str(venv)
    receipt.body["server_python"] = "the image's interpreter (--python)" if python else "the server venv"
    info = receipt.phase("preflight", lambda: preflight(venv, stages[0].size))
    receipt.body["versions"]["server"] = info["versions"]
    receipt.body["jax_devices"] = info["jax_devices"]
    receipt.body["jax_vs_lock"] = info["jax_vs_lock"]
    receipt.body["device_peaks"] = peaks = roofline.device_peaks(device_name(receipt, info), info.get("probe"))
    for i, plan in enumerate(stages):
        prefix = f"{plan.size}/" if i else ""
        need = stage_need(receipt, plan, stages[0]) if i else 0.0
        if CLOCK.left() < need:
            skip(receipt, f"{prefix}stage", f"needs ~{need:.0f}s, {CLOCK.left():.0f}s of the budget left")
            continue
        run_stage(receipt, plan, prefix, work, out, tokenizer, peaks)
    exact = next((v["result"] for k, v in receipt.body["phases"].items()
                  if k.split("/")[-1] == "exactness" and v.get("result")), None)
    if exact:
        receipt.body["headline"]["exactness"] = {
            "fused_loss_vs_float64": exact["fused"]["loss_abs_diff"],
            "fused_per_token_vs_float64": exact["fused"]["per_token_max_abs_diff"],
            "two_pass_loss_vs_float64": exact["two_pass"]["loss_abs_diff"],
            "fused_minus_two_pass": exact["fused_minus_two_pass"],
            "logprob_gap_forward_vs_forward_backward": exact["logprob_gap_forward_vs_forward_backward"],
            "grad_norm_rel_diff": exact["grad_norm_rel_diff"], "ok": exact["check"]["ok"]}
    receipt.body["headline"]["jax"] = info["jax_vs_lock"]
    receipt.save()
    shutil.rmtree(work, ignore_errors=True)
    return receipt


def describe_stage(plan: Plan) -> dict:
    """The plan as the receipt and --plan show it, with the model's parameter count and weight bytes."""
    vocab = plan.vocab or 2048  # the embedded tokenizer's when the plan names none
    params = roofline.param_count(plan.arch, vocab)["total"]
    return {**asdict(plan), "model_vocab": vocab, "params": params,
            "weight_bytes": params * roofline.DTYPE_BYTES[plan.dtype]}


def plan_line(stages: list[Plan]) -> str:
    """One line: each stage's model and phases, and the budget."""
    parts = []
    for plan in stages:
        d = describe_stage(plan)
        phases = ", ".join(p if p != "breakdown" else "breakdown " + "/".join(f"{b}x{n}"
                                                                             for b, n in plan.breakdown.shapes)
                           for p in plan.phases if p != "run" or plan.run_steps)
        parts.append(f"{plan.size}: {d['params'] / 1e9:.2f}B params, vocab {d['model_vocab']:,}, {plan.dtype} "
                     f"({d['weight_bytes'] / 1e9:.1f} GB of weights) -> {phases}")
    return "plan: " + "; then ".join(parts) + f"; budget {stages[0].budget_s:.0f}s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="4b",
                        help="4b: the GPU check (then fused vs 2-pass on the 1.7B); 1.7b: the 1.7B alone; "
                             "tiny: a 2-layer model, the dry run on CPU")
    parser.add_argument("--out", type=Path, help="folder for the receipt and the server logs (required to run)")
    parser.add_argument("--tokenizer", help=f"folder with the tokenizer files (default: rlcli/assets/{EMBEDDED}/)")
    parser.add_argument("--python", help="run the server with this interpreter (the GPU image's) instead of "
                                         "rlcli's server venv; its PYTHONPATH must hold the carried wheels")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    parser.add_argument("--pairs", type=int, default=None, help="fused/2-pass pairs timed")
    parser.add_argument("--run-steps", type=int, default=None, help="steps of the short GSPO run (0: none)")
    parser.add_argument("--slots", default=None, help="max_lora_adapters of the sweep, comma-separated ('': none)")
    parser.add_argument("--budget-s", type=float, default=None, help="optional phases start only within it")
    parser.add_argument("--plan", action="store_true", help="print the plan as JSON and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global CLOCK
    args = parse_args(argv)
    stages = stages_from_args(args)
    plan = stages[0]
    if args.plan:
        print(json.dumps([describe_stage(p) for p in stages], indent=1))
        print(plan_line(stages))
        return 0
    if args.out is None:
        raise SystemExit("gpu-check: --out DIR is required (the receipt goes there)")
    tokenizer = find_tokenizer(args.tokenizer)
    CLOCK = Clock(plan.budget_s)
    say(f"size {plan.size}, {plan.dtype}, budget {plan.budget_s:.0f}s, tokenizer {tokenizer.name}")
    receipt = run_check(stages, args.out, tokenizer, args.python)
    head = receipt.body.get("headline", {})
    print(json.dumps(head, indent=1))
    print(f"receipt: {receipt.path}")
    failed = [k for k, v in receipt.body["phases"].items() if v.get("status") == "failed"]
    # a phase the budget skipped is no failure; an exactness check that ran must pass
    return 1 if failed or not head.get("exactness", {}).get("ok", True) else 0


if __name__ == "__main__":
    sys.exit(main())
