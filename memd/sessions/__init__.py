"""Sessions and conversations: recording, prefix index, exchange keys, state, group commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.sessions.events import Hook, SessionEvent, SessionInfo
    from memd.sessions.states import SessionState
    from memd.sessions.tracker import ClientSessions
else:
    __getattr__ = lazy_face(__name__, __file__)
