"""How long `make test` takes and where its time goes: the suite run once with each test's start and end recorded.

    .venv/bin/python -m benchmarks.test_suite [--label NAME] [PYTEST ARGS...]

Runs `make test` (warm: the venvs, Docker and the base image are expected in place; make builds what is
missing, and that time counts) with a small pytest plugin that appends each test's worker, id, start and end to a
file in a private temporary folder. Writes benchmarks/receipts/test-suite-<time>.json: the wall time, pytest's
summary line and exit status, the seconds before the first test started (start-up and collection), each worker's
busy seconds, first start and last end, the seconds per test file (sorted, with its worker) and every test's row.
Workers busy for about the same time and close to the wall say the run is bound by the suite's work, not by how
it was split between them: then only less work shortens it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import REPO, versions, write_receipt

PLUGIN = "rlcli_suite_timeline"
PLUGIN_SOURCE = '''
import json, os, time
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    row = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid, "start": start,
           "end": time.time()}
    with open(os.environ["RLCLI_SUITE_TIMELINE"], "a") as f:  # one short append per test: whole lines
        f.write(json.dumps(row) + "\\n")
'''


def analyse(rows: list[dict], began: float, wall_s: float) -> dict:
    """The receipt's figures from the per-test rows (times in seconds since the epoch) and the run's start."""
    if not rows:
        return {"wall_s": wall_s, "tests": 0}
    first = min(r["start"] for r in rows)
    workers: dict[str, dict] = {}
    for name in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == name]
        workers[name] = {"tests": len(mine), "busy_s": round(sum(r["end"] - r["start"] for r in mine), 2),
                         "first_start_s": round(min(r["start"] for r in mine) - began, 2),
                         "last_end_s": round(max(r["end"] for r in mine) - began, 2)}
    files: dict[str, dict] = defaultdict(lambda: {"s": 0.0, "tests": 0, "workers": set()})
    for r in rows:
        entry = files[r["test"].split("::", 1)[0]]
        entry["s"] += r["end"] - r["start"]
        entry["tests"] += 1
        entry["workers"].add(r["worker"])
    by_file = [{"file": name, "s": round(e["s"], 2), "tests": e["tests"], "workers": sorted(e["workers"])}
               for name, e in sorted(files.items(), key=lambda kv: -kv[1]["s"])]
    busy = [w["busy_s"] for w in workers.values()]
    return {"wall_s": round(wall_s, 2), "tests": len(rows), "before_first_test_s": round(first - began, 2),
            "workers": workers, "busy_spread_s": round(max(busy) - min(busy), 2),
            "busy_total_s": round(sum(busy), 2), "files": by_file}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="", help="a word for the receipt's name (e.g. before, after)")
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="rlcli-suite-") as tmp:  # 0700: test ids stay private
        (Path(tmp) / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        timeline = Path(tmp) / "timeline.jsonl"
        env = dict(os.environ, RLCLI_SUITE_TIMELINE=str(timeline),
                   PYTHONPATH=os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p))
        make_args = ["make", "test", f"PYTEST_ARGS=-p {PLUGIN} {shlex.join(pytest_args)}".strip()]
        print(f"running {shlex.join(make_args)} (about the suite's time)", file=sys.stderr, flush=True)
        began = time.time()
        proc = subprocess.run(make_args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        wall_s = time.time() - began
        rows = [json.loads(line) for line in timeline.read_text().splitlines()] if timeline.exists() else []
    out = proc.stdout.strip().splitlines()
    summary = next((ln for ln in reversed(out) if " passed" in ln or " failed" in ln or " error" in ln), "")
    figures = analyse(rows, began, wall_s)
    body = {"label": args.label, "versions": versions("pytest", "pytest-xdist", "tinker"),
            "config": {"make": make_args, "cpu_count": os.cpu_count()}, "pytest": summary,
            "make_rc": proc.returncode, **figures,
            "rows": [{**r, "start": round(r["start"] - began, 3), "end": round(r["end"] - began, 3)} for r in rows]}
    path = write_receipt("test-suite" + (f"-{args.label}" if args.label else ""), body)
    print("\n".join(out[-3:]))
    print(f"wall {figures['wall_s']:.0f} s; workers busy "
          + ", ".join(f"{name} {w['busy_s']:.0f} s" for name, w in figures.get("workers", {}).items()))
    print(f"receipt: {path}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
