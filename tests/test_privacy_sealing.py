"""Stored hashes are keyed (issue #26, item 4): nothing in the state database lets a guess
of a message be confirmed, and a database from before keys still recognises its chats."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from memd.layout import ClientLayout
from memd.sessions import chat, sealing
from memd.sessions.store import STATE_FILE
from tests.support.sessions import Clock, open_sessions, run

SHORT = "1234"  # a PIN: a plain hash of it is found by trying 10,000 candidates


def history() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return [{"role": "user", "content": f"my pin is {SHORT}"}], {
        "role": "assistant",
        "content": "ok",
    }


def plain_chain(messages: list[dict[str, Any]], response: dict[str, Any]) -> list[bytes]:
    return chat.prepare(messages, response)[2]


def db_bytes(layout: ClientLayout) -> bytes:
    out = b""
    for name in (STATE_FILE, f"{STATE_FILE}-wal"):
        path = layout.state_dir / name
        if path.exists():
            out += path.read_bytes()
    return out


def test_stored_hashes_are_sealed_and_the_key_file_is_private(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "c1")
    messages, reply = history()

    async def scenario() -> None:
        async with open_sessions(tmp_path, Clock()) as cs:
            await cs.record_chat(messages, reply)
            stored = db_bytes(layout)
            assert not any(h in stored for h in plain_chain(messages, reply))
            nxt = [*messages, reply, {"role": "user", "content": "and again"}]
            out = await cs.record_chat(nxt, {"role": "assistant", "content": "sure"})
            assert out["match"] == "continuation"

    run(scenario)
    key_file = layout.state_dir / sealing.KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert len(key_file.read_bytes()) == sealing.KEY_BYTES


def test_a_database_with_plain_hashes_is_sealed_once_and_keeps_its_chats(tmp_path: Path) -> None:
    """Make a pre-key database by hand (plain hashes, user_version 0, no key file), then
    open it: the hashes are sealed, none of the plain ones is left in the file or its WAL,
    and the next request of the chat and a retried exchange_id are still recognised."""
    layout = ClientLayout(tmp_path, "c1")
    messages, reply = history()

    async def record() -> None:
        async with open_sessions(tmp_path, Clock()) as cs:
            await cs.record_chat(messages, reply)
            await cs.record_exchange("mcp", "q", "a", exchange_id="e1")

    run(record)
    key = (layout.state_dir / sealing.KEY_FILE).read_bytes()
    plain = plain_chain(messages, reply)
    db = sqlite3.connect(layout.state_dir / STATE_FILE)
    for h in plain:
        db.execute("UPDATE nodes SET hash = ? WHERE hash = ?", (h, sealing.seal(key, h)))
        db.execute("UPDATE nodes SET parent = ? WHERE parent = ?", (h, sealing.seal(key, h)))
    from memd.sessions.exchange_keys import digest as sealed_digest

    unsealed = _plain_digest("q", "a")
    assert sealed_digest("q", "a", key) == sealing.seal(key, unsealed)
    db.execute("UPDATE exchange_keys SET digest = ?", (unsealed,))
    db.execute("PRAGMA user_version = 0")
    db.commit()
    db.close()
    os.unlink(layout.state_dir / sealing.KEY_FILE)
    assert plain[0] in db_bytes(layout)

    async def resume() -> None:
        async with open_sessions(tmp_path, Clock()) as cs:
            assert not any(h in db_bytes(layout) for h in plain)
            nxt = [*messages, reply, {"role": "user", "content": "next"}]
            out = await cs.record_chat(nxt, {"role": "assistant", "content": "fine"})
            assert out["match"] == "continuation"
            again = await cs.record_exchange("mcp", "q", "a", exchange_id="e1")
            assert again["duplicate"] is True

    run(resume)
    db = sqlite3.connect(layout.state_dir / STATE_FILE)
    assert db.execute("PRAGMA user_version").fetchone()[0] == sealing.SEALED_VERSION
    db.close()


def _plain_digest(user: str, assistant: str) -> bytes:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for text in (user, assistant):
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.digest()
