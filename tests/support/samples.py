"""Sample exchanges that recall tests record and then look for, shared by the library and
the daemon tests so both search the same memories.

Each is (conversation_id, user, assistant, timestamp). Alice's are all in one session (one
file): facts with distinct words, a follow-up that leans on its opener, Unicode, and two
exchanges dated relative to now (for the relative time filters). Bob holds a secret that
Alice must never see.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

NOW = datetime.now(UTC).replace(microsecond=0)

Exchange = tuple[str, str, str, str]

ALICE: list[Exchange] = [
    (
        "space",
        "What is the capital of Australia?",
        "Canberra is the capital of Australia.",
        "2026-10-01T10:00:00Z",
    ),
    (
        "garden",
        "When should I water the greenhouse tomatoes?",
        "Water the greenhouse tomatoes every morning before 9.",
        "2026-11-05T09:00:00Z",
    ),
    (
        "garden",
        "And how do I prune the greenhouse tomatoes?",
        "Prune the greenhouse tomatoes by pinching out side shoots.",
        "2026-11-05T15:00:00Z",
    ),
    (
        "travel",
        "Über die Straßenbahn in Zürich 🚋?",
        "Die Straßenbahn fährt alle 7 Minuten; в Москве тоже метро. 東京の電車も便利です。",
        "2026-11-06T08:00:00Z",
    ),
    (
        "bread",
        "My sourdough starter smells of acetone, is it dead?",
        "No: feed the sourdough starter twice a day for three days.",
        (NOW - timedelta(days=3)).isoformat(),
    ),
    (
        "bread",
        "The sourdough starter doubled overnight now!",
        "Great, the sourdough starter is ready for baking.",
        (NOW - timedelta(hours=2)).isoformat(),
    ),
]
BOB: list[Exchange] = [
    (
        "secret",
        "Remember: the launch code for Project Nightingale is tangerine-42.",
        "Noted, Project Nightingale uses tangerine-42.",
        "2026-11-07T10:00:00Z",
    )
]
