"""A soak: a realistic mix against one server for many minutes, its resources read every few seconds, each judged flat
or not after warm-up.

    .venv/bin/python -m benchmarks.soak --minutes 30 [--warmup-minutes 15] [--interval 10] [--rate 2]
                                        [--loop-every 300] [--out DIR] [--label NAME]
    .venv/bin/python -m benchmarks.soak --loop-every 0 ...   # the steady mix: trainers and endpoint, no loop
    make soak                                        # the same, 30 minutes, under nice -n 10

One `rlcli serve start` on the embedded model (a private RLCLI_HOME, the shared server venv), and against it:
- two SFT trainers, each `rlcli train sl` on a small chat set again and again (a new run folder each time, a
  checkpoint every 2 steps, the newest intermediate one kept with the final: `--keep-checkpoints 1`);
- an RL run sampling: `rlcli train rl` on one-digit sums again and again (per-step sampler snapshots);
- `rlcli endpoint start --loops DIR` under a steady rate of chat requests (model `champion`) from the `openai`
  package, open-loop: each request leaves on its schedule whatever the ones before did, its latency counted from
  then, no retries (a failed request is counted, never hidden);
- the loop: at once and then every --loop-every seconds either a new trace batch, `rlcli loop run --once` (manual
  gate) and `rlcli loop promote`, or `rlcli loop rollback DIR 0`, in turn.
- `rlcli train prune RUNS --keep-runs 6 --loops DIR` every minute: the finished runs' retention a user opts into.
The server runs with 6 LoRA slots (the mix holds up to 5 models at once) and short retentions (below).
Every --interval seconds: RSS (and its anonymous part) and open file descriptors (and their kinds) of the server's
and the endpoint's processes (per role), the jax programs the server compiled and the arrays its engine holds (its
once-a-minute memory line), SkyRL's futures rows (and any kept past their retention), disk under the server's home
(benchmarks/soak_probe.py), the window's requests, failures and latency p50/p99. The first --warmup-minutes (15) are
recorded, not judged: every workload of the mix, a loop iteration and a rollback included, runs in them. The receipt
keeps the raw series, every job run and every failed request, and per resource its verdict by what it is expected
to do (EXPECTED): flat by soak_probe's trend rule, bounded by its peak rule; a PNG beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import fire

from benchmarks import soak_probe as probe
from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
from benchmarks.models import server_versions
from rlcli.loop import batches, settings
from rlcli.model import ensure_embedded_model
from rlcli.server.commands import MAX_LOG_BYTES
from rlcli.server.private import PACKAGE_PARENT, RLCLI, PrivateServer, free_port, private_server
from rlcli.train import retention

MAX_TOKENS = 16
SL_DATA = PACKAGE_PARENT / "tests" / "fixtures" / "sl_small.jsonl"
SL_ARGS = ("--batch-size", "4", "--epochs", "1", "--save-every", "2", "--keep-checkpoints", "1", "--eval-every", "0",
           "--lr", "5e-3")
RL_ARGS = ("--loss", "gspo", "--dataset", "arithmetic", "--max-operand", "9", "--batch-size", "4", "--group-size", "4",
           "--max-tokens", "8", "--eval-size", "8", "--eval-every", "0", "--save-every", "0", "--lr", "1e-3",
           "--max-steps", "20")
LOOP = dict(gate="manual", steps=4, lr=1e-2, save_every=2, max_tokens=8, eval_limit=8, match="number")
WARMUP_MINUTES = 15  # the mix's every workload (a loop iteration, a rollback) runs in it; not judged
SNAPSHOTS_KEPT = 4  # `serve start --sampler-snapshots`'s default, which this server runs with
# The retentions the soak runs with, short enough to reach within its minutes (the defaults: 60 minutes, 2, none).
FUTURES_MINUTES = 5  # serve start --futures-retention
KEEP_CHECKPOINTS = 1  # train sl --keep-checkpoints (SL_ARGS): a run's newest intermediate checkpoint and its final
CAPTURE_MAX_HOURS = 0.1  # endpoint start --capture-max-hours: no loop drains this store (the loop reads an inbox)
# The mix holds up to 5 models at once (two SFT runs, the RL run, the loop's stage, its candidate's reload): a trainer
# refuses at its start when no slot is free (by design, one line), which on the default 4 failed 7 runs in 30 minutes.
SLOTS = 6
PROGRAM_MB = 512  # serve start --program-memory (default 2048): the mix's compiled programs pass it within minutes
KEEP_RUNS = 6  # train prune --keep-runs, every PRUNE_EVERY_S: the finished runs' retention (opt-in, off by default)
PRUNE_EVERY_S = 60
# What each series is judged against: "flat" (a leak if its line rises: soak_probe's trend rule), "bounded" (a
# sawtooth a retention bounds: soak_probe's peak rule), or "grows by design" (reported, not judged).
EXPECTED = {
    "server_rss_mb": f"flat: the engine drops its compiled programs past --program-memory {PROGRAM_MB} (at most "
                     "every ten minutes) and loads those in use again",
    "server_fds": "flat", "endpoint_rss_mb": "flat", "endpoint_fds": "flat",
    "engine_arrays_mb": "flat: the jax arrays the engine holds (weights, LoRA slots, optimizer states, snapshots)",
    "compiled_programs": "bounded: one per new batch shape or sequence length the mix brings (a fixed set, met "
                         "in the warm-up)",
    "disk_mb_sampler_snapshots": "bounded: --sampler-snapshots (4) per loaded model, a model's all deleted when "
                                 "unloaded",
    "futures_rows": f"bounded: --futures-retention {FUTURES_MINUTES}: no finished row older than it (and the "
                    f"pruner's {probe.PRUNE_SLACK_MINUTES:.0f} minutes) at any reading, whatever the request rate",
    "disk_mb_database": "bounded: its file keeps the high-water mark of the futures rows within their retention "
                        "(SQLite reuses freed pages, never shrinks), judged as those rows: none past the retention",
    "disk_mb_checkpoints_intermediate": f"bounded: the runs in flight's, --keep-checkpoints {KEEP_CHECKPOINTS} each "
                                        "(and the one just saved); a run's all deleted when it ends with its final",
    "disk_mb_checkpoints_final": f"bounded: `train prune --keep-runs {KEEP_RUNS}` every {PRUNE_EVERY_S} s keeps the "
                                 "newest finished runs' finals (opt-in: finals are user data, kept by default): at "
                                 f"no reading more finals than {KEEP_RUNS} and the runs ended since the last prune "
                                 "began",
    "disk_mb_checkpoints_loop": "grows by design: the loop's stage runs and champions its ledger names (its history, "
                                "what a rollback needs), one iteration per two loop cycles",
    "disk_mb_checkpoints_training": "grows by design: by kind, the states of the three rows above (the loop's grow)",
    "disk_mb_sampler_named": "grows by design: by kind, the named sampler weights of the three rows above",
    "disk_mb_capture": f"bounded: --capture-max-hours {CAPTURE_MAX_HOURS} (no loop drains this store)",
    "disk_mb_server_log": f"bounded: rotated at {MAX_LOG_BYTES // 2**20} MB, two parts: at most "
                          f"{2 * MAX_LOG_BYTES // 2**20} MB at any reading",
    "latency_p50_ms": "flat", "latency_p99_ms": "flat",
}


def start_job(args: list[str], env: dict[str, str], log: IO[str]) -> subprocess.Popen:
    """`rlcli ARGS` as a fresh process, both its outputs into `log` (tests/integration/test_soak_smoke.py forks them
    from the suite's zygote instead)."""
    return subprocess.Popen([*RLCLI, *args], env=env, cwd=PACKAGE_PARENT, stdout=log, stderr=subprocess.STDOUT)


class Jobs:
    """Commands run to their end (or stopped), each run recorded: job, start, seconds, exit code, output's tail."""

    def __init__(self, env: dict[str, str], root: Path, origin: float, stop: threading.Event):
        self.env, self.root, self.origin, self.stop = env, root, origin, stop
        self.runs: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def run(self, job: str, k: int, *args: str) -> int | None:
        """One `rlcli ARGS`; its exit code, None when the soak's end stopped it."""
        start = time.monotonic()
        log = self.root / "logs" / f"{job}-{k:04d}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("w") as out:
            proc = start_job(list(args), self.env, out)
            while proc.poll() is None and not self.stop.wait(0.5):
                pass
            stopped = proc.poll() is None
            if stopped:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        rc = None if stopped else proc.returncode
        row = {"job": job, "run": k, "start_s": round(start - self.origin, 1),
               "seconds": round(time.monotonic() - start, 1), "rc": rc}
        if rc:
            row["tail"] = log.read_text(errors="replace")[-1500:]
        with self.lock:
            self.runs.append(row)
        return rc

    def repeat(self, job: str, args_of: Callable[[int], list[str]]) -> threading.Thread:
        """A thread running `rlcli ARGS(k)` for k = 1, 2, ... until the stop (a pause after a failed run)."""
        def body() -> None:
            k = 0
            while not self.stop.is_set():
                k += 1
                if self.run(job, k, *args_of(k)) not in (0, None):
                    self.stop.wait(5)
        thread = threading.Thread(target=body, name=job, daemon=True)
        thread.start()
        return thread


class Load:
    """Open-loop chat requests at `rate` per second through the `openai` package: latency from each one's schedule."""

    def __init__(self, endpoint: str, rate: float, origin: float, stop: threading.Event):
        import openai

        self.client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="soak", max_retries=0, timeout=120)
        self.rate, self.origin, self.stop = rate, origin, stop
        self.rows: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="load")

    def run(self) -> None:
        due, i = time.monotonic(), 0
        while not self.stop.is_set():
            self.pool.submit(self.one, i, due)
            i += 1
            due += 1 / self.rate
            self.stop.wait(max(0.0, due - time.monotonic()))
        self.pool.shutdown(wait=True)  # requests under way are answered and counted

    def one(self, i: int, due: float) -> None:
        row: dict[str, Any] = {"i": i, "sent_s": round(due - self.origin, 3)}
        try:
            answer = self.client.chat.completions.create(
                model="champion", max_tokens=MAX_TOKENS, temperature=0.7,
                messages=[{"role": "user", "content": f"What is {i % 10} + {i % 7}?"}])
            row["ok"] = bool(answer.choices)
        except Exception as e:  # noqa: BLE001 - a failed request is what is counted
            row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"[:300]
        row["done_s"] = round(time.monotonic() - self.origin, 3)
        row["ms"] = round((time.monotonic() - due) * 1000, 1)
        with self.lock:
            self.rows.append(row)

    def window(self, since_s: float, until_s: float) -> dict[str, Any]:
        with self.lock:
            rows = [r for r in self.rows if since_s < r["done_s"] <= until_s]
        ms = [r["ms"] for r in rows if r["ok"]]
        return {"requests": len(rows), "failed": sum(not r["ok"] for r in rows),
                "latency_p50_ms": probe.pct(ms, 0.5), "latency_p99_ms": probe.pct(ms, 0.99)}


def loop_cycles(jobs: Jobs, folder: Path, inbox: Path, every: float) -> threading.Thread:
    """At once and then every `every` seconds, in turn: new traces, `loop run --once`, `loop promote N`; then `loop
    rollback DIR 0`."""
    def body() -> None:
        k, iteration = 0, 0
        while not jobs.stop.wait(every if k else 0):  # the first cycle at once: the warm-up meets a loop iteration
            k += 1
            if k % 2:
                batches.write_batch(inbox / f"soak-{k:03d}.openai.jsonl", batch=1, n=24, seed=k)
                if jobs.run("loop-run", k, "loop", "run", str(folder), "--once") != 0:
                    continue
                iteration += 1
                jobs.run("loop-promote", k, "loop", "promote", str(folder), str(iteration))
            else:
                jobs.run("loop-rollback", k, "loop", "rollback", str(folder), "0")
    thread = threading.Thread(target=body, name="loop", daemon=True)
    thread.start()
    return thread


def pruning(jobs: Jobs, runs: Path, loop: Path, url: str) -> threading.Thread:
    """Every PRUNE_EVERY_S: `rlcli train prune RUNS --keep-runs KEEP_RUNS --loops LOOP`, the finished runs' retention
    a user opts into (rlcli/train/prune.py)."""
    def body() -> None:
        k = 0
        while not jobs.stop.wait(PRUNE_EVERY_S):
            k += 1
            if runs.is_dir():
                jobs.run("prune", k, "train", "prune", str(runs), "--keep-runs", str(KEEP_RUNS), "--loops", str(loop),
                         "--base-url", url)
    thread = threading.Thread(target=body, name="prune", daemon=True)
    thread.start()
    return thread


def pgid_of(state: Path) -> int | None:
    try:
        record = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    return record.get("pgid", record.get("pid"))


def sample(server: PrivateServer, capture: Path, ledger: Path, load: Load, last_s: float,
           now_s: float) -> dict[str, Any]:
    """One reading; the window's requests are those answered after last_s, up to now_s (seconds into the soak)."""
    server_dir = server.home / "servers" / "default"
    row: dict[str, Any] = {"t_s": round(now_s, 3), "load_1min": os.getloadavg()[0]}
    row |= probe.process_readings("server", pgid_of(server_dir / "state.json"))
    row |= probe.process_readings("endpoint", pgid_of(server.home / "endpoints" / "default.json"))
    row |= probe.futures_rows(server_dir / "tinker.db", FUTURES_MINUTES)
    row |= probe.engine_memory(server.log)
    row |= probe.compiled_programs(Path(server.env.get("JAX_COMPILATION_CACHE_DIR") or server.home / "cache" / "jax"))
    row |= probe.disk_readings(server_dir, capture, server_dir / "checkpoints", ledger)
    return row | load.window(last_s, now_s)


def soak(server: PrivateServer, root: Path, minutes: float, interval: float, rate: float,
         loop_every: float) -> dict[str, Any]:
    """The mix against `server` for `minutes`; the series, the job runs, the requests."""
    env = dict(server.env, TINKER_API_KEY="tml-soak")
    folder, inbox, capture = root / "loop", root / "inbox", server.home / "capture" / "default"
    inbox.mkdir()
    regression = batches.write_regression(root / "regression.jsonl")
    origin, stop = time.monotonic(), threading.Event()
    jobs = Jobs(env, root, origin, stop)
    if jobs.run("loop-init", 0, "loop", "init", str(folder), "--traces", str(inbox / "*.jsonl"), "-f", "openai",
                "--regression", str(regression), "--base-url", server.url) != 0:
        raise RuntimeError(f"loop init failed: {jobs.runs[-1].get('tail')}")
    settings.write(folder, replace(settings.read(folder), **LOOP))
    started = subprocess.run([*RLCLI, "endpoint", "start", "--port", str(free_port()), "--loops", str(folder),
                              "--capture-max-hours", str(CAPTURE_MAX_HOURS)],
                             env=env, cwd=PACKAGE_PARENT, capture_output=True, text=True, timeout=300)
    if started.returncode != 0:
        raise RuntimeError(f"endpoint start failed: {started.stderr.strip()}")
    endpoint = started.stdout.strip()  # it prints its URL
    load = Load(endpoint, rate, origin, stop)
    threads = [threading.Thread(target=load.run, name="load", daemon=True)]
    threads[0].start()
    for name in ("sl-a", "sl-b"):
        threads.append(jobs.repeat(name, lambda k, name=name: [
            "train", "sl", "--dataset", str(SL_DATA), *SL_ARGS, "--base-url", server.url,
            "--log-path", str(root / "runs" / f"{name}-{k:04d}")]))
    threads.append(jobs.repeat("rl", lambda k: [
        "train", "rl", *RL_ARGS, "--seed", str(k), "--base-url", server.url,
        "--log-path", str(root / "runs" / f"rl-{k:04d}")]))
    if loop_every > 0:  # 0: a steady mix, no new trace batches (no new shapes after warm-up), no promotions
        threads.append(loop_cycles(jobs, folder, inbox, loop_every))
    threads.append(pruning(jobs, root / "runs", folder, server.url))
    series, last_s, end = [], 0.0, origin + minutes * 60
    try:
        while time.monotonic() < end:
            time.sleep(max(0.0, min(interval, end - time.monotonic())))
            now_s = time.monotonic() - origin
            series.append(sample(server, capture, folder / retention.LEDGER, load, last_s, now_s))
            last_s = now_s
            s = series[-1]
            print(f"{s['t_s']:7.0f}s server {s['server_rss_mb']:.0f} MB/{s['server_fds']:.0f} fds "
                  f"({s['server_fds_socket']} sockets), {s['compiled_programs']} programs, endpoint "
                  f"{s['endpoint_rss_mb']:.0f} MB, futures {s.get('futures_rows')}, snapshots "
                  f"{s['disk_mb_sampler_snapshots']:.1f} MB, requests {s['requests']} ({s['failed']} failed), p50 "
                  f"{s['latency_p50_ms']} ms, load {s['load_1min']:.1f}", flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        jobs.run("endpoint-stop", 0, "endpoint", "stop")
        for log in server.log.parent.glob("server.log*"):  # the home goes with the server: its log stays with ours
            shutil.copy2(log, root / "logs" / log.name)
    return {"series": series, "jobs": jobs.runs, "requests": load.rows}


TRAINERS = ("sl-a", "sl-b", "rl")  # the jobs whose runs end with a final checkpoint `train prune` may delete
# A run's final is on disk a moment before its process has left and its job's end is recorded (its client closes,
# the command exits), and a reading takes a moment: the 60-minute soak of 14:22Z counted one final more than this
# rule allowed at 80 of 323 readings with no slack, each a run ending within 2 s after the reading, and none with it.
FINAL_SLACK_S = 2.0


def finals_allowed(t_s: float, jobs: list[dict[str, Any]]) -> int:
    """The finals `train prune --keep-runs` leaves at time t_s: KEEP_RUNS, and every run that ended after the start of
    the newest prune finished by then (that prune listed the runs before they ended), up to FINAL_SLACK_S after."""
    def end(j):
        return j["start_s"] + (j["seconds"] or 0.0)

    pruned = [j["start_s"] for j in jobs if j["job"] == "prune" and j["rc"] == 0 and end(j) <= t_s]
    since = max(pruned, default=-1.0)
    return KEEP_RUNS + sum(1 for j in jobs if j["job"] in TRAINERS and since < end(j) <= t_s + FINAL_SLACK_S)


def finals_past_retention(series: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> int | None:
    """The most finals any reading held beyond finals_allowed; None when the series has no count of finals."""
    past = [r["final_checkpoints"] - finals_allowed(r["t_s"], jobs) for r in series if "final_checkpoints" in r]
    return max(0, *past) if past else None


def verdict_of(key: str, series: list[dict[str, Any]], warmup_share: float,
               jobs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """A series' verdict by what it is expected to do (EXPECTED): flat by the trend rule (descriptors by their
    floor), bounded by the peak rule (futures rows by none kept past their retention, finals by none past
    `train prune`'s), else its trend, reported."""
    times, values = [r["t_s"] / 60 for r in series], [r.get(key) for r in series]
    slope = probe.trend(times, values, warmup_share, probe.FLOOR_MINUTES if key.endswith("_fds") else None)
    if not EXPECTED[key].startswith("bounded"):
        return slope
    if key in ("futures_rows", "disk_mb_database"):  # the retention's own test, whatever the request rate did
        past = max((r.get("futures_past_retention", 0) for r in series), default=0)
        return {**slope, "most_past_retention": past, "verdict": "bounded" if past == 0 else "growing"}
    if key == "disk_mb_checkpoints_final" and (past := finals_past_retention(series, list(jobs))) is not None:
        return {**slope, "most_finals": max(r.get("final_checkpoints", 0) for r in series),
                "most_past_retention": past, "verdict": "bounded" if past == 0 else "growing"}
    if key == "disk_mb_server_log":  # a cap, not a retention: every reading within it
        most = max((v for v in values if v is not None), default=0.0)
        cap = 2 * MAX_LOG_BYTES / 2**20
        return {**slope, "most": most, "cap": cap, "verdict": "bounded" if most <= cap else "growing"}
    return {**probe.peaks(times, values, warmup_share), "trend_per_hour": slope.get("per_hour")}


def judge(series: list[dict[str, Any]], requests: list[dict[str, Any]], jobs: list[dict[str, Any]],
          warmup_share: float = 1 / 3) -> dict:
    """Per resource its trend and expectation; the targets: leaks none, failed requests none, snapshots bounded."""
    trends = {key: {**verdict_of(key, series, warmup_share, jobs), "expected": expected}
              for key, expected in EXPECTED.items()}
    leaks = [k for k, t in trends.items() if not t["expected"].startswith("grows by design")
             and t["verdict"] == "growing"]
    failed = [r for r in requests if not r["ok"]]
    most_states = max((r.get("intermediate_states_most_per_model", 0) for r in series), default=0)
    failed_jobs = [j for j in jobs if j["rc"] not in (0, None)]
    counts: dict[str, int] = {}
    for j in jobs:
        if j["rc"] == 0:
            counts[j["job"]] = counts.get(j["job"], 0) + 1
    return {"trends": trends, "growing_where_flat_expected": leaks,
            "unbounded_by_design": [k for k, t in trends.items() if t["expected"].startswith("grows by design")
                                    and t["verdict"] == "growing"],
            "requests": len(requests), "failed_requests": len(failed), "first_failures": failed[:10],
            "failed_job_runs": len(failed_jobs), "completed_job_runs": counts,
            "most_snapshots_of_one_model": max((r["sampler_snapshots_most_per_model"] for r in series), default=0),
            "most_intermediate_states_of_one_model": most_states,
            "intermediate_states_bound": KEEP_CHECKPOINTS + 1,  # while a run trains: the one just saved on top
            "snapshots_kept_per_model": SNAPSHOTS_KEPT,
            "targets": {"flat_after_warmup": not leaks, "no_failed_request": not failed and bool(requests),
                        "no_failed_job": not failed_jobs,
                        "snapshots_within_retention": max((r["sampler_snapshots_most_per_model"] for r in series),
                                                          default=0) <= SNAPSHOTS_KEPT,
                        "intermediate_states_within_retention": most_states <= KEEP_CHECKPOINTS + 1}}


def main(minutes: float = 30, interval: float = 10, rate: float = 2.0, loop_every: float = 300, label: str = "",
         out: str | None = None, plot: bool = True, workdir: str | None = None,
         warmup_minutes: float = WARMUP_MINUTES, rejudge: str | None = None) -> None:
    """minutes: the whole run, warm-up included (its first warmup_minutes are recorded, not judged; a third of a
    run too short for them). workdir: keep the jobs' logs, run folders and loop folder there (a new folder;
    default: a temporary one). rejudge: a receipt's raw series judged again by today's rules (the receipt
    rewritten with the new verdict and the date of the rejudging, its plot redrawn); nothing is run."""
    if rejudge:
        return rejudge_receipt(Path(rejudge), plot)
    stop_servers_on_sigterm()
    model = str(ensure_embedded_model())
    with (private_server(model, "--futures-retention", str(FUTURES_MINUTES), "--slots", str(SLOTS),
                        "--program-memory", str(PROGRAM_MB)) as server,
          tempfile.TemporaryDirectory(prefix="rlcli-soak-") as tmp):
        root = Path(workdir) if workdir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        run = soak(server, root, minutes, interval, rate, loop_every)
        names = {str(root): "<soak-root>", str(server.home): "<server-home>"}
    warmup_share = warmup_minutes / minutes if warmup_minutes < minutes / 2 else 1 / 3
    verdict = judge(run["series"], run["requests"], run["jobs"], warmup_share)
    body = {"label": label,
            "versions": {**versions("tinker", "tinker-cookbook", "openai"), "server": server_versions()},
            "config": {"minutes": minutes, "size": "full" if loop_every > 0 else "steady", "interval_s": interval,
                       "rate_per_s": rate, "loop_every_s": loop_every,
                       "warmup_share": warmup_share,
                       **rules(),
                       "model": "rlcli-tiny-qwen3-v1",
                       "server": f"`rlcli serve start --futures-retention {FUTURES_MINUTES} --slots {SLOTS} "
                                 f"--program-memory {PROGRAM_MB}`, else its defaults",
                       "retention": {"futures_minutes": FUTURES_MINUTES, "keep_checkpoints": KEEP_CHECKPOINTS,
                                     "capture_max_hours": CAPTURE_MAX_HOURS, "keep_runs": KEEP_RUNS,
                                     "prune_every_s": PRUNE_EVERY_S, "program_memory_mb": PROGRAM_MB},
                       "sl": " ".join(SL_ARGS) + " on tests/fixtures/sl_small.jsonl, twice at once, repeated",
                       "rl": " ".join(RL_ARGS) + ", repeated", "loop": LOOP, "endpoint_max_tokens": MAX_TOKENS,
                       "nice": os.nice(0), "machine": "shared 2-core machine (other engineers' tests and benchmarks "
                       "ran beside it): latency is noisy; resources are what this judges"},
            "verdict": verdict, "series": run["series"], "jobs": run["jobs"], "requests": run["requests"]}
    receipt = write_receipt("soak", body, Path(out) if out else None, names=names)
    if plot:
        from benchmarks.soak_plot import plot as draw

        draw(receipt, receipt.with_suffix(".png"))
    print(f"soak {minutes} min: {verdict['requests']} requests, {verdict['failed_requests']} failed; growing where "
          f"flat is expected: {verdict['growing_where_flat_expected'] or 'none'}; growing without retention: "
          f"{verdict['unbounded_by_design']}; receipt {receipt}")


def rules() -> dict[str, str]:
    """The two rules a receipt is judged by, in soak_probe's own words."""
    return {"flat_rule": probe.__doc__.split("Trend: ")[1].split("Peaks: ")[0].strip(),
            "peak_rule": probe.__doc__.split("Peaks: ")[1].strip()}


def rejudge_receipt(path: Path, plot: bool) -> None:
    data = json.loads(path.read_text())
    data["verdict"] = judge(data["series"], data["requests"], data["jobs"], data["config"]["warmup_share"])
    data["config"] |= rules()
    data["rejudged_utc"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path.write_text(json.dumps(data, indent=2) + "\n")
    if plot:
        from benchmarks.soak_plot import plot as draw

        draw(path, path.with_suffix(".png"))
    print(f"{path.name}: growing where flat or bounded is expected: "
          f"{data['verdict']['growing_where_flat_expected'] or 'none'}")


if __name__ == "__main__":
    fire.Fire(main)
