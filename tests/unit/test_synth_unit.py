"""`rlcli synth qa`: checkable answers out of traces, every skip counted, and the file train rl reads."""

from __future__ import annotations

import json

import pytest

from rlcli.errors import UsageError
from rlcli.problems import synth, traces
from tests.conftest import REPO, run_rlcli

TRACES = REPO / "tests" / "fixtures" / "traces"


@pytest.mark.parametrize(("reply", "answer", "kind"), [
    ("13 + 14 = 27.", "27", "number"),
    ("1,234", "1234", "number"),
    ("The answer is 4.5.", "4.5", "number"),
    ('{"city": "Paris", "n": 2}', '{"city":"Paris","n":2}', "json"),
    ("```json\n[1, 2]\n```", "[1,2]", "json"),
    ("Paris.", "Paris", "short_text"),
    ("Well, it depends on a great many things, as you will see.", None, "free_text"),
    ("  ", None, "empty_reply"),
])
def test_checkable_answers(reply, answer, kind):
    assert synth.checkable_answer(reply) == (answer, kind)


def test_verdicts_duplicates_and_conflicts_are_skipped_and_counted(tmp_path):
    lines = [({"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}),
             ({"messages": [{"role": "user", "content": "2 +  2?"}, {"role": "assistant", "content": "4"}]}),
             ({"messages": [{"role": "user", "content": "Capital?"}, {"role": "assistant", "content": "Rome"}]}),
             ({"messages": [{"role": "user", "content": "Capital?"}, {"role": "assistant", "content": "Paris"}]}),
             ({"messages": [{"role": "user", "content": "3 + 3?"}, {"role": "assistant", "content": "7"}],
               "score": 0.0})]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    problems, skipped, kinds = synth.synthesize(traces.read_traces(str(path)))
    assert problems == [{"question": "2 + 2?", "answer": "4", "source": "t.jsonl:1"}]
    assert dict(skipped) == {"duplicate": 2, "conflicting_answers": 1, "bad_verdict": 1}
    assert dict(kinds) == {"number": 1}


def test_synth_qa_writes_problems_train_rl_reads(tmp_path):
    out = tmp_path / "qa.jsonl"
    proc = run_rlcli("synth", "qa", str(TRACES / "demo.jsonl"), "-o", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "64 replies -> 63 problems (63 number)" in proc.stderr and "skipped: 1 duplicate" in proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"question": "What is 13 + 14?", "answer": "27", "source": "demo.jsonl:1"}
    from rlcli.problems import envs

    problems = envs.read_problems(str(out))
    assert problems.grader == "numeric" and len(problems.records) == 63


def test_nothing_checkable_is_one_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Tell me a story."},
                                             {"role": "assistant", "content": "Once upon a time, there was a"
                                              " fox who lived in a very deep wood."}]}) + "\n")
    with pytest.raises(UsageError, match="no reply has a checkable final answer .*1 free_text"):
        synth.qa(synth.QaOptions(traces_file=str(path), output=str(tmp_path / "qa.jsonl")))
    with pytest.raises(UsageError, match="pass -o FILE.jsonl"):
        synth.QaOptions(traces_file=str(path))
