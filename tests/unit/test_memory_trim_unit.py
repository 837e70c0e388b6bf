"""runtime/rlcli_memory.py: the engine's heap trim runs at most once per interval, and on glibc calls malloc_trim."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rlcli.server import commands


def _memory():
    spec = importlib.util.spec_from_file_location("rlcli_memory_under_test", commands.RUNTIME_DIR / "rlcli_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_trim_at_most_once_an_interval(monkeypatch):
    memory, calls = _memory(), []
    now = [1000.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: now[0])
    trimmer = memory.Trimmer(every_s=60, trim=calls.append)
    trimmer.maybe()
    assert calls == [0]  # the first look: what start-up freed goes back, and the line says what serving holds
    now[0] += 30
    trimmer.maybe()
    assert calls == [0]
    now[0] += 31
    trimmer.maybe()
    trimmer.maybe()
    assert calls == [0, 0] and trimmer.trims == 2
    now[0] += 61
    trimmer.maybe()
    assert calls == [0, 0, 0]


def test_a_failing_trim_says_so_once_and_stops(monkeypatch, capsys):
    memory = _memory()
    now = [0.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: now[0])

    def broken(_pad):
        raise OSError("no")

    trimmer = memory.Trimmer(every_s=1, trim=broken)
    for _ in range(3):
        now[0] += 2
        trimmer.maybe()
    assert capsys.readouterr().err.count("could not trim the heap") == 1 and trimmer.trim is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibc_gives_freed_heap_back():
    trim = _memory().malloc_trim()
    assert trim is not None and trim(0) in (0, 1)


def test_each_trim_logs_rss_and_the_jax_arrays_alive(monkeypatch, capsys):
    memory = _memory()
    now = [0.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: now[0])

    class Array:
        def __init__(self, nbytes):
            self.nbytes = nbytes

    alive = [Array(2**20), Array(3 * 2**20)]
    monkeypatch.setitem(sys.modules, "jax", type(sys)("jax"))
    sys.modules["jax"].live_arrays = lambda: list(alive)
    trimmer = memory.Trimmer(every_s=1, trim=lambda _pad: None)
    trimmer.maybe()
    alive.append(Array(2**20))
    now[0] += 2
    trimmer.maybe()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "jax arrays alive 2 (4.0 MB)" in lines[0] and "jax arrays alive 3 (5.0 MB)" in lines[1]
    assert all("RSS " in line for line in lines)
