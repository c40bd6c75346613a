"""Histories from elsewhere: memd's JSON lines, ChatGPT and Claude.ai data exports, streamed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.histories.model import Conversation, Exchange, HistoryError, Tally
    from memd.histories.source import FORMATS, History, open_history

__all__ = [
    "FORMATS",
    "Conversation",
    "Exchange",
    "History",
    "HistoryError",
    "Tally",
    "open_history",
]

__getattr__ = public_face(
    __name__,
    {
        "model": ("Conversation", "Exchange", "HistoryError", "Tally"),
        "source": ("FORMATS", "History", "open_history"),
    },
)
