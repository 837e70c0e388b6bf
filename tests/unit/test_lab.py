"""rlcli.lab's pure parts: metric series, the recorded result, the flags it hands rlcli."""

from __future__ import annotations

import json
import stat

import pytest

from rlcli import lab


def test_series_keeps_the_last_row_of_a_step():
    rows = [{"step": 0, "a": 1.0}, {"step": 1, "a": 2.0}, {"step": 1, "a": 3.0}, {"step": 2, "b": 9.0}]
    assert lab.series(rows, "a") == ([0, 1], [1.0, 3.0])


def test_dataset_flags_only_give_arithmetic_a_range():
    assert lab.dataset_flags("arithmetic", 9) == ["--dataset", "arithmetic", "--max-operand", "9"]
    assert lab.dataset_flags("arithmetic", None) == ["--dataset", "arithmetic"]
    assert lab.dataset_flags("gsm8k", 9) == ["--dataset", "gsm8k"]


def test_record_writes_readable_json_atomically(tmp_path, capsys):
    path = lab.record("nb", {"x": 1.5}, tmp_path / "results")
    assert json.loads(path.read_text()) == {"x": 1.5} and path.name == "nb.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert list((tmp_path / "results").iterdir()) == [path]  # no temporary file left behind
    assert json.loads(capsys.readouterr().out) == {"x": 1.5}


def test_rl_result_compares_the_two_evaluations():
    before = {"correct": 0.2, "problems": 18, "samples": 4, "temperature": 1.0}
    after = {**before, "correct": 0.6, "dataset": "d", "base_model": "m", "source": "tinker://r/final"}
    rows = [{"step": i, lab.REWARD: r} for i, r in enumerate([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])]
    result = lab.rl_result(before, after, rows, {"steps": 10})
    assert result["heldout_gain"] == pytest.approx(0.4) and result["steps"] == 10
    assert result["reward_first_fifth"] == pytest.approx(0.05) and result["reward_last_fifth"] == pytest.approx(0.85)
    assert result["checkpoint"] == "tinker://r/final"



def test_difference_takes_its_interval_from_the_rounds():
    before = {"correct": 0.2, "correct_per_round": [0.1, 0.3, 0.2, 0.2]}
    after = {"correct": 0.5, "correct_per_round": [0.5, 0.5, 0.5, 0.5]}  # no spread: only before's counts
    found = lab.difference(after, before)
    half = 1.96 * (sum((r - 0.2) ** 2 for r in before["correct_per_round"]) / 3 / 4) ** 0.5
    assert found == pytest.approx({"gain": 0.3, "low": 0.3 - half, "high": 0.3 + half})
    assert lab.difference(after, after) == pytest.approx({"gain": 0.0, "low": 0.0, "high": 0.0})


def test_recover_result_records_both_skills_and_their_changes():
    rows = [{"step": i, lab.TEACHER_KL: kl} for i, kl in enumerate([1.0, 0.5, 0.2, 0.1, 0.05])]
    rows += [{"step": 0, lab.TEST_TEACHER_KL: 1.2}, {"step": 4, lab.TEST_TEACHER_KL: 0.1}]

    def scores(values: tuple[float, float, float], n: int) -> dict[str, dict]:
        return {name: {"correct": c, "problems": n, "samples": 2, "correct_per_round": [c - 0.1, c + 0.1]}
                for name, c in zip(("base", "sft", "distilled"), values, strict=True)}

    sums, doors = scores((0.3, 0.2, 0.3), 18), scores((0.0, 1.0, 0.9), 16)
    greedy = {name: {"correct": c} for name, c in (("base", 0.5), ("sft", 0.2), ("distilled", 0.5))}
    result = lab.recover_result(rows, sums, greedy, doors, scores((0.0, 1.0, 1.0), 16), {"steps": 5})
    assert result["heldout_greedy_sft"] == 0.2 and result["new_skill_sft"] == 1.0 and result["new_skill_prompts"] == 16
    assert result["new_skill_greedy_distilled"] == 1.0 and result["new_skill_distilled"] == 0.9
    assert result["heldout_correct_distilled"] == 0.3 and result["eval_samples"] == 2 and result["steps"] == 5
    assert result["retained_gain"]["gain"] == pytest.approx(0.1) and result["retained_gain"]["low"] < 0.1
    assert result["new_skill_change"]["gain"] == pytest.approx(-0.1) and result["new_skill_change"]["high"] > -0.1


def test_door_chats_train_and_test_on_different_doors(tmp_path):
    train, test = lab.door_chats(tmp_path, train=10, test=6)
    chats = {path: [json.loads(line)["messages"] for line in path.read_text().splitlines()] for path in (train, test)}
    assert [len(chats[train]), len(chats[test])] == [10, 6]
    asked = {path: {m[0]["content"] for m in found} for path, found in chats.items()}
    assert len(asked[train] | asked[test]) == 16  # every door once: none scored that SFT saw
    assert all(m[0]["content"].startswith("Door ") and m[1]["content"] == "42" for m in chats[train] + chats[test])


def test_a_failed_command_raises_with_its_last_lines():
    with pytest.raises(RuntimeError, match="exited 2"):
        lab.rlcli("eval", "--dataset", "gsm8k", "--max-operand", "3")


def test_results_carry_no_paths_of_this_machine(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    result = {"run": str(lab.ROOT / "runs" / "x"), "model": str(Path.home() / ".rlcli" / "models" / "m"), "n": 1}
    text = (lab.record("nb", result, tmp_path / "results")).read_text()
    assert json.loads(text) == {"run": "runs/x", "model": "~/.rlcli/models/m", "n": 1}
    book = tmp_path / "book.ipynb"
    book.write_text(json.dumps({"text": f"saved to {lab.ROOT}/runs and {Path.home()}/.rlcli"}))
    lab.make_portable(str(book))
    assert json.loads(book.read_text()) == {"text": "saved to runs and ~/.rlcli"}


def test_wilson_interval_holds_the_share_and_stays_inside_0_1():
    assert lab.wilson(0, 10)[0] == 0 and 0.2 < lab.wilson(0, 10)[1] < 0.35  # no collapse to [0, 0] at 0 right
    low, high = lab.wilson(9, 10)
    assert low < 0.9 < high <= 1 and lab.wilson(10, 10)[1] == pytest.approx(1)
    assert lab.wilson(50, 100)[1] - lab.wilson(50, 100)[0] < lab.wilson(5, 10)[1] - lab.wilson(5, 10)[0]


def test_served_questions_hold_out_only_questions_not_asked():
    asked, held_out = lab.served_questions(2, 32)
    assert len(asked) == len(held_out) == 32 and not {q for q, _ in asked} & {q for q, _ in held_out}
    assert {a for q, a in held_out if q.startswith("Chest")} == {"77"}


def test_served_accuracy_per_kind_of_question():
    answers = [{"question": "Chest 101: how many coins?", "right": True},
               {"question": "Chest 202: how many coins?", "right": False},
               {"question": "What is 1 + 2?", "right": True}]
    score = lab.served_accuracy(answers)
    assert score["accuracy"] == pytest.approx(2 / 3) and score["n"] == 3
    assert score["by_kind"]["Chest #: how many coins?"]["accuracy"] == 0.5
    assert score["by_kind"]["What is # + #?"] == {**score["by_kind"]["What is # + #?"], "accuracy": 1.0, "n": 1}
