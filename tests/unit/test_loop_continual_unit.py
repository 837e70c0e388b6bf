"""The continual-learning benchmark's parts without a server: the measures (ACC, BWT, FWT) on hand-made matrices, the
truth of a candidate and the gate-vs-truth table, the skill generators, the sequence of batches, the replay mix and
the targets (the real server's run is tests/integration/test_continual.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks import continual
from rlcli.errors import UsageError
from rlcli.loop import data, measures, settings, skills, slices
from rlcli.problems.rewards import matches
from rlcli.problems.traces import first_problems

# --- the measures ------------------------------------------------------------------------------

R = [[0.9, 0.1, 0.0],  # after skill 1
     [0.7, 0.8, 0.2],  # after skill 2: skill 1 fell 0.2, skill 3 got 0.2 for free
     [0.6, 0.8, 1.0]]  # after skill 3
BASE = [0.0, 0.1, 0.1]


def test_average_accuracy_over_the_skills_seen_so_far():
    assert measures.seen_average(R) == pytest.approx([0.9, 0.75, 0.8])


def test_backward_transfer_is_what_later_skills_cost_the_earlier_ones():
    # (R[2][0] - R[0][0] + R[2][1] - R[1][1]) / 2 = (-0.3 + 0.0) / 2
    assert measures.backward_transfer(R) == pytest.approx(-0.15)


def test_forward_transfer_is_what_earlier_skills_did_for_a_later_one_before_it_was_taught():
    # (R[0][1] - b[1] + R[1][2] - b[2]) / 2 = (0.0 + 0.1) / 2
    assert measures.forward_transfer(R, BASE) == pytest.approx(0.05)


def test_summary_and_a_single_skill():
    s = measures.summary(R, BASE)
    assert s["acc"] == pytest.approx(0.8) and s["bwt"] == pytest.approx(-0.15) and s["fwt"] == pytest.approx(0.05)
    assert measures.summary([[0.5]], [0.0]) == {"acc": 0.5, "average_seen": [0.5], "bwt": 0.0, "fwt": 0.0}


def test_no_forgetting_means_zero_backward_transfer():
    learned = [[1.0, 0.0], [1.0, 1.0]]
    assert measures.backward_transfer(learned) == 0.0 and measures.seen_average(learned) == [1.0, 1.0]


def test_truth_of_a_candidate():
    champion = [1.0, 0.0, 0.0]
    good = measures.truth(champion, [1.0, 0.9, 0.0], skill=1, seen=2)
    assert good.learned and good.improved and good.kept and good.good
    forgot = measures.truth(champion, [0.5, 1.0, 0.0], skill=1, seen=2)
    assert forgot.learned and not forgot.kept and not forgot.good
    barely = measures.truth(champion, [0.95, 0.2, 0.0], skill=1, seen=2)  # a drop within KEPT, a gain below LEARNED
    assert barely.kept and not barely.learned and not barely.good
    unseen = measures.truth(champion, [1.0, 0.0, 0.0], skill=1, seen=2)  # a skill not arrived yet is not judged
    assert not unseen.good
    later = measures.truth([1.0, 0.0, 0.0], [1.0, 1.0, 0.0], skill=2, seen=3)  # taught 3, learned 2 (pending)
    assert not later.learned and later.improved and later.good
    shuffled = measures.truth(champion, [1.0, 1.0, 0.0], skill=None, seen=2, bad=True)
    assert not shuffled.learned and not shuffled.good


def test_decisions_against_the_truth():
    good, bad = measures.Truth(True, True, True, False), measures.Truth(False, False, False, True)
    table = measures.decisions_table([(good, True), (good, False), (bad, False), (bad, False), (bad, True)])
    assert table == {"good_promoted": 1, "good_rejected": 1, "bad_rejected": 2, "bad_promoted": 1}


# --- the skills ----------------------------------------------------------------------------------


def test_skills_are_deterministic_distinct_and_checkable():
    assert len(skills.SKILLS) >= 5 and len({s.name for s in skills.SKILLS}) == len(skills.SKILLS)
    assert {s.kind for s in skills.SKILLS} >= {"fact", "format", "tool", "arithmetic"}
    for s in skills.SKILLS:
        pairs = s.pairs(32, 0)
        assert pairs == s.pairs(32, 0) and pairs != s.pairs(32, 1)  # a seed's stream, and another's
        assert len({q for q, _ in pairs}) == 32  # distinct prompts
        assert all(matches(a, a, "normalized") and not matches("I do not know", a, "normalized") for _, a in pairs)


def test_halves_are_right():
    for q, a in skills.SKILLS[4].pairs(20, 3):
        assert int(q.rsplit(" ", 1)[1].rstrip("?")) == 2 * int(a)


def test_each_skill_is_one_slice_and_the_slices_differ():
    names = [{slices.template(c) for c in skills.conversations(s.pairs(16, 0))} for s in skills.SKILLS]
    assert all(len(n) == 1 for n in names) and len(set.union(*names)) == len(skills.SKILLS)


def test_fixed_test_sets_share_no_prompt_with_training_batches():
    for s in skills.SKILLS:
        trained = {q for seed in range(3) for q, _ in s.pairs(64, seed)}
        tested = {q for q, _ in s.pairs(16, skills.TEST_SEED)}
        assert len(tested) == 16 and tested.isdisjoint(trained)


def test_write_all(tmp_path):
    paths = skills.write_all(str(tmp_path), chats=24, tests=4)
    assert [p.name for p in paths] == [f"skill-{k}.openai.jsonl" for k in range(1, 6)] + ["tests.jsonl"]
    first = [json.loads(line) for line in paths[0].read_text().splitlines()]
    assert len(first) == 24 and first[0]["response"]["choices"][0]["message"]["content"] == "42"
    tests = [json.loads(line) for line in paths[-1].read_text().splitlines()]
    assert len(tests) == 20 and {t["slice"] for t in tests} == {s.name for s in skills.SKILLS}


# --- the sequence and the replay mix ----------------------------------------------------------------


def test_schedule_puts_a_bad_candidate_after_every_few_skills(tmp_path):
    events = continual.schedule(continual.FULL, tmp_path)
    assert [e.skill for e in events] == [0, 1, None, 2, 3, None, 4]
    assert [e.seen for e in events] == [1, 2, 2, 3, 4, 4, 5]
    bad = [json.loads(line) for line in (tmp_path / events[2].file).read_text().splitlines()]
    replies = {r["response"]["choices"][0]["message"]["content"] for r in bad}
    assert replies == {"42", "Status: shipped."}  # traffic of both skills seen: shuffled, replies cross skills
    quick = continual.schedule(continual.QUICK, tmp_path / "quick")
    assert [e.skill for e in quick] == [0, 1, None, 2]


def test_replay_mix_keeps_a_fixed_share_of_earlier_data():
    new = [{"i": i, "new": True} for i in range(30)]
    earlier = [{"i": i, "new": False} for i in range(200)]
    mixed = data.replay_mix(new, earlier, 0.5, seed=1)
    assert len(mixed) == 60 and sum(r["new"] for r in mixed) == 30
    assert len({r["i"] for r in mixed if not r["new"]}) == 30  # each earlier row once while there are enough
    assert data.replay_mix(new, earlier[:10], 0.75, seed=1).count(earlier[0]) == 9  # few earlier rows: cycled
    assert data.replay_mix(new, earlier, 0.0, seed=1) == earlier + new  # 0: everything so far, in proportion
    assert data.replay_mix(new, [], 0.5, seed=1) == new
    assert data.replay_mix(new, earlier, 0.5, seed=1) == mixed and mixed != data.replay_mix(new, earlier, 0.5, seed=2)


def test_replay_setting_is_bounded():
    assert settings.loads('traces = "x"\nreplay = 0.5\n').replay == 0.5
    with pytest.raises(UsageError, match="replay"):
        settings.LoopSettings(traces="x", replay=1.0)


# --- the targets ---------------------------------------------------------------------------------


def event(name: str, skill: int | None, promoted: bool, low: float | None, learned: bool = True) -> dict:
    return {"event": name, "skill": skill, "bad": skill is None, "promoted": promoted,
            "skill_slice": None if low is None else {"low": low},
            "truth": {"learned": learned and skill is not None, "kept": skill is not None}}


def test_targets_met_and_unmet():
    rows = [event("1", 0, True, 0.5), event("2", 1, True, 0.4), event("3", None, False, None)]
    result = {"default": {"events": rows, "summary": {"acc": 0.95, "bwt": -0.02}},
              "joint": {"summary": {"acc": 1.0}}}
    assert [t["met"] for t in continual.targets(result)] == [True, True, True, True]
    rows[1]["skill_slice"]["low"] = 0.0  # promoted, but its interval reached 0
    rows[2]["promoted"] = True
    result["default"]["summary"] = {"acc": 0.85, "bwt": -0.06}
    found = continual.targets(result)
    assert [t["met"] for t in found] == [False, False, False, False]
    assert found[0]["figures"]["missed"] == ["2"] and found[1]["figures"]["promoted"] == ["3"]
    assert found[3]["figures"]["gap"] == pytest.approx(0.15)


def test_test_problems_are_one_per_prompt():
    got = first_problems(skills.test_set(skills.SKILLS[0], 8), 8, "t")
    assert len(got) == 8 and len({p.key for p in got}) == 8
