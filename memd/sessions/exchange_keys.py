"""Idempotency keys of `record_exchange`: a retry with the same exchange_id writes nothing.

A caller may name each exchange with an `exchange_id` of its choosing, unique within the
conversation. The first call records the exchange and the key together: the key's row
goes into the same sqlite transaction as the exchange's state (see
`memd.sessions.store`), so a key is durable exactly when its exchange is acknowledged.
A later call with the same key and the same text (a gateway retrying after a lost reply,
a daemon restart or kill -9 in between) writes nothing and gets the first call's result
again; the same key with other text is refused with `exchange_conflict`.

What identifies an exchange is its user and assistant text as written to the transcript
(after `transcript.clean_text`: line breaks unified, lone surrogates replaced), digested
with blake2b. The `timestamp` of an import only labels an exchange and is not compared.
Keys are kept for good, like the conversations they belong to, in the state database;
memory holds the 256 used last (~320 bytes each with a UUID-sized id, measured with
tracemalloc) and those not yet committed, and any other is looked up on disk.

Concurrency. `ClientSessions.record_exchange` looks a key up and adds it in the same
synchronous step as its write decision, before the commit, so of two identical calls in
flight exactly one writes. A call that finds a key then waits on a barrier (an empty
change through the group commit): whatever was queued before it, the first call's
commit included, is on disk when the barrier returns, so `duplicate: true` is never
answered for an exchange that is not durable. If the first call's commit fails, the
barrier fails with it (both callers get `storage_error`), the state is reloaded from
disk without the key, and the next retry writes.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from memd.errors import ExchangeConflict
from memd.layout import ClientLayout
from memd.sessions import sealing
from memd.sessions.chat import InvalidRecord
from memd.sessions.recent import Recent

MAX_EXCHANGE_ID = 256
KeyRow = tuple[int, str, bytes, str, int]  # conversation, exchange_id, digest, session, number


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the first call with a key wrote: its text's digest and where it went."""

    digest: bytes
    session_id: str
    number: int  # the conversation's number in that session


def check_exchange_id(value: Any) -> str | None:
    """None when absent; else an opaque string, bounded and printable like conversation_id."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord("exchange_id must be a non-empty string", "exchange_id")
    if len(value) > MAX_EXCHANGE_ID:
        raise InvalidRecord(
            f"exchange_id is longer than {MAX_EXCHANGE_ID} characters", "exchange_id"
        )
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise InvalidRecord("exchange_id must not contain control characters", "exchange_id")
    return value


def digest(user: str, assistant: str, key: bytes) -> bytes:
    """16 bytes naming the pair; each half length-prefixed, so no split of it collides;
    sealed with the client's key (memd.sessions.sealing), as it is stored."""
    h = hashlib.blake2b(digest_size=16)
    for text in (user, assistant):
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return sealing.seal(key, h.digest())


class KeyStore(Protocol):
    """The committed keys: what ExchangeKeys asks about a key it no longer holds."""

    def exchange_key(self, conv: int, exchange_id: str) -> tuple[bytes, str, int] | None: ...


KEYS_CAPACITY = 256  # committed keys a client keeps in memory when a store backs them


class ExchangeKeys:
    """(conversation key, exchange_id) -> Recorded, for one client.

    Entries are added when a call decides to write, before its commit, so a concurrent
    call with the same key finds it at once; a failed commit reloads the whole state
    from disk, and with it this table. With a `store`, memory keeps the `capacity` keys
    used last and every key not yet committed (`saved` is told of each commit), and asks
    the store for the others (memd.sessions.recent).
    """

    def __init__(
        self,
        rows: Iterable[KeyRow] = (),
        *,
        store: KeyStore | None = None,
        capacity: int = KEYS_CAPACITY,
    ) -> None:
        self._seen: Recent[tuple[int, str], Recorded] = Recent(
            capacity if store is not None else None
        )
        self._store = store
        for conv, exchange_id, dig, session_id, number in rows:
            self._seen.keep((conv, exchange_id), Recorded(bytes(dig), session_id, number))

    def __len__(self) -> int:
        """Keys held in memory (not those only the store has)."""
        return len(self._seen)

    def get(self, conv: int, exchange_id: str) -> Recorded | None:
        seen = self._seen.get((conv, exchange_id))
        if seen is None and self._store is not None:
            row = self._store.exchange_key(conv, exchange_id)
            if row is not None:
                seen = Recorded(bytes(row[0]), row[1], row[2])
                self._seen.keep((conv, exchange_id), seen)
        return seen

    def add(self, conv: int, exchange_id: str, dig: bytes, session_id: str, number: int) -> KeyRow:
        """Note a key for an exchange being written; the row to commit with it."""
        assert (conv, exchange_id) not in self._seen, "a known key must be replayed"
        self._seen.add((conv, exchange_id), Recorded(dig, session_id, number))
        return conv, exchange_id, dig, session_id, number

    def saved(self, rows: Iterable[KeyRow]) -> None:
        """`add`'s rows are on disk: memory may let them go (memd.sessions.recent)."""
        self._seen.saved((conv, exchange_id) for conv, exchange_id, _, _, _ in rows)


def replay(
    seen: Recorded, dig: bytes, conversation_id: str, exchange_id: str, layout: ClientLayout
) -> dict[str, Any]:
    """The first call's result for a retry; ExchangeConflict if the text differs.

    `path` is the one the first call returned, `sessions/<session_id>.md`, even when the
    session has been compacted since and its transcript is in `archive/` (sessions.list
    tells where it is now): a retry gets the answer the lost reply carried.
    """
    if seen.digest != dig:
        raise ExchangeConflict(
            f"exchange_id {exchange_id!r} of conversation {conversation_id!r} was already "
            f"recorded with a different user or assistant text; nothing was written "
            f"(a new exchange needs a new exchange_id)",
            data={
                "conversation_id": conversation_id,
                "exchange_id": exchange_id,
                "session_id": seen.session_id,
                "conversation": seen.number,
            },
        )
    return {
        "session_id": seen.session_id,
        "conversation": seen.number,
        "path": str(layout.session_file(seen.session_id)),
        "duplicate": True,
        "redacted": 0,
    }
