"""`make test` runs whole files on parallel workers: a file's module servers (two jax processes, Ray, tenants,
faults) must never start twice because its tests went to two workers, and the worker count stays sane."""

from __future__ import annotations

import os
import shlex
import subprocess

from tests.conftest import REPO


def pytest_line(*overrides: str) -> list[str]:
    out = subprocess.run(["make", "-n", "--no-print-directory", "test", *overrides], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, MAKEFLAGS="")).stdout
    line = next(line for line in out.splitlines() if " -m pytest " in line)
    return shlex.split(line)


def test_files_are_never_split_and_the_collection_order_is_kept():
    args = pytest_line()
    assert args[args.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in args  # faults and integration first: no slow file left for the end


def test_one_worker_per_core_at_most_four_and_the_count_can_be_set():
    workers = int(pytest_line()[pytest_line().index("-n") + 1])
    assert 1 <= workers <= min(4, os.cpu_count() or 1)
    args = pytest_line("TEST_WORKERS=1", "PYTEST_ARGS=-k x")
    assert args[args.index("-n") + 1] == "1" and args[-2:] == ["-k", "x"]
