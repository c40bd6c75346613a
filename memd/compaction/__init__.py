"""Compaction: LLM summaries of ended sessions, the archive, re-compaction, crash-safe steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.compaction.base import base_file
    from memd.compaction.files import restore_files, summary_meta
    from memd.compaction.service import Compactor
    from memd.compaction.store import CompactionStates, Store
else:
    __getattr__ = lazy_face(__name__, __file__)
