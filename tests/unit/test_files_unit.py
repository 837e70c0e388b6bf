"""rlcli.files: a command's files are its owner's alone, whatever the umask it was started with."""

from __future__ import annotations

import os
import stat

import pytest

from rlcli import cli, files


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_private_files_makes_new_files_and_folders_owner_only(tmp_path, umask_022):
    assert files.private_files() == 0o022
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("user data")
    with files.staged_file(tmp_path / "staged-file") as f:
        f.write(b"x")
    with files.staged_folder(tmp_path / "staged") as staging:
        (staging / "inside").write_text("x")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {"folder": 0o700, "file": 0o600, "staged-file": 0o600, "staged": 0o700, "inside": 0o600}


def test_shared_is_for_figures_and_says_so_whatever_the_umask(tmp_path):
    old = files.private_files()
    try:
        with files.staged_file(tmp_path / "result.json", shared=True) as f:
            f.write(b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == 0o644


def test_every_command_starts_private(umask_022, capsys):
    assert cli.main(["--version"]) == 0
    assert files.umask() == files.PRIVATE_UMASK
