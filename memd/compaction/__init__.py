"""Compaction: LLM summaries of ended sessions, the archive, re-compaction, crash-safe steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.compaction.base import base_file
    from memd.compaction.files import sha256, summary_meta
    from memd.compaction.job import compact_session, restore
    from memd.compaction.llm import LLMError, LLMSettings, complete, split_text, summarize
    from memd.compaction.service import Compactor
    from memd.compaction.store import Backoff, CompactionStates, Record, S, Store

__all__ = [
    "Backoff",
    "CompactionStates",
    "Compactor",
    "LLMError",
    "LLMSettings",
    "Record",
    "S",
    "Store",
    "base_file",
    "compact_session",
    "complete",
    "restore",
    "sha256",
    "split_text",
    "summarize",
    "summary_meta",
]

__getattr__ = public_face(
    __name__,
    {
        "base": ("base_file",),
        "files": (
            "sha256",
            "summary_meta",
        ),
        "job": (
            "compact_session",
            "restore",
        ),
        "llm": (
            "LLMError",
            "LLMSettings",
            "complete",
            "summarize",
            "split_text",
        ),
        "service": ("Compactor",),
        "store": (
            "CompactionStates",
            "S",
            "Backoff",
            "Record",
            "Store",
        ),
    },
)
