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


def _files_requesting(fixture: str) -> set[str]:
    """The test files with a test or fixture function that takes `fixture` as a parameter (read with ast)."""
    import ast

    found = set()
    for path in sorted((REPO / "tests").glob("*/test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and fixture in {a.arg for a in node.args.args}:
                found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_files_using_the_stock_server_or_the_fault_server_go_to_one_worker_each():
    """tests/conftest.py's scheduler: every file whose tests take the stock server is one unit (one worker, one
    stock server start), and so is every file whose tests take the fault server (tests/faults); any other file is
    its own unit, as --dist loadfile makes it."""
    from tests.conftest import pytest_xdist_make_scheduler

    class Config:
        def getvalue(self, name):
            return {"dist": "loadfile", "tx": ["2*popen"]}[name]

    scheduler = pytest_xdist_make_scheduler(Config(), None)
    stock, fault = _files_requesting("stock_server"), _files_requesting("fault_server")
    assert len(stock) >= 2 and len(fault) >= 2, (stock, fault)  # otherwise there is nothing to group
    units = {f: scheduler._split_scope(f"{f}::test_x") for f in
             sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").glob("*/test_*.py"))}
    assert {units[f] for f in stock} == {"uses stock_server"}
    assert {units[f] for f in fault} == {"uses fault_server"}
    assert all(unit == f for f, unit in units.items() if f not in stock | fault)
    # Naming the fixture in text (as this file does) is not using it.
    assert units["tests/integration/test_fused_gspo.py"] == "uses stock_server"
    assert units["tests/unit/test_make_test.py"] == "tests/unit/test_make_test.py"
