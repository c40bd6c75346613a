"""The one owner of the transcript and summary format: front matter, headings, writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.markdown.bare import bare_text
    from memd.markdown.edit import (
        Span,
        exchange_spans,
        first_user_titles,
        remove_exchanges,
        replace_file,
        retitle,
    )
    from memd.markdown.lines import FileLines, has_other_breaks, lines_of, newlines, read_lines
    from memd.markdown.overflow import index_view
    from memd.markdown.summary import (
        code_fence,
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
        TITLE_SEP,
        ParsedExchange,
        Part,
        clean_text,
        conversation_title,
        exchange_block,
        fsync_dir,
        heading_time,
        iso,
        label,
        parse_exchange_heading,
        parse_exchange_title,
        parse_transcript,
        parts_block,
        read_transcript,
    )
else:
    __getattr__ = lazy_face(__name__, __file__)
