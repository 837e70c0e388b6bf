"""Locked environments: every lock current with its inputs (CI fails otherwise), every package hashed, the
server's lock inside the package, torch's CPU build for the client."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rlcli import locks
from rlcli.server import server_venv

REPO = Path(__file__).resolve().parents[2]


def test_every_lock_is_current_with_its_inputs() -> None:
    assert locks.problems() == []


def _copy(tmp_path: Path) -> Path:
    for lock in locks.LOCKS:
        for name in (*lock.inputs, lock.output, *([lock.split_torch] if lock.split_torch else [])):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_an_edited_input_is_caught(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    with (root / "env/dev.in").open("a") as f:
        f.write("coverage\n")
    found = locks.problems(root)
    assert found == ["env/client.lock was made from other inputs than env/client.in env/dev.in env/notebooks.in: "
                     "run `make lock`"]


def test_a_lock_that_does_not_meet_its_inputs_is_caught(tmp_path: Path) -> None:
    """Even with a matching digest (a hand-edited lock), a pin outside the inputs' range is reported."""
    root = _copy(tmp_path)
    lock = root / "rlcli/server/env/server-jax.lock"
    lock.write_text(re.sub(r"^skyrl==0\.4\.0", "skyrl==0.3.9", lock.read_text(), flags=re.M))
    found = locks.problems(root)
    assert len(found) == 1 and "'skyrl[tinker,jax]==0.4.0'" in found[0] and "locked: 0.3.9" in found[0]


def test_a_missing_lock_is_caught(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "env/torch-cpu.lock").unlink()
    assert locks.problems(root) == ["env/torch-cpu.lock is missing: run `make lock`"]


@pytest.mark.parametrize("path", ["env/client.lock", "env/torch-cpu.lock", "rlcli/server/env/server-jax.lock",
                                  "env/compat-oldest.lock"])
def test_every_locked_package_has_hashes(path: str) -> None:
    text = (REPO / path).read_text()
    entries = re.split(r"^(?=[A-Za-z0-9])", text, flags=re.M)[1:]
    assert entries, path
    for entry in entries:
        assert re.match(r"^[A-Za-z0-9._-]+==\S+ \\\n", entry), entry[:80]
        assert "--hash=sha256:" in entry, entry[:80]


def test_client_gets_torchs_cpu_build_and_no_cuda_libraries() -> None:
    assert locks.pins(REPO / "env/torch-cpu.lock") == {"torch": "2.13.0+cpu"}
    client = locks.pins(REPO / "env/client.lock")
    assert "torch" not in client and not [n for n in client if n.startswith(("nvidia", "triton"))]
    assert client["tinker"].startswith("0.38.") and client["tinker-cookbook"] == "0.5.8"


def test_server_venv_builds_from_the_lock_that_ships_in_the_package() -> None:
    lock = server_venv.pins_file("jax")
    assert lock.name == "server-jax.lock" and lock.parent.parent.name == "server" and lock.exists()
    assert lock.read_bytes() == (REPO / "rlcli/server/env/server-jax.lock").read_bytes()
    # The GPU backends cannot be locked from PyPI (locks.UNLOCKED says why): their inputs ship instead.
    assert server_venv.pins_file("fsdp").name == "server-fsdp.in" and set(locks.UNLOCKED) == {
        "server-fsdp", "server-megatron"}
    # The server venv keeps tinker 0.25 (SkyRL's types); the client's is another SDK the server answers
    # (test_sdk_compat runs both ends of that range against it).
    from rlcli.server.runtime import manifest

    client, server = locks.pins(REPO / "env/client.lock")["tinker"], server_venv.pinned_versions()["tinker"]
    assert server == locks.pins(REPO / "env/compat-oldest.lock")["tinker"] == "0.25.0"
    assert manifest.satisfies(client, manifest.SERVED_SDKS) and manifest.satisfies(server, manifest.SERVED_SDKS)
