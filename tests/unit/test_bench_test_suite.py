"""benchmarks/test_suite.py: the figures of a `make test` receipt from its per-test rows, and its plugin's rows."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import test_suite as suite


def row(worker: str, test: str, start: float, end: float) -> dict:
    return {"worker": worker, "test": test, "start": 1000.0 + start, "end": 1000.0 + end}


def test_workers_files_and_the_time_before_the_first_test():
    rows = [row("gw0", "tests/a.py::t1", 10, 40), row("gw0", "tests/a.py::t2", 40, 45),
            row("gw1", "tests/b.py::t[x]", 12, 50), row("gw1", "tests/a.py::t3", 50, 51)]
    figures = suite.analyse(rows, began=1000.0, wall_s=55.0)
    assert figures["tests"] == 4 and figures["before_first_test_s"] == 10 and figures["wall_s"] == 55.0
    assert figures["workers"]["gw0"] == {"tests": 2, "busy_s": 35, "first_start_s": 10, "last_end_s": 45}
    assert figures["workers"]["gw1"]["busy_s"] == 39 and figures["busy_spread_s"] == 4
    assert figures["busy_total_s"] == 74
    assert [(f["file"], f["s"], f["tests"], f["workers"]) for f in figures["files"]] == [
        ("tests/b.py", 38, 1, ["gw1"]), ("tests/a.py", 36, 3, ["gw0", "gw1"])]
    assert suite.analyse([], began=0.0, wall_s=3.0) == {"wall_s": 3.0, "tests": 0}


def test_the_plugin_records_each_test_once(tmp_path):
    (tmp_path / f"{suite.PLUGIN}.py").write_text(suite.PLUGIN_SOURCE)
    (tmp_path / "test_x.py").write_text("import time\ndef test_a():\n    time.sleep(0.05)\ndef test_b():\n    pass\n")
    out = tmp_path / "timeline.jsonl"
    env = {"PYTHONPATH": str(tmp_path), "RLCLI_SUITE_TIMELINE": str(out), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", suite.PLUGIN, "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(tmp_path / "test_x.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["test"].split("::")[1] for r in rows] == ["test_a", "test_b"]
    assert all(r["worker"] == "main" and r["end"] >= r["start"] for r in rows)
    assert rows[0]["end"] - rows[0]["start"] >= 0.05
