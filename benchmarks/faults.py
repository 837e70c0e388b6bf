"""Time to notice each fault, and what the command said: the tests/faults suite run with its figures recorded.

    .venv/bin/python -m benchmarks.faults [--timeouts 5,15,60]

Runs tests/faults (real server, real kill -9, SIGSTOP, a filled tmpfs; see each test) and writes
benchmarks/receipts/faults-<time>.json: per fault the --server-timeout, seconds from the fault to the
command's exit, its exit code and its last line, plus the exact-resume and repeat-run weight differences.
The frozen-server case runs once per --timeouts value.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import REPO, versions, write_receipt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeouts", default="5,15,60", help="--server-timeout values for the frozen server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "faults.jsonl"
        env = dict(os.environ, RLCLI_FAULTS_RECEIPT=str(figures), RLCLI_FAULTS_TIMEOUTS=args.timeouts)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"],
                              cwd=REPO, env=env, capture_output=True, text=True)
        # A test's temporary folders say nothing about the fault; keep them out of a committed receipt.
        text = figures.read_text() if figures.exists() else ""
        text = re.sub(r"/tmp/(?:\S+?/)?(run|rlcli-export-\w+)\b", r"<tmp>/\1", text)
        rows = [json.loads(line) for line in text.splitlines()]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    path = write_receipt("faults", {"versions": versions("tinker", "tinker-cookbook"), "pytest": summary,
                                    "pytest_rc": proc.returncode, "faults": rows})
    for row in rows:
        print(json.dumps(row))
    print(f"{summary}\nreceipt: {path}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
