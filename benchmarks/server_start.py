"""How long `rlcli serve start` takes until the engine serves a request: a cold-ish start, then warm ones.

    .venv/bin/python -m benchmarks.server_start --size tiny --rounds 3 --warm 2
    .venv/bin/python -m benchmarks.server_start --size large --rounds 2 --warm 2

Each round builds a new model folder (`rlcli model build --seed N --output DIR`, or the larger model of
benchmarks/models.py), then starts a server on it under a new private RLCLI_HOME ("cold"), stops it,
and starts it again --warm times on the same folders ("warm"); --model DIR skips the build and starts every
round on DIR (its files are then in the page cache even for a cold start). Every start is timed twice: until the
API's /healthz answers, and until `rlcli serve start` returns (its readiness check creates and unloads a
LoRA model through the engine). From the server log: when the engine's loop started, and the engine's
own create_model time.

After each start the first SFT step (a new rank-8 LoRA, forward_backward of 8 x 64 tokens + optim_step),
whose compilation a warm start should skip, is timed against --steady further steps.
--processes N starts a multi-process jax server (its start includes the workers joining).
--rlcli-tree runs another checkout's `rlcli serve start` (e.g. the commit before a change); the receipt
records its commit. --compare-tree OTHER alternates warm starts of both checkouts on the same home (A B, B A,
...), so a loaded machine's drift falls on both ("warm" and "warm_compare" in the receipt).

What "cold" means here, honestly: new model files, a new state folder and database, and fresh
processes that import SkyRL and jax and compile everything again. Since rlcli keeps jax's persistent
compilation cache under RLCLI_HOME (cache/jax), a cold start (new RLCLI_HOME) starts with an empty cache
and warm starts (same RLCLI_HOME) load what the earlier starts compiled; a tree without that cache
compiles as much on warm starts as on cold ones. The OS page cache is NOT dropped (that needs root and
slows everyone sharing the machine), so the venv's libraries are in memory after the first start: this is
not a cold boot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import REPO, stop_servers_on_sigterm, summary, versions, write_receipt
from benchmarks.models import (
    RLCLI,
    build_large,
    engine_timings,
    free_port,
    private_env,
    server_versions,
    start_command,
    wait_for_quiet,
)
from benchmarks.request_path import sft_batch, tree_commit
from rlcli.config import server_venv_dir


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def first_steps(url: str, model: Path, steady: int) -> dict:
    """Seconds of the first SFT step on a new LoRA after a start, and of `steady` more."""
    import tinker

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    service = tinker.ServiceClient(base_url=url)
    client = service.create_lora_training_client(base_model=str(model), rank=8, seed=0).result()
    batch, adam = sft_batch(8, 64, vocab), tinker.AdamParams(learning_rate=1e-4)
    times = []
    for _ in range(1 + steady):
        start = time.perf_counter()
        fb = client.forward_backward(batch, "cross_entropy")
        optim = client.optim_step(adam)
        fb.result()
        optim.result()
        times.append(time.perf_counter() - start)
    for holder in (getattr(service, "_session_holder", None), getattr(service, "_rest_holder", None)):
        if holder is not None:  # stop its heartbeat and telemetry: this server stops next
            holder.close()
    return {"first_step_s": times[0], "steady_step_s": times[1:]}


def timed_start(model: Path, home: Path, tree: Path, steady: int = 3, timeout: float = 900, processes: int = 1) -> dict:
    """One `rlcli serve start` of tree: seconds to /healthz and to ready, the first steps, `rlcli serve stop`."""
    env, port = private_env(home), free_port()
    env["PYTHONPATH"] = str(tree)  # and cwd=tree: `python -m` puts its working folder first on sys.path
    cmd = start_command(model, port, processes=processes)
    log = home / "servers" / "default" / "server.log"
    offset = log.stat().st_size if log.exists() else 0
    wall, start = time.time(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree)
    health_s = None
    try:
        while proc.poll() is None and time.perf_counter() - start < timeout:
            if health_s is None and healthy(f"http://127.0.0.1:{port}"):
                health_s = time.perf_counter() - start
            time.sleep(0.1)
        ready_s = time.perf_counter() - start
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise SystemExit(f"`rlcli serve start` failed ({proc.returncode}):\n{err[-2000:]}")
        cpu = server_cpu(home)  # before the steps: what the start itself cost
        steps = first_steps(f"http://127.0.0.1:{port}", model, steady) if steady else {}
    finally:
        subprocess.run([*RLCLI, "serve", "stop"], env=env, capture_output=True, timeout=120, cwd=tree)
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    create = next((s for kind, s in engine_timings(text) if kind == "create_model"), None)
    cache = home / "cache" / "jax"  # where rlcli keeps jax's compiled programs (absent on a tree without it)
    steps["jax_cache_entries_after"] = len(list(cache.iterdir())) if cache.is_dir() else None
    warmed = re.search(r"warmed (\d+) recorded batch shapes and optim_step in ([\d.]+) s", text)
    return {"health_s": health_s, "engine_loop_s": engine_loop_at(text, wall), "ready_s": ready_s,
            "phases_s": phases_at(text, wall), "warmup_s": float(warmed.group(2)) if warmed else None,
            "engine_create_model_s": create, "cpu_at_ready_s": cpu,
            "command": " ".join(cmd).replace(str(model.parent), "MODELS"), **steps}


def server_cpu(home: Path) -> dict[str, float] | None:
    """CPU seconds (user + system) the server's processes had used when it was ready, by launcher role and in all:
    the processes of the process group `serve start` recorded (supervisor, API, engine and its stand-in)."""
    from rlcli.server.process import read_state

    state = read_state(home / "servers" / "default")
    if state is None:
        return None
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if not entry.name.isdigit() or int(fields[2]) != state.pgid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        role = next((a.decode() for a in argv[2:3] if a), "other") if b"launcher.py" in b" ".join(argv) else "other"
        found[role] = found.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return {**{k: round(v, 2) for k, v in sorted(found.items())}, "total": round(sum(found.values()), 2)}


_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})[^\n]{0,80}?"
# Where a start spends its time, by the first log line of each phase (SkyRL's and uvicorn's, which carry a time):
PHASES = {
    "api_imported": "Started server process",  # the API process imported SkyRL's API and the extensions
    "engine_spawned": "Started background engine with PID",  # the API's lifespan started its engine command
    "engine_loading_model": "Using local model",  # the engine has its imports and extensions; weights next
    "engine_model_built": "Initialized base model",  # weights loaded, LoRA tables and optimizer built
    "engine_loop": "Starting background engine",  # warm-up (rlcli_warmup) done; the loop serves from here
}


def phases_at(log_text: str, wall_start: float) -> dict[str, float]:
    """Seconds from the start command to each phase's first log line (local time), for the phases found."""
    found = {}
    for name, words in PHASES.items():
        hit = re.search(_STAMP + re.escape(words), log_text)
        if hit:
            stamp = dt.datetime.strptime(hit.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(hit.group(2)) / 1000
            found[name] = round(stamp - wall_start, 3)
    return found


def engine_loop_at(log_text: str, wall_start: float) -> float | None:
    """Seconds from the start command to the engine's `Starting background engine...` log line (local time)."""
    return phases_at(log_text, wall_start).get("engine_loop")


def build_model(size: str, folder: Path, seed: int) -> tuple[float, str]:
    """A new model folder for this round; (seconds, command) of building it."""
    start = time.perf_counter()
    if size == "tiny":
        cmd = [*RLCLI, "model", "build", "--seed", str(seed), "--output", str(folder)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        return time.perf_counter() - start, " ".join(cmd)
    build_large(folder, seed)
    return time.perf_counter() - start, f"benchmarks.models.build_large({str(folder)!r}, seed={seed})"


def jax_cache_setting() -> str | None:
    python = server_venv_dir() / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import jax; print(jax.config.jax_compilation_cache_dir)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip() or out.stderr.strip()[-200:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "large"))
    parser.add_argument("--rounds", type=int, default=3, help="new model + cold start, each")
    parser.add_argument("--warm", type=int, default=2, help="warm starts after each cold one")
    parser.add_argument("--seed", type=int, default=100, help="first model seed (one per round)")
    parser.add_argument("--steady", type=int, default=3, help="SFT steps timed after the first one (0: none)")
    parser.add_argument("--model", type=Path, default=None,
                        help="start every round on this model folder instead of building a new one (saves the build)")
    parser.add_argument("--rlcli-tree", type=Path, default=REPO, help="the rlcli checkout whose server starts")
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="A/B: after each cold start, alternate --warm pairs of warm starts of --rlcli-tree and "
                             "of this checkout (e.g. the commit before a change) on the same home and cache")
    parser.add_argument("--processes", type=int, default=1,
                        help="jax processes of the server (`serve start --processes N`, all on this machine)")
    parser.add_argument("--label", default="", help="added to the receipt's name (e.g. before, after)")
    parser.add_argument("--max-load", type=float, default=2.5, help="wait for this 1-minute load average first")
    parser.add_argument("--max-wait", type=float, default=600, help="seconds to wait for it at most")
    args = parser.parse_args()
    stop_servers_on_sigterm()
    from rlcli.config import ensure_api_key

    ensure_api_key()  # the first-step timing talks to the server through the tinker client
    quiet = wait_for_quiet(args.max_load, args.max_wait)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rlcli-bench-start-"))  # mode 0700
    rounds = []
    try:
        for r in range(args.rounds):
            model, home = work / f"model-{r}", work / f"home-{r}"
            if args.model:
                model, build_s, build_cmd = args.model.resolve(), 0.0, f"(given) {args.model.resolve()}"
            else:
                build_s, build_cmd = build_model(args.size, model, args.seed + r)
            tree = args.rlcli_tree.resolve()
            cold = timed_start(model, home, tree, args.steady, processes=args.processes)
            other = args.compare_tree.resolve() if args.compare_tree else None
            warm, warm_compare = [], []
            for w in range(args.warm):
                pair = ((tree, warm), (other, warm_compare)) if w % 2 == 0 else ((other, warm_compare), (tree, warm))
                for which, into in pair:
                    if which is not None:
                        into.append(timed_start(model, home, which, args.steady, processes=args.processes))
            rounds.append({"model_build_s": build_s, "model_build_command": build_cmd, "cold": cold, "warm": warm,
                           **({"warm_compare": warm_compare} if other else {})})
            warm_text = ", ".join(f"{w['ready_s']:.1f}s" for w in warm)
            if other:
                warm_text += " (compare tree: " + ", ".join(f"{w['ready_s']:.1f}s" for w in warm_compare) + ")"
            print(f"round {r + 1}: build {build_s:.1f}s, cold ready {cold['ready_s']:.1f}s, warm ready {warm_text}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {}
    for kind in ("cold", "warm", *(("warm_compare",) if args.compare_tree else ())):
        starts = [x for r in rounds for x in ([r[kind]] if kind == "cold" else r[kind])]
        for s in starts:
            if s.get("steady_step_s"):
                s["first_over_steady"] = s["first_step_s"] / statistics.median(s["steady_step_s"])
                # A warm-up at start moves time from the first step into the start: this sum shows both.
                s["ready_plus_first_step_s"] = s["ready_s"] + s["first_step_s"]
        keys = ("health_s", "engine_loop_s", "ready_s", "warmup_s", "engine_create_model_s", "first_step_s",
                "first_over_steady", "ready_plus_first_step_s")
        results[kind] = {key: summary([s[key] for s in starts if s.get(key) is not None])
                         for key in keys if any(s.get(key) is not None for s in starts)}
        results[kind]["phases_s"] = {name: summary([s["phases_s"][name] for s in starts if name in s["phases_s"]])
                                     for name in PHASES if any(name in s["phases_s"] for s in starts)}
        roles = sorted({role for s in starts for role in (s.get("cpu_at_ready_s") or {})})
        results[kind]["cpu_at_ready_s"] = {
            role: summary([s["cpu_at_ready_s"][role] for s in starts if role in (s.get("cpu_at_ready_s") or {})])
            for role in roles}
    body = {"label": args.label, "rlcli_tree_commit": tree_commit(args.rlcli_tree),
            "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                       if k not in ("rlcli_tree", "compare_tree")},
            **({"compare_tree_commit": tree_commit(args.compare_tree)} if args.compare_tree else {}),
            "jax_compilation_cache_dir_without_rlcli": jax_cache_setting(),
            "meaning_of_cold": __doc__.split("What \"cold\" means here, honestly: ")[1].strip(),
            "rounds": rounds, "results": results,
            "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()}, "load_wait": quiet}
    def medians(part: dict) -> dict:
        return {m: round(v["median"], 2) if "median" in v else medians(v) for m, v in part.items()}

    print(json.dumps(medians(results)))
    other = {str(args.compare_tree.resolve()): "COMPARE_TREE", str(args.compare_tree): "COMPARE_TREE"} \
        if args.compare_tree else {}
    other[str(work)] = "MODELS"  # the rounds' model folders (built in this run's scratch folder)
    print(f"receipt: {write_receipt('server-start', body, names=other)}")


if __name__ == "__main__":
    main()
