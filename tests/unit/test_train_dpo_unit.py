"""Fast tests of `rlcli train dpo`'s pieces: the pair reader, its counts and errors, the plan, the progress line.
No server: the real-server run is tests/integration/test_train_dpo.py."""

from __future__ import annotations

import io
import json

import pytest

from rlcli.errors import UsageError
from rlcli.train import dpo
from tests.conftest import run_rlcli

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]


def pair(chosen: str = "4", rejected: str = "5", prompt: list | None = None) -> dict:
    return {"messages": PROMPT if prompt is None else prompt, "chosen": {"role": "assistant", "content": chosen},
            "rejected": {"role": "assistant", "content": rejected}}


def lines(*records: object) -> io.StringIO:
    return io.StringIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_pairs_are_kept_and_same_or_repeated_ones_dropped_and_counted():
    read = dpo.read_pairs("-", stdin=lines(pair(), "", pair("4", "4"), pair(), pair("four", "5"), {**pair(), "id": 7}))
    assert [r["chosen"]["content"] for r in read.records] == ["4", "four"]
    assert read.lines == [1, 5] and read.read == 5
    assert read.dropped == {"chosen same as rejected": 1, "repeated": 2}  # a pair's other keys are not its own
    assert read.count() == "5 lines read, 2 pairs kept, 3 dropped (1 chosen same as rejected, 2 repeated)"
    assert set(read.records[0]) == {"messages", "chosen", "rejected"}


@pytest.mark.parametrize(("bad", "says"), [
    ("{not json", "not valid JSON"),
    ({"messages": PROMPT, "chosen": {"role": "assistant", "content": "4"}}, '"rejected"'),
    ({"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}, '{"messages": [...'),
    (pair(prompt=[]), "the prompt (messages) is empty"),
    (pair(prompt=[{"role": "wizard", "content": "x"}]), "role 'wizard'"),
    (pair(prompt=[*PROMPT, {"role": "assistant", "content": "4"}]), "the prompt's last turn is 'assistant'"),
    ({**pair(), "chosen": {"role": "user", "content": "4"}}, 'chosen must be {"role": "assistant"'),
    ({**pair(), "rejected": "5"}, 'rejected must be {"role": "assistant"'),
    ({**pair(), "rejected": {"role": "assistant", "content": None}}, "rejected must be"),
])
def test_the_first_bad_line_is_one_line_with_its_number(bad, says):
    with pytest.raises(UsageError) as e:
        dpo.read_pairs("-", stdin=lines(pair(), "", bad, pair("x")))
    assert str(e.value).startswith("stdin line 3: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_no_usable_pair_is_an_error_that_counts_what_was_read():
    with pytest.raises(UsageError, match="stdin is empty"):
        dpo.read_pairs("-", stdin=lines("", ""))
    with pytest.raises(UsageError, match=r"no usable pair \(2 lines read, 2 dropped\)"):
        dpo.read_pairs("-", stdin=lines(pair("a", "a"), pair("b", "b")))


def test_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(UsageError, match="no pairs file at"):
        dpo.read_pairs(str(tmp_path / "none.jsonl"))


def test_each_pair_renders_as_its_two_conversations():
    assert dpo.conversations([pair()]) == [{"messages": [*PROMPT, {"role": "assistant", "content": "4"}]},
                                           {"messages": [*PROMPT, {"role": "assistant", "content": "5"}]}]


def test_bad_numbers_and_no_dataset_name_their_flag():
    with pytest.raises(UsageError, match="--beta must be positive"):
        dpo.DpoOptions(dataset="-", beta=0.0)
    with pytest.raises(UsageError, match="pass --dataset FILE"):
        dpo.DpoOptions()


def test_progress_is_one_dense_line_per_step():
    progress = dpo.DpoProgress(total_steps=6, stream=io.StringIO())
    progress.log_metrics({"epoch": 0, "learning_rate": 5e-4}, step=0)  # no loss: no step row
    progress.log_metrics({"dpo_loss": 0.5853, "accuracy": 1.0, "margin": 0.229, "epoch": 1, "learning_rate": 4e-4},
                         step=1)
    out = progress.stream.getvalue().splitlines()
    assert len(out) == 1
    assert out[0].startswith("step 2/6  epoch 1  loss 0.5853  accuracy 1.00  margin 0.229  lr 4.00e-04")


def test_a_bad_pairs_file_stops_the_command_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "pairs.jsonl"
    bad = pair(prompt=[{"role": "assistant", "content": "hi"}])
    path.write_text(json.dumps(pair()) + "\n" + json.dumps(bad) + "\n")
    proc = run_rlcli("train", "dpo", "--dataset", str(path), "--base-url", "http://127.0.0.1:9", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"rlcli: error: {path} line 2: the prompt's last turn is 'assistant'; "
                                                "it must end with the user turn both answers reply to; fix it (one "
                                                f"pair per line: {dpo.SHAPE})"]
