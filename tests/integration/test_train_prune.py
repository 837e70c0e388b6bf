"""`rlcli train prune` against the real server: of three finished runs, the newest keeps its checkpoints, an older
one loses them (the server's listing and its disk), and an older one whose final a loop's ledger names keeps that
final (rlcli/train/prune.py)."""

from __future__ import annotations

import pytest

from rlcli.client import parse_tinker_path
from rlcli.loop import ledger
from tests.conftest import run_rlcli
from tests.integration.test_checkpoint_retention import SL, _listed, _on_disk, _rows

pytestmark = pytest.mark.server


def test_older_finished_runs_lose_their_checkpoints_but_what_a_loop_names(server, tmp_path, monkeypatch):
    top, ids = tmp_path / "runs", {}
    for name in ("named", "older", "newest"):
        proc = run_rlcli(*SL, "--max-steps", "2", "--save-every", "1", "--log-path", str(top / name), "--base-url",
                         server.url, env=server.env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ids[name] = parse_tinker_path(_rows(top / name)[-1]["state_path"])[0]
    loop = tmp_path / "loop"
    loop.mkdir()
    book = ledger.Ledger(loop)
    with book.transaction() as db:  # a champion promoted from the first run: what an endpoint may be serving
        final = _rows(top / "named")[-1]
        db.execute("INSERT INTO aliases (at, iteration, sampler_path, state_path, reason) VALUES (?, 1, ?, ?, "
                   "'promote')", ("now", final["sampler_path"], final["state_path"]))
    book.close()
    proc = run_rlcli("train", "prune", str(top), "--keep-runs", "1", "--loops", str(loop), "--base-url", server.url,
                     env=server.env, timeout=120)
    assert proc.returncode == 0 and "deleted 1 checkpoint(s) of 2 finished run(s)" in proc.stdout, proc.stderr
    assert _rows(top / "older") == [] and _listed(server.url, ids["older"], monkeypatch) == set()
    assert _on_disk(server.home, ids["older"]) == set()
    assert [r["name"] for r in _rows(top / "named")] == ["final"] and _on_disk(server.home, ids["named"]) == {"final"}
    assert [r["name"] for r in _rows(top / "newest")] == ["final"] and _on_disk(server.home, ids["newest"]) == {
        "final"}
    again = run_rlcli("train", "prune", str(top), "--keep-runs", "1", "--loops", str(loop), "--base-url", server.url,
                      env=server.env, timeout=120)
    assert again.returncode == 0 and "deleted 0 checkpoint(s)" in again.stdout, again.stderr
