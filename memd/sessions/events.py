"""What session hooks and inspection calls get: a session's info, and the hook events.

`SessionInfo` is a TypedDict, not a dataclass, because the same rows go out as JSON
(`sessions.list`, `memd status`) unchanged; mypy checks every key a hook reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict


class SessionInfo(TypedDict):
    """One session as hooks and `sessions.list` see it (times are ISO 8601 UTC)."""

    client_id: str
    session_id: str
    state: str  # a memd.sessions.states.SessionState value
    started: str
    last_activity: str
    ended: str | None
    end_reason: str | None  # inactivity | max_duration | closed
    path: str  # sessions/<id>.md, or archive/<id>.md once compacted
    conversations: int
    resumed: str | None
    resumes: int
    expires: NotRequired[str]  # active sessions: when it ends unless written to
    old_state: NotRequired[str]  # resume events: the state it was reopened from


Hook = Callable[[SessionInfo], Awaitable[None] | None]
EventKind = Literal["end", "resume"]


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A session ended or was reopened; its hooks run after the change is on disk."""

    kind: EventKind
    info: SessionInfo
