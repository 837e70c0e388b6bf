"""How fast `rlcli --help` and each subcommand's --help answer (target: under 0.3 s).

    .venv/bin/python -m benchmarks.cli_startup [--runs 10]

Writes benchmarks/receipts/cli-startup-<time>.json with every raw timing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import summary, versions, write_receipt

COMMANDS = [["--help"], ["serve", "--help"], ["serve", "start", "--help"], ["train", "sl", "--help"],
            ["train", "rl", "--help"], ["import", "--help"], ["--version"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    exe = shutil.which("rlcli") or str(Path(sys.executable).with_name("rlcli"))
    results = {}
    for cmd in COMMANDS:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            proc = subprocess.run([exe, *cmd], capture_output=True)
            times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            continue  # a command not built yet; nothing to time
        results[" ".join(cmd)] = {"raw_s": times, **summary(times)}
        print(f"rlcli {' '.join(cmd):24s} median {results[' '.join(cmd)]['median'] * 1000:.0f} ms")
    path = write_receipt("cli-startup", {"versions": versions("tinker", "tinker-cookbook"),
                                         "config": {"runs": args.runs, "target_s": 0.3}, "results": results})
    print(f"receipt: {path}")


if __name__ == "__main__":
    main()
