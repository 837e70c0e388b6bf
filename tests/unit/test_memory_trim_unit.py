"""runtime/rlcli_memory.py: the engine's heap trim runs at most once per interval, and on glibc calls malloc_trim."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rlcli.server import commands


def _memory():
    if str(commands.RUNTIME_DIR) not in sys.path:  # the runtime's modules import each other by name (shared)
        sys.path.insert(0, str(commands.RUNTIME_DIR))
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


def test_programs_are_dropped_past_the_cap_and_not_again_for_ten_trims(capsys):
    memory, drops, trims = _memory(), [], []
    trimmer = memory.Trimmer(every_s=1, trim=trims.append, cap_mb=100, drop=lambda: drops.append(1))
    trimmer.bound(500)  # the first reading is the base
    trimmer.trims = 2
    trimmer.bound(599)
    assert drops == []  # +99: within the cap
    trimmer.bound(601)
    assert drops == [1] and trims == [0] and trimmer.drops == 1  # +101: dropped, then trimmed what they held
    line = capsys.readouterr().err
    assert "dropped the compiled programs" in line and "+101 MB" in line and "--program-memory 100" in line
    for n in range(3, 3 + memory.DROP_EVERY_TRIMS - 1):
        trimmer.trims = n
        trimmer.bound(900)
    assert drops == [1]  # a working set over the cap reloads now and then, never in a loop
    trimmer.trims = 2 + memory.DROP_EVERY_TRIMS
    trimmer.bound(900)
    assert drops == [1, 1]


def test_a_cap_of_zero_keeps_every_program():
    memory, drops = _memory(), []
    trimmer = memory.Trimmer(every_s=1, trim=lambda _pad: None, cap_mb=0, drop=lambda: drops.append(1))
    trimmer.bound(100)
    trimmer.trims = 50
    trimmer.bound(10_000)
    assert drops == []


def test_a_drop_that_cannot_be_done_says_why_once_and_stops(capsys):
    memory, asked = _memory(), []
    trimmer = memory.Trimmer(every_s=1, trim=lambda _pad: None, cap_mb=10,
                             drop=lambda: asked.append(1) or "no persistent compilation cache")
    trimmer.bound(0)
    for n in range(2, 40):
        trimmer.trims = n
        trimmer.bound(50)
    err = capsys.readouterr().err
    assert asked == [1] and err.count("compiled programs kept, no persistent compilation cache") == 1


def test_programs_are_dropped_only_where_the_disk_keeps_them_and_in_one_process(monkeypatch):
    memory = _memory()
    fake = type(sys)("jax")
    cleared = []
    fake.config = type("Config", (), {"jax_compilation_cache_dir": ""})()
    fake.process_count = lambda: 1
    fake.clear_caches = lambda: cleared.append(1)
    monkeypatch.setitem(sys.modules, "jax", fake)
    assert "no persistent compilation cache" in memory.drop_programs() and not cleared
    fake.config.jax_compilation_cache_dir = "/cache"
    fake.process_count = lambda: 2
    assert "2 jax processes" in memory.drop_programs() and not cleared
    fake.process_count = lambda: 1
    assert memory.drop_programs() is None and cleared == [1]


def test_the_cap_and_the_interval_come_from_the_servers_environment(monkeypatch):
    memory = _memory()
    monkeypatch.setenv(memory.PROGRAM_MEMORY_ENV, "512")
    monkeypatch.setenv(memory.MEMORY_EVERY_ENV, "5")
    trimmer = memory.Trimmer(trim=lambda _pad: None)
    assert (trimmer.cap_mb, trimmer.every_s) == (512, 5)
    monkeypatch.setenv(memory.PROGRAM_MEMORY_ENV, "lots")
    with pytest.raises(SystemExit, match="RLCLI_PROGRAM_MEMORY='lots'"):
        memory.Trimmer(trim=lambda _pad: None)
