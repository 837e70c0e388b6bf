"""Lock files: every package of an environment pinned with its hashes, made by `uv pip compile` from short
input files (`*.in`), installed with `pip install --require-hashes --no-deps`.

    make lock          # re-lock the environments whose inputs changed (keeps every pin it can)
    make lock-check    # exit 1 when a lock is out of date with its inputs (offline; CI runs it)

| lock | inputs | for |
|---|---|---|
| env/client.lock + env/torch-cpu.lock | env/client.in, dev.in, notebooks.in | `make venv` (CPython 3.11, x86_64) |
| rlcli/server/env/server-jax.lock | rlcli/server/env/server-jax.in | the server venv (CPython 3.12, x86_64) |
| rlcli/server/env/server-ray.lock | rlcli/server/env/server-ray.in (-c server-jax.lock) | Ray over it, when asked |
| env/compat-oldest.lock | env/compat-oldest.in | the oldest supported tinker SDK, for the compatibility test (3.11) |

The server lock ships inside the package (`rlcli serve install` builds from it after a plain `pip install`).
torch has a lock of its own because the client's CPU build is not on PyPI: it comes from PyTorch's CPU index
(TORCH_INDEX in the Makefile) or from a local folder pip already looks in (PIP_FIND_LINKS).
The fsdp and megatron servers cannot be locked from PyPI alone (see UNLOCKED); they install from their inputs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlcli.errors import RlcliError, run_guarded

ROOT = Path(__file__).resolve().parent.parent  # a checkout: locks are made and checked there, never at run time
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PLATFORM = "x86_64-manylinux_2_28"
DIGEST_LINE = "# inputs-sha256: "


@dataclass(frozen=True)
class Lock:
    name: str
    inputs: tuple[str, ...]
    output: str
    python: str
    split_torch: str | None = None  # a second lock that takes torch out of this one


LOCKS = (
    Lock("client", ("env/client.in", "env/dev.in", "env/notebooks.in"), "env/client.lock", "3.11",
         split_torch="env/torch-cpu.lock"),
    Lock("server-jax", ("rlcli/server/env/server-jax.in",), "rlcli/server/env/server-jax.lock", "3.12"),
    # Ray over the jax venv, only when asked (`rlcli serve install --with ray`); constrained by the jax lock.
    Lock("server-ray", ("rlcli/server/env/server-ray.in",), "rlcli/server/env/server-ray.lock", "3.12"),
    # The oldest supported tinker SDK, for the compatibility test's second client venv (tests/sdk_clients.py).
    Lock("compat-oldest", ("env/compat-oldest.in",), "env/compat-oldest.lock", "3.11"),
)
# Checked with `uv pip compile` against PyPI: skyrl[fsdp] 0.4.0 needs flashinfer-jit-cache==0.6.18.post1 and
# skyrl[megatron] 0.4.0 transformer-engine-cu13==2.16.0+cu.13.0, neither of which PyPI has.
UNLOCKED = {
    "server-fsdp": "skyrl[fsdp]==0.4.0 needs flashinfer-jit-cache==0.6.18.post1, which is not on PyPI",
    "server-megatron": "skyrl[megatron]==0.4.0 needs transformer-engine-cu13==2.16.0+cu.13.0, not on PyPI",
}


def inputs_digest(lock: Lock, root: Path = ROOT) -> str:
    h = hashlib.sha256()
    for name in lock.inputs:
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()


def recorded_digest(path: Path) -> str | None:
    for line in path.read_text().splitlines()[:5]:
        if line.startswith(DIGEST_LINE):
            return line[len(DIGEST_LINE):].strip()
    return None


def pins(path: Path) -> dict[str, str]:
    """{normalised name: version} of a lock's `name==version` lines."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", path.read_text(), flags=re.M)
    return {_norm(name): version for name, version in found}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip() and not line.startswith("-")]


def problems(root: Path = ROOT) -> list[str]:
    """Why each lock is out of date with its inputs (empty: all current)."""
    from packaging.requirements import Requirement

    found = []
    for lock in LOCKS:
        outputs = [root / lock.output] + ([root / lock.split_torch] if lock.split_torch else [])
        missing = [p for p in outputs if not p.exists()]
        if missing:
            found.append(f"{missing[0].relative_to(root)} is missing: run `make lock`")
            continue
        if recorded_digest(outputs[0]) != inputs_digest(lock, root):
            found.append(f"{lock.output} was made from other inputs than {' '.join(lock.inputs)}: run `make lock`")
            continue
        pinned = {k: v for p in outputs for k, v in pins(p).items()}
        for name in lock.inputs:
            for text in _requirements(root / name):
                req = Requirement(text)
                version = pinned.get(_norm(req.name))
                if version is None or not req.specifier.contains(version, prereleases=True):
                    found.append(f"{lock.output}: {text!r} from {name} is not met (locked: {version}): "
                                 "run `make lock`")
    return found


def _local_torch_links() -> list[str]:
    """Folders pip is told to look in (PIP_FIND_LINKS, pip's config) that hold a CPU torch wheel."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    config = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                            capture_output=True, text=True)
    links += config.stdout.split() if config.returncode == 0 else []
    return [d for d in dict.fromkeys(links) if list(Path(d).glob("torch-*+cpu-*.whl"))]


def _compile(lock: Lock, root: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise RlcliError("uv is not installed: `make venv` installs it (env/dev.in)")
    out = root / lock.output
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "draft.txt"
        if out.exists():  # uv keeps the pins of an existing output wherever the inputs still allow them
            draft.write_text(out.read_text() + (root / lock.split_torch).read_text() if lock.split_torch
                             else out.read_text())
        cmd = [uv, "pip", "compile", *lock.inputs, "--generate-hashes", "--no-header", "--quiet",
               "--python-version", lock.python, "--python-platform", PLATFORM, "-o", str(draft)]
        if lock.split_torch:
            links = _local_torch_links()
            cmd += [f"--find-links={d}" for d in links] or ["--extra-index-url", TORCH_CPU_INDEX]
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RlcliError(f"uv pip compile for {lock.output} failed: {done.stderr.strip().splitlines()[-1:]}")
        body = draft.read_text()
    header = (f"# Locked by `make lock` (uv pip compile --generate-hashes, CPython {lock.python}, {PLATFORM}) "
              f"from {' '.join(lock.inputs)}.\n{DIGEST_LINE}{inputs_digest(lock, root)}\n"
              "# Install: pip install --require-hashes --no-deps -r THIS_FILE\n")
    if lock.split_torch:
        torch, body = _take_package(body, "torch")
        (root / lock.split_torch).write_text(
            f"# torch's CPU build for the client, cut from {lock.output} by `make lock` (PyTorch's CPU index).\n"
            + torch)
    out.write_text(header + body)


def _take_package(body: str, name: str) -> tuple[str, str]:
    """Cut one package's entry (its pin, hashes and `# via` lines) out of uv's output."""
    lines = body.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}=="))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "#", "\t")), len(lines))
    return "".join(lines[start:end]), "".join(lines[:start] + lines[end:])


def compile_locks(all: bool = False) -> int:
    """Re-lock every environment whose inputs changed (all=True: every one).

    Args:
        all: re-lock even the locks that are current (keeps their pins where the inputs allow).
    """
    for lock in LOCKS:
        out = ROOT / lock.output
        if not all and out.exists() and recorded_digest(out) == inputs_digest(lock):
            print(f"lock: {lock.output} is current")
            continue
        _compile(lock, ROOT)
        print(f"lock: wrote {lock.output} ({len(pins(out))} packages)")
    for name, why in UNLOCKED.items():
        print(f"lock: {name} not locked: {why}")
    return 0


def check() -> int:
    """Exit 1, saying why, when a lock is out of date with its inputs."""
    found = problems()
    for line in found:
        print(f"lock-check: {line}", file=sys.stderr)
    if not found:
        print(f"lock-check: {len(LOCKS)} locks current with their inputs")
    return 1 if found else 0


if __name__ == "__main__":
    run_guarded(lambda: check() if sys.argv[1:2] == ["check"] else compile_locks(all="--all" in sys.argv))
