"""Throughput and memory of `rlcli import` against a plain json-module loop.

    .venv/bin/python -m benchmarks.import_bench                 # 100 MB dump, 3 runs each
    .venv/bin/python -m benchmarks.import_bench --size_mb=10 --runs=5
    .venv/bin/python -m benchmarks.import_bench --format=otel    # also responses, gemini (import_dumps.py)

Generates a dump of realistic OpenAI request+response records (system prompts, multi-turn
chats, tool calls, image parts, n>1 choices now and then) in a private temporary folder
(0700), then times, in alternating rounds:
- json_baseline: the naive importer, `json.loads` each line and write its messages;
- import_inprocess: rlcli.data.import_cmd.import_cmd(ImportOptions(input=dump, output=...));
- import_subprocess / json_baseline_subprocess: the same as child processes
  (`rlcli import DUMP -o OUT`), whose peak RSS comes from os.wait4.
--format picks the dump: openai (above), or the same calls logged as OpenAI Responses, Gemini or
OpenTelemetry records (benchmarks/import_dumps.py, with a naive json loop for each).
For those, json_passthrough also times (in-process) a loop that only copies each record's own message
lists (no reshaping): the floor a first try sets. Writes benchmarks/receipts/import-<time>.json
(import-<format>-<time>.json for the others): hardware, versions, config, every raw timing (wall, and
CPU seconds, which a loaded machine disturbs less), medians, spread and the ratios. The dump is deleted at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fire

from benchmarks.common import hardware
from benchmarks.import_dumps import BASELINES, GENERATORS, PASSTHROUGH
from rlcli.config import portable

ROOT = Path(__file__).resolve().parent.parent
# The naive importer: what a person writes first. Run in-process and as a child, same code.
BASELINE = """
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        rec = json.loads(line)
        messages = rec["request"]["messages"] + [rec["response"]["choices"][0]["message"]]
        out.write(json.dumps({"messages": messages}) + "\\n")
"""
WORDS = (
    "the a to of and in is for on with that this it as be are from by at or an your can will not model "
    "data user request order account error please thanks help update file server config deploy token "
    "query result value table python function return list import install version support issue fixed "
    "billing invoice refund shipping address customer agent tool call step first then next check"
).split()
# Real logs are mostly ASCII, but model replies often hold an em dash or curly quote, and some users
# write in other scripts. Share of messages, by role, that hold non-ASCII text:
NON_ASCII = {"system": 0.05, "user": 0.15, "assistant": 0.35}
NON_ASCII_WORDS = ("café", "naïve", "—", "it’s", "résumé", "数据", "模型", "✓", "→", "…", "😊")


def _text(rng: random.Random, lo: int, hi: int, role: str = "user") -> str:
    words = rng.choices(WORDS, k=rng.randint(lo, hi) // 6)
    if rng.random() < NON_ASCII[role]:
        words[rng.randrange(len(words))] = rng.choice(NON_ASCII_WORDS)
    return " ".join(words).capitalize() + "."


def _tool_turns(rng: random.Random, i: int) -> list[dict]:
    call_id = f"call_{i:08x}"
    args = json.dumps({"order_id": f"ORD-{rng.randint(10**5, 10**6)}", "fields": ["status", "eta"]})
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "lookup_order", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"status": "shipped", "eta": "2d"})},
    ]


def record(rng: random.Random, i: int) -> dict:
    """One logged Chat Completions call: the request and the response side by side."""
    messages: list[dict] = [{"role": "system", "content": _text(rng, 400, 3000, "system")}]
    for _ in range(rng.randint(0, 3)):
        messages += [
            {"role": "user", "content": _text(rng, 40, 600)},
            {"role": "assistant", "content": _text(rng, 80, 1200, "assistant")},
        ]
    if rng.random() < 0.1:
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _text(rng, 40, 300)},
                    {"type": "image_url", "image_url": {"url": f"https://img.example.com/{i}.png"}},
                ],
            }
        )
    else:
        messages.append({"role": "user", "content": _text(rng, 40, 600)})
    if rng.random() < 0.2:
        messages += _tool_turns(rng, i)
    n_choices = 2 if rng.random() < 0.05 else 1
    choices = [
        {
            "index": k,
            "finish_reason": "stop",
            "logprobs": None,
            "message": {"role": "assistant", "content": _text(rng, 80, 1500, "assistant"), "refusal": None},
        }
        for k in range(n_choices)
    ]
    request = {"model": "gpt-4o-2024-08-06", "messages": messages, "temperature": 0.7}
    if rng.random() < 0.3:
        request["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": "lookup_order",
                    "description": "Find an order",
                    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
                },
            }
        ]
    response = {
        "id": f"chatcmpl-{i:012d}",
        "object": "chat.completion",
        "created": 1730000000 + i,
        "model": "gpt-4o-2024-08-06",
        "choices": choices,
        "usage": {"prompt_tokens": 900, "completion_tokens": 200, "total_tokens": 1100},
    }
    return {"request": request, "response": response}


def make_dump(path: Path, size_mb: float, seed: int = 0, format: str = "openai") -> int:
    rng, n, target, state = random.Random(seed), 0, int(size_mb * 1e6), {}
    shape = GENERATORS.get(format)
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < target:
            rec = record(rng, n)
            if shape is not None:
                rec = shape(rec, n, rng, state)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def _vmhwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def _child(cmd: list[str]) -> tuple[float, float, float, float]:
    """(seconds, peak RSS MB, ru_maxrss MB, CPU seconds) of one child process.

    Peak RSS is the kernel's high-water mark of the child's own memory (VmHWM), read every
    5 ms until it exits; the import's memory is flat, so the last reading is its peak.
    ru_maxrss from wait4 is an upper bound only: Linux folds the forking parent's peak
    into it at exec, so it can never read below this benchmark's own size.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_kb = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak_kb = max(peak_kb, _vmhwm_kb(proc.pid))
        time.sleep(0.005)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.read().decode()[-500:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, peak_kb / 1024, usage.ru_maxrss / 1024, cpu  # Linux reports kilobytes


class _Clock:
    """Wall and CPU seconds of each timed call, kept under the variant's name.

    CPU time is what the work itself cost: on a machine that other jobs load, wall time also holds
    the time spent waiting for a core, which swings far more between rounds.
    """

    def __init__(self, times: dict, cpu: dict) -> None:
        self.times, self.cpu = times, cpu

    def run(self, name: str, fn, *args) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        fn(*args)
        self.times[name].append(time.perf_counter() - start)
        self.cpu[name].append(time.process_time() - cpu_start)


def _versions() -> dict:
    from importlib import metadata

    import rlcli

    try:
        orjson_version = metadata.version("orjson")
    except metadata.PackageNotFoundError:
        orjson_version = None
    return {
        "python": platform.python_version(),
        "rlcli": rlcli.__version__,
        "orjson": orjson_version,
        "platform": platform.platform(),
    }


def _round(work: Path, dump: Path, clock: _Clock, rss: dict, format: str) -> None:
    from rlcli.data.import_cmd import ImportOptions, import_cmd

    rlcli_bin = str(Path(sys.executable).with_name("rlcli"))
    code = BASELINES.get(format, BASELINE)
    baseline = compile(code, "baseline", "exec")
    fmt = "openai" if format == "responses" else format  # -f openai reads Responses records

    def run_baseline() -> None:
        saved, sys.argv = sys.argv, ["baseline", str(dump), str(work / "base.jsonl")]
        try:
            exec(baseline, {"__name__": "baseline"})
        finally:
            sys.argv = saved

    clock.run("json_baseline", run_baseline)
    if format in PASSTHROUGH:
        passthrough = compile(PASSTHROUGH[format], "passthrough", "exec")
        saved, sys.argv = sys.argv, ["passthrough", str(dump), str(work / "pass.jsonl")]
        try:
            clock.run("json_passthrough", exec, passthrough, {"__name__": "passthrough"})
        finally:
            sys.argv = saved
    options = ImportOptions(input=str(dump), format=fmt, output=str(work / "inproc.jsonl"))
    clock.run("import_inprocess", import_cmd, options)
    for name, cmd in (
        ("import_subprocess", [rlcli_bin, "import", str(dump), "-f", fmt, "-o", str(work / "sub.jsonl")]),
        ("json_baseline_subprocess", [sys.executable, "-c", code, str(dump), str(work / "b.jsonl")]),
    ):
        seconds, peak, upper, cpu = _child(cmd)
        clock.times[name].append(seconds)
        clock.cpu[name].append(cpu)
        rss[name].append(peak)
        rss[name + "_ru_maxrss_upper_bound"].append(upper)


def main(
    size_mb: float = 100,
    runs: int = 3,
    seed: int = 0,
    format: str = "openai",
    receipt_dir: str = str(ROOT / "benchmarks/receipts"),
):
    """Generate the dump, time every variant `runs` times, write the receipt and print its path.

    Args:
        size_mb: size of the generated dump in megabytes
        runs: rounds of timings (each round runs every variant once)
        seed: random seed of the generated records
        format: openai, responses, gemini or otel: the shape the same generated calls are logged in
        receipt_dir: folder for the JSON receipt
    """
    work = Path(tempfile.mkdtemp(prefix="rlcli-import-bench-"))
    os.chmod(work, 0o700)  # the dump is synthetic, but the folder is private like any temp of ours
    try:
        dump = work / "dump.jsonl"
        if format != "openai" and format not in GENERATORS:
            raise SystemExit(f"unknown format {format!r}; use openai, {', '.join(GENERATORS)}")
        records = make_dump(dump, size_mb, seed, format)
        load_before = os.getloadavg()
        names = ("json_baseline", "import_inprocess", "import_subprocess", "json_baseline_subprocess")
        extra = ("json_passthrough",) if format in PASSTHROUGH else ()
        times: dict[str, list[float]] = {k: [] for k in names + extra}
        cpu: dict[str, list[float]] = {k: [] for k in names + extra}
        rss: dict[str, list[float]] = {k + sfx: [] for k in names[2:] for sfx in ("", "_ru_maxrss_upper_bound")}
        for _ in range(runs):
            _round(work, dump, _Clock(times, cpu), rss, format)
        written = sum(1 for _ in open(work / "inproc.jsonl", "rb"))
        receipt = _receipt(dump.stat().st_size, records, runs, seed, times, rss, written, format)
        receipt["cpu_s"] = cpu
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        receipt["ratio_cpu"] = {
            "inprocess": med_cpu["json_baseline"] / med_cpu["import_inprocess"],
            "subprocess": med_cpu["json_baseline_subprocess"] / med_cpu["import_subprocess"],
        }
        # Other work on the machine slows both sides; rounds alternate so the ratio suffers least.
        receipt["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    finally:
        shutil.rmtree(work)
    label = "" if format == "openai" else f"{format}-"
    stamp = dt.datetime.fromisoformat(receipt["date"]).strftime("%Y%m%dT%H%M%SZ")  # two runs a day: two receipts
    out = Path(receipt_dir) / f"import-{label}{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(portable(json.dumps(receipt, indent=2), ROOT) + "\n")
    print(json.dumps({"receipt": str(out), **receipt["ratio"], "cpu": receipt["ratio_cpu"],
                      "peak_rss_mb": receipt["peak_rss_mb"]["import_subprocess"]}))  # fmt: skip


def _receipt(size: int, records: int, runs: int, seed: int, times: dict, rss: dict, written: int, fmt: str) -> dict:
    med = {k: statistics.median(v) for k, v in times.items()}
    what = "openai request+response records" if fmt == "openai" else f"{fmt} records"
    return {
        "benchmark": f"rlcli import, {what}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hardware": hardware(),  # the CPU named as every receipt names it (machine)
        "versions": _versions(),
        "config": {
            "bytes": size,
            "records": records,
            "runs": runs,
            "seed": seed,
            "format": fmt,
            "non_ascii_share_by_role": NON_ASCII,
        },
        "timings_s": times,
        "median_s": med,
        "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
        "throughput_mb_s": {k: size / 1e6 / v for k, v in med.items()},
        "ratio": {
            "inprocess_speedup_vs_json": med["json_baseline"] / med["import_inprocess"],
            "subprocess_speedup_vs_json_subprocess": med["json_baseline_subprocess"] / med["import_subprocess"],
            **(
                {"inprocess_speedup_vs_json_passthrough": med["json_passthrough"] / med["import_inprocess"]}
                if "json_passthrough" in med
                else {}
            ),
        },
        # Fastest runs against each other: on a loaded machine the least disturbed run is the closest
        # to each side's own cost, so this ratio moves less with load than the medians' does.
        "ratio_of_fastest": {
            "inprocess": min(times["json_baseline"]) / min(times["import_inprocess"]),
            "subprocess": min(times["json_baseline_subprocess"]) / min(times["import_subprocess"]),
        },
        "peak_rss_mb": {k: max(v) for k, v in rss.items()},
        "records_written": written,
    }


if __name__ == "__main__":
    fire.Fire(main)
