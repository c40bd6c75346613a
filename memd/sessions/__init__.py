"""Sessions and conversations: recording, prefix index, exchange keys, state, group commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.sessions.events import Hook, SessionEvent, SessionInfo
    from memd.sessions.states import SessionState
    from memd.sessions.tracker import ClientSessions

__all__ = [
    "ClientSessions",
    "Hook",
    "SessionEvent",
    "SessionInfo",
    "SessionState",
]

__getattr__ = public_face(
    __name__,
    {
        "events": ("Hook", "SessionEvent", "SessionInfo"),
        "states": ("SessionState",),
        "tracker": ("ClientSessions",),
    },
)
