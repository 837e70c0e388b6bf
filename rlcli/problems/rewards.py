"""How a reply is scored against a logged one: the `match`, `verdict` and `rubric` rewards of `--env replay`.

Pure and deterministic (no model, no I/O but reading a rubric file), so each reward is unit-tested on
its own and a degenerate policy (an empty reply, the prompt repeated back) is shown not to score well:

- match: the reply agrees with the logged reply, `exact`ly, `normalized` (case, whitespace and
  trailing punctuation ignored), as the `number` each ends with, or as what `regex:PATTERN`
  captures from each (group 1 if it has one). 1 or 0.
- verdict: match against a logged reply with a good verdict (score >= GOOD_SCORE) scores 1; a reply
  that matches one with a bad verdict scores -1 (a negative example), anything else 0.
- rubric: the weighted share of passed checks, in 0..1 (see RUBRIC_HINT for the file).
Every reward also pays `format`: FORMAT_PENALTY off for an empty reply or one cut off before its
stop token, as the cookbook's ProblemEnv does, and an `echo` (the reply is the prompt's last user
message again, once or more) scores nothing but that penalty.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError

GOOD_SCORE = 0.5  # LangSmith feedback scores lie in 0..1; a mean score at or above this is a good verdict
FORMAT_PENALTY = 0.1  # the cookbook's ProblemEnv format_coef
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?")
CHECKS = ("contains", "not_contains", "regex", "min_length", "max_length", "json", "json_schema")
RUBRIC_HINT = ('a JSON object {"all": [CHECK, ...], "problems": {"<trace id or FILE:LINE>": [CHECK, ...]}}, '
               'each CHECK {"check": "' + '|'.join(CHECKS) + '", "value": ..., "weight": 1}')


# --- match ---------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .!?;:")


def last_number(text: str) -> Decimal | None:
    """The last number written in text (commas dropped), or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None


def check_match(match: str) -> str:
    """A --match value checked: exact, normalized, number, or regex:PATTERN that compiles."""
    if match in ("exact", "normalized", "number"):
        return match
    if match.startswith("regex:"):
        try:
            re.compile(match[6:])
        except re.error as e:
            raise UsageError(f"--match {match}: not a valid regular expression ({e})") from None
        return match
    raise UsageError(f"--match {match}: choose exact, normalized, number or regex:PATTERN")


def extract(text: str, match: str) -> str | Decimal | None:
    """What `match` compares of a reply: the text, its normal form, its last number, or its regex capture."""
    if match == "exact":
        return text.strip()
    if match == "normalized":
        return normalize(text)
    if match == "number":
        return last_number(text)
    found = re.search(match[6:], text)
    if not found:
        return None
    return normalize(found.group(1) if found.re.groups else found.group())


def matches(reply: str, logged: str, match: str) -> bool:
    """True when the reply agrees with the logged reply under `match` (nothing extracted never agrees)."""
    got, want = extract(reply, match), extract(logged, match)
    return got is not None and want is not None and got != "" and got == want


# --- verdict -------------------------------------------------------------------------------------


def verdict_of(record: dict[str, Any]) -> float | None:
    """A conversation's score: its `score` field (rlcli import's mean LangSmith feedback score), else None."""
    score = record.get("score")
    return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None


def verdict_reward(reply: str, logged: str, score: float, match: str) -> float:
    if not matches(reply, logged, match):
        return 0.0
    return 1.0 if score >= GOOD_SCORE else -1.0


# --- rubric --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rubric:
    """Checks for every problem, and checks for problems named by trace id or FILE:LINE."""

    common: list[dict[str, Any]] = field(default_factory=list)
    by_problem: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def checks_for(self, *names: str | None) -> list[dict[str, Any]]:
        extra = next((self.by_problem[n] for n in names if n and n in self.by_problem), [])
        return self.common + extra


def read_rubric(path: str) -> Rubric:
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"--rubric {path}: no such file; pass {RUBRIC_HINT}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"--rubric {path}: not JSON ({e}); pass {RUBRIC_HINT}") from None
    return parse_rubric(data, path)


def parse_rubric(data: Any, source: str) -> Rubric:
    if not isinstance(data, dict) or not set(data) <= {"all", "problems"}:
        raise UsageError(f"{source}: expected {RUBRIC_HINT}")
    common = [check_rule(c, f"{source} all[{i}]") for i, c in enumerate(data.get("all", []))]
    problems = data.get("problems", {})
    if not isinstance(problems, dict):
        raise UsageError(f'{source}: "problems" must map a trace id or FILE:LINE to a list of checks')
    by = {name: [check_rule(c, f"{source} problems[{name!r}][{i}]") for i, c in enumerate(rules)]
          for name, rules in problems.items()}
    if not common and not any(by.values()):
        raise UsageError(f"{source} has no checks: expected {RUBRIC_HINT}")
    return Rubric(common, by)


def check_rule(rule: Any, where: str) -> dict[str, Any]:
    if not isinstance(rule, dict) or rule.get("check") not in CHECKS:
        raise UsageError(f"{where}: each check is {{\"check\": {'|'.join(CHECKS)}, \"value\": ..., \"weight\": 1}}")
    kind, value, weight = rule["check"], rule.get("value"), rule.get("weight", 1)
    if not isinstance(weight, int | float) or weight <= 0:
        raise UsageError(f"{where}: weight must be a positive number, got {weight!r}")
    if kind in ("contains", "not_contains", "regex") and not (isinstance(value, str) and value):
        raise UsageError(f"{where}: {kind} needs a non-empty text value")
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as e:
            raise UsageError(f"{where}: not a valid regular expression ({e})") from None
    if kind in ("min_length", "max_length") and not (isinstance(value, int) and value >= 0):
        raise UsageError(f"{where}: {kind} needs a character count, got {value!r}")
    if kind == "json_schema" and not isinstance(value, dict):
        raise UsageError(f"{where}: json_schema needs a JSON schema object as its value")
    return {"check": kind, "value": value, "weight": float(weight)}


def passes(rule: dict[str, Any], reply: str) -> bool:
    kind, value = rule["check"], rule["value"]
    if kind == "contains":
        return value in reply
    if kind == "not_contains":
        return bool(reply.strip()) and value not in reply  # an empty reply avoids everything: it earns nothing
    if kind == "regex":
        return re.search(value, reply) is not None
    if kind == "min_length":
        return len(reply.strip()) >= value
    if kind == "max_length":
        return bool(reply.strip()) and len(reply.strip()) <= value
    parsed = parse_json(reply)
    if kind == "json":
        return parsed is not NOT_JSON
    return parsed is not NOT_JSON and not schema_errors(parsed, value)


def rubric_score(reply: str, rules: list[dict[str, Any]]) -> float:
    """The weighted share of the checks the reply passes, 0..1."""
    total = sum(r["weight"] for r in rules)
    return sum(r["weight"] for r in rules if passes(r, reply)) / total if total else 0.0


NOT_JSON = object()


def parse_json(reply: str) -> Any:
    """The JSON value of a reply (a ```json fence around it allowed), or NOT_JSON."""
    text = reply.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return NOT_JSON


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def schema_errors(value: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Where value breaks the schema: type, enum, required, properties, additionalProperties, items,
    minimum, maximum (the keywords a rubric needs; any other keyword is ignored)."""
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return [f"{at}: not {kind}"]
    errors = [] if "enum" not in schema or value in schema["enum"] else [f"{at}: not one of the enum"]
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{at}: out of range")
    if isinstance(value, dict):
        errors += [f"{at}.{k}: missing" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                errors += schema_errors(v, props[k], f"{at}.{k}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{at}.{k}: not allowed")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{at}[{i}]")
    return errors


def _is_type(value: Any, kind: str | list[str]) -> bool:
    if isinstance(kind, list):
        return any(_is_type(value, k) for k in kind)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(kind, object))


# --- what every reward shares ------------------------------------------------------------------


def is_echo(reply: str, prompt_text: str) -> bool:
    """The reply is the prompt's last user message again, once or repeated (normalized): a copy, not an answer."""
    said, asked = normalize(reply), normalize(prompt_text)
    return bool(asked) and bool(said) and not said.replace(asked, "").strip(" .!?;:")


def format_ok(reply: str, stopped: bool) -> bool:
    return stopped and bool(reply.strip())


def total(score: float, well_formed: bool) -> float:
    """The cookbook's ProblemEnv shape: the score, FORMAT_PENALTY off when the reply is malformed."""
    return score - (0.0 if well_formed else FORMAT_PENALTY)
