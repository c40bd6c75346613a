"""`[privacy]`: scrubbing on by default, user patterns and the allow-list checked on load."""

from __future__ import annotations

import pytest

from memd.config import ConfigError, parse_config
from memd.daemon.privacy import scrubber_of
from memd.redaction import marker


def test_scrubbing_is_on_by_default() -> None:
    config = parse_config({})
    assert config.privacy.redact_secrets is True
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    assert scrubber_of(config).scrub(token).text == marker("github-token")


def test_user_patterns_and_allowed_kinds_take_effect() -> None:
    config = parse_config(
        {
            "privacy": {
                "allow": ["jwt"],
                "patterns": [{"kind": "employee-id", "regex": r"\bEMP-[0-9]{6}\b"}],
            }
        }
    )
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlc2lnbmF0dXJl"
    out = scrubber_of(config).scrub(f"EMP-123456 {jwt}")
    assert out.text == f"{marker('employee-id')} {jwt}"


@pytest.mark.parametrize(
    ("table", "where"),
    [
        ({"allow": ["no-such-kind"]}, "privacy.allow[0]"),
        ({"allow": "jwt"}, "privacy.allow"),
        ({"patterns": [{"kind": "x", "regex": "("}]}, "privacy.patterns[0].regex"),
        ({"patterns": [{"kind": "x", "regex": "a*"}]}, "privacy.patterns[0].regex"),
        ({"patterns": [{"kind": "jwt", "regex": "x"}]}, "privacy.patterns[0].kind"),
        ({"patterns": ["x"]}, "privacy.patterns[0]"),
        ({"redact_secrets": "yes"}, "privacy.redact_secrets"),
        ({"unknown": 1}, "privacy.unknown"),
    ],
)
def test_bad_privacy_tables_are_refused_naming_the_key(table: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=f"{where.replace('[', '.').replace(']', '.')}"):
        parse_config({"privacy": table})
