"""rlcli.files: a command's files are its owner's alone, whatever the umask it was started with."""

from __future__ import annotations

import os
import runpy
import stat
import sys
from pathlib import Path

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


SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))
PICKS = {"harbor.py": ["run"], "sample.py": ["sample"]}  # scripts whose first word picks the command


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_starts_private(script, umask_022, monkeypatch, capsys):
    """A script run as `python scripts/X.py` goes through rlcli.cli.main, which sets the umask before any work."""
    monkeypatch.setattr(sys, "argv", [str(script), *PICKS.get(script.name, []), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0 and files.umask() == files.PRIVATE_UMASK


def reachable_by_others(top: Path) -> list[str]:
    """What under `top` a group member or anyone else can read: its own mode lets them, and so does every folder on
    the way down from `top` (where the test's own folder ends, itself private)."""
    found = []

    def walk(folder: Path, through: int) -> None:  # through: the classes (group 0o010, other 0o001) still let in
        for path in folder.iterdir():
            mode = path.lstat().st_mode
            if (mode >> 2) & through:  # the r bits (0o040, 0o004) moved onto the x bits of who got this far
                found.append(f"{path.relative_to(top)} {oct(stat.S_IMODE(mode))}")
            if stat.S_ISDIR(mode):
                walk(path, through & mode)

    walk(top, 0o011)
    return found


def test_the_walk_sees_a_readable_file_only_through_open_folders(tmp_path, umask_022):
    (tmp_path / "open" / "closed").mkdir(parents=True)
    (tmp_path / "open" / "closed").chmod(0o700)
    (tmp_path / "open" / "closed" / "x").write_text("x")
    (tmp_path / "open" / "y").write_text("y")
    assert sorted(reachable_by_others(tmp_path)) == ["open 0o755", "open/y 0o644"]


def test_the_library_writes_user_data_for_its_owner_alone(tmp_path, umask_022, monkeypatch, capsys):
    """rlcli called as a library (a notebook, a script of the user's) under umask 022, not through rlcli.cli.main:
    every root of user data it makes is 0700 (or the file 0600), whatever is written inside afterwards."""
    import numpy as np
    from safetensors.numpy import save_file
    from tinker_cookbook.capture.store.db import CaptureDB

    from rlcli import export, tenants
    from rlcli.data.import_cmd import Run, convert
    from rlcli.endpoint import capture
    from rlcli.loop import batches
    from rlcli.loop import commands as loop
    from rlcli.train import folder as runs

    inputs, out = tmp_path / "inputs", tmp_path / "out"  # the test's own inputs; what rlcli wrote
    inputs.mkdir()
    out.mkdir(mode=0o755)
    out.chmod(0o755)  # as a user's working folder is: what rlcli makes in it must close itself
    monkeypatch.setenv("RLCLI_HOME", str(out / "home"))
    tenants.add(tenants.AddOptions(name="alice"))
    traces = batches.write_batch(inputs / "b1.jsonl", 1, 8)
    convert(Run(), str(traces), "messages", str(out / "imported.jsonl"))
    loop.init(loop.InitOptions(dir=str(out / "loop"), traces=str(inputs / "*.jsonl"),
                               regression=str(batches.write_regression(inputs / "regression.jsonl")),
                               base_url="http://127.0.0.1:9"))
    (out / "made-first").mkdir()  # an empty --log-path the user made before the run
    for log_path in (None, str(out / "made-first")):
        run = runs.run_folder(log_path, False)
        with runs.claim(run):
            (run / "metrics.jsonl").write_text("{}\n")  # as the cookbook writes: open(), the process's umask
            runs.note_models(run, ["model_x"])
    store = inputs / "capture"
    store.mkdir()
    CaptureDB(store / "capture.sqlite").ingest_annotations([{"event_id": "e1", "run_id": capture.RUN, "kind": "x",
                                                             "payload": {}, "created_at": 0.0}])
    capture.drain(store, out / "drained")
    adapter = inputs / "adapter"
    adapter.mkdir()
    save_file({"model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((2, 4), np.float32)},
              str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text("{}")
    with files.staged_folder(out / "exported") as staging:  # what `export` writes, as it writes it
        export.write_peft(adapter, staging, "base")

    made = {p.name for p in out.iterdir()}
    assert made == {"home", "imported.jsonl", "loop", "made-first", "drained", "exported"}, made
    assert (out / "home" / "tenants.json").is_file() and (out / "home" / "runs").is_dir()
    assert reachable_by_others(out) == []
