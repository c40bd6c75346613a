"""The answer after a question: a result whose reply asks something shows the user's next
message (memd.recall.context), recorded with the real recording code and expanded by
`recall.collect`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from memd import recall as rc
from memd.layout import ClientLayout
from memd.recall import context
from tests.test_recall import _hit, _lines_of, _record

FOLLOW = context.FOLLOW_LABEL


@pytest.fixture
def layout(tmp_path: Path) -> ClientLayout:
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    return layout


def _hits(path: Path, *numbers: int) -> list[rc.Memory]:
    out = []
    for n in numbers:
        heading = f"## 2026-11-01 10:0{n}:00 UTC · exchange {n}"
        line = _lines_of(path, heading)
        out.append(_hit(path, line, line + 4, heading[3:], chunk=f"h{n}"))
    return out


def _conversation(layout: ClientLayout, *pairs: tuple[str, str], conv: str = "a") -> Path:
    return asyncio.run(
        _record(
            layout,
            *[(conv, u, a, f"2026-11-01T10:0{i}:00Z") for i, (u, a) in enumerate(pairs, 1)],
        )
    )


@pytest.mark.parametrize(
    ("message", "asks"),
    [
        ("That agency looks great! What made you pick it?", True),
        ("Did it work? Let me know.", True),
        ("Why? No idea. It just worked.", False),
        ("It worked. Great!", False),
        ("Is it the red one? 😊", True),
        ("Sure.", False),
        ("", False),
    ],
)
def test_a_message_asks_when_a_question_follows_its_last_statement(
    message: str, asks: bool
) -> None:
    assert context.asks(message) is asks


def test_a_reply_that_asks_is_followed_by_the_users_next_message(layout: ClientLayout) -> None:
    path = _conversation(
        layout,
        ("I found an adoption agency.", "That looks great! What made you pick it?"),
        ("They help LGBTQ+ folks with adoption.", "Lovely, good luck with it."),
        ("Thanks!", "Anytime."),
    )
    [first, second] = rc.collect(_hits(path, 1, 2)[:1] + _hits(path, 3), layout, 5)
    assert first.content.endswith(f"{FOLLOW} They help LGBTQ+ folks with adoption.")
    assert "Lovely, good luck" not in first.content  # only the user's message
    assert FOLLOW not in second.content  # "Anytime." asks nothing


def test_no_follow_up_when_that_exchange_is_a_result_or_it_is_switched_off(
    layout: ClientLayout,
) -> None:
    path = _conversation(
        layout,
        ("I found an agency.", "What made you pick it?"),
        ("They help LGBTQ+ folks.", "Nice."),
    )
    both = rc.collect(_hits(path, 1, 2), layout, 5)
    assert [FOLLOW in m.content for m in both] == [False, False]
    [alone] = rc.collect(_hits(path, 1), layout, 5, follow_questions=False)
    assert FOLLOW not in alone.content


def test_no_follow_up_from_another_conversation_and_a_long_one_is_clipped(
    layout: ClientLayout,
) -> None:
    long = "word " * 400
    path = asyncio.run(
        _record(
            layout,
            ("a", "first", "Shall we go?", "2026-11-01T10:01:00Z"),
            ("b", "another topic", "What now?", "2026-11-01T10:02:00Z"),
            ("b", long, "ok", "2026-11-01T10:03:00Z"),
        )
    )
    heading = "## 2026-11-01 10:01:00 UTC · exchange 1"
    line = _lines_of(path, heading)
    [first] = rc.collect([_hit(path, line, line + 4, heading[3:])], layout, 5)
    assert FOLLOW not in first.content  # the next exchange belongs to conversation b
    heading = "## 2026-11-01 10:02:00 UTC · exchange 1"
    line = _lines_of(path, heading)
    [other] = rc.collect([_hit(path, line, line + 4, heading[3:])], layout, 5)
    follow = other.content.split(FOLLOW, 1)[1]
    assert follow.endswith("[…]") and len(follow) <= context.FOLLOW_CHARS + 1


def test_a_transcript_kept_between_recalls_is_read_afresh_once_it_changes(
    layout: ClientLayout,
) -> None:
    path = _conversation(layout, ("first question", "Shall I go on?"))
    [before] = rc.collect(_hits(path, 1), layout, 5)
    assert FOLLOW not in before.content  # nothing follows yet
    asyncio.run(_record(layout, ("a", "yes please", "done", "2026-11-01T10:02:00Z")))
    [after] = rc.collect(_hits(path, 1), layout, 5)
    assert after.content.endswith(f"{FOLLOW} yes please")
