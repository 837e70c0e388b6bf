"""The random-kill harness's bookkeeping (benchmarks/kill_points.py, benchmarks/kill_loop.py) without a server: which
stage a line of the loop opens, which command a stage's points wait for, and that a seed replays its points."""

from __future__ import annotations

import random

from benchmarks import kill_loop
from benchmarks.kill_points import draw, stage_of

# What the loop prints, in order, through one promotion (rlcli.loop.stages.move_to)
MOVE = ["rlcli loop: exporting iteration 3 (tinker://session_1:train:0/final) to /x/loop/champion",
        "rlcli loop: moving the champion alias to iteration 3 (champions/0003-peft is whole)",
        "rlcli loop: champion -> iteration 3 (exported to /x/loop/champion)"]


def test_a_promotion_opens_before_the_alias_moves_so_a_kill_can_land_inside_it():
    assert [stage_of(line, "gate", "promote") for line in MOVE] == ["export", "promotion", "promotion"]
    assert {stage_of(line, "x", "rollback") for line in MOVE} == {"rollback"}  # a rollback's lines are all its own
    assert stage_of("rlcli loop: iteration 4: dpo from the previous stage -> /x/run-3-dpo", "x", "run") == "train:dpo"
    assert stage_of("step 1/2 loss 0.3", "train:dpo", "run") == "train:dpo"


def test_each_stage_waits_for_a_command_that_reaches_it(tmp_path):
    """`loop run` never promotes these candidates: its points are the stages before; export and promotion wait for
    `loop promote`, rollback for `loop rollback`."""
    names = kill_loop.Harness(tmp_path, server=None, seed=0).stage_names  # type: ignore[arg-type]
    assert names == ["ingest", "split", "power", "train:sft", "train:rl", "train:distill", "train:dpo", "scoring",
                     "gate", "export", "promotion", "rollback"]
    takers = {name: [c for c, takes in kill_loop.RUN_COMMANDS.items() if takes(name)] for name in names}
    assert takers == {**{n: ["run"] for n in names[:9]}, "export": ["promote"], "promotion": ["promote"],
                      "rollback": ["rollback"]}


def test_a_seed_draws_the_same_points_and_a_round_tops_the_waiting_ones_up_to_pending(tmp_path):
    def points(seed: int) -> list[tuple]:
        h = kill_loop.Harness(tmp_path, server=None, seed=seed)  # type: ignore[arg-type]
        h.draw_points(30)
        return [(p.stage, p.event, p.delay, p.signal, p.target) for p in h.points]

    assert points(0) == points(0) != points(1)
    stages = {p[0] for p in points(0)}
    assert {"promotion", "rollback", "export", "train:distill"} <= stages
    h = kill_loop.Harness(tmp_path, server=None, seed=0)  # type: ignore[arg-type]
    h.draw_points(kill_loop.PENDING - 2 - len(h.pending))
    h.draw_points(min(4, kill_loop.PENDING - len(h.pending)))
    assert len(h.pending) == kill_loop.PENDING
    h.draw_points(min(4, kill_loop.PENDING - len(h.pending)))
    assert len(h.pending) == kill_loop.PENDING


def test_a_server_kill_comes_only_where_a_command_waits_on_the_server():
    rng = random.Random(0)
    drawn = [draw(rng, ["promotion", "ingest", "train:sft"] * 50, 0.5) for _ in range(150)]
    assert {p.stage for p in drawn if p.target == "server"} <= {"train:sft"}
    assert all(p.signal == "SIGKILL" for p in drawn if p.target == "server")
