"""`train distill --teacher-context answer` and `--prompts TRACES.jsonl` without a server: the teacher's
prompt, the logprobs it gives back aligned with the student's tokens, and traces as prompts in the plan.
tests/integration/test_distill.py runs both against the real server."""

from __future__ import annotations

import asyncio
import json
import stat

import pytest

from rlcli.errors import UsageError
from rlcli.problems import traces
from rlcli.train import distill
from rlcli.train.teacher_context import RECORD_FILE, ContextTeacher, check, with_answer
from tests.unit.test_distill_unit import DEAD_URL, fake_server  # noqa: F401 (a fixture)


def test_the_answer_goes_into_the_last_user_turn_only():
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "What is 2 + 3?"}]
    before = json.dumps(convo)
    got = with_answer(convo, " 5\n")
    assert json.dumps(convo) == before  # the student's prompt is untouched
    assert got[:3] == convo[:3] and got[3]["role"] == "user"
    assert got[3]["content"].startswith("What is 2 + 3?") and got[3]["content"].endswith("a correct answer is: 5)")
    parts = [{"type": "text", "text": "Name it"}]
    assert with_answer([{"role": "user", "content": parts}], "Paris")[0]["content"][-1]["text"].endswith("Paris)")
    with pytest.raises(ValueError, match="no user turn"):
        with_answer([{"role": "system", "content": "x"}], "5")


def test_refusals():
    check("none", "arithmetic")
    check("answer", "problems.jsonl")
    with pytest.raises(UsageError, match="arithmetic's are generated"):
        check("answer", "arithmetic")
    with pytest.raises(UsageError, match="--teacher-context both: choose from none, answer"):
        distill.DistillOptions(prompts="problems.jsonl", teacher="base", teacher_context="both")


class Tokens:
    def __init__(self, ints):
        self.ints = list(ints)

    def to_ints(self):
        return self.ints


class Renderer:
    """Each character a token: the teacher's prompt is longer than the student's by the note."""

    class tokenizer:  # noqa: N801
        @staticmethod
        def decode(ints):
            return "".join(map(chr, ints))

    def build_generation_prompt(self, messages):
        return Tokens(ord(c) for m in messages for c in f"<{m['role']}>{m['content']}")


class Env:
    def __init__(self, question, answer):
        self.convo_prefix, self.renderer, self.q, self.a = [], Renderer(), question, answer

    def get_question(self):
        return self.q

    def get_reference_answer(self):
        return self.a


class Client:
    """Hosted shape: logprob of token i is -(token value) / 1000, the first None."""

    def __init__(self):
        self.asked = []

    async def compute_logprobs_async(self, seq):
        self.asked.append(seq.to_ints())
        return [None] + [-t / 1000 for t in seq.to_ints()[1:]]


def test_the_teacher_scores_the_students_tokens_after_its_own_prompt(tmp_path):
    import tinker

    env, client = Env("2+3?", "5"), Client()
    teacher = ContextTeacher(client, tmp_path)
    student_prompt = env.renderer.build_generation_prompt([{"role": "user", "content": "2+3?"}])
    teacher.register(env, student_prompt)
    teacher.register(env, student_prompt)  # a group's second sample: recorded once
    completion = [ord(c) for c in "It is 5"]
    sequence = tinker.ModelInput.from_ints(student_prompt.to_ints() + completion)
    got = asyncio.run(teacher.compute_logprobs_async(sequence))
    assert len(got) == sequence.length and got[0] is None
    assert got[len(student_prompt.ints):] == [-t / 1000 for t in completion]  # the completion's, in order
    asked = "".join(map(chr, client.asked[0]))
    assert asked == "<user>2+3?\n\n(For reference, a correct answer is: 5)It is 5"
    rows = [json.loads(line) for line in (tmp_path / RECORD_FILE).read_text().splitlines()]
    assert len(rows) == 1 and "correct answer is: 5" in rows[0]["teacher_prompt"]
    assert "5" not in rows[0]["student_prompt"] and rows[0]["answer"] == "5"
    assert stat.S_IMODE((tmp_path / RECORD_FILE).stat().st_mode) & 0o077 == 0
    with pytest.raises(RuntimeError, match="never registered"):
        asyncio.run(teacher.compute_logprobs_async(tinker.ModelInput.from_ints([1, 2, 3])))


def conversations(path, n=12):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                                     {"role": "assistant", "content": str(i + 1)}]}) + "\n"
                            for i in range(n)))
    return path


def test_import_output_is_read_as_prompts_with_answers(fake_server, embedded_model, tmp_path, capsys):  # noqa: F811
    data = conversations(tmp_path / "traces.jsonl")
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    assert traces.is_traces_file(str(data)) and not traces.is_traces_file(str(qa))
    assert not traces.is_traces_file(str(tmp_path / "missing.jsonl"))
    assert distill.train_distill(distill.DistillOptions(
        prompts=str(data), teacher="base", base_url=DEAD_URL, model=embedded_model, batch_size=2, group_size=2,
        eval_size=2, teacher_context="answer", log_path=str(tmp_path / "run"), dry_run=True)) is None
    out = capsys.readouterr().out
    assert f"replay traces {data}" in out and "10 prompts, 5 batches of 2; 2 held-out prompts" in out
    assert "its prompt also shows the logged answer" in out
    with pytest.raises(UsageError, match="holds conversations"):
        distill.train_distill(distill.DistillOptions(prompts=str(data), teacher="base", base_url=DEAD_URL,
                                                     model=embedded_model, grader="exact",
                                                     log_path=str(tmp_path / "run2"), dry_run=True))
