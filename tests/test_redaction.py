"""The scrubber on its own: every kind caught in every setting, look-alikes left alone."""

from __future__ import annotations

import pytest

from memd.redaction import KINDS, PRIVATE_MARKER, Scrubber, marker
from tests.secret_corpus import embed, lookalikes, secrets

FALSE_POSITIVE_BOUND = 0.02  # at most 2% of look-alike texts may lose anything


@pytest.mark.parametrize("form", range(4))
def test_every_kind_is_caught_in_prose_code_json_and_urls(form: int) -> None:
    scrubber = Scrubber()
    kinds_seen = set()
    for kind, value, written in secrets(seed=form):
        text = embed(kind, written, form)
        out = scrubber.scrub(text)
        assert value not in out.text, (kind, out.text)
        assert marker(kind) in out.text, (kind, out.text)
        assert out.kinds[kind] >= 1
        kinds_seen.add(kind)
    assert kinds_seen == set(KINDS)


def test_scrubbing_is_deterministic_and_idempotent() -> None:
    scrubber = Scrubber()
    text = "\n".join(embed(k, w, i) for i, (k, _v, w) in enumerate(secrets()))
    once = scrubber.scrub(text)
    assert scrubber.scrub(text).text == once.text
    again = scrubber.scrub(once.text)
    assert again.text == once.text and again.count == 0


def test_private_spans_and_unclosed_ones_in_user_text() -> None:
    scrubber = Scrubber()
    text = "my PIN is <private>4711 and the safe code 0815</private>, remember the rest"
    out = scrubber.scrub(text, private=True)
    assert out.text == f"my PIN is {PRIVATE_MARKER}, remember the rest"
    assert out.kinds["private"] == 1
    unclosed = scrubber.scrub("a <PRIVATE>diary entry that never closes", private=True)
    assert unclosed.text == f"a {PRIVATE_MARKER}"
    assert scrubber.scrub("use the <private> tag", private=False).text == "use the <private> tag"
    echoed = scrubber.scrub("You said: <private>4711</private>.", private=False)
    assert echoed.text == f"You said: {PRIVATE_MARKER}." and echoed.kinds["private"] == 1


def test_private_spans_are_dropped_even_with_scrubbing_off() -> None:
    scrubber = Scrubber(enabled=False)
    key = secrets()[0][1]
    out = scrubber.scrub(f"{key} <private>x</private>", private=True)
    assert out.text == f"{key} {PRIVATE_MARKER}"


def test_user_patterns_and_allow_list() -> None:
    key = next(v for k, v, _w in secrets() if k == "github-token")
    scrubber = Scrubber(patterns={"employee-id": r"\bEMP-[0-9]{6}\b"}, allow=["github-token"])
    out = scrubber.scrub(f"EMP-123456 uses {key}")
    assert out.text == f"{marker('employee-id')} uses {key}"
    with pytest.raises(ValueError, match="unknown kinds"):
        Scrubber(allow=["no-such-kind"])


def test_false_positive_rate_on_lookalikes_is_reported_and_bounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scrubber = Scrubber()
    texts = lookalikes()
    hit = [t for t in texts if scrubber.scrub(t).count]
    rate = len(hit) / len(texts)
    with capsys.disabled():
        print(f"\nredaction false positives: {len(hit)}/{len(texts)} = {rate:.1%}")
    assert rate <= FALSE_POSITIVE_BOUND, hit[:5]


def test_an_unterminated_private_key_takes_its_base64_lines_not_the_prose_after() -> None:
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\nVJTUt9Us8cKjMzEfYyjiWA4R4"
    text = f"-----BEGIN PRIVATE KEY-----\n{body}\n\nThanks for the help with this"
    out = Scrubber().scrub(text)
    assert out.text == f"{marker('private-key')}\n\nThanks for the help with this"
