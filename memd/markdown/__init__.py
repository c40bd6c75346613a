"""The one owner of the transcript and summary format: front matter, headings, writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.markdown.lines import read_lines
    from memd.markdown.summary import (
        parse_summary_title,
        read_front_matter,
        render_summary,
        shape_body,
        span_text,
        split_front_matter,
        transcript_span,
    )
    from memd.markdown.transcript import (
        HEADING_TIME,
        SESSION_ID_RE,
        Part,
        clean_text,
        exchange_block,
        fsync_dir,
        heading_time,
        iso,
        label,
        parse_exchange_title,
        parts_block,
    )

__all__ = [
    "HEADING_TIME",
    "SESSION_ID_RE",
    "Part",
    "clean_text",
    "exchange_block",
    "fsync_dir",
    "heading_time",
    "iso",
    "label",
    "parse_exchange_title",
    "parse_summary_title",
    "parts_block",
    "read_front_matter",
    "read_lines",
    "render_summary",
    "shape_body",
    "span_text",
    "split_front_matter",
    "transcript_span",
]

__getattr__ = public_face(
    __name__,
    {
        "lines": ("read_lines",),
        "summary": (
            "parse_summary_title",
            "read_front_matter",
            "render_summary",
            "shape_body",
            "span_text",
            "split_front_matter",
            "transcript_span",
        ),
        "transcript": (
            "HEADING_TIME",
            "Part",
            "SESSION_ID_RE",
            "clean_text",
            "exchange_block",
            "fsync_dir",
            "heading_time",
            "iso",
            "label",
            "parse_exchange_title",
            "parts_block",
        ),
    },
)
