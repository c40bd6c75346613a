"""ClientSessions' parts by composition: the Recorder and the Importer read the one
SessionCore, so what the daemon sets on ClientSessions (a new scrubber on a config
reload) is what every kind of record call uses next."""

from __future__ import annotations

from pathlib import Path

from memd.redaction import Scrubber
from tests.support.sessions import Clock, open_sessions, run


def test_a_new_scrubber_applies_to_every_record_call(tmp_path: Path) -> None:
    async def body() -> None:
        tickets = Scrubber(patterns={"ticket": r"TCK-\d{3}"})
        async with open_sessions(tmp_path, Clock(), scrubber=tickets) as cs:
            assert cs.scrubber is tickets
            first = await cs.record_exchange("conv-a", "see TCK-111", "noted")
            assert first["redacted"] == 1
            cs.scrubber = Scrubber()  # a reload without the pattern
            second = await cs.record_exchange("conv-a", "see TCK-222", "noted")
            chat = await cs.record_chat(
                [{"role": "user", "content": "and TCK-333"}],
                {"role": "assistant", "content": "ok"},
            )
            imported = await cs.import_exchanges(
                "conv-b",
                [
                    {
                        "user": "old TCK-444",
                        "assistant": "ok",
                        "timestamp": "2026-01-02T03:04:05Z",
                        "exchange_id": "x1",
                    }
                ],
            )
            assert (second["redacted"], chat["redacted"], imported[0]["redacted"]) == (0, 0, 0)
            assert cs.redaction_counts() == {"ticket": 1}
            text = "".join(p.read_text() for p in (tmp_path / "c1").rglob("*.md"))
            assert "TCK-111" not in text
            assert all(t in text for t in ("TCK-222", "TCK-333", "TCK-444"))

    run(body)
