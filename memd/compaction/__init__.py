"""Compaction: LLM summaries of ended sessions, the archive, re-compaction, crash-safe steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.compaction.service import Compactor

__all__ = [
    "Compactor",
]

__getattr__ = public_face(
    __name__,
    {
        "service": ("Compactor",),
    },
)
