"""Two trainers on one run folder: the second is refused at once, whichever trainer it is."""

from __future__ import annotations

import fcntl

import pytest

from tests.conftest import REPO, run_rlcli
from tests.faults.conftest import SL_DATA

pytestmark = [pytest.mark.server, pytest.mark.faults]

TRAINERS = {
    "sl": ["--dataset", str(SL_DATA)],
    "rl": ["--dataset", "arithmetic"],
    "harbor": ["--dataset", str(REPO / "tests" / "fixtures" / "harbor" / "hello-file")],
}


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_a_second_trainer_on_a_held_folder_is_refused(server, tmp_path, kind):
    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running trainer holds it
        proc = run_rlcli("train", kind, *TRAINERS[kind], "--base-url", server.url, "--log-path", str(folder),
                         "--resume", env=server.env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"rlcli: error: another rlcli run is using {folder}: wait for "
                                                    "it, or pass a new --log-path")
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]  # nothing written, no model made
