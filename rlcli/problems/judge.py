"""`--reward judge`: a judge model ranks a group's replies against the logged reply (and a rubric), RULER-style.

The judge sees one problem's prompt, the logged reply as a reference, the rubric's checks if any, and
the group's replies, and returns a score in 0..1 for each: relative within the group, which is what
group-normalised advantages use. The prompt is a versioned template shipped in the package
(rlcli/problems/judge_prompt_v1.txt); a change of wording is a new version, never an edit.

- Judges: a model on a Tinker server (the training server's base model, tinker:// sampler weights,
  or another server with --judge-url), or any OpenAI-compatible endpoint (POST URL/chat/completions).
- Redaction: the text sent is redacted (rlcli.data.redact) first, whatever the traces were imported with.
- Cache: each answer is kept under the SHA-256 of (template version, judge, request) in
  RLCLI_HOME/judge-cache/, so a rerun asks nothing twice.
- Failure (no answer, unparseable, wrong count): the group is counted in `judge/failed` and gets no
  advantage (every reply the same reward), never a silent 0 for some of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcli.data.redact import redact_text

TEMPLATE_VERSION = "v1"
JUDGE_TIMEOUT_S = 120.0
JUDGE_MAX_TOKENS = 256


def template(version: str = TEMPLATE_VERSION) -> str:
    return (Path(__file__).parent / f"judge_prompt_{version}.txt").read_text(encoding="utf-8")


def render(prompt: list[dict[str, Any]], reference: str, replies: list[str], checks: list[dict[str, Any]]) -> str:
    """The judge's request text, redacted."""
    conversation = "\n".join(f"[{m['role']}] {m['content'] if isinstance(m['content'], str) else ''}"
                             for m in prompt)
    rubric = "\n".join(f"- {c['check']}: {json.dumps(c.get('value'))} (weight {c['weight']:g})"
                       for c in checks) or "- (none: judge correctness and helpfulness against the reference)"
    answers = "\n".join(f"<reply id={i + 1}>\n{r}\n</reply>" for i, r in enumerate(replies))
    text = template().format(conversation=conversation, reference=reference, rubric=rubric, replies=answers,
                             count=len(replies))
    return redact_text(text)


def parse_scores(text: str, count: int) -> list[float] | None:
    """The judge's scores: the last JSON object {"scores": [...]} in its answer, count of them in 0..1."""
    for found in reversed(list(re.finditer(r"\{[^{}]*\}", text, re.DOTALL))):
        try:
            scores = json.loads(found.group()).get("scores")
        except (ValueError, AttributeError):
            continue
        if (isinstance(scores, list) and len(scores) == count
                and all(isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s <= 1 for s in scores)):
            return [float(s) for s in scores]
        return None
    return None


class Cache:
    """Judge answers on disk, one file per request hash (private: they hold user text)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def key(self, judge: str, request: str) -> str:
        return hashlib.sha256(json.dumps([TEMPLATE_VERSION, judge, request]).encode()).hexdigest()

    def get(self, key: str) -> list[float] | None:
        path = self.folder / f"{key}.json"
        return json.loads(path.read_text())["scores"] if path.exists() else None

    def put(self, key: str, scores: list[float]) -> None:
        from rlcli.files import staged_file

        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with staged_file(self.folder / f"{key}.json", shared=False) as f:
            f.write(json.dumps({"scores": scores}).encode())


def openai_ask(url: str, model: str, text: str) -> str:
    """One chat completion from an OpenAI-compatible endpoint (temperature 0)."""
    from rlcli.client import request_json

    body = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": JUDGE_MAX_TOKENS}
    key = os.environ.get("OPENAI_API_KEY")  # sent only when set: a local endpoint needs none
    answer = request_json(url.rstrip("/") + "/chat/completions", body, timeout=JUDGE_TIMEOUT_S,
                          headers={"Authorization": f"Bearer {key}"} if key else None)
    return answer["choices"][0]["message"]["content"]


def tinker_asker(checkpoint: str | None, url: str | None) -> Any:
    """A function text -> answer over a sampler of the judge model on a Tinker server (greedy)."""
    import atexit

    from rlcli import sample
    from rlcli.slot_wait import BACKGROUND_WAIT_S

    # Serving an unloaded judge checkpoint again may wait for a slot: the training run asking it is not urgent.
    s = sample.open_sampler(checkpoint, None, url, None, JUDGE_MAX_TOKENS, 0.0, 0, slot_wait_s=BACKGROUND_WAIT_S)
    # The judge lives as long as the training run that asks it; a model loaded to serve an unloaded
    # checkpoint (sample._reload) is freed when the run's process ends, as `rlcli sample` frees its own.
    atexit.register(sample.close, s)
    return lambda text: sample.complete(s, [{"role": "user", "content": text}])[0]


@dataclass
class Judge:
    """Scores groups; counts what it asked, what the cache answered and what failed."""

    name: str
    ask: Any  # text -> answer text (blocking)
    cache: Cache
    rubric: Any = None  # rlcli.problems.rewards.Rubric
    counts: dict[str, int] = field(default_factory=lambda: {"asked": 0, "cached": 0, "failed": 0})

    @classmethod
    def from_settings(cls, settings: dict[str, Any], rubric: Any = None, home: Path | None = None) -> Judge:
        from rlcli.config import rlcli_home

        cache = Cache((home or rlcli_home()) / "judge-cache")
        if settings["kind"] == "openai":
            url, model = settings["url"], settings["model"]
            return cls(f"openai:{url}:{model}", lambda text: openai_ask(url, model, text), cache, rubric)
        ask = tinker_asker(settings.get("checkpoint"), settings.get("url"))
        return cls(f"tinker:{settings.get('url') or ''}:{settings.get('checkpoint') or 'base'}", ask, cache, rubric)

    def scores(self, prompt: list[dict[str, Any]], reference: str, replies: list[str],
               checks: list[dict[str, Any]]) -> list[float] | None:
        """The judge's scores for the replies (cached), or None when it gave none usable."""
        text = render(prompt, reference, replies, checks)
        key = self.cache.key(self.name, text)
        if (hit := self.cache.get(key)) is not None:
            self.counts["cached"] += 1
            return hit
        self.counts["asked"] += 1
        try:
            found = parse_scores(self.ask(text), len(replies))
        except Exception:  # an unreachable or refusing judge is a failed judgment, counted like a bad answer
            found = None
        if found is None:
            self.counts["failed"] += 1
            return None
        self.cache.put(key, found)
        return found

    async def group_rewards(self, envs: list[Any]) -> list[tuple[float, dict[str, float]]]:
        """For a group of ReplayEnvs (rlcli.problems.replay) after their step: (reward, metrics) each."""
        problem = envs[0].problem
        checks = self.rubric.checks_for(problem.trace_id, problem.source) if self.rubric else []
        replies = [e.reply for e in envs]
        found = await asyncio.to_thread(self.scores, problem.prompt, problem.text, replies, checks)
        if found is None:
            return [(0.0, {"judge/failed": 1.0}) for _ in envs]
        # An empty reply or an echo of the prompt earns nothing whatever the judge says.
        from rlcli.problems.rewards import is_echo

        return [(0.0 if not r.strip() or is_echo(r, problem.last_user()) else s,
                 {"judge/failed": 0.0, "reward/judge": s}) for r, s in zip(replies, found, strict=True)]
