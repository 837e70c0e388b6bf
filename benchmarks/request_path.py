"""Where a request's time goes: wall (tinker client) vs the engine's own time, per request type, and idle CPU.

    .venv/bin/python -m benchmarks.request_path --label after --max-lora-adapters 32
    .venv/bin/python -m benchmarks.request_path --label before --rlcli-tree OTHER_CHECKOUT --max-lora-adapters 32

One server of its own (`rlcli serve start` of --rlcli-tree, default this checkout, under a private RLCLI_HOME,
on a free port), the embedded model (--size large: the 26M one of benchmarks/models.py), one rank-8 LoRA.
In order:
1. idle CPU: after the start and --settle-s of quiet, the CPU seconds of every process of the server's process
   group (launcher, SkyRL API, engine) over --idle-s with no client, as a percentage of one core;
2. the first SFT step after the start (compilation included), then --warmup steps;
3. --reps of each request type, one request at a time: forward (1 x 16 tokens), forward_backward
   (8 x 64 tokens), optim_step, sample (1 prompt, 8 tokens): wall from submit to result in the client,
   engine time from the engine's own `(timing)` log lines, overhead = wall - engine;
4. --reps SFT steps (forward_backward 8 x 64 + optim_step submitted back to back, as the cookbook does).
The sampler is saved once, before the reps, so every sample is of a checkpoint older than the live weights:
rlcli's server samples it on a borrowed slot (its weights kept in memory after the first read), as it does
for an RL loop whose sampler lags its trainer; a sample of the checkpoint just saved needs no borrowing (on
the 26M model ~0.12 s a sample against ~0.19 s borrowed, measured with the tinker client alone).
Beside each request's wall time, the CPU time the server's processes spent while it ran (mean per request):
on a machine shared with other work, wall times move with the neighbours, the CPU a request costs much less.
After the reps, the server's resident memory (now and at its peak, all its processes).
The receipt keeps every raw timing, p50/p95 of each, the load average before and after, and the git commit
of the rlcli tree whose server ran.

A/B in one run: --ab-env VAR=VALUE alternates --rounds pairs of servers, A as `serve start` runs it and B with
VAR=VALUE in the server's environment (A B, B A, ...), and pools each arm's reps:
    .venv/bin/python -m benchmarks.request_path --label NAME-ab --ab-env NAME=VALUE --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, stop_servers_on_sigterm, versions, write_receipt
from benchmarks.models import (
    LogCursor,
    describe_model,
    free_port,
    model_dir,
    private_env,
    server_versions,
    wait_for_quiet,
)
from rlcli.server import process

KINDS = ("forward", "forward_backward", "optim_step", "sample")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def stats(values: list[float]) -> dict:
    return {"p50": statistics.median(values), "p95": percentile(values, 95), "min": min(values),
            "max": max(values), "n": len(values)}


def tree_commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = out.stdout.strip() if out.returncode == 0 else "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True)
    return commit + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def group_cpu_ticks(pgid: int) -> int:
    """utime + stime, in clock ticks, of every live process in the process group."""
    return sum(int(fields[11]) + int(fields[12]) for _, fields in process.group_stats(pgid))


def group_memory_mb(pgid: int) -> dict:
    """Resident memory of the group's processes now and at their peaks (VmRSS, VmHWM), in MiB, summed."""
    now = peak = 0
    for pid, _ in process.group_stats(pgid):
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except OSError:
            continue
        now += int(fields.get("VmRSS", "0 kB").split()[0])
        peak += int(fields.get("VmHWM", "0 kB").split()[0])
    return {"rss_mib": round(now / 1024, 1), "peak_rss_mib": round(peak / 1024, 1)}


def idle_cpu(pgid: int, seconds: float) -> dict:
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), group_cpu_ticks(pgid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), group_cpu_ticks(pgid)
    cpu_s = (c1 - c0) / hz
    return {"window_s": t1 - t0, "cpu_s": cpu_s, "percent_of_one_core": 100 * cpu_s / (t1 - t0)}


def sft_batch(n: int, length: int, vocab: int) -> list:
    import tinker

    data = []
    for i in range(n):
        tokens = [(7 + 13 * i + 31 * j) % (vocab - 10) + 5 for j in range(length + 1)]
        data.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                 loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * length}))
    return data


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(url: str, model: str, log: Path, args, pgid: int) -> dict:
    import tinker

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    service = tinker.ServiceClient(base_url=url)
    client = service.create_lora_training_client(base_model=model, rank=8, seed=0).result()
    batch, one = sft_batch(8, 64, vocab), sft_batch(1, 16, vocab)
    adam = tinker.AdamParams(learning_rate=1e-4)
    prompt = one[0].model_input
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0)

    def sft_step() -> None:
        fb = client.forward_backward(batch, "cross_entropy")
        optim = client.optim_step(adam)
        fb.result()
        optim.result()

    requests = {
        "forward": lambda: client.forward(one, "cross_entropy").result(),
        "forward_backward": lambda: client.forward_backward(batch, "cross_entropy").result(),
        "optim_step": lambda: client.optim_step(adam).result(),
        "sample": lambda: sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result(),
    }
    cursor = LogCursor(log)
    first_step_s = timed(sft_step)
    first_engine = cursor.take(["forward_backward", "optim_step"])
    sampler = client.save_weights_and_get_sampling_client().result()
    for _ in range(args.warmup):
        for fn in requests.values():
            fn()
        sft_step()
    cursor = LogCursor(log)
    raw: dict[str, dict[str, list[float]]] = {k: {"wall_s": [], "engine_s": []} for k in (*KINDS, "sft_step")}
    hz = os.sysconf("SC_CLK_TCK")
    cpu_ticks = dict.fromkeys(raw, 0)  # the server's CPU (every process of its group) while each kind ran
    phase_ticks = group_cpu_ticks(pgid)  # and over all of them: work a request leaves running counts here too
    for _ in range(args.reps):
        for kind in KINDS:
            ticks = group_cpu_ticks(pgid)
            wall = timed(requests[kind])
            cpu_ticks[kind] += group_cpu_ticks(pgid) - ticks
            engine = cursor.take([kind])
            if engine is None:  # the log did not hold exactly this request's timing: keep wall only
                raw[kind]["wall_s"].append(wall)
                continue
            raw[kind]["wall_s"].append(wall)
            raw[kind]["engine_s"].append(engine[0])
        ticks = group_cpu_ticks(pgid)
        wall = timed(sft_step)
        cpu_ticks["sft_step"] += group_cpu_ticks(pgid) - ticks
        engine = cursor.take(["forward_backward", "optim_step"])
        raw["sft_step"]["wall_s"].append(wall)
        if engine is not None:
            raw["sft_step"]["engine_s"].append(sum(engine))
    phase_cpu_s = (group_cpu_ticks(pgid) - phase_ticks) / hz
    memory = group_memory_mb(pgid)
    for holder in (getattr(service, "_session_holder", None), getattr(service, "_rest_holder", None)):
        if holder is not None:  # stop its session heartbeat: this server stops next, and A/B starts another
            holder.close()
    results = {}
    for kind, r in raw.items():
        paired = len(r["engine_s"]) == len(r["wall_s"])
        out = {"wall": stats(r["wall_s"]), "server_cpu_s_per_request": cpu_ticks[kind] / hz / len(r["wall_s"])}
        if r["engine_s"]:
            out["engine"] = stats(r["engine_s"])
        if paired:
            out["overhead"] = stats([w - e for w, e in zip(r["wall_s"], r["engine_s"], strict=True)])
        results[kind] = out
    return {"first_sft_step": {"wall_s": first_step_s, "engine_s": first_engine},
            "raw": raw, "results": results, "server_cpu_s_all_reps": phase_cpu_s,
            "server_memory_after_reps": memory,
            "batch": {"forward": "1 x 16 tokens", "forward_backward": "8 x 64 tokens", "sample": "1 prompt of "
                      "16 tokens, 8 new tokens", "lora_rank": 8}}


def serve_and_measure(args, model: Path, tree: Path, extra_env: dict[str, str]) -> dict:
    """Start one server (with extra_env), take the idle CPU and the request timings, stop it."""
    home = Path(tempfile.mkdtemp(prefix="rlcli-bench-path-"))  # mode 0700
    env = {**private_env(home), **extra_env}
    # Whose `rlcli serve start` (and server extensions) run: `python -m` puts its working folder first on
    # sys.path, ahead of PYTHONPATH, so every rlcli command below runs in that tree.
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-m", "rlcli.cli", "serve", "start", "--base-model", str(model), "--port", str(free_port())]
    if args.max_lora_adapters:
        cmd += ["--backend-config", json.dumps({"max_lora_adapters": args.max_lora_adapters})]
    try:
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tree)
        start_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"`rlcli serve start` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        url = proc.stdout.strip().splitlines()[-1]
        state = json.loads((home / "servers" / "default" / "state.json").read_text())
        time.sleep(args.settle_s)
        idle = idle_cpu(state["pgid"], args.idle_s)
        print(f"idle: {idle['percent_of_one_core']:.2f}% of one core", flush=True)
        body = measure(url, str(model), home / "servers" / "default" / "server.log", args, state["pgid"])
        memory = body["server_memory_after_reps"]
        print(f"server memory after the reps: {memory['rss_mib']} MiB resident, {memory['peak_rss_mib']} MiB "
              "at peak", flush=True)
        status = subprocess.run([sys.executable, "-m", "rlcli.cli", "serve", "status"], env=env, capture_output=True,
                                text=True, cwd=tree).stdout.strip().replace(str(model), model.name)
    finally:
        subprocess.run([sys.executable, "-m", "rlcli.cli", "serve", "stop"], env=env, capture_output=True, timeout=120,
                       cwd=tree)
        shutil.rmtree(home, ignore_errors=True)
    body.update(idle=idle, server={"start_command": " ".join(cmd[1:]).replace(str(model), model.name),
                                   "start_s": start_s, "status": status, "extra_env": extra_env})
    return body


def p50_ms(results: dict) -> dict:
    return {kind: {**{part: round(r[part]["p50"] * 1e3, 1) for part in ("wall", "engine", "overhead") if part in r},
                   "server_cpu": round(r["server_cpu_s_per_request"] * 1e3, 1)}
            for kind, r in results.items()}


def pooled(runs: list[dict]) -> dict:
    """p50/p95 over every rep of every run of one arm (overhead paired within each run)."""
    out = {}
    for kind in (*KINDS, "sft_step"):
        walls = [w for run in runs for w in run["raw"][kind]["wall_s"]]
        over = [w - e for run in runs if len(run["raw"][kind]["engine_s"]) == len(run["raw"][kind]["wall_s"])
                for w, e in zip(run["raw"][kind]["wall_s"], run["raw"][kind]["engine_s"], strict=True)]
        cpu = [run["results"][kind]["server_cpu_s_per_request"] for run in runs]
        out[kind] = {"wall": stats(walls), **({"overhead": stats(over)} if over else {}),
                     "server_cpu_s_per_request": statistics.fmean(cpu)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="what this run is (before, after, ...); in the receipt name")
    parser.add_argument("--rlcli-tree", type=Path, default=REPO, help="the rlcli checkout whose server runs")
    parser.add_argument("--max-lora-adapters", type=int, default=None,
                        help="SkyRL's LoRA table size (default: what the tree's `serve start` chooses)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "large"),
                        help="the embedded model, or the 26M-parameter one of benchmarks/models.py")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=10)
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--max-load", type=float, default=2.5, help="wait for this 1-minute load average first")
    parser.add_argument("--max-wait", type=float, default=600, help="seconds to wait for it at most")
    parser.add_argument("--ab-env", default=None, metavar="VAR=VALUE[,VAR=VALUE]",
                        help="A/B: alternate servers without (A) and with (B) these variables in the server's "
                             "environment, --rounds pairs")
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs with --ab-env")
    args = parser.parse_args()
    stop_servers_on_sigterm()

    from rlcli.config import ensure_api_key

    ensure_api_key()
    model = model_dir(args.size)
    quiet = wait_for_quiet(args.max_load, args.max_wait)
    load_before = os.getloadavg()
    tree = args.rlcli_tree.resolve()
    common = dict(label=args.label, rlcli_tree_commit=tree_commit(args.rlcli_tree),
                  versions={**versions("tinker"), "server": server_versions()},
                  config={k: (str(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items() if k != "rlcli_tree"},
                  model={**describe_model(model), "path": model.name})  # no path of this machine
    if args.ab_env:
        b_env = dict(pair.partition("=")[::2] for pair in args.ab_env.split(","))
        arms: dict[str, list[dict]] = {"A": [], "B": []}
        for n in range(args.rounds):
            for arm, extra in (("A", {}), ("B", b_env)) if n % 2 == 0 else (("B", b_env), ("A", {})):
                print(f"round {n + 1}/{args.rounds}, arm {arm} {extra or '(as served)'}", flush=True)
                arms[arm].append(serve_and_measure(args, model, tree, extra))
        body = {"ab": {"A": "the server as `serve start` runs it", "B": f"the same with {args.ab_env}",
                       "order": "A B, B A, ... (alternating pairs)"},
                "pooled": {arm: pooled(runs) for arm, runs in arms.items()}, "runs": arms, **common,
                "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()}, "load_wait": quiet}
        summary = {arm: p50_ms(body["pooled"][arm]) for arm in arms}
        print(json.dumps({"p50_ms": summary,
                          "idle_percent": {arm: [round(r["idle"]["percent_of_one_core"], 2) for r in runs]
                                           for arm, runs in arms.items()}}, indent=1))
    else:
        body = serve_and_measure(args, model, tree, {})
        body.update(common, load_average_1_5_15={"before": load_before, "after": os.getloadavg()}, load_wait=quiet)
        print(json.dumps({"p50_ms": p50_ms(body["results"]),
                          "first_sft_step_s": round(body["first_sft_step"]["wall_s"], 2),
                          "idle_percent": round(body["idle"]["percent_of_one_core"], 2)}, indent=1))
    print(f"receipt: {write_receipt(f'request-path-{args.label}', body)}")


if __name__ == "__main__":
    main()
