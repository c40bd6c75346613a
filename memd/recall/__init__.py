"""MemoryRecall: the tool's definition and arguments, search + expand, and the text an LLM reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.recall.output import Memory, Source, allot, clip, render
    from memd.recall.service import (
        OVERFETCH,
        RecallBusyError,
        RecallLane,
        RecallTimeoutError,
        collect,
        contained_path,
        recall,
    )
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

__all__ = [
    "MAX_QUERY_CHARS",
    "NO_RESULTS",
    "OVERFETCH",
    "SERVER_NAME",
    "Memory",
    "RecallArgs",
    "RecallArgumentError",
    "RecallBusyError",
    "RecallLane",
    "RecallTimeoutError",
    "Source",
    "allot",
    "clip",
    "collect",
    "contained_path",
    "instructions",
    "parse_arguments",
    "parse_time",
    "recall",
    "render",
    "tool_definition",
]

__getattr__ = public_face(
    __name__,
    {
        "output": (
            "Memory",
            "Source",
            "allot",
            "clip",
            "render",
        ),
        "service": (
            "OVERFETCH",
            "RecallBusyError",
            "RecallLane",
            "RecallTimeoutError",
            "collect",
            "contained_path",
            "recall",
        ),
        "tool": (
            "MAX_QUERY_CHARS",
            "NO_RESULTS",
            "RecallArgs",
            "RecallArgumentError",
            "SERVER_NAME",
            "instructions",
            "parse_arguments",
            "parse_time",
            "tool_definition",
        ),
    },
)
