"""`memory.record_chat` with `after`: recording a turn that names where it continues.

APIs such as OpenAI Responses (`previous_response_id`) send only a turn's new items; a
gateway records them after the `head` the previous turn's record returned, and they land
in the same conversation, exactly as if the whole history had been sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError

CLIENTS = {"gw": {"memory_enabled": True, "mode": "both"}}


def record(memd: Any, messages: list[Any], reply: str, **extra: Any) -> dict[str, Any]:
    response = {"role": "assistant", "content": reply}
    params = {"client_id": "gw", "messages": messages, "response": response, **extra}
    return memd.call("memory.record_chat", params)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_turn_after_a_head_continues_its_conversation(module_daemon) -> None:
    memd, _tmp = module_daemon(clients=CLIENTS)
    before = conversations(memd)
    system = {"role": "system", "content": "be brief"}
    first = record(memd, [system, user("Name a green fruit")], "Lime")
    assert first["match"] == "new" and len(first["head"]) == 32
    second = record(memd, [user("And a yellow one?")], "Lemon", after=first["head"])
    assert second["match"] == "continuation" and second["appended"] == 2
    assert second["conversation"] == first["conversation"]
    again = record(memd, [user("And a yellow one?")], "Lemon", after=first["head"])
    assert again["match"] == "duplicate" and again["head"] == second["head"]
    # The whole history sent at once reaches the same point: the heads are the same chain.
    whole = [
        system,
        user("Name a green fruit"),
        {"role": "assistant", "content": "Lime"},
        user("And a yellow one?"),
    ]
    assert record(memd, whole, "Lemon")["match"] == "duplicate"
    third = record(
        memd, [*whole, {"role": "assistant", "content": "Lemon"}, user("Red?")], "Cherry"
    )
    assert third["match"] == "continuation" and third["conversation"] == first["conversation"]
    text = Path(first["path"]).read_text()
    assert text.count("**Assistant:** Lime") == 1 and text.count("**Assistant:** Lemon") == 1
    assert "Cherry" in text
    assert conversations(memd) == before + 1


def conversations(memd: Any) -> int:
    sessions = memd.call("sessions.list", {"client_id": "gw"})["sessions"]
    return sum(s["conversations"] for s in sessions)


def test_an_unknown_head_starts_a_new_conversation(module_daemon) -> None:
    memd, _tmp = module_daemon(clients=CLIENTS)
    first = record(memd, [user("Name a purple fruit")], "Plum")
    lost = record(memd, [user("Something else entirely")], "Sure", after="ab" * 16)
    assert lost["match"] == "new" and lost["conversation"] != first["conversation"]
    assert "Something else entirely" in Path(lost["path"]).read_text()


def test_a_malformed_after_is_invalid_params(module_daemon) -> None:
    memd, tmp = module_daemon(clients=CLIENTS)
    before = sorted(p.read_text() for p in (tmp / "memory").rglob("*.md"))
    for after in ("", "xyz", "ab" * 8, "ab" * 17, 42):
        with pytest.raises(RemoteError) as err:
            record(memd, [user("FACT-MALFORMED-AFTER")], "hi", after=after)
        assert err.value.code == -32602, after
        assert "after" in str(err.value)
    assert sorted(p.read_text() for p in (tmp / "memory").rglob("*.md")) == before
