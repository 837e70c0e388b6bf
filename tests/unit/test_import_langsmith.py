"""LangSmith run exports: llm runs in every shape, other runs counted, feedback attached and filtered."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.import_cmd import Run, langsmith
from rlcli.data.importers import Feedback, from_langsmith
from rlcli.data.messages import Options
from rlcli.errors import UsageError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def lc(cls, **kwargs):
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", cls], "kwargs": kwargs}


def llm_run(run_id, inputs, outputs, **extra):
    return {"id": run_id, "run_type": "llm", "inputs": inputs, "outputs": outputs, "error": None, **extra}


def feedback(run_id, score, key="user_score", **extra):
    return {"id": f"fb-{run_id}-{key}", "run_id": run_id, "key": key, "score": score, **extra}


def convert(records, min_score=None, feedback_file=None, strict=False):
    """Run the LangSmith pass over records as lines; (written conversations, stats)."""
    out: list[bytes] = []
    run = Run(strict=strict)
    langsmith(run, [json.dumps(r).encode() + b"\n" for r in records], out.append, min_score, feedback_file)
    return [json.loads(line) for line in out], run.stats


LC_RUN = llm_run(
    "r1",
    {"messages": [[lc("SystemMessage", content="sys"), lc("HumanMessage", content="2+2?")]]},
    {"generations": [[{"text": "4", "message": lc("AIMessage", content="4")}]]},
    extra={"invocation_params": {"tools": [{"function": {"name": "calc"}}]}},
)


def test_langchain_run_with_nested_messages_generations_and_tools():
    conv = from_langsmith(LC_RUN, Counter())
    assert conv["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert conv["tools"][0]["function"]["name"] == "calc" and conv["run_id"] == "r1"


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            {"choices": [{"message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}]},
        ),
        (
            {"system": "s", "messages": [{"role": "user", "content": "hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "yo"}], "stop_reason": "x"},
        ),
        ({"prompts": ["hi"]}, {"generations": [[{"text": "yo"}]]}),
        (
            {"messages": [[{"type": "human", "data": {"content": "hi"}}]]},
            {"generations": [{"text": "yo", "message": {"type": "ai", "data": {"content": "yo"}}}]},
        ),
    ],
    ids=["openai-wrapper", "anthropic-wrapper", "completion", "langchain-dict"],
)
def test_llm_run_shapes(inputs, outputs):
    conv = from_langsmith(llm_run("r", inputs, outputs), Counter())
    assert conv["messages"][-1] == {"role": "assistant", "content": "yo"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"id": "c", "run_type": "chain", "inputs": {}, "outputs": {}}, "non_llm_run"),
        ({"id": "t", "run_type": "tool", "inputs": {}, "outputs": {}}, "non_llm_run"),
        (llm_run("e", {"messages": [{"role": "user", "content": "x"}]}, None, error="RateLimit"), "run_error"),
        (
            llm_run(
                "l",
                {"prompts": ["x"]},
                {"generations": [[{"text": "y", "generation_info": {"finish_reason": "length"}}]]},
            ),
            "truncated",
        ),
        ({"name": "not a run"}, "unrecognized"),
        ({"run_id": "r1", "key": 5}, "bad_feedback"),
    ],
)
def test_drop_reasons(record, reason):
    assert from_langsmith(record, Counter()) == reason


def test_feedback_records_are_recognized():
    fb = from_langsmith(feedback("r1", True, comment="good", correction={"output": "4"}), Counter())
    assert fb == Feedback("r1", {"key": "user_score", "score": 1.0, "comment": "good", "correction": '{"output":"4"}'})


def test_feedback_before_or_after_its_run_is_attached_with_the_mean_score():
    written, stats = convert([feedback("r1", 1), LC_RUN, feedback("r1", 0.5, key="expert")])
    assert written[0]["score"] == 0.75
    assert [f["key"] for f in written[0]["feedback"]] == ["user_score", "expert"]
    assert (stats.read, stats.written, stats.attached, stats.dropped.total()) == (3, 1, 2, 0)


def test_min_score_filters_and_runs_without_score_are_dropped_as_no_score():
    run2 = {**LC_RUN, "id": "r2"}
    run3 = {**LC_RUN, "id": "r3"}  # feedback without a numeric score
    run4 = {**LC_RUN, "id": "r4"}  # no feedback at all
    written, stats = convert(
        [LC_RUN, run2, run3, run4, feedback("r1", 0.9), feedback("r2", 0.1), feedback("r3", None, value="meh")],
        min_score=0.5,
    )
    assert [c["run_id"] for c in written] == ["r1"]
    assert stats.dropped == Counter(below_min_score=1, no_score=2)


def test_separate_feedback_file_and_unmatched_feedback(tmp_path):
    fb_file = tmp_path / "feedback.jsonl"
    fb_file.write_text(json.dumps(feedback("r1", 0.2)) + "\n" + json.dumps(feedback("ghost", 1)) + "\n")
    written, stats = convert([LC_RUN], feedback_file=str(fb_file))
    assert written[0]["score"] == 0.2
    assert stats.dropped == Counter(feedback_unmatched=1)
    assert stats.read == stats.written + stats.attached + stats.dropped.total() == 3


def test_strict_names_the_line_of_a_late_drop():
    with pytest.raises(UsageError, match=r"^line 2: record dropped \(below_min_score\)"):
        convert([{**LC_RUN, "id": "ok"}, LC_RUN, feedback("ok", 1), feedback("r1", 0)], min_score=0.5, strict=True)


def test_fixture_file_accounting():
    lines = (FIXTURES / "langsmith.jsonl").read_bytes().splitlines(keepends=True)
    out: list[bytes] = []
    run = Run()
    langsmith(run, lines, out.append, None, str(FIXTURES / "langsmith_feedback.jsonl"))
    stats = run.stats
    assert stats.written == 3 == len(out)
    assert stats.dropped == Counter(non_llm_run=2, run_error=1, feedback_unmatched=1)
    assert stats.read == stats.written + stats.attached + stats.dropped.total() == 13


def test_feedback_on_the_trace_root_scores_its_llm_runs():
    root = {"id": "root", "trace_id": "root", "run_type": "chain", "inputs": {}, "outputs": {}}
    child = {**LC_RUN, "id": "child", "trace_id": "root"}
    written, stats = convert([root, child, feedback("root", 1), feedback("child", 0.5, key="judge")])
    assert written[0]["trace_id"] == "root" and written[0]["score"] == 0.75
    assert stats.attached == 2 and stats.dropped == Counter(non_llm_run=1)


def test_redact_reaches_feedback_comments_and_corrections():
    out: list[bytes] = []
    run = Run(Options(redact=True))
    fb = feedback("r1", 1, comment="mail bob@x.io", correction={"answer": "call\n415-555-0132"})
    langsmith(run, [json.dumps(r).encode() for r in (LC_RUN, fb)], out.append)
    entry = json.loads(out[0])["feedback"][0]
    assert entry["comment"] == "mail <EMAIL>" and json.loads(entry["correction"]) == {"answer": "call\n<PHONE>"}
