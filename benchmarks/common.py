"""What every benchmark receipt records: hardware, versions, the command, and summary statistics."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from rlcli.config import portable
from rlcli.data.redact import TINKER_KEY

RECEIPTS = Path(__file__).resolve().parent / "receipts"
REPO = RECEIPTS.parent.parent


# CPU features that change which kernels XLA and torch run. Two 2-core machines both named "AMD EPYC" took 48 and
# 133 ms (engine p50) for the same forward_backward (request-path receipts of 2026-12-01 06:02 and 13:52): the
# name alone does not tell machines apart, so receipts also keep family/model and these flags.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx_vnni", "amx_tile")


def cpu_detail() -> dict:
    """Family/model/stepping, MHz and the vector features of this CPU, from /proc/cpuinfo (Linux; {} elsewhere)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {}
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines())}
    flags = set(fields.get("flags", "").split())
    return {"family_model_stepping": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
            "mhz": fields.get("cpu MHz"), "vector": [f for f in VECTOR_FLAGS if f in flags]}


def hardware() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")))
    gpu = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        gpu = out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"cpu": cpu, "cpu_detail": cpu_detail(), "cpu_count": os.cpu_count(),
            "memory_gb": round(mem_kb / 2**20, 1), "gpu": gpu, "platform": platform.platform()}


def versions(*packages: str) -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("polygramme-rlcli", *packages):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def stop_servers_on_sigterm() -> None:
    """A `kill` of a benchmark runs its `finally` blocks, as Ctrl-C does: the servers it started stop with it
    instead of running on, unattended, in a temporary RLCLI_HOME that is then gone."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def command_line() -> str:
    """How this benchmark was launched, as a person would retype it: `python -m benchmarks.NAME ARGS`."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    launched = f"python -m {spec.name}" if spec else Path(sys.argv[0]).name
    return " ".join([launched, *sys.argv[1:]])


def write_receipt(name: str, body: dict, folder: Path | None = None, names: dict[str, str] | None = None) -> Path:
    """The receipt, in benchmarks/receipts/ or `folder` (tests and smoke runs keep theirs out of git). `names`:
    other paths of this machine the receipt may hold (e.g. a second checkout), each written as its name."""
    folder = folder or RECEIPTS
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    receipt = {"benchmark": name, "created_utc": stamp, "command": command_line(),
               "hardware": hardware(), **body}
    path = folder / f"{name}-{stamp}.json"
    # Receipts are committed: no paths of this machine in them (the repo becomes relative, home `~`).
    text = json.dumps(receipt, indent=2)
    for local, name in (names or {}).items():
        text = text.replace(local, name)
    text = re.sub(TINKER_KEY, "<API_KEY>", text)  # a key a benchmark made (its tenants') never reaches git
    path.write_text(portable(text, REPO) + "\n")
    return path
