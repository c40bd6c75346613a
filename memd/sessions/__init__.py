"""Sessions and conversations: recording, prefix index, exchange keys, state, group commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.sessions.chat import INDEX_CAPACITY, InvalidRecord, prepare, render
    from memd.sessions.exchange_keys import MAX_EXCHANGE_ID, check_exchange_id
    from memd.sessions.store import Change, Event, Session, StateStore
    from memd.sessions.tracker import ClientSessions

__all__ = [
    "INDEX_CAPACITY",
    "MAX_EXCHANGE_ID",
    "Change",
    "ClientSessions",
    "Event",
    "InvalidRecord",
    "Session",
    "StateStore",
    "check_exchange_id",
    "prepare",
    "render",
]

__getattr__ = public_face(
    __name__,
    {
        "chat": (
            "InvalidRecord",
            "INDEX_CAPACITY",
            "render",
            "prepare",
        ),
        "exchange_keys": (
            "MAX_EXCHANGE_ID",
            "check_exchange_id",
        ),
        "store": (
            "Event",
            "Session",
            "Change",
            "StateStore",
        ),
        "tracker": ("ClientSessions",),
    },
)
