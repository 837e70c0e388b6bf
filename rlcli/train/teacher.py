"""The teacher of `rlcli train distill`: which model it is, checked before any model is made, and its client.

Kinds (--teacher, or --teacher-url):
- base: the server's base model, sampled with create_sampling_client(base_model=...) only. SkyRL
  answers 400 when a request names both base_model and model_path (the cookbook's distillation main
  sends both for a checkpoint teacher), so rlcli builds its teacher clients itself and names one.
- state: a training state (tinker://M/weights/NAME, or a run folder's newest saved state) re-created
  into a LoRA slot of its own, saved for the sampler once and never trained.
- a sampler checkpoint (tinker://M/sampler_weights/NAME) is never sampled directly: SkyRL loads a
  sampler checkpoint into its training model's own slot, so sampling one of a model that is still
  training overwrites that model's live weights (docs/decisions.md). rlcli takes the training
  state saved under the same name instead (runs save both), or refuses in one line.
- url: the base model of a second server; its tokenizer must agree with the student's (vocabulary,
  special tokens, chat template), checked before any compute.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.client import parse_tinker_path, server_base_model, training_run
from rlcli.errors import RlcliError, UsageError


@dataclass(frozen=True)
class Teacher:
    kind: str  # base | state | url
    source: str  # what was asked for, as given
    path: str | None = None  # state: the training state re-created for the teacher
    url: str | None = None  # the server the teacher runs on
    model: str = ""  # its base model

    def describe(self) -> str:
        if self.kind == "base":
            return f"the served base model {self.model}"
        if self.kind == "state":
            return f"{self.path} (re-created in a LoRA slot of its own, never trained)"
        return f"the base model {self.model} of the server at {self.url}"


def state_of(source: str) -> str:
    """The training state a --teacher run folder or tinker:// path names (see the module docstring)."""
    if not source.startswith("tinker://"):
        from rlcli.train.folder import last_checkpoint

        folder = Path(source).expanduser()
        last = last_checkpoint(folder, "state_path") if folder.is_dir() else None
        if not last:
            raise UsageError(f"--teacher {source}: not base, a tinker:// path, nor a run folder whose "
                             "checkpoints.jsonl lists a saved state")
        return last["state_path"]
    run_id, kind, name = parse_tinker_path(source)
    return f"tinker://{run_id}/weights/{name}"  # a sampler checkpoint: the state saved under its name


def resolve(teacher: str | None, teacher_url: str | None, url: str, student_model: str, dry_run: bool) -> Teacher:
    """The teacher the flags name, checked against the servers; nothing is created."""
    if teacher_url:
        if teacher not in (None, "base"):
            raise UsageError("--teacher-url serves its own base model as the teacher: drop --teacher")
        return remote(teacher_url.rstrip("/"), student_model)
    if not teacher:
        raise UsageError("pass --teacher base, a run folder, tinker://RUN/weights/NAME, or --teacher-url URL")
    if teacher == "base":
        return Teacher("base", teacher, url=url, model=student_model)
    path = state_of(teacher)
    if path != teacher and teacher.startswith("tinker://"):
        print(f"rlcli: --teacher {teacher} is a sampler checkpoint: sampling it would load it into its training "
              f"model's slot; the teacher is its training state {path} instead", file=sys.stderr)
    if not dry_run:
        run = training_run(url, parse_tinker_path(path)[0])
        if run.get("base_model") not in (None, student_model):
            raise UsageError(f"--teacher {teacher} was trained on {run['base_model']!r}, not this server's "
                             f"{student_model!r}: serve it on a second server and pass --teacher-url")
    return Teacher("state", teacher, path=path, url=url, model=student_model)


def remote(teacher_url: str, student_model: str) -> Teacher:
    try:
        model = server_base_model(teacher_url)
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise RlcliError(f"cannot reach the teacher's server at {teacher_url} ({e}): start it with "
                         "`rlcli serve start --name teacher --port 8001 --base-model DIR`") from None
    if problem := tokenizer_mismatch(student_model, model):
        raise UsageError(f"the teacher at {teacher_url} ({model}) cannot grade the student's tokens: {problem}; "
                         "distill from a teacher with the student's tokenizer")
    return Teacher("url", teacher_url, url=teacher_url, model=model)


def tokenizer_facts(tokenizer: Any) -> dict[str, Any]:
    return {"vocabulary": tokenizer.get_vocab(),
            "special tokens": sorted(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True)),
            "chat template": getattr(tokenizer, "chat_template", None)}


def tokenizer_mismatch(student: str, teacher: str) -> str | None:
    """What differs between the two models' tokenizers (the first of vocabulary, special tokens, chat
    template), or None; a tokenizer that cannot be loaded here is a mismatch that cannot be ruled out."""
    from rlcli.sample import load_tokenizer

    if student == teacher:
        return None
    facts = []
    for name in (student, teacher):
        try:
            facts.append(tokenizer_facts(load_tokenizer(name)))
        except (OSError, ValueError, UsageError) as e:
            return f"cannot load the tokenizer of {name} here to compare ({type(e).__name__})"
    for what in facts[0]:
        if facts[0][what] != facts[1][what]:
            return f"their {what} differ"
    return None


async def sampling_client(teacher: Teacher, service: Any) -> Any:
    """The teacher's sampling client; a state teacher first gets its own training client (its slot)."""
    import tinker

    if teacher.kind == "url":
        return await tinker.ServiceClient(base_url=teacher.url).create_sampling_client(base_model=teacher.model)
    if teacher.kind == "base":
        return await service.create_sampling_client(base_model=teacher.model)
    try:
        trainer = await service.create_training_client_from_state(teacher.path)
    except tinker.APIStatusError as e:
        raise UsageError(f"--teacher {teacher.source}: the server has no training state {teacher.path} "
                         f"({e.status_code}): `rlcli checkpoint list` shows the saved ones") from None
    return await trainer.save_weights_and_get_sampling_client()
