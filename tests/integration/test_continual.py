"""The continual-learning benchmark at its --quick size against the real SkyRL server on CPU: three skills arriving
one batch at a time, a bad candidate after the second, the loop's default strategy and joint training, scored on
the fixed test sets, and its receipt (benchmarks/continual.py; the full size is `python -m benchmarks.continual`)."""

from __future__ import annotations

import json

import pytest

from benchmarks import continual

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def quick(server, tmp_path_factory):
    root = tmp_path_factory.mktemp("continual")
    with pytest.MonkeyPatch.context() as mp:  # the loop's trainers run in this process: the server's home and key
        for key in ("RLCLI_HOME", "TINKER_API_KEY"):
            if key in server.env:
                mp.setenv(key, server.env[key])
        result = continual.run_all(server.url, root / "runs", continual.QUICK, ["default", "joint"], {})
        return continual.finish(result, continual.QUICK, "test", root / "receipts", 1.0)


def test_matrices_have_a_row_per_skill_and_a_column_per_skill(quick):
    skills = continual.QUICK.skills
    for R in (quick["default"]["R_champion"], quick["default"]["R_candidate"], quick["joint"]["R"]):
        assert len(R) == skills and all(len(row) == skills and all(0 <= a <= 1 for a in row) for row in R)
    assert len(quick["default"]["events"]) == skills + 1 and quick["base"] == [0.0] * skills  # the base knows none


def test_the_first_skill_is_learned_promoted_and_its_slice_gained(quick):
    first = quick["default"]["events"][0]
    assert first["truth"]["learned"] and first["promoted"], first["why"]
    assert first["skill_slice"]["new"] and first["skill_slice"]["low"] > 0
    assert quick["default"]["R_champion"][0][0] >= 0.75


def test_the_bad_candidate_is_rejected_and_judged_bad(quick):
    bad = [e for e in quick["default"]["events"] if e["bad"]]
    assert len(bad) == 1 and bad[0]["decision"] == "rejected" and not bad[0]["truth"]["good"]
    assert bad[0]["champion"] == bad[0]["champion_before"]  # the champion stayed: its scores did too
    table = quick["default"]["decisions"]
    assert sum(table.values()) == continual.QUICK.skills + 1 and table["bad_promoted"] == 0


def test_joint_training_learns_every_skill_seen(quick):
    R = quick["joint"]["R"]
    assert all(R[t][j] >= 0.5 for t in range(len(R)) for j in range(t + 1)), R
    assert quick["joint"]["summary"]["acc"] == pytest.approx(sum(R[-1]) / len(R))


def test_receipt_holds_the_measures_and_the_targets(quick):
    receipt = json.loads(open(quick["receipt"]).read())
    assert receipt["benchmark"] == "continual" and receipt["config"]["strategies"] == ["default", "joint"]
    summary = receipt["default"]["summary"]
    assert set(summary) >= {"acc", "bwt", "fwt", "average_seen"} and len(summary["average_seen"]) == 3
    assert [t["met"] in (True, False) for t in receipt["targets"]] == [True] * 4
    assert receipt["targets"][1]["met"]  # the bad candidate was rejected
