"""`--keep-checkpoints` against the real server: while a run trains it keeps its newest N intermediate checkpoints, and
once it ended its final one alone; the others are gone from checkpoints.jsonl, from the server's records (its
checkpoint listing) and from its disk, state and sampler weights alike; a run stopped mid-way still resumes from an
intermediate one kept (rlcli/train/retention.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlcli.client import parse_tinker_path
from rlcli.train.retention import canonical
from tests.conftest import REPO, popen_rlcli, run_rlcli

pytestmark = pytest.mark.server

FIXTURE = REPO / "tests" / "fixtures" / "sl_small.jsonl"
SL = ["train", "sl", "--dataset", str(FIXTURE), "--batch-size", "4", "--lr", "5e-3", "--eval-every", "0"]


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "checkpoints.jsonl").read_text().splitlines() if line.strip()]


def _listed(url: str, run_id: str, monkeypatch) -> set[str]:
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    listing = tinker.RestClient(base_url=url).list_checkpoints(run_id).result()
    return {c.tinker_path for c in listing.checkpoints}


def _on_disk(home: Path, run_id: str) -> set[str]:
    """The checkpoints in the server's folder of the run: states at its top, sampler weights beneath (SkyRL's
    11-byte .probe files beside each sampler save are its own, and stay)."""
    folder = home / "servers" / "default" / "checkpoints" / run_id
    entries = [*folder.iterdir(), *(folder / "sampler_weights").glob("*")]
    return {p.name.removesuffix(".tar.gz") for p in entries if p.name.endswith(".tar.gz")}


def test_a_finished_run_keeps_its_final_checkpoint_alone(server, tmp_path, monkeypatch):
    run = tmp_path / "run"
    proc = run_rlcli(*SL, "--max-steps", "6", "--save-every", "1", "--keep-checkpoints", "2", "--log-path",
                     str(run), "--base-url", server.url, env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(run)
    assert [r["name"] for r in rows] == ["final"], rows  # the newest 2 kept while it trained: superseded
    run_id = parse_tinker_path(rows[-1]["state_path"])[0]
    kept = {canonical(r[k]) for r in rows for k in ("state_path", "sampler_path")}
    assert _listed(server.url, run_id, monkeypatch) == kept  # the server's records agree with the run folder
    on_disk = _on_disk(server.home, run_id)
    assert on_disk == {r["name"] for r in rows}, on_disk  # states and sampler weights of the deleted ones: gone


def test_keep_zero_keeps_every_checkpoint_and_a_resume_after_pruning_works(server, tmp_path):
    run = tmp_path / "all"
    proc = run_rlcli(*SL, "--max-steps", "4", "--save-every", "1", "--keep-checkpoints", "0", "--log-path",
                     str(run), "--base-url", server.url, env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_rows(run)) == 4  # three intermediate ones (steps 1-3) and the final
    pruned = tmp_path / "pruned"
    args = [*SL, "--epochs", "2", "--max-steps", "12", "--save-every", "1", "--keep-checkpoints", "1", "--log-path",
            str(pruned), "--base-url", server.url]
    stopped_at = _stopped_after_saves(args, pruned, server.env, saves=3)
    assert stopped_at and not any(r["name"] == "final" for r in stopped_at), stopped_at  # stopped mid-way
    resumed = run_rlcli(*args, "--resume", env=server.env, timeout=300)  # from the newest intermediate one kept
    assert resumed.returncode == 0 and f"resuming {pruned} from checkpoint" in resumed.stderr, resumed.stderr[-3000:]
    assert [r["name"] for r in _rows(pruned)] == ["final"]


def _stopped_after_saves(args: list[str], run: Path, env: dict, saves: int) -> list[dict]:
    """`rlcli ARGS` stopped (SIGTERM, as Ctrl-C's kin) once its folder has recorded `saves` checkpoints: the rows
    it kept then. An interrupted run never ended, so the end's pruning leaves its intermediate ones."""
    proc = popen_rlcli(*args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, new_session=True)
    deadline, seen = time.monotonic() + 240, 0
    while proc.poll() is None and time.monotonic() < deadline and seen < saves:
        time.sleep(0.1)
        rows = [r for r in _rows_if_any(run) if r.get("name") != "final"]
        seen = max(seen, int(rows[-1]["name"]) if rows else 0)
    with contextlib.suppress(ProcessLookupError):  # it ended first: the assertion after says so
        if proc.pid > 0:  # 0: a zygote child that died before it could say its pid (killpg(0) is our own group)
            os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    return _rows(run)


def _rows_if_any(run: Path) -> list[dict]:
    try:
        return _rows(run)
    except (OSError, ValueError):  # not written yet, or a line written as we read
        return []
