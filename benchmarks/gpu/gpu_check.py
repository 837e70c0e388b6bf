"""The GPU check: rlcli's jax route on one NVIDIA GPU, with Qwen3-4B- and 1.7B-shaped models, in one command and
one receipt.

    bash benchmarks/gpu/run.sh OUT_DIR                                   # on the GPU machine (README.md)
    .venv/bin/python -m benchmarks.gpu.gpu_check --size tiny --out DIR   # dry run on CPU, against the server venv
    .venv/bin/python -m benchmarks.gpu.gpu_check --plan                  # what the GPU run would do

A size (plans.py) is a list of stages, each a model and a server with its phases in order, most wanted
first (phases.py and sampling.py measure them); the default, 4b, samples and trains a Qwen3-4B-shaped model
(breakdown, RL run, then fused vs 2-pass), then measures the 1.7B shape's sampling at batch 64 while the
budget lasts. The phases; the receipt OUT_DIR/gpu-check-<UTC time>.json is rewritten as each ends, so a run
cut short still leaves one, and optional phases start only while the time budget lasts:
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
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.fused_vs_2pass import bench_loss, headline, rollouts
from benchmarks.gpu import phases, roofline, sampling
from benchmarks.gpu.phases import compile_times, exactness, keep_log, say, short_run, slot_point
from benchmarks.gpu.plans import SIZES, Plan, describe_stage, phase_need, plan_line, stages_from_args
from benchmarks.models import MARKER, TOKENIZER_FILES, bench_server, describe_model
from rlcli.config import portable, server_venv_dir

REPO = common.REPO

EMBEDDED = "rlcli-tiny-qwen3-v1"
DEFAULT_TOKENIZER = REPO / "rlcli" / "assets" / EMBEDDED
EXTRA_TOKENIZER_FILES = ("special_tokens_map.json", "chat_template.jinja")
SERVER_PACKAGES = ("skyrl", "tinker", "jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "transformers", "peft",
                   "torch", "numpy", "safetensors", "fastapi", "pydantic", "uvicorn", "sqlalchemy")



def find_tokenizer(given: str | None) -> Path:
    """--tokenizer, else the shipped embedded model's folder in this working tree; one line if neither."""
    folder = Path(given) if given else DEFAULT_TOKENIZER
    if not all((folder / name).is_file() for name in TOKENIZER_FILES):
        where = f"--tokenizer {given}" if given else f"{DEFAULT_TOKENIZER.relative_to(REPO)}/ (the shipped model)"
        raise SystemExit(f"gpu-check: no tokenizer at {where}: pass --tokenizer DIR, a folder with "
                         f"{' and '.join(TOKENIZER_FILES)} (e.g. what `rlcli model build` wrote)")
    return folder



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


# --- the check ------------------------------------------------------------------------------------


class Receipt:
    def __init__(self, out: Path, body: dict):
        self.stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.path = out / f"gpu-check-{self.stamp}.json"
        self.body = {"benchmark": "gpu-check", "created_utc": self.stamp,
                     "command": common.command_line(), "hardware": common.hardware(),
                     "gpu": gpu_snapshot(), **body, "phases": {}}

    def save(self) -> None:
        self.body["elapsed_s"] = phases.CLOCK.elapsed()
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



def stage_need(receipt: Receipt, plan: Plan, first: Plan) -> float:
    """A later stage's model and server, from the first stage's times scaled by the weights' bytes (at least
    half: importing and starting the engine does not shrink with the model), and its first phase."""
    done = receipt.body["phases"]
    took = sum(done.get(k, {}).get("seconds", 60.0) for k in ("model", "server"))
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
                    elif phases.CLOCK.left() < phase_need(plan, name):
                        skip(receipt, label, f"needs ~{phase_need(plan, name):.0f}s, {phases.CLOCK.left():.0f}s of the "
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
            if phases.CLOCK.left() < need:
                skip(receipt, label, f"needs ~{need:.0f}s, {phases.CLOCK.left():.0f}s of the budget left")
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
        if phases.CLOCK.left() < need:
            skip(receipt, f"{prefix}stage", f"needs ~{need:.0f}s, {phases.CLOCK.left():.0f}s of the budget left")
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
    phases.CLOCK = phases.Clock(plan.budget_s)
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
