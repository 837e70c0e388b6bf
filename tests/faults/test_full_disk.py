"""A full disk fails the command with one line and leaves nothing half-written under a final name.

The disk is the one under the output (export, import), the run folder, or the server's own checkpoint folder
(a checkpoint save, and the unnamed per-step sampler snapshots RL loops save: runtime/rlcli_samplers.py).

Each test fills a real 4 MiB tmpfs to the last byte (tests/faults/conftest.py: skipped where mounting is not
permitted), then frees it and shows the command (or the resumed run) completes.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import time

import pytest

from rlcli.client import unload_models
from rlcli.server.private import private_server
from rlcli.train.folder import last_checkpoint
from tests.conftest import REPO, Background, run_rlcli, shared_compile_cache, shared_server_venv
from tests.faults.conftest import SL_DATA, fill, step_rows, tmpfs, trainer, wait_for
from tests.faults.test_server_dies import last_line, record
from tests.integration.test_sampler_snapshots import SNAPSHOT, _sample, _snapshots, _step

pytestmark = [pytest.mark.server, pytest.mark.faults]

FULL = "rlcli: error: no space left on the device"
TRACES = REPO / "rlcli" / "data" / "demo" / "demo-traces.openai.jsonl"


@pytest.fixture(scope="module")
def sampler_checkpoint(server, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("full-disk") / "run"
    run_rlcli("train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--max-steps", "2", "--save-every",
              "0", "--base-url", server.url, "--log-path", str(folder), env=dict(server.env, TINKER_API_KEY="tml-f"),
              check=True)
    return last_checkpoint(folder, "sampler_path")["sampler_path"]


def test_export_onto_a_full_disk(server, sampler_checkpoint, small_fs):
    out = small_fs / "adapter"
    filler = fill(small_fs)
    proc = run_rlcli("export", sampler_checkpoint, "-o", str(out), "--base-url", server.url, env=server.env,
                     timeout=300)
    record("disk full during rlcli export -o", rc=proc.returncode, line=last_line(proc.stderr))
    assert proc.returncode == 1 and last_line(proc.stderr).startswith(FULL), proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # no output, no staging folder left
    filler.unlink()
    run_rlcli("export", sampler_checkpoint, "-o", str(out), "--base-url", server.url, env=server.env, check=True)
    assert (out / "adapter_model.safetensors").is_file()


def test_import_onto_a_full_disk(small_fs):
    out = small_fs / "chats.jsonl"
    filler = fill(small_fs)
    proc = run_rlcli("import", str(TRACES), "-f", "openai", "-o", str(out), timeout=120)
    record("disk full during rlcli import -o", rc=proc.returncode, line=last_line(proc.stderr))
    assert proc.returncode == 1 and last_line(proc.stderr).startswith(FULL), proc.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # no truncated file, no .part
    filler.unlink()
    run_rlcli("import", str(TRACES), "-f", "openai", "-o", str(out), check=True, timeout=120)
    assert out.stat().st_size > 0


def test_a_full_run_folder_stops_training_and_the_run_resumes(server, small_fs):
    folder = small_fs / "run"
    env = dict(server.env, TINKER_API_KEY="tml-f")
    args = ["train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--max-steps", "12", "--save-every",
            "2", "--base-url", server.url, "--log-path", str(folder)]
    proc = trainer(*args, env=env)
    wait_for(lambda: last_checkpoint(folder, "state_path") is not None, 600, proc, "the first checkpoint")
    filler = fill(small_fs)
    filled_at = time.monotonic()
    _, err = proc.communicate(timeout=300)
    record("disk full under the run folder during train sl", rc=proc.returncode, exit_s=round(time.monotonic() -
           filled_at, 2), line=last_line(err))
    assert proc.returncode == 1 and last_line(err).startswith(FULL), err[-3000:]
    assert "Traceback" not in err and "Logging error" not in err
    filler.unlink()
    done = run_rlcli(*args, "--resume", env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (folder / "checkpoints.jsonl").read_text().splitlines()
    assert all(json.loads(line)["name"] for line in lines)  # every record whole
    assert [r["step"] for r in step_rows(folder)] == list(range(12))


@pytest.fixture(scope="module", autouse=True)
def ckpt_server(request, embedded_model, tmp_path_factory):
    """The private server of the last two tests (2 snapshots kept), whose checkpoints go to a 32 MiB tmpfs:
    started in a thread when the module starts (if a test that uses it is selected), so that its ~20 s start
    runs alongside the tests before it.
    Yields a function that waits for it and returns (server, disk), or skips when no tmpfs can be mounted."""
    if not any("ckpt_server" in inspect.signature(item.function).parameters for item in request.session.items
               if getattr(item, "function", None) is not None):
        yield None
        return

    @contextlib.contextmanager
    def tmpfs_server():
        with (tmpfs(tmp_path_factory.mktemp("ckpt") / "ckpt-fs", "32m") as disk,
              private_server(embedded_model, "--slots", "2", "--sampler-snapshots", "2",
                             "--checkpoints-base", str(disk), venv=shared_server_venv(),
                             home=shared_compile_cache(tmp_path_factory.mktemp("rlcli-ckpt-home"))) as srv):
            yield srv, disk

    server = Background(tmpfs_server)  # a skip (no tmpfs) or a failed start is raised in the test that asks
    yield server.get
    server.stop()

def test_the_servers_checkpoint_folder_full_stops_training_and_the_run_resumes(ckpt_server, tmp_path):
    """A private server keeps its checkpoints on a 32 MiB tmpfs (one SL checkpoint of the embedded model, state
    and sampler weights, takes ~4 MiB); it is filled after the first save, so the next save fails on the server."""
    srv, disk = ckpt_server()
    folder, env = tmp_path / "run", dict(srv.env, TINKER_API_KEY="tml-f")
    args = ["train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--max-steps", "8", "--save-every",
            "2", "--base-url", srv.url, "--log-path", str(folder)]
    proc = trainer(*args, env=env)
    wait_for(lambda: last_checkpoint(folder, "state_path") is not None, 600, proc, "the first checkpoint")
    filler = fill(disk)
    _, err = proc.communicate(timeout=300)
    line, saved = last_line(err), [json.loads(r)["name"] for r in (folder / "checkpoints.jsonl").read_text()
                                   .splitlines()]
    record("server's checkpoint folder full during train sl", rc=proc.returncode, line=line)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    failed = re.match(r"rlcli: error: the server could not save checkpoint (\w+) \(.*No space left on device\); "
                      r"nothing was recorded for it and the last good checkpoint is (\w+): free space", line)
    assert failed and f"--log-path {folder} --resume" in line, err[-3000:]
    assert failed.group(1) not in saved and failed.group(2) == saved[-1]  # the failed save left no record
    filler.unlink()
    done = run_rlcli(*args, "--resume", env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"from checkpoint {saved[-1]}" in done.stderr
    assert [r["step"] for r in step_rows(folder)] == list(range(8))
    assert json.loads((folder / "checkpoints.jsonl").read_text().splitlines()[-1])["name"] == "final"


def test_a_full_checkpoint_folder_still_takes_the_next_snapshot(ckpt_server, monkeypatch):
    """At K (2) unnamed snapshots kept, the oldest goes before the next is written, so that save succeeds on a
    disk full to the last byte; below K a failed save leaves no partial file and no probe."""
    import tinker

    srv, disk = ckpt_server()
    monkeypatch.setenv("TINKER_API_KEY", "tml-f")
    service = tinker.ServiceClient(base_url=srv.url)
    first = service.create_lora_training_client(base_model=srv.model, rank=32, seed=0).result()
    second = service.create_lora_training_client(base_model=srv.model, rank=32, seed=1).result()
    folder, other = (disk / c.model_id / "sampler_weights" for c in (first, second))
    fillers = []
    try:
        for _ in range(2):
            _step(first)
            first.save_weights_and_get_sampling_client().result()
        kept = _snapshots(folder)
        fillers.append(fill(disk))
        _step(first)
        _sample(first.save_weights_and_get_sampling_client().result())  # room made: the oldest went first
        assert len(_snapshots(folder)) == 2 and _snapshots(folder)[0] == kept[1], _snapshots(folder)

        (disk / "more").mkdir()
        fillers.append(fill(disk / "more"))  # full to the last byte again (the first filler stays)
        with pytest.raises(Exception, match="No space left"):
            second.save_weights_and_get_sampling_client().result()  # nothing kept yet, so no room to make: it fails
        left = [p.name for p in other.iterdir()] if other.exists() else []
        assert not any(SNAPSHOT.match(name) for name in left), left  # no partial file, no probe
    finally:
        for filler in fillers:
            filler.unlink()
        assert unload_models(srv.url, [first.model_id, second.model_id]) == []
