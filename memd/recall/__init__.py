"""MemoryRecall: the tool's definition and arguments, search + expand, and the text an LLM reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.recall.caches import RecallCaches
    from memd.recall.expand import collect, contained_path
    from memd.recall.files import RecentFiles
    from memd.recall.lane import RecallBusyError, RecallLane
    from memd.recall.output import Memory, Source, allot, clip, render
    from memd.recall.service import OVERFETCH, RecallTimeoutError, recall
    from memd.recall.tool import (
        MAX_QUERY_CHARS,
        NO_RESULTS,
        SERVER_NAME,
        RecallArgs,
        RecallArgumentError,
        instructions,
        parse_arguments,
        parse_time,
        tool_definition,
    )
else:
    __getattr__ = lazy_face(__name__, __file__)
