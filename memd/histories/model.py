"""What every history format is read into: conversations of exchanges, and what was left out.

A reader yields one `Conversation` at a time, so a history of any size costs the memory
of its largest conversation. `Tally` counts what was left out and why, for the summary.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(slots=True)
class Exchange:
    """One user turn and the assistant's answer to it, as memd records them."""

    exchange_id: str  # stable across re-reads of the same export: the idempotency key
    when: datetime
    user: str
    assistant: str
    origin: tuple[int, int] | None = None  # memd export: (conversation, exchange) numbers


@dataclass(slots=True)
class Conversation:
    """One conversation of the source, in the order it was shown to the user."""

    conversation_id: str  # memd's conversation id for it (prefixed with the format)
    title: str
    when: datetime
    exchanges: list[Exchange] = field(default_factory=list)
    session_id: str | None = None  # memd export only: the session it came from

    def add(self, from_user: bool, text: str, message_id: str, when: datetime) -> None:
        """One message of a chat export: a user message opens an exchange (or joins the
        open one that has no answer yet); an assistant message answers the open one (or
        opens one with no user text, when the conversation starts with it)."""
        last = self.exchanges[-1] if self.exchanges else None
        if from_user:
            if last is not None and not last.assistant:
                last.user += "\n\n" + text
            else:
                self.exchanges.append(Exchange(message_id, when, text, ""))
        elif last is None:
            self.exchanges.append(Exchange(message_id, when, "", text))
        else:
            last.assistant = f"{last.assistant}\n\n{text}" if last.assistant else text


@dataclass
class Tally:
    """Messages and conversations left out, by reason (`skipped["system message"] == 3`)."""

    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, reason: str, n: int = 1) -> None:
        if n:
            self.skipped[reason] += n


class HistoryError(Exception):
    """The file cannot be read as the history it claims to be; the message names where."""


def from_epoch(value: object, fallback: datetime) -> datetime:
    """A ChatGPT time (epoch seconds, float or null) as an aware datetime."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(float(value), UTC)
    return fallback


def from_iso(value: object, fallback: datetime) -> datetime:
    """A Claude.ai time (ISO 8601 with Z or an offset) as an aware datetime."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return fallback
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return fallback


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
