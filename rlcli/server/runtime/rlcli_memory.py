"""The engine hands the heap it freed back to the system (glibc's malloc_trim) at most once every EVERY_S, and drops
its compiled programs when they have grown it past --program-memory.

XLA compiling a program and running a step allocate much and free most of it, on many threads; glibc keeps what
they freed in its arenas and the engine's RSS keeps the high-water mark: the soak saw it rise in steps of 13-95 MB
after warm-up, 140 MB of it free heap at one reading (docs/decisions.md, "The engine trims its heap once a
minute"). A trim costs milliseconds; on a C library without malloc_trim (musl, macOS) there is nothing to call.

Each trim logs one line: RSS before and after, and what jax holds alive (arrays and their bytes: weights, LoRA
slots, optimizer states, sampler snapshots). RSS that rises while the arrays stay flat is memory outside them
(compiled programs, the allocator's arenas); arrays that rise are state a model or a request left behind.

Every batch shape the engine meets compiles a program that jax keeps in memory for the process's life (~30 MB each
for the tiny model on CPU), and a long-lived server meets new shapes as its traffic changes. When the memory outside
the arrays has grown by more than the cap since the first trim, jax's in-memory caches are cleared: the server's
persistent compilation cache holds every program on disk, so each one still in use is loaded again at its next call
(0.8 s on CPU, not the 4.4 s of compiling it: benchmarks/program_memory.py). At most once every DROP_EVERY_TRIMS
trims, so a working set larger than the cap costs a reload now and then, never a loop of them (docs/decisions.md,
"The engine drops its compiled programs past --program-memory").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import os
import sys
import time

from shared import MEMORY_EVERY_ENV, PROGRAM_MEMORY_ENV

EVERY_S = 60.0
DEFAULT_PROGRAM_MB = 2048
DROP_EVERY_TRIMS = 10  # trims between two drops at least (ten minutes at the default interval)


def log(message: str) -> None:
    print(f"[rlcli memory] {message}", file=sys.stderr, flush=True)


def malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def live_arrays() -> tuple[int, int] | None:
    """How many jax arrays are alive in this process and their bytes; None where jax is not loaded."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    arrays = jax.live_arrays()
    return len(arrays), sum(a.nbytes for a in arrays)


def rss_mb() -> int | None:
    """This process's resident set in MB (Linux's /proc), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (OSError, ValueError, IndexError):
        return None


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if value < 0 or not math.isfinite(value):
        raise SystemExit(f"rlcli memory: {name}={raw!r}: give a number of at least 0")
    return value


def drop_programs() -> str | None:
    """Clear jax's in-memory caches of compiled and traced programs; None when done, else why it was not: only
    where every program is also on disk (the persistent cache, which the server sets to keep every one) and in a
    single jax process (the processes of a mesh run each program together)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return "jax is not loaded"
    if not jax.config.jax_compilation_cache_dir:
        return "no persistent compilation cache (each program would be compiled again)"
    if jax.process_count() > 1:
        return f"{jax.process_count()} jax processes"
    jax.clear_caches()
    gc.collect()
    return None


class Trimmer:
    """The engine's: `maybe()` after each look trims at the first look and then when every_s have passed since the
    last trim; after a trim, drops the compiled programs when the memory outside jax arrays is more than cap_mb
    above the first trim's."""

    def __init__(self, every_s: float | None = None, trim=None, cap_mb: float | None = None, drop=drop_programs):
        self.trim = trim or malloc_trim()
        self.every_s = _number(MEMORY_EVERY_ENV, EVERY_S) if every_s is None else every_s
        self.cap_mb = _number(PROGRAM_MEMORY_ENV, DEFAULT_PROGRAM_MB) if cap_mb is None else cap_mb  # 0: keep all
        self.drop = drop
        self.last = -math.inf  # the first look trims: start-up's loading and compiling freed much, and its line says
        # what the engine holds once serving
        self.trims = self.drops = 0
        self.base_mb: float | None = None  # memory outside jax arrays at the first trim
        self.last_drop = -math.inf  # in trims

    def maybe(self) -> None:
        if self.trim is None or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        try:
            before = rss_mb()
            self.trim(0)
            self.trims += 1
        except Exception as e:  # housekeeping: the engine serves without it
            log(f"could not trim the heap: {type(e).__name__}: {e}")
            self.trim = None
            return
        try:
            alive = live_arrays()
        except Exception:  # a reading, not a duty: the trim's line says what it can
            alive = None
        after = rss_mb()
        held = f"; jax arrays alive {alive[0]} ({alive[1] / 2**20:.1f} MB)" if alive else ""
        log(f"trimmed the heap (malloc_trim): RSS {before} -> {after} MB{held}; again every {self.every_s:.0f} s")
        if after is not None:
            self.bound(after - (alive[1] / 2**20 if alive else 0.0))

    def bound(self, outside_mb: float) -> None:
        """Drop the compiled programs when outside_mb (RSS less the arrays) has grown past the cap."""
        if self.base_mb is None:
            self.base_mb = outside_mb
            return
        grown = outside_mb - self.base_mb
        if not self.cap_mb or self.drop is None or grown <= self.cap_mb:
            return
        if self.trims - self.last_drop < DROP_EVERY_TRIMS:
            return
        self.last_drop = self.trims
        before = rss_mb()
        try:
            why_not = self.drop()
        except Exception as e:  # housekeeping: the engine serves without it
            why_not = f"{type(e).__name__}: {e}"
        if why_not:
            log(f"memory outside jax arrays grew {grown:.0f} MB past the first reading (--program-memory "
                f"{self.cap_mb:.0f}): compiled programs kept, {why_not}")
            self.drop = None
            return
        self.drops += 1
        self.trim(0)
        log(f"dropped the compiled programs (memory outside jax arrays +{grown:.0f} MB since the first reading, "
            f"over --program-memory {self.cap_mb:.0f}): RSS {before} -> {rss_mb()} MB; each program in use is "
            f"loaded again from the disk cache at its next call; drop {self.drops}")
