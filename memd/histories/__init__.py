"""Histories from elsewhere: memd's JSON lines, ChatGPT and Claude.ai data exports, streamed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.histories.model import Conversation, Exchange, HistoryError, Tally
    from memd.histories.source import FORMATS, History, open_history
else:
    __getattr__ = lazy_face(__name__, __file__)
