"""The server venv's bytecode: written once at install (and once for a venv built before), whatever
PYTHONDONTWRITEBYTECODE says, so no server process compiles SkyRL's source at start. Fast: a scratch 'venv'
whose python is this interpreter and whose site-packages holds two small modules
and one that does not compile. And the packages' import names (top_level.txt): written as Python infers them,
recorded for uninstall, once, and named where one cannot be written."""

from __future__ import annotations

import json
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
    for suite in ("tests", "test"):  # a package's own test suite: no server process imports it
        (site / "pkg" / suite).mkdir()
        (site / "pkg" / suite / f"{suite}_pkg.py").write_text("def test_value():\n    assert True\n")
    (site / "pkg" / "testing.py").write_text("HELPER = 1\n")  # a module merely named like one is compiled
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
    assert _pycs(venv) == ["__init__", "single", "testing"]  # not tests/ nor test/
    assert server_venv.BYTECODE in (venv / server_venv.MARKER).read_text().split()
    assert server_venv.is_complete(venv, "jax")  # the marker still says which pins it was built from
    assert "bytecode written" in capsys.readouterr().err
    # Once: the next start finds the marker and compiles nothing, even a module added since.
    (venv / "lib" / "python3.12" / "site-packages" / "later.py").write_text("X = 3\n")
    server_venv.ensure_server_venv("jax", venv=str(venv))
    assert "later" not in _pycs(venv) and capsys.readouterr().err == ""


def test_a_venv_inside_a_folder_named_tests_still_gets_its_bytecode(tmp_path):
    """Only test suites inside site-packages are skipped, not everything below a user's ~/tests/."""
    venv = _scratch_venv(tmp_path / "tests" / "test")
    server_venv.compile_bytecode(venv)
    assert _pycs(venv) == ["__init__", "single", "testing"]


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


def test_doctor_warns_about_a_venv_without_bytecode_or_package_names_and_names_the_fix(tmp_path, monkeypatch):
    from rlcli import doctor

    venv = _scratch_venv(tmp_path)
    _dist(venv / "lib" / "python3.12" / "site-packages", "plain", {"plainpkg/__init__.py": ""})
    monkeypatch.setenv("RLCLI_SERVER_VENV", str(venv))
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    check = doctor.check_server_venv()
    assert check.status == "warn" and "no bytecode" in check.detail and "rlcli serve install" in check.detail
    server_venv.compile_bytecode(venv)
    check = doctor.check_server_venv()
    assert check.status == "warn" and "import names" in check.detail and "rlcli serve install" in check.detail
    server_venv.write_top_level_names(venv)
    assert doctor.check_server_venv().status == "ok"


def _dist(site: Path, name: str, files: dict[str, str], record_extra: str = "", declared: str | None = None) -> Path:
    """A distribution as an installer leaves it: its files, and a dist-info with METADATA and RECORD."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    if declared is not None:
        (info / "top_level.txt").write_text(declared)
    lines = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(lines) + record_extra)  # no newline at the end, as some write it
    return info


def _mapping(site: Path) -> dict:
    """packages_distributions() as a fresh interpreter that sees only this site-packages computes it."""
    import json
    import subprocess

    code = "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions(), sort_keys=True))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}).stdout
    return json.loads(out)


def test_package_names_are_written_as_python_infers_them_and_recorded_for_uninstall(tmp_path, capsys):
    venv = _scratch_venv(tmp_path)
    site = venv / "lib" / "python3.12" / "site-packages"
    plain = _dist(site, "plain", {"plainpkg/__init__.py": "", "plainpkg/sub/x.py": "", "plain_mod.py": "",
                                  "plain.pth": "", "../../bin/plain-tool": ""}, record_extra="\ngone/missing.py,,")
    declared = _dist(site, "declared", {"declpkg/__init__.py": ""}, declared="declpkg\n")
    before = _mapping(site)
    assert before["plainpkg"] == ["plain"] and before["plain_mod"] == ["plain"] and "plain.pth" not in before
    server_venv.finish_install(venv)
    # The names this Python infers (3.12 skips a RECORD line whose file is gone, 3.11 keeps it)
    assert (plain / "top_level.txt").read_text().split() == sorted(k for k, v in before.items() if v == ["plain"])
    assert (plain / "RECORD").read_text().splitlines()[-1] == f"{plain.name}/top_level.txt,,"
    assert (declared / "top_level.txt").read_text() == "declpkg\n"  # a declared one is left as it was
    assert "top_level.txt" not in (declared / "RECORD").read_text()
    assert _mapping(site) == before  # what transformers gets is unchanged
    marker = (venv / server_venv.MARKER).read_text().split()
    assert server_venv.TOP_LEVEL in marker and server_venv.BYTECODE in marker
    # Written once: a later finish of an older venv finds the marker; a new install writes again, and the
    # RECORD keeps one line.
    server_venv.finish_install(venv, again=False)
    (plain / "top_level.txt").unlink()
    server_venv.finish_install(venv)
    assert (plain / "RECORD").read_text().count("top_level.txt") == 1 and (plain / "top_level.txt").exists()
    assert (venv / server_venv.MARKER).read_text().split().count(server_venv.TOP_LEVEL) == 1


def test_a_venv_with_bytecode_but_no_names_gets_only_the_names(tmp_path, capsys):
    venv = _scratch_venv(tmp_path)
    site = venv / "lib" / "python3.12" / "site-packages"
    info = _dist(site, "plain", {"plainpkg/__init__.py": ""})
    with (venv / server_venv.MARKER).open("a") as f:
        f.write(f"{server_venv.BYTECODE}\n")  # as the rlcli before this one left it
    assert server_venv.has_bytecode(venv) and not server_venv.has_top_level_names(venv)
    server_venv.ensure_server_venv("jax", venv=str(venv))
    assert (info / "top_level.txt").read_text() == "plainpkg\n" and server_venv.has_top_level_names(venv)
    assert _pycs(venv) == [] and "bytecode" not in capsys.readouterr().err


def test_a_distribution_that_cannot_be_written_is_named_and_the_others_are_written(tmp_path, capsys):
    venv = _scratch_venv(tmp_path)
    site = venv / "lib" / "python3.12" / "site-packages"
    good = _dist(site, "good", {"goodpkg/__init__.py": ""})
    bad = _dist(site, "bad", {"badpkg/__init__.py": ""})
    (bad / "top_level.txt").mkdir()  # a folder where the file goes: that one cannot be written
    server_venv.write_top_level_names(venv)
    assert (good / "top_level.txt").read_text() == "goodpkg\n"
    err = capsys.readouterr().err
    assert "could not write the server venv's package names" in err and "bad-1.0.dist-info" in err
    assert not server_venv.has_top_level_names(venv)  # the next start tries again


def test_peft_record_is_made_again_when_the_venvs_peft_changes(tmp_path):
    venv = _scratch_venv(tmp_path)
    site = venv / "lib" / "python3.12" / "site-packages"
    (site / "peft-0.18.1.dist-info").mkdir()
    (site / "transformers-5.16.1.dist-info").mkdir()
    assert not server_venv.has_peft_record(venv)
    server_venv._mark(venv, server_venv.PEFT_RECORD)
    assert server_venv.has_peft_record(venv)  # tried, no record (peft could not be recorded): not retried
    (venv / server_venv.RECORD).write_text(json.dumps({"peft": "0.18.1", "transformers": "5.16.1"}))
    assert server_venv.has_peft_record(venv)
    (site / "peft-0.18.1.dist-info").rename(site / "peft-0.19.0.dist-info")
    assert not server_venv.has_peft_record(venv)
    # Recording again fails here (this scratch venv's Python has no SkyRL): the stale record goes, not retried.
    server_venv.write_peft_record(venv)
    assert not (venv / server_venv.RECORD).exists() and server_venv.has_peft_record(venv)
