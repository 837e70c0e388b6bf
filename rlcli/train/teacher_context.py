"""`rlcli train distill --teacher-context answer`: self-distillation, the teacher sees the logged answer.

The student samples from its plain prompt and is trained on it; the teacher's logprobs of the same
sampled tokens are computed on another prompt: the same conversation with the logged answer added to
its last user turn (`with_answer`). The student thus learns to answer as the model does when it
knows the answer. Each prompt's environment registers its teacher prompt with `ContextTeacher` when
it is first observed; the teacher client then swaps the student's prompt for the teacher's before
compute_logprobs and gives back logprobs aligned with the student's tokens. Every distinct teacher
prompt is written once, as text, to the run folder's teacher_prompts.jsonl (what the teacher saw).

Where two problems share a prompt but not an answer, the teacher sees the answer registered last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from rlcli.errors import UsageError

TeacherContext = Literal["none", "answer"]
RECORD_FILE = "teacher_prompts.jsonl"
NOTE = "\n\n(For reference, a correct answer is: {answer})"


def check(context: str, prompts: str) -> None:
    """Refuse `answer` for prompts that carry no logged answer (the choice itself: DistillOptions)."""
    if context == "answer" and prompts == "arithmetic":
        raise UsageError("--teacher-context answer needs prompts with logged answers (a FILE.jsonl of "
                         "{question, answer} or `rlcli import` conversations, or gsm8k); arithmetic's are "
                         "generated: drop --teacher-context or pass a file")


def with_answer(messages: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """The conversation with `answer` noted at the end of its last user turn (a copy; the input is kept)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user"), None)
    if last is None:
        raise ValueError("the prompt has no user turn to note the answer in")
    note = NOTE.format(answer=answer.strip())
    content = messages[last]["content"]
    if isinstance(content, str):
        content = content + note
    else:
        content = [*content, {"type": "text", "text": note}]
    return [*messages[:last], {**messages[last], "content": content}, *messages[last + 1:]]


def env_prompt(env: Any) -> tuple[list[dict[str, Any]], str]:
    """(the conversation the env prompts with, its logged answer): replay traces or a problem env."""
    problem = getattr(env, "problem", None)
    if problem is not None and hasattr(problem, "prompt") and hasattr(problem, "text"):  # rlcli.problems.traces
        from rlcli.problems.replay import renderer_messages

        return list(renderer_messages(problem.prompt)), problem.text
    if hasattr(env, "get_question") and hasattr(env, "get_reference_answer"):  # the cookbook's ProblemEnv
        convo = list(env.convo_prefix or []) + [{"role": "user", "content": env.get_question()}]
        return convo, str(env.get_reference_answer())
    raise UsageError(f"--teacher-context answer: {type(env).__name__} prompts carry no answer: drop the flag")


class ContextTeacher:
    """A teacher sampling client that scores the student's tokens after the teacher's own prompt."""

    def __init__(self, client: Any, folder: str | Path | None):
        self.client = client
        self.prompts: dict[tuple[int, ...], list[int]] = {}
        self.lengths: set[int] = set()
        self.record = Path(folder) / RECORD_FILE if folder else None

    def register(self, env: Any, student_prompt: Any) -> None:
        messages, answer = env_prompt(env)
        tokens = env.renderer.build_generation_prompt(with_answer(messages, answer)).to_ints()
        key = tuple(student_prompt.to_ints())
        if self.prompts.get(key) == tokens:
            return
        self.prompts[key] = tokens
        self.lengths.add(len(key))
        if self.record is not None:
            decode = env.renderer.tokenizer.decode
            line = json.dumps({"student_prompt": decode(list(key)), "teacher_prompt": decode(tokens),
                               "answer": answer}, ensure_ascii=False)
            fd = os.open(self.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def teacher_sequence(self, ints: list[int]) -> tuple[list[int], int, int]:
        """(the teacher's sequence, the student prompt's length, the teacher prompt's length)."""
        for length in sorted(self.lengths, reverse=True):
            if (found := self.prompts.get(tuple(ints[:length]))) is not None:
                return found + ints[length:], length, len(found)
        raise RuntimeError("--teacher-context answer: a sequence whose prompt was never registered")

    async def compute_logprobs_async(self, sequence: Any) -> list[float | None]:
        """Hosted Tinker's shape for the student's sequence (len N, the first None); prompt positions 0.0."""
        import tinker

        ints = sequence.to_ints()
        full, student_len, teacher_len = self.teacher_sequence(ints)
        found = await self.client.compute_logprobs_async(tinker.ModelInput.from_ints(full))
        return [None] + [0.0] * (student_len - 1) + list(found[teacher_len:])
