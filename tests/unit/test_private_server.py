"""rlcli.server.private without a server: its environment, and the clean-up when a start fails."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from rlcli.errors import RlcliError
from rlcli.server import private


def test_private_env_has_its_own_home_the_shared_venv_and_no_stray_url(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", "http://elsewhere:8000")
    env = private.private_env(tmp_path / "home", tmp_path / "venv")
    assert env["RLCLI_HOME"] == str(tmp_path / "home") and env["RLCLI_SERVER_VENV"] == str(tmp_path / "venv")
    assert "TINKER_BASE_URL" not in env


def test_a_failed_start_raises_with_its_output_and_leaves_no_home(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the private home
    with pytest.raises(RlcliError, match=r"exited 2:\n.*unrecognized arguments: --no-such-flag"):
        with private.private_server("some-model", "--no-such-flag", venv=tmp_path / "venv"):
            pytest.fail("the block ran without a server")
    assert list(Path(tmp_path).iterdir()) == []  # the home it made is gone


def test_a_given_home_is_the_callers_and_kept(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep").write_text("x")
    with pytest.raises(RlcliError):
        with private.private_server("some-model", "--no-such-flag", home=tmp_path / "mine", venv=tmp_path / "venv"):
            pass
    assert (tmp_path / "mine" / "keep").read_text() == "x"


def test_every_benchmark_imports_and_starts_its_server_here():
    """Each module of the benchmarks package imports as `python -m benchmarks.NAME` would (a fresh process at the
    checkout's root: no path set up by hand), and their servers are rlcli.server.private's."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    names = sorted(".".join(p.relative_to(repo).with_suffix("").parts) for p in (repo / "benchmarks").rglob("*.py")
                   if p.name != "__init__.py")
    assert "benchmarks.gpu.gpu_check" in names and "benchmarks.report" in names
    code = ("import importlib\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "from benchmarks import models; import rlcli.server.private as private\n"
            "print(models.free_port is private.free_port and models.private_env is private.private_env)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120, env=env)
    assert proc.stdout.strip() == "True", proc.stderr
