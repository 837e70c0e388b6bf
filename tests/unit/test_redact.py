"""Redaction: every known positive caught, no known negative touched, every text field covered."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.importers import from_anthropic, from_openai
from rlcli.data.messages import Options, finalize
from rlcli.data.redact import luhn_ok, redact_json_text, redact_text

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent.parent / "fixtures" / "redaction_corpus.jsonl").read_text().splitlines()
]
POSITIVES = [c for c in CORPUS if c["positive"]]
NEGATIVES = [c for c in CORPUS if not c["positive"]]


def test_corpus_covers_every_placeholder_and_has_negatives():
    assert {c["kind"] for c in POSITIVES} >= {"EMAIL", "PHONE", "API_KEY", "IP", "CARD"}
    assert len(NEGATIVES) >= 20


@pytest.mark.parametrize("case", POSITIVES, ids=[c["secret"][:24] for c in POSITIVES])
def test_every_positive_is_caught(case):
    counts: Counter[str] = Counter()
    out = redact_text(case["text"], counts)
    assert case["secret"] not in out
    assert f"<{case['kind']}>" in out and counts[case["kind"]] >= 1


@pytest.mark.parametrize("case", NEGATIVES, ids=[c["why"] for c in NEGATIVES])
def test_no_negative_is_touched(case):
    assert redact_text(case["text"]) == case["text"]


def test_luhn():
    assert luhn_ok("4111111111111111") and luhn_ok("378282246310005")
    assert not luhn_ok("4111111111111112")


def test_tool_arguments_stay_valid_json_and_escapes_do_not_hide_secrets():
    args = json.dumps({"to": "jane@example.com", "note": "call\n415-555-0132", "n": 3})
    out = redact_json_text(args)
    assert json.loads(out) == {"to": "<EMAIL>", "note": "call\n<PHONE>", "n": 3}
    assert redact_json_text('{"q": "nothing here"}') == '{"q": "nothing here"}'  # untouched, byte for byte
    assert redact_json_text("not json, mail a@b.co") == "not json, mail <EMAIL>"


def test_redact_covers_content_reasoning_and_tool_arguments():
    record = {
        "request": {
            "system": "Owner: ops@acme.io",
            "messages": [{"role": "user", "content": "my key is sk-ant-api03-abcdefghijklmnopqrstuvwx"}],
        },
        "response": {
            "type": "message",
            "role": "assistant",
            "stop_reason": "tool_use",
            "content": [
                {"type": "thinking", "thinking": "user IP is 10.1.2.3"},
                {"type": "tool_use", "id": "t", "name": "charge", "input": {"card": "4111 1111 1111 1111"}},
            ],
        },
    }
    counts: Counter[str] = Counter()
    conv = finalize(from_anthropic(record, Counter()), Options(redact=True), counts)
    text = json.dumps(conv)
    for secret in ("ops@acme.io", "sk-ant-api03", "10.1.2.3", "4111"):
        assert secret not in text
    assert counts == Counter(EMAIL=1, API_KEY=1, IP=1, CARD=1)


def test_without_the_flag_nothing_is_redacted():
    record = {"messages": [{"role": "user", "content": "mail me: a@b.co"}, {"role": "assistant", "content": "ok"}]}
    conv = finalize(from_openai(record, Counter()), Options())
    assert conv["messages"][0]["content"] == "mail me: a@b.co"


def test_tinker_keys_are_redacted_and_placeholders_kept():
    from rlcli import tenants

    key = tenants.KEY_PREFIX + "A" * 43
    assert redact_text(f"key {key} and tml-self-hosted") == "key <API_KEY> and tml-self-hosted"
