"""tinker SDKs other than the client venv's, each in a venv of its own, for the compatibility test
(tests/integration/test_sdk_compat.py) and the matrix of every minor (`python -m tests.sdk_clients matrix`).

    python -m tests.sdk_clients build    # the oldest supported SDK's venv, env/compat-oldest.lock (make compat-venv)
    python -m tests.sdk_clients matrix   # every tinker minor 0.25.. against a private server; a JSON receipt

The oldest SDK's venv (the client venv holds the newest) is built from its lock (hashes, nothing resolved) once per
lock, under the shared model home (~/.rlcli/compat-venv-<digest of the lock>): a changed lock builds a new one beside
it. The matrix's venvs are not locked (each `tinker==0.X.*` with what pip resolves for it today): they answer "which
SDKs work", not a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlcli.server.server_venv import installer

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "env" / "compat-oldest.lock"
SCENARIO = REPO / "tests" / "sdk_scenario.py"
DONE = ".rlcli-complete"


class CannotBuild(Exception):
    """A venv could not be built: one line saying why (no package index, no Python 3.11)."""


def home() -> Path:
    return Path(os.environ.get("RLCLI_TEST_MODEL_HOME", Path.home() / ".rlcli"))


def compat_venv_dir(lock: Path = LOCK) -> Path:
    return home() / f"compat-venv-{hashlib.sha256(lock.read_bytes()).hexdigest()[:12]}"


def locked_version(lock: Path = LOCK) -> str:
    from rlcli.locks import pins

    return pins(lock)["tinker"]


def ensure_compat_venv(lock: Path = LOCK) -> Path:
    """The oldest supported SDK's venv, built from its lock if this lock has none yet; its folder."""
    venv = compat_venv_dir(lock)
    if not (venv / DONE).exists():
        _build(venv, ["--require-hashes", "--no-deps", "-r", str(lock)])
    return venv


def version_venv(version: str, root: Path) -> Path:
    """A venv under `root` with tinker `version` (e.g. "0.30.*") and what the package index resolves for it."""
    venv = root / f"tinker-{version.replace('*', 'x')}"
    if not (venv / DONE).exists():
        _build(venv, [f"tinker=={version}"])
    return venv


def _build(venv: Path, args: list[str]) -> None:
    """A venv made beside `venv` and renamed into place when complete: a build that fails leaves nothing."""
    venv.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=f".{venv.name}-", dir=venv.parent))
    try:
        _run([sys.executable, "-m", "venv", "--without-pip", str(staging)], "python -m venv")
        python = str(staging / "bin" / "python")
        tool = installer()
        # A venv without pip of its own: uv, or the client venv's pip, installs into it.
        cmd = ([sys.executable, "-m", "pip", "--python", python, *tool[2:], *args] if tool[0] == "-m"
               else [*tool, "--python", python, *args])
        _run(cmd, "installing tinker")
        (staging / DONE).write_text(" ".join(args) + "\n")
        shutil.rmtree(venv, ignore_errors=True)
        staging.rename(venv)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(cmd: list[str], what: str) -> None:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        why = next((ln.strip() for ln in lines if ln.lower().lstrip("× ").startswith(("error", "no solution",
                                                                                           "because"))), None)
        raise CannotBuild(f"{what} failed: {why or (lines[-1].strip() if lines else 'no output')}")


def run_scenario(python: str | Path, base_url: str, model: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Run tests/sdk_scenario.py with `python` against the server: its JSON report (see that file)."""
    proc = subprocess.run([str(python), str(SCENARIO), "--base-url", base_url, "--base-model", model],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        report = {"ok": False, "failed": "start", "error": tail}
    report["exit"] = proc.returncode
    return report


def matrix(first: int = 25, last: int = 38, out: str | None = None, keep_venvs: str | None = None) -> int:
    """Every tinker minor first..last (the newest patch of each the index has) through tests/sdk_scenario.py against
    one private server of this tree; one line per minor, and a JSON receipt at `out` when given.

    Args:
        first: the oldest minor (0.FIRST).
        last: the newest minor (0.LAST).
        out: where to write the receipt (JSON); none: printed only.
        keep_venvs: a folder to build the venvs in and keep (default: a temp folder, removed).
    """
    import platform
    import time

    from rlcli.server.private import private_server
    from tests.conftest import install_embedded_model, shared_server_venv

    root = Path(keep_venvs) if keep_venvs else Path(tempfile.mkdtemp(prefix="rlcli-sdk-matrix-"))
    rows = []
    try:
        with private_server(install_embedded_model(), "--slots", "7", venv=shared_server_venv()) as srv:
            for minor in range(first, last + 1):
                row: dict = {"minor": f"0.{minor}"}
                try:
                    venv = version_venv(f"0.{minor}.*", root)
                except CannotBuild as e:
                    row |= {"ok": None, "why": f"not installed: {e}"}
                else:
                    report = run_scenario(venv / "bin" / "python", srv.url, srv.model, srv.env)
                    row |= {"tinker": report.get("tinker"), "ok": report["ok"],
                            "failed_after": report.get("failed_after"), "error": report.get("error")}
                rows.append(row)
                verdict = {True: "passes", False: "FAILS", None: "skipped"}[row["ok"]]
                print(f"tinker {row.get('tinker', row['minor'])}: {verdict}"
                      f"{'' if row['ok'] else ': ' + str(row.get('error') or row.get('why'))[:200]}", flush=True)
    finally:
        if not keep_venvs:
            shutil.rmtree(root, ignore_errors=True)
    receipt = {"what": "tests/sdk_scenario.py per tinker minor against this tree's server", "rows": rows,
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
               "passed": sum(r["ok"] is True for r in rows), "failed": sum(r["ok"] is False for r in rows)}
    if out:
        Path(out).write_text(json.dumps(receipt, indent=1) + "\n")
    return 1 if receipt["failed"] else 0


def build() -> int:
    """Build the oldest supported SDK's venv from env/compat-oldest.lock (nothing when this lock has one); print its
    path."""
    try:
        print(ensure_compat_venv())
    except CannotBuild as e:
        print(f"compat-venv: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import fire

    sys.exit(fire.Fire({"build": build, "matrix": matrix}))
