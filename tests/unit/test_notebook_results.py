"""The results `make notebooks` recorded at full size (committed beside the executed notebooks) read back sane."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO

NOTEBOOKS = REPO / "notebooks"


def test_recorded_results_are_there_and_sane():
    results = {p.stem: json.loads(p.read_text()) for p in (NOTEBOOKS / "results").glob("*.json")}
    assert set(results) == {"fused_vs_2pass", "learning_curve", "gsm8k", "distill", "continual_loop",
                            "served_loop"}, sorted(results)
    for name in results:
        assert (NOTEBOOKS / "results" / f"{name}.ipynb").is_file(), f"no executed copy of {name}"
    fused = results["fused_vs_2pass"]
    assert 0 < fused["ratio_median"] < 1.5 and fused["fused_median_s"] > 0 and fused["pairs"] >= 10
    rl = results["gsm8k"]
    assert 0 <= rl["heldout_correct_before"] <= 1 and 0 <= rl["heldout_correct_after"] <= 1
    assert rl["heldout_gain"] == pytest.approx(rl["heldout_correct_after"] - rl["heldout_correct_before"])
    assert rl["minutes"] > 0 and rl["steps"] == rl["params"]["steps"]
    curve = results["learning_curve"]
    assert curve["sl_last_nll"] < curve["sl_first_nll"]
    distill = results["distill"]
    assert distill["teacher_kl_last_fifth"] < distill["teacher_kl_first_fifth"] / 2  # recover: the KL halves
    assert distill["heldout_kl_last"] < distill["heldout_kl_first"] and distill["steps"] == distill["params"]["steps"]
    # SFT taught the new skill (the door code) and cost the old one (the one-digit sums); distillation from the base
    # on the sums' prompts, with the door chats kept toward the SFT weights (--keep), brought the sums back beyond
    # the noise of the two sampled evaluations and kept the door code within it.
    assert distill["new_skill_sft"] > distill["new_skill_base"] + 0.5
    assert distill["heldout_greedy_sft"] < distill["heldout_greedy_base"] and distill["params"]["keep"]
    gain, new = distill["retained_gain"], distill["new_skill_change"]
    assert gain["low"] > 0 and gain["gain"] == pytest.approx(distill["heldout_correct_distilled"]
                                                                - distill["heldout_correct_sft"])
    assert new["high"] >= 0 and new["gain"] > -0.1 and distill["new_skill_greedy_distilled"] >= 0.9
    assert distill["heldout_greedy_distilled"] > distill["heldout_greedy_sft"] and distill["eval_samples"] >= 8
    compress = distill["compress"]  # a rank-4 student of a rank-32 RL teacher: the KL falls
    assert compress["teacher_kl_last_fifth"] < compress["teacher_kl_first_fifth"]
    assert compress["heldout_correct_teacher"] > compress["heldout_correct_base"]
    loop = results["continual_loop"]  # three batches, three iterations; the first teaches what the base lacks
    assert loop["iterations"] == 3 and loop["decisions"][0] == "promoted" and loop["promoted"] >= 1
    assert loop["heldout_candidate"][0] > loop["heldout_champion"][0] and loop["heldout_low"][0] > 0
    bench = loop["benchmark"]  # the continual-learning benchmark's receipt it plotted: five skills, every strategy
    assert bench["skills"] >= 5 and set(bench["strategies"]) == {"default", "new", "distill", "joint"}
    assert (REPO / "benchmarks" / "receipts" / bench["receipt"]).is_file()
    assert sum(bench["decisions"].values()) == 7 and len(bench["targets"]) == 4  # 5 skills, 2 bad candidates
    assert bench["targets"]["every bad candidate is rejected"]
    served = results["served_loop"]  # the endpoint's traffic, corrected by its user, became the next champion
    before, new, again = (served["phases"][k] for k in ("before (asked)", "after (not asked before)",
                                                         "after (asked again)"))
    assert served["decisions"] == ["promoted"] and before["weights"] == ["base"]
    assert new["champion_iterations"] == again["champion_iterations"] == [1] and new["weights"][0].startswith("tinker://")
    assert new["low"] > before["high"] and again["low"] > before["high"]  # beyond both Wilson intervals
    gained = [x for x in served["slices"][0] if x["low"] > 0]  # the gate's per-slice line that promoted it
    assert gained and all(x["new"] and x["n"] >= 7 for x in gained)
