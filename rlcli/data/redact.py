"""Replace personal data and secrets in text with typed placeholders.

A regex finds candidates; where a regex alone cannot tell, a check confirms them
(Luhn and issuer prefix for cards, `ipaddress` for IPs, a digit count for phones),
so that dates, version numbers, order ids, timestamps and hashes stay untouched.

Decisions a reader may want to revisit:
- a bare dotted quad that is a valid IPv4 address (1.2.3.4) counts as an IP: text
  cannot tell it from a version number, and a leak costs more than a lost version.
  It is kept when written as a version: `v1.2.3.4`, `version 1.2.3.4`, `1.2.3.4.5`.
- IPv6 needs two or more non-empty groups and five or more hex digits, so `::1`,
  `a[1::3]`, `a::b` and `std::vector` stay.
- phones need a leading `+` (8-15 digits) or the North American 3-3-4 grouping;
  bare digit runs are left alone because they are far more often ids than phones.
- cards need 13-19 digits, a known issuer prefix and a valid Luhn checksum, so
  millisecond timestamps (they start with 1) and date-based ids (20xx...) stay.

Passes run in a fixed order (keys before emails, IPs and cards before phones) and
placeholders hold no digits or key prefixes, so a later pass never re-matches them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

_CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[068]|35|6(?:011|5|4[4-9])")
_VERSION_WORDS = ("version ", "ver ", "release ", "build ")


def luhn_ok(digits: str) -> bool:
    """True when a digit string passes the Luhn checksum that payment cards carry."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _is_card(m: re.Match[str]) -> bool:
    digits = m.group().replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and bool(_CARD_PREFIX.match(digits)) and luhn_ok(digits)


def _is_phone(m: re.Match[str]) -> bool:
    digits = sum(ch.isdigit() for ch in m.group())
    return 8 <= digits <= 15 if m.group().startswith("+") else digits == 10


def _is_ipv4(m: re.Match[str]) -> bool:
    before = m.string[max(0, m.start() - 8) : m.start()].lower()
    if before.endswith(_VERSION_WORDS):
        return False
    try:
        ipaddress.IPv4Address(m.group())
    except ValueError:  # an octet over 255 or with a leading zero: not an address
        return False
    return True


def _is_ipv6(m: re.Match[str]) -> bool:
    text = m.group()
    groups = [g for g in text.split(":") if g]
    if len(groups) < 2 or sum(map(len, groups)) < 5:  # `a::b`, `x[1::3]` are code, not addresses
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


# `tml-` and 32 or more key characters (`rlcli tenant add` makes 43); the placeholders (tml-self-hosted) are shorter.
TINKER_KEY = r"\btml-[A-Za-z0-9_-]{32,}"
_KEY = (
    r"\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI (sk-, sk-proj-) and Anthropic (sk-ant-)
    r"|\b[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{22,}"  # GitHub
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bAIza[0-9A-Za-z_-]{35}"  # Google
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r"|" + TINKER_KEY  # Tinker's and rlcli's tenants' keys
)
_KEY_NEEDLES = tuple("sk- k_live_ k_test_ AKIA ASIA ghp_ gho_ ghu_ ghs_ ghr_ github_pat_ xox AIza eyJ tml-".split())
_DIGITS = tuple("0123456789")


class _Pass(NamedTuple):
    placeholder: str
    pattern: re.Pattern[str]
    check: Callable[[re.Match[str]], bool] | None  # None: every match is replaced
    # A match needs one of these substrings, and maybe a digit. `in` scans at memory speed while the
    # regex engine crawls, so text without them skips the pass (most text, for most passes).
    needles: tuple[str, ...] = ()
    digits: bool = False


_PASSES = [
    _Pass("<PRIVATE_KEY>", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
          None, ("PRIVATE KEY",)),
    _Pass("<API_KEY>", re.compile(_KEY), None, _KEY_NEEDLES),
    _Pass("<API_KEY>", re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{16,}"), None, ("earer", "EARER")),
    _Pass("<EMAIL>", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"), None,
          ("@",)),
    _Pass("<IP>", re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}"
                             r"(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{1,4})?(?![\w:]|\.\d)"), _is_ipv6, (":",)),
    _Pass("<IP>", re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)"), _is_ipv4, (".",), True),
    _Pass("<CARD>", re.compile(r"(?<![\w-])(?:\d[ -]?){12,18}\d(?![\w-])"), _is_card, (), True),
    _Pass("<PHONE>", re.compile(r"(?<![\w+.\-/])(?:"
                                r"\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]?\d{1,4}){1,4}"
                                r"|(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}"
                                r")(?![\w-]|\.\d)"), _is_phone, (), True),
]  # fmt: skip


def redact_text(text: str, counts: Counter[str] | None = None) -> str:
    """Replace every secret and piece of personal data in text; count replacements by placeholder."""
    has_digit = any(d in text for d in _DIGITS)
    for p in _PASSES:
        if (p.digits and not has_digit) or (p.needles and not any(n in text for n in p.needles)):
            continue

        def swap(m: re.Match[str], p: _Pass = p) -> str:
            if p.check is not None and not p.check(m):
                return m.group()
            if counts is not None:
                counts[p.placeholder.strip("<>")] += 1
            return p.placeholder

        text = p.pattern.sub(swap, text)
    return text


def redact_value(value: Any, counts: Counter[str] | None = None) -> Any:
    """Redact every string inside a JSON value (dict values, list items), keeping its structure."""
    if isinstance(value, str):
        return redact_text(value, counts)
    if isinstance(value, list):
        return [redact_value(v, counts) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(v, counts) for k, v in value.items()}
    return value


def redact_json_text(text: str, counts: Counter[str] | None = None) -> str:
    """Redact JSON text (tool arguments) value by value, so escapes like \\n never hide a match.

    Text that is not JSON (a model can emit anything) is redacted as plain text.
    """
    try:
        parsed = json.loads(text)
    except ValueError:
        return redact_text(text, counts)
    cleaned = redact_value(parsed, counts)
    return text if cleaned == parsed else json.dumps(cleaned, ensure_ascii=False)


def redact_messages(messages: list[dict[str, Any]], counts: Counter[str] | None = None) -> None:
    """Redact, in place, every text field of normalized messages: content, reasoning, tool arguments."""
    for m in messages:
        m["content"] = redact_text(m["content"], counts)
        if "reasoning" in m:
            m["reasoning"] = redact_text(m["reasoning"], counts)
        for call in m.get("tool_calls", ()):
            fn = call["function"]
            fn["arguments"] = redact_json_text(fn["arguments"], counts)
