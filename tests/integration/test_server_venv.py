"""The server venv, built for real as `rlcli serve install` builds it: from the lock that ships in the package,
with uv, hash-checked. Downloads ~5 GB the first time on a machine (uv's cache makes later builds seconds)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rlcli import locks
from rlcli.server import server_venv
from tests.conftest import run_rlcli

pytestmark = pytest.mark.slow


# Run in the server venv: for each distribution whose top_level.txt rlcli wrote (its RECORD line), the names it
# declares against the standard library's own inference (a private function of Python 3.12's importlib).
DECLARED_EQUALS_INFERRED = """
import importlib.metadata as m
declared, inferred = m._top_level_declared, m._top_level_inferred
ours = [d for d in m.distributions() if '/top_level.txt,,' in (d.read_text('RECORD') or '')]
bad = [d.metadata['Name'] for d in ours if sorted(declared(d)) != sorted(inferred(d))]
left = [d.metadata['Name'] for d in m.distributions() if not declared(d) and list(inferred(d))]
print('written', len(ours), 'differ' if bad else '', bad, 'undeclared' if left else '', left)
raise SystemExit(1 if bad or left else 0)
"""


def test_serve_install_builds_exactly_the_lock_and_it_runs(tmp_path):
    venv = tmp_path / "server-venv"
    env = {**os.environ, "RLCLI_HOME": str(tmp_path / "home")}
    proc = run_rlcli("serve", "install", "--venv", str(venv), env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv) and "server venv ready" in proc.stderr
    assert server_venv.is_complete(venv, "jax")
    # Every module's bytecode is written at install (uv writes none): no server process compiles SkyRL's source.
    assert "bytecode written" in proc.stderr
    site = next(venv.glob("lib/python3*/site-packages"))
    sources = list((site / "skyrl").rglob("*.py"))
    compiled = {(p.parent.parent, p.name.split(".")[0]) for p in (site / "skyrl").rglob("__pycache__/*.pyc")}
    assert sources and all((p.parent, p.stem) in compiled for p in sources)
    # ... but not the packages' own test suites, which no server process imports.
    assert list((site / "numpy").rglob("tests/*.py")) and not list((site / "numpy").rglob("tests/__pycache__"))
    python = str(venv / "bin" / "python")
    # Every distribution declares its import names, and they are the ones the venv's own Python infers from its
    # files, so packages_distributions() (transformers, at import) reads them instead of listing every file.
    names = subprocess.run([python, "-c", DECLARED_EQUALS_INFERRED], capture_output=True, text=True, timeout=120)
    assert names.returncode == 0 and names.stdout.startswith("written "), names.stdout + names.stderr
    assert int(names.stdout.split()[1]) > 10 and "differ" not in names.stdout
    freeze = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True).stdout
    installed = {locks._norm(line.split("==")[0]): line.split("==")[1] for line in freeze.splitlines()
                 if "==" in line}
    installed.pop("pip", None)  # the venv's own pip, from `python -m venv`
    assert installed == locks.pins(server_venv.pins_file("jax"))  # every package, at its locked version, no other
    check = subprocess.run([python, "-c", "import skyrl.tinker.api, skyrl.tinker.engine, jax; print(jax.devices())"],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "Cpu" in check.stdout, check.stderr
    # peft's adapter config is recorded for the torch-free jax engine, with the venv's peft and transformers.
    record = json.loads((venv / server_venv.RECORD).read_text())
    assert (record["peft"], record["transformers"]) == (installed["peft"], installed["transformers"])
    assert record["config"]["peft_type"] == "LORA" and server_venv.has_peft_record(venv)
    # A second install finds the venv complete and touches nothing.
    again = run_rlcli("serve", "install", "--venv", str(venv), env=env, timeout=120)
    assert again.returncode == 0 and "building the server venv" not in again.stderr
    assert "bytecode" not in again.stderr and "recording peft" not in again.stderr
    # The written names go with their package: uninstalling one (with the installer rlcli used) leaves no
    # dist-info behind, because its RECORD lists the file rlcli added.
    info = next(p for p in site.glob("*.dist-info") if f"{p.name}/top_level.txt,," in (p / "RECORD").read_text())
    name = (info / "METADATA").read_text().split("\nName: ", 1)[1].split("\n", 1)[0]
    tool = server_venv.installer()
    remove = ([python, "-m", "pip", "uninstall", "-y", name] if tool[0] == "-m"
              else [tool[0], "pip", "uninstall", "--python", python, name])
    gone = subprocess.run(remove, capture_output=True, text=True, timeout=120)
    assert gone.returncode == 0, gone.stderr
    assert not info.exists(), sorted(p.name for p in info.iterdir())
