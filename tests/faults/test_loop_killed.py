"""`rlcli loop` killed at a seeded handful of points (benchmarks/kill_loop.py, the full run: `make kill-test`):
4 kill points of seed 8, drawn up front and landed on two rounds' commands (`loop run`, `loop promote`,
`loop rollback`): the server kill -9'd during sft, and SIGKILL or SIGTERM to the loop at the gate, in a rollback and
in the split. After each kill the folder must be sound as a reader finds it, and after each round every ledger
invariant must hold (benchmarks/loop_invariants.py). A failure replays: same seed, same points, same order.
"""

from __future__ import annotations

import pytest

from benchmarks.kill_loop import Harness

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.faults]
SEED = 8  # its first 4 points: server at train:sft, loop at gate, rollback and split (server_share 0.5)


def test_the_loop_survives_a_seeded_handful_of_kills(fault_server, tmp_path):
    h = Harness(tmp_path, fault_server, SEED, server_share=0.5, overrides={"train": "sft"})
    h.init()
    h.draw_points(4)
    assert [p.target for p in h.points].count("server") == 1
    for r in (1, 2):
        h.round(r, kills=0)
    landed = [p for p in h.points if p.landed is not None]
    report = "\n".join(f"{p.label()} -> {p.landed}: {p.outcome}" for p in h.points)
    assert all(row["invariants"] == "all hold" for row in h.rounds), h.rounds
    assert all(p.outcome["at_kill"] == "all hold" and p.outcome.get("resumed") for p in landed), report
    assert len(landed) >= 3 and any(p.target == "server" for p in landed), report
