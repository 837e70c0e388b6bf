"""`rlcli harbor run` on a task that asks for a privilege: one line, exit 2, and no container started, against a
real Docker daemon (the kinds and their declarations: tests/unit/test_harbor_privileges_unit.py)."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_harbor import labelled, rlcli
from tests.unit.test_harbor_privileges_unit import KINDS, task_with

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


@pytest.mark.parametrize("where", [0, 1], ids=["task.toml", "compose"])
@pytest.mark.parametrize("kind", KINDS)
def test_harbor_run_refuses_a_privileged_task(docker_client, tmp_path, kind, where):
    declaration = KINDS[kind][where]
    folder = task_with(tmp_path, **({"toml_line": declaration} if where == 0 else {"compose": declaration}))
    proc, owner = rlcli("harbor", "run", str(folder), "--policy", "oracle", "--output", str(tmp_path / "out"),
                        env=dict(os.environ, RLCLI_HOME=str(tmp_path / "home")), timeout=100)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot have" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert labelled(docker_client, owner) == []  # no container of this command's, running or stopped
