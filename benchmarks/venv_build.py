"""Building the server venv from its lock with pip and with uv: cold and warm cache, wall time and size.

    .venv/bin/python -m benchmarks.venv_build                     # pip and uv, cold then warm, one round each
    .venv/bin/python -m benchmarks.venv_build --tools uv --rounds 2

Both install exactly rlcli/server/env/server-jax.lock (hash-checked, no resolution) into a fresh Python 3.12
venv, as `rlcli serve install` does. "cold" is an empty cache folder made for the run; "warm" reuses the cache
the cold run filled. pip runs with PIP_CONFIG_FILE=/dev/null, so it sees PyPI only, as a user's machine does
(no local mirror or extra wheel folder). Each venv is then checked (skyrl's API and engine import, jax runs,
`pip check`) and its size measured, then removed. Writes benchmarks/receipts/venv-build-*.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import summary, versions, write_receipt
from rlcli.locks import pins
from rlcli.server import server_venv

CHECK = ("import skyrl.tinker.api, skyrl.tinker.engine, jax, jax.numpy as jnp; "
         "print(jax.__version__, float(jnp.arange(4.0).sum()))")


def _size_gb(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return round(int(out.stdout.split()[0]) / 1e9, 2)


def _install(tool: str, venv: Path, cache: Path, lock: Path) -> tuple[list[str], dict]:
    python = str(venv / "bin" / "python")
    if tool == "pip":
        cmd = [python, "-m", "pip", "install", "--quiet", "--progress-bar", "off", "--require-hashes", "--no-deps",
               "--cache-dir", str(cache), "-r", str(lock)]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT"):
            env.pop(key, None)
    else:
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
        cmd = [uv, "pip", "install", "--quiet", "--require-hashes", "--no-deps", "--python", python,
               "--cache-dir", str(cache), "-r", str(lock)]
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return cmd, env


def one_build(tool: str, cache: Path, work: Path, python: str, lock: Path) -> dict:
    venv = work / f"venv-{tool}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    cmd, env = _install(tool, venv, cache, lock)
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    row = {"wall_s": round(wall, 1), "exit": done.returncode, "error": done.stderr.strip()[-400:] or None}
    if done.returncode == 0:
        check = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], capture_output=True, text=True)
        pip_check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True,
                                   text=True)
        row.update(works=check.returncode == 0, check_output=(check.stdout or check.stderr).strip()[-200:],
                   pip_check=pip_check.stdout.strip()[-200:], venv_gb=_size_gb(venv))
    row["cache_gb"] = _size_gb(cache)
    shutil.rmtree(venv, ignore_errors=True)
    print(f"venv-build: {tool} {row}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", default="pip,uv")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", default=None, help="scratch folder (default: a new one under the temp dir)")
    args = parser.parse_args()
    lock = server_venv.pins_file("jax")
    python = server_venv.find_python()
    work = Path(args.work or tempfile.mkdtemp(prefix="rlcli-venv-bench-"))
    results: dict = {}
    try:
        for tool in args.tools.split(","):
            rows = []
            for _ in range(args.rounds):
                cache = work / f"cache-{tool}"
                shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir(parents=True)
                rows.append({"cold": one_build(tool, cache, work, python, lock),
                             "warm": one_build(tool, cache, work, python, lock)})
                shutil.rmtree(cache, ignore_errors=True)
            walls = {f"{kind}_wall_s": summary([r[kind]["wall_s"] for r in rows]) for kind in ("cold", "warm")}
            results[tool] = {"rounds": rows, **walls}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    uv_version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip() if uv else None
    pip_version = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1]
    path = write_receipt("venv-build", {
        "config": {"lock": lock.name, "packages": len(pins(lock)), "rounds": args.rounds,
                   "load_avg_at_start": os.getloadavg()},
        "versions": {**versions(), "uv": uv_version, "pip (server venv)": pip_version},
        "results": results,
    })
    print(f"venv-build: receipt {path}")


if __name__ == "__main__":
    main()
