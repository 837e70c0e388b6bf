"""The server venv's bytecode: written once at install (and once for a venv built before), whatever
PYTHONDONTWRITEBYTECODE says, so no server process compiles SkyRL's source at start. Fast: a scratch 'venv'
whose python is this interpreter and whose site-packages holds two small modules
and one that does not compile."""

from __future__ import annotations

import sys
from pathlib import Path

from rlcli.server import server_venv


def _scratch_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "single.py").write_text("def f():\n    return 2\n")
    (site / "broken.py").write_text("def (:\n")  # a file that does not compile must not stop the others
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / server_venv.MARKER).write_text(f"jax:{server_venv._pins_digest('jax')}\n")  # built from today's pins
    return venv


def _pycs(venv: Path) -> list[str]:
    return sorted(p.name.split(".")[0] for p in venv.rglob("__pycache__/*.pyc"))


def test_a_complete_venv_without_bytecode_gets_it_once_even_with_dontwritebytecode(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    venv = _scratch_venv(tmp_path)
    assert _pycs(venv) == [] and not server_venv.has_bytecode(venv)
    assert server_venv.ensure_server_venv("jax", venv=str(venv)) == venv
    assert _pycs(venv) == ["__init__", "single"]
    assert server_venv.BYTECODE in (venv / server_venv.MARKER).read_text().split()
    assert server_venv.is_complete(venv, "jax")  # the marker still says which pins it was built from
    assert "bytecode written" in capsys.readouterr().err
    # Once: the next start finds the marker and compiles nothing, even a module added since.
    (venv / "lib" / "python3.12" / "site-packages" / "later.py").write_text("X = 3\n")
    server_venv.ensure_server_venv("jax", venv=str(venv))
    assert "later" not in _pycs(venv) and capsys.readouterr().err == ""


def test_an_interpreter_without_site_packages_of_its_own_needs_nothing(tmp_path):
    """The GPU check's image 'venv' is a wrapper around the image's python: nothing of the image is compiled."""
    venv = tmp_path / "image"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert server_venv.has_bytecode(venv)
    server_venv.compile_bytecode(venv)
    assert not (venv / server_venv.MARKER).exists()


def test_a_read_only_venv_is_said_and_left_alone(tmp_path, monkeypatch, capsys):
    venv = _scratch_venv(tmp_path)
    # Root writes read-only folders anyway: the venv is made to look read-only to the check itself.
    monkeypatch.setattr(server_venv.os, "access", lambda path, mode: False)
    server_venv.compile_bytecode(venv)
    assert "read-only" in capsys.readouterr().err
    assert _pycs(venv) == [] and server_venv.BYTECODE not in (venv / server_venv.MARKER).read_text()


def test_doctor_warns_about_a_venv_without_bytecode_and_names_the_fix(tmp_path, monkeypatch):
    from rlcli import doctor

    venv = _scratch_venv(tmp_path)
    monkeypatch.setenv("RLCLI_SERVER_VENV", str(venv))
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    check = doctor.check_server_venv()
    assert check.status == "warn" and "no bytecode" in check.detail and "rlcli serve install" in check.detail
    server_venv.compile_bytecode(venv)
    assert doctor.check_server_venv().status == "ok"
