"""The engine hands the heap it freed back to the system (glibc's malloc_trim), at most once every EVERY_S.

XLA compiling a program and running a step allocate much and free most of it, on many threads; glibc keeps what
they freed in its arenas and the engine's RSS keeps the high-water mark: the soak saw it rise in steps of 13-95 MB
after warm-up, 140 MB of it free heap at one reading (docs/decisions.md, "The engine trims its heap once a
minute"). A trim costs milliseconds; on a C library without malloc_trim (musl, macOS) there is nothing to call.

Each trim logs one line: RSS before and after, and what jax holds alive (arrays and their bytes: weights, LoRA
slots, optimizer states, sampler snapshots). RSS that rises while the arrays stay flat is memory outside them
(compiled programs, the allocator's arenas); arrays that rise are state a model or a request left behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import time

EVERY_S = 60.0


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


class Trimmer:
    """The engine's: `maybe()` after each look trims at the first look and then when EVERY_S have passed since the
    last trim."""

    def __init__(self, every_s: float = EVERY_S, trim=None):
        self.trim, self.every_s = trim or malloc_trim(), every_s
        self.last = -math.inf  # the first look trims: start-up's loading and compiling freed much, and its line says
        # what the engine holds once serving
        self.trims = 0

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
        held = f"; jax arrays alive {alive[0]} ({alive[1] / 2**20:.1f} MB)" if alive else ""
        log(f"trimmed the heap (malloc_trim): RSS {before} -> {rss_mb()} MB{held}; again every {self.every_s:.0f} s")
