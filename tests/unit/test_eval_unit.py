"""`rlcli eval` and `--max-operand` without a server: flag checks, checkpoint lookup, the held-out draw."""

from __future__ import annotations

import json

import pytest

from rlcli import evaluate
from rlcli.errors import UsageError
from rlcli.model import pretrain as model_pretrain
from rlcli.problems import heldout
from rlcli.train import rl
from tests.conftest import run_rlcli


@pytest.mark.parametrize("args, message", [
    (dict(samples=0, temperature=1.0, max_tokens=8, eval_size=None), "--samples must be at least 1"),
    (dict(samples=1, temperature=-1.0, max_tokens=8, eval_size=None), "--temperature must be 0"),
    (dict(samples=4, temperature=0.0, max_tokens=8, eval_size=None), "needs --temperature above 0"),
    (dict(samples=1, temperature=0.0, max_tokens=8, eval_size=0), "--eval-size must be at least 1"),
    (dict(samples=1, temperature=0.0, max_tokens=0, eval_size=None), "--max-tokens must be at least 1"),
    (dict(samples=1, temperature=0.0, max_tokens=8, eval_size=None, reward="judge"), "--reward judge ranks"),
])
def test_bad_numbers_are_refused(args, message):
    with pytest.raises(UsageError, match=message):
        evaluate.EvalOptions(**args)


def test_checkpoint_from_a_run_folder(tmp_path):
    rows = [{"name": "000005", "state_path": "tinker://m/weights/000005"},
            {"name": "final", "state_path": "tinker://m/weights/final", "sampler_path": "tinker://m/sampler_weights/final"}]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert evaluate.sampler_path(str(tmp_path)) == "tinker://m/sampler_weights/final"
    assert evaluate.sampler_path("tinker://x/sampler_weights/1") == "tinker://x/sampler_weights/1"
    (tmp_path / "checkpoints.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(UsageError, match="lists no sampler weights"):
        evaluate.sampler_path(str(tmp_path))
    with pytest.raises(UsageError, match="neither a tinker:// path nor a run folder"):
        evaluate.sampler_path(str(tmp_path / "missing"))


def test_summarize_averages_rounds():
    rounds = [{evaluate.CORRECT: 0.5, evaluate.REWARD: 0.4}, {evaluate.CORRECT: 1.0, evaluate.REWARD: 0.9}]
    assert evaluate.summarize(rounds) == {"correct": 0.75, "reward": 0.65, "correct_per_round": [0.5, 1.0]}


def test_max_operand_only_for_arithmetic_and_in_range():
    assert rl.choose_dataset("arithmetic", None, "auto", 9) == ("arithmetic", None, "auto")
    with pytest.raises(UsageError, match="--max-operand is for --dataset arithmetic"):
        rl.choose_dataset("gsm8k", None, "auto", 9)
    with pytest.raises(UsageError, match="--max-operand must be 5 to 1000000, got 4 \\(the few-shot example asks"):
        heldout.ProblemSet(dataset="arithmetic", max_operand=4)
    with pytest.raises(UsageError, match="operands 0..9 holds out at most 18"):
        heldout.check_arithmetic(19, 9)
    heldout.check_arithmetic(18, 9)
    heldout.check_arithmetic(1000, 100)  # the cookbook's range keeps its old limit


def test_held_out_pairs_stay_in_range_and_the_default_draw_is_unchanged():
    small = heldout.arithmetic_eval_pairs(18, max_operand=9)
    assert len({heldout.pair_key(*p) for p in small}) == 18 and all(max(p) <= 9 for p in small)
    assert heldout.pair_key(*heldout.FEWSHOT_PAIR) not in {heldout.pair_key(*p) for p in small}
    # The embedded model's pretraining skips these: the default range must draw what it drew before.
    assert heldout.arithmetic_eval_pairs(5) == heldout.arithmetic_eval_pairs(5, max_operand=100)


def test_pretraining_never_shows_a_two_digit_sum_train_rl_can_hold_out():
    held = heldout.arithmetic_eval_pairs(heldout.ARITHMETIC_EVAL_MAX)
    two_digit = [(x, y) for x, y in held if max(x, y) >= 10]
    assert len(two_digit) > 900
    assert all(model_pretrain.is_heldout(x, y) and model_pretrain.is_heldout(y, x) for x, y in two_digit)
    assert not model_pretrain.is_heldout(3, 4)  # one-digit sums are facts: all of them are trained


def test_cli_refuses_bad_flags_in_one_line():
    proc = run_rlcli("eval", "--dataset", "gsm8k", "--max-operand", "9")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "--max-operand is for --dataset arithmetic" in proc.stderr


@pytest.mark.parametrize("command", [("eval",), ("train", "rl")])
@pytest.mark.parametrize("flags, message", [(("--max-operand", "2"), "--max-operand must be 5 to 1000000, got 2"),
                                            (("--max-operand", "9", "--eval-size", "40"), "holds out at most 18")])
def test_arithmetic_flags_fail_before_any_server_is_asked(command, flags, message):
    proc = run_rlcli(*command, "--dataset", "arithmetic", *flags, "--base-url", "http://127.0.0.1:9")
    assert proc.returncode == 2 and message in proc.stderr and "cannot reach" not in proc.stderr, proc.stderr
