"""The server's own virtual environment: found, built from the lock that ships in rlcli/server/env/, verified.

SkyRL needs Python 3.12 while rlcli's client side runs on 3.11+, and SkyRL's
dependencies (jax, a CUDA torch pulled by peft) would bloat the client: the
server therefore lives in a venv of its own, built on first start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import typing
from importlib import resources
from pathlib import Path
from typing import Literal

from rlcli.config import server_venv_dir
from rlcli.errors import RlcliError, UsageError
from rlcli.server.runtime.shared import PEFT_RECORD as PEFT_RECORD_FILE

Backend = Literal["jax", "fsdp", "megatron"]  # a fixed choice of `rlcli serve start|install --backend`
BACKENDS: tuple[str, ...] = typing.get_args(Backend)
REQUIRED_PYTHON = (3, 12)
MARKER = ".rlcli-complete"
BYTECODE = "bytecode:1"  # the marker's line once every module of the venv has its bytecode written
TOP_LEVEL = "top-level:1"  # ... once every distribution in it declares its import names (top_level_names.py)
RECORD = PEFT_RECORD_FILE  # peft's LoraConfig recorded for the torch-free engine (peft_record.py)
PEFT_RECORD = "peft-record:1"  # ... once peft's LoraConfig is recorded for the torch-free engine (peft_record.py)


def pins_file(backend: str) -> Path:
    """The backend's lock (every package pinned with hashes), else its input file where no lock can be made.

    Found in the installed package, so a plain `pip install` of rlcli builds the server venv too."""
    folder = Path(str(resources.files("rlcli.server") / "env"))
    lock = folder / f"server-{backend}.lock"
    return lock if lock.exists() else folder / f"server-{backend}.in"


def pinned_versions(backend: str = "jax") -> dict[str, str]:
    """{package: version} for the packages the backend's input names, at the versions its lock pins."""
    locked: dict[str, str] = {}
    for line in _requirement_lines(pins_file(backend)):
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
        if m:
            locked[_norm(m.group(1))] = m.group(2)
    named = [re.match(r"^[A-Za-z0-9_.\-]+", line) for line in _requirement_lines(pins_file(backend).with_suffix(".in"))]
    return {m.group(0): locked[_norm(m.group(0))] for m in named if m and _norm(m.group(0)) in locked}


def installed_version(site_packages: Path, package: str) -> str | None:
    """A package's version from its dist-info folder name: no interpreter started, nothing imported."""
    for info in sorted(site_packages.glob(f"{package.replace('-', '_')}-*.dist-info")):
        return info.name.removesuffix(".dist-info").split("-", 1)[1]
    return None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            lines.append(line)
    return lines


def _python_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def _candidate_pythons() -> list[str]:
    found = [shutil.which("python3.12")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found += sorted(str(p) for p in pyenv_root.glob("versions/3.12*/bin/python3.12"))
    found += ["/usr/bin/python3.12", "/usr/local/bin/python3.12", sys.executable]
    return [p for p in found if p and Path(p).exists()]


def find_python(explicit: str | None = None) -> str:
    """A Python 3.12 for the server: --python, else RLCLI_PYTHON, else a search."""
    explicit = explicit or os.environ.get("RLCLI_PYTHON")
    if explicit:
        exe = shutil.which(explicit) or explicit
        if _python_version(exe) != REQUIRED_PYTHON:
            raise UsageError(
                f"--python {explicit} is not a working Python 3.12 (skyrl requires 3.12); "
                "name a python3.12 interpreter"
            )
        return exe
    for exe in _candidate_pythons():
        if _python_version(exe) == REQUIRED_PYTHON:
            return exe
    raise UsageError(
        "no Python 3.12 found (skyrl requires it): install one (`pyenv install 3.12`, "
        "`apt-get install python3.12` or `uv python install 3.12`) or name it with --python PATH"
    )


def _pins_digest(backend: str) -> str:
    return hashlib.sha256(pins_file(backend).read_bytes()).hexdigest()[:16]


def is_complete(venv: Path, backend: str) -> bool:
    """The venv was built from exactly the current pins of this backend."""
    marker = venv / MARKER
    if not (venv / "bin" / "python").exists() or not marker.exists():
        return False
    return f"{backend}:{_pins_digest(backend)}" in marker.read_text().split()


def ensure_server_venv(backend: Backend = "jax", python: str | None = None, venv: str | None = None) -> Path:
    """Return the server venv's folder, building or updating it from the pins first if needed."""
    path = server_venv_dir(venv)
    if is_complete(path, backend):
        finish_install(path, again=False)  # a venv built by an older rlcli: what it lacks, once
        return path
    if not (path / "bin" / "python").exists():
        exe = find_python(python)
        _progress(f"creating the server venv at {path} with {exe}")
        path.parent.mkdir(parents=True, exist_ok=True)
        _run_checked([exe, "-m", "venv", str(path)], "creating the server venv")
    elif _python_version(str(path / "bin" / "python")) != REQUIRED_PYTHON:
        raise UsageError(f"the server venv at {path} is not Python 3.12: remove it, or point --venv elsewhere")
    _pip_install(path, pins_file(backend))
    with (path / MARKER).open("a") as f:
        f.write(f"{backend}:{_pins_digest(backend)}\n")
    finish_install(path)
    return path


def ensure_extra(venv: Path, extra: str) -> None:
    """Install an optional lock (server-EXTRA.lock, e.g. ray) over a built server venv, once."""
    if is_complete(venv, extra):
        return
    _pip_install(venv, pins_file(extra))
    with (venv / MARKER).open("a") as f:
        f.write(f"{extra}:{_pins_digest(extra)}\n")
    finish_install(venv)


def has_extra(venv: Path, extra: str) -> bool:
    """The optional lock is installed in this venv (its marker), or the package is there some other way."""
    return is_complete(venv, extra) or any(venv.glob(f"lib/python3*/site-packages/{extra}-*.dist-info"))


def _site_packages(venv: Path) -> list[Path]:
    return sorted(venv.glob("lib/python3*/site-packages"))


def _marked(venv: Path, line: str) -> bool:
    marker = venv / MARKER
    # A 'venv' without site-packages of its own (an image's interpreter behind a wrapper) has nothing to do.
    return not _site_packages(venv) or (marker.exists() and line in marker.read_text().split())


def has_bytecode(venv: Path) -> bool:
    return _marked(venv, BYTECODE)


def has_top_level_names(venv: Path) -> bool:
    return _marked(venv, TOP_LEVEL)


def has_peft_record(venv: Path) -> bool:
    """Recorded (or tried and failed: not retried), and any record still names the venv's peft and transformers."""
    if not _marked(venv, PEFT_RECORD):
        return False
    try:
        record = json.loads((venv / RECORD).read_text())
    except (OSError, ValueError):
        return True
    return all(record.get(name) == _installed_version(venv, name) for name in ("peft", "transformers"))


def _installed_version(venv: Path, distribution: str) -> str | None:
    for site in _site_packages(venv):
        for info in site.glob(f"{distribution}-*.dist-info"):
            return info.name[len(distribution) + 1:-len(".dist-info")]
    return None


def finish_install(venv: Path, again: bool = True) -> None:
    """What an install into the venv leaves undone and every server process would otherwise redo at start:
    the bytecode, the distributions' import names and the record that lets the jax engine start without torch.
    `again=False`: only what the marker says is missing."""
    if again or not has_bytecode(venv):
        compile_bytecode(venv)
    if again or not has_top_level_names(venv):
        write_top_level_names(venv)
    if again or not has_peft_record(venv):  # also when the venv's peft or transformers changed since
        write_peft_record(venv)


def suites_pattern(sites: list[Path]) -> str:
    """compileall's -x pattern (searched in each full path) for the files under a folder named `tests` or
    `test` inside these site-packages; the folders above them (a venv under ~/test/, say) do not count."""
    import re

    return "^(?:" + "|".join(re.escape(str(s)) for s in sites) + r")/(?:[^/]+/)*tests?/"


def compile_bytecode(venv: Path) -> None:
    """Write the bytecode of every module in the venv now, so no process of the server compiles source.

    uv installs without bytecode, and where the venv cannot be written or PYTHONDONTWRITEBYTECODE is set
    (common in containers) Python never caches what it compiles: every process of every server start then
    compiled SkyRL's imports again, ~25 s of CPU on a 2-core machine (docs/decisions.md). compileall writes
    regardless of that setting; a file that does not compile (templates, old syntax) is left as it is, as
    pip leaves it. The packages' own test suites (`tests/` and `test/` folders: 3,018 of the jax venv's
    19,594 files) are skipped: no server process imports them, and skipping them took a full compile from 50 s
    to 41 s on 2 cores. Should anything import one, Python compiles it then, as it would have before."""
    sites = _site_packages(venv)
    if not sites:
        return
    if not _writable(venv, sites):
        _progress(f"the server venv at {venv} is read-only: its bytecode cannot be written, so every server "
                  "start compiles its imports (slower starts, nothing else)")
        return
    start = time.monotonic()
    _progress("writing the server venv's bytecode (once per install)")
    cmd = [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-q", "-j", "0", "-x", suites_pattern(sites),
           *map(str, sites)]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _mark(venv, BYTECODE)
    _progress(f"server venv bytecode written in {time.monotonic() - start:.0f}s")


def write_top_level_names(venv: Path) -> None:
    """Give each distribution in the venv a top_level.txt with the names Python would infer, so that
    importlib.metadata.packages_distributions() (transformers calls it in every engine and worker) reads one
    file each instead of stat-ing every installed file: 0.9-1.4 s of each engine start on 2 cores, 0.13 s after
    (top_level_names.py, run in the venv, says why and how; docs/decisions.md)."""
    sites = _site_packages(venv)
    if not sites or not _writable(venv, sites):
        return  # nothing of its own, or read-only (compile_bytecode has said so): starts are slower, no more
    script = Path(__file__).resolve().parent / "top_level_names.py"
    proc = subprocess.run([str(venv / "bin" / "python"), str(script), *map(str, sites)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        _progress(f"could not write the server venv's package names ({tail[0]}): starts are ~1 s slower")
        return
    _mark(venv, TOP_LEVEL)


def write_peft_record(venv: Path) -> None:
    """Record, with the venv's real peft, the adapter_config.json its LoraConfig writes, so that the jax engine can
    import SkyRL without peft and torch: ~6 s less CPU per engine start on 2 cores (runtime/rlcli_no_torch.py).
    Without the record (a read-only venv, a peft the record cannot reproduce) the engine imports them as stock."""
    sites = _site_packages(venv)
    if not sites or not _writable(venv, sites):
        return
    script = Path(__file__).resolve().parent / "peft_record.py"
    _progress("recording peft's adapter config for the torch-free engine (once per install)")
    proc = subprocess.run([str(venv / "bin" / "python"), str(script), str(venv / RECORD)],
                          capture_output=True, text=True)
    if proc.returncode != 0:  # marked all the same: a venv whose peft cannot be recorded is not retried each start
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        _progress(f"could not record peft's adapter config ({tail[0]}): the jax engine will import torch as "
                  "stock SkyRL does (slower starts)")
        (venv / RECORD).unlink(missing_ok=True)  # an older record would be tried again at every start
    _mark(venv, PEFT_RECORD)


def _writable(venv: Path, sites: list[Path]) -> bool:
    return all(os.access(p, os.W_OK) for p in [venv / MARKER, *sites])


def _mark(venv: Path, line: str) -> None:
    """Add a line to the marker file, once."""
    marker = venv / MARKER
    if line not in (marker.read_text().split() if marker.exists() else []):
        with marker.open("a") as f:
            f.write(f"{line}\n")


def _progress(message: str) -> None:
    print(f"rlcli: {message}", file=sys.stderr, flush=True)


def _run_checked(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RlcliError(f"{what} failed: {tail[0]}")


def installer() -> list[str]:
    """uv (`uv pip install`), else pip: building the server venv from its lock, uv took 54 s cold and 5 s warm,
    pip 197 s either way (benchmarks/receipts/venv-build-*.json); both gave a working venv.
    RLCLI_INSTALLER=pip chooses pip."""
    if os.environ.get("RLCLI_INSTALLER", "uv") != "pip":
        try:
            from uv import find_uv_bin

            return [find_uv_bin(), "pip", "install"]
        except (ImportError, FileNotFoundError):
            found = shutil.which("uv")
            if found:
                return [found, "pip", "install"]
    return ["-m", "pip", "install", "--progress-bar", "off"]


def _install_command(venv: Path, requirements: Path) -> list[str]:
    python = str(venv / "bin" / "python")
    # A lock holds every package with its hashes: nothing is resolved, nothing unchecked is installed.
    locked = ["--require-hashes", "--no-deps"] if requirements.suffix == ".lock" else []
    tool = installer()
    if tool[0] == "-m":
        return [python, *tool, *locked, "-r", str(requirements)]
    return [*tool, "--python", python, *locked, "-r", str(requirements)]


def _pip_install(venv: Path, requirements: Path) -> None:
    """Install the requirements into the venv, showing one live progress line (elapsed time, last step)."""
    cmd = _install_command(venv, requirements)
    name = "pip" if cmd[1:3] == ["-m", "pip"] else "uv"
    log_path = venv / "rlcli-install.log"
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last_print = 0.0
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
    with log_path.open("w") as log, subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        step = "resolving/downloading"
        for line in proc.stdout:
            log.write(line)
            if line.strip():
                step = line.strip()[:60]
            now = time.monotonic()
            if now - last_print > (0.5 if tty else 15):
                last_print = now
                msg = f"building the server venv ({requirements.name}, {name}): {now - start:.0f}s  {step}"
                print(("\r" if tty else "") + f"rlcli: {msg}", end="" if tty else "\n", file=sys.stderr, flush=True)
        proc.wait()
    if tty:
        print(file=sys.stderr)
    if proc.returncode != 0:
        errors = [ln for ln in log_path.read_text().splitlines() if ln.lower().startswith(("error", "  × ", "×"))]
        detail = errors[0] if errors else f"{name} exited {proc.returncode}"
        raise RlcliError(f"building the server venv failed: {detail} (full log: {log_path})")
    _progress(f"server venv ready in {time.monotonic() - start:.0f}s")
