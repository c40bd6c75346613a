"""Session states and the transitions between them, checked on every change.

Import-free on purpose (like memd.supervision.states): status renderers and the
compaction service may name the states without loading the session machinery.

- `active`: takes writes; ends at its deadline (inactivity or maximum duration) or on
  `sessions.close`.
- `ended`: its transcript is in `sessions/`, due for compaction; a write to one of its
  conversations reopens it (`active` again).
- `compacted`: its transcript is in `archive/`, its summary in `sessions/`; a write
  reopens it after the restore hooks brought the transcript back.

On open, an ended session's state follows where its file is (`ended` <-> `compacted`),
so a move the state did not hear of (a crash between the two, a person's `mv`) heals.
"""

from __future__ import annotations

from enum import StrEnum


class SessionState(StrEnum):
    """Stored in the state database as its value (a str), so old databases read as is."""

    ACTIVE = "active"
    ENDED = "ended"
    COMPACTED = "compacted"


S = SessionState
ALLOWED: dict[SessionState, frozenset[SessionState]] = {
    S.ACTIVE: frozenset({S.ENDED}),
    S.ENDED: frozenset({S.ACTIVE, S.COMPACTED}),
    S.COMPACTED: frozenset({S.ACTIVE, S.ENDED}),
}


class SessionStateError(RuntimeError):
    """A state change the table does not allow: a bug in memd, never user input."""


def check_transition(session_id: str, old: SessionState, new: SessionState) -> None:
    if new not in ALLOWED[old]:
        raise SessionStateError(f"session {session_id}: {old} -> {new} is not allowed")
