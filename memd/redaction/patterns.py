"""The built-in secret patterns: one `Rule` per kind of credential, with its cheap anchors.

A rule's regex is tried only where one of its anchors (the literals each of its
alternatives starts with; lowercase, in the lowered text, when `fold` is set) occurs:
`str.find` scans a MiB in about a millisecond, while a regex searched over every
position of a 1 MiB paste costs 20-200 ms (sre scans fast only for a single literal
prefix; `\\b`, `(?i)` or an alternation in front make it try every position).
Where a rule has a group named `v`, only that group is replaced (the key name before a
password stays readable); else the whole match is. `check` vets a candidate value
(entropy, placeholders) for the rules whose shape alone would catch ordinary code.

Kinds are the names users see in markers (`[redacted: github-token]`), in `memd status`
counts and in `[privacy] allow`; renaming one changes what users configured.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    kind: str
    regex: re.Pattern[str]
    anchors: tuple[str, ...] = ()  # none: always run (user patterns)
    fold: bool = False  # regex and anchors are lowercase, run on the lowered text
    boundary: bool = True  # the match must not start inside a word (checked in Python)
    check: Callable[[str], bool] | None = None


PLACEHOLDERS = frozenset(
    [
        "password",
        "passwd",
        "pass",
        "pwd",
        "secret",
        "token",
        "changeme",
        "example",
        "test",
        "dummy",
        "none",
        "null",
        "undefined",
        "redacted",
        "hidden",
        "xxxxxxxx",
        "your_password",
        "yourpassword",
        "mypassword",
    ]
)


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def high_entropy(value: str) -> bool:
    """A value that looks generated, not a word, a path, an identifier or a placeholder.

    Needs 8+ characters, letters plus a digit or symbol, no run of one character (`****`,
    `xxxx`), and at least 3 bits of entropy per character: `hunter2hunter2` (2.8) passes
    as prose-like, `Xk9#qL2v` (3.0) and every generated key do not.
    """
    v = value.strip("\"'`").rstrip("=")
    if len(v) < 8 or v.lower() in PLACEHOLDERS or v.startswith(("$", "%", "{", "<")):
        return False
    if "://" in v:
        return False  # a URL: its password, if any, is url-password's
    if re.search(r"(.)\1{3}", v) or re.fullmatch(r"[A-Za-z][A-Za-z_.-]*(\(\))?", v):
        return False  # a mask, or an identifier / attribute path
    if not re.search(r"[A-Za-z]", v) or not re.search(r"[0-9\W_]", v):
        return False
    return entropy(v) >= 3.0


def _url_password(value: str) -> bool:
    v = value.lower()
    return v not in PLACEHOLDERS and not v.startswith(("$", "{", "<", "*", "%"))


# Each keyword is also an anchor: the password rule is tried where one of them occurs.
_KEYWORDS = (
    "password", "passwd", "passphrase", "pwd", "secret", "token", "apikey", "api_key",
    "api-key", "access_key", "access-key", "private_key", "private-key", "credential",
)  # fmt: skip

BUILTIN: tuple[Rule, ...] = (
    Rule(
        "private-key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
            r"(?:[\s\S]{0,40000}?-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
            r"|(?:(?:\s|\\n)*[A-Za-z0-9+/=]{16,})*)"  # unterminated: its base64 lines only
        ),
        ("-----BEGIN ",),
    ),
    Rule(
        "anthropic-api-key", re.compile(r"sk-ant-[A-Za-z0-9]{2,8}-[A-Za-z0-9_-]{32,}"), ("sk-ant-",)
    ),
    Rule(
        "openai-api-key",
        re.compile(
            r"sk-(?!ant-)(?:(?:(?:proj|svcacct|admin|None)-)?[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}"
            r"|(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}|[A-Za-z0-9]{48}\b)"
        ),
        ("sk-",),
    ),
    Rule("google-api-key", re.compile(r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"), ("AIza",)),
    Rule(
        "aws-access-key-id",
        re.compile(r"(?:AKIA|ASIA|ABIA|ACCA|AROA|AIDA)[0-9A-Z]{16}\b"),
        ("AKIA", "ASIA", "ABIA", "ACCA", "AROA", "AIDA"),
    ),
    Rule(
        "aws-secret-access-key",
        re.compile(
            r"aws.{0,24}?(?:secret|private).{0,24}?[\"']?\s*(?:=|:|=>)\s*[\"']?"
            r"(?P<v>[a-z0-9/+]{40})(?![a-z0-9/+])"
        ),
        ("aws",),
        fold=True,
        boundary=False,
    ),
    Rule(
        "github-token",
        re.compile(
            r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,255}\b|github_pat_[A-Za-z0-9_]{60,255}\b"
        ),
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Rule(
        "slack-token",
        re.compile(
            r"xox[abposer]-[A-Za-z0-9-]{10,250}"
            r"|https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,}"
        ),
        ("xox", "https://hooks.slack.com/"),
    ),
    Rule(
        "stripe-key",
        re.compile(r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,247}\b"),
        ("sk_live_", "sk_test_", "rk_live_", "rk_test_"),
    ),
    Rule("huggingface-token", re.compile(r"hf_[A-Za-z0-9]{34,}\b"), ("hf_",)),
    Rule(
        "jwt",
        re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
        ("eyJ",),
    ),
    Rule(
        "bearer-token",
        re.compile(r"(?:bearer|authorization:\s*(?:token|basic))\s+(?P<v>[a-z0-9._~+/-]{16,}=*)"),
        ("bearer", "authorization"),
        fold=True,
        check=lambda v: v.lower() not in PLACEHOLDERS and not v.startswith("$"),
    ),
    Rule(
        "url-password",
        re.compile(r"://[^\s:/@\[\]]{1,128}:(?P<v>[^\s@/\[\]]{1,256})@"),
        ("://",),
        check=_url_password,
        boundary=False,
    ),
    Rule(
        "password",
        re.compile(
            "(?:" + "|".join(_KEYWORDS) + r")[a-z0-9_]{0,16}[\"']?\s*(?:=|:|=>)\s*"
            r"\\?[\"']?(?P<v>[^\s\"'`,;(){}<>\[\]\\=]{8,256}={0,2})"
        ),
        _KEYWORDS,
        fold=True,
        check=high_entropy,
        boundary=False,
    ),
)

KINDS: tuple[str, ...] = tuple(rule.kind for rule in BUILTIN)
