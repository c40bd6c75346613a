"""Compaction: LLM summaries of ended sessions, the archive, re-compaction, crash-safe steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.compaction.base import base_file
    from memd.compaction.files import restore_files, summary_meta
    from memd.compaction.service import Compactor
    from memd.compaction.store import CompactionStates, Store

__all__ = [
    "CompactionStates",
    "Compactor",
    "Store",
    "base_file",
    "restore_files",
    "summary_meta",
]

__getattr__ = public_face(
    __name__,
    {
        "base": ("base_file",),
        "files": ("restore_files", "summary_meta"),
        "service": ("Compactor",),
        "store": (
            "CompactionStates",
            "Store",
        ),
    },
)
