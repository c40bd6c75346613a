"""Sessions and conversations: recording, prefix index, exchange keys, state, group commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.sessions.tracker import ClientSessions

__all__ = [
    "ClientSessions",
]

__getattr__ = public_face(
    __name__,
    {
        "tracker": ("ClientSessions",),
    },
)
