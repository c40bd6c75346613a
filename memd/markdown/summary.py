"""The summary file's format: front matter, dated titles and headings, and reading them back.

memsearch's chunker splits at every `#`..`######` line and keeps the heading as the
chunk's label, so every heading of a summary starts with the session's time range: BM25
finds a date, and recall can filter by time (`parse_summary_title`; the range sorts as
text like exchange headings do).
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import UTC, datetime

from memd.markdown.transcript import heading_time, iso, parse_exchange_title

_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+)$")  # memsearch's chunker splits exactly here
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_PLAIN_RE = re.compile(r"^[A-Za-z0-9_.:/+-]*$")
_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
_SPAN_RE = re.compile(rf"({_TIME}) – ({_TIME})")
_BREAKS_RE = re.compile("\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def render_summary(
    client_id: str,
    session_id: str,
    body: str,
    *,
    start: datetime,
    end: datetime,
    compacted_at: float,
    provider: str,
    model: str,
    parts: int,
    source_sha256: str,
    extra: dict[str, str] | None = None,
) -> str:
    """The summary file: front matter, a dated title, the LLM's text with dated headings.

    Headings in the LLM's text move one level down under the title; `#` lines inside
    code fences are escaped so code never splits a chunk. `extra` adds front matter
    (compaction records what the next incremental compaction needs).
    """
    span = span_text(start, end)
    meta = {
        "client_id": client_id,
        "session_id": session_id,
        "summary_of": f"sessions/{session_id}.md",
        "archive": f"archive/{session_id}.md",
        "started": iso(start.timestamp()),
        "ended": iso(end.timestamp()),
        "compacted_at": iso(compacted_at),
        "llm_provider": provider,
        "llm_model": model,
        "parts": str(parts),
        "source_sha256": source_sha256,
        **(extra or {}),
    }
    front = "".join(f"{k}: {_yaml_value(v)}\n" for k, v in meta.items())
    return f"---\n{front}---\n\n# {span} · session summary\n\n{shape_body(body, span)}\n"


def span_text(start: datetime, end: datetime) -> str:
    """The time range every summary heading starts with."""
    return f"{heading_time(start)} – {heading_time(end)}"


def shape_body(text: str, span: str) -> str:
    """The LLM's markdown, with headings demoted and dated, and code fences made inert."""
    out: list[str] = []
    fence: str | None = None
    for line in _BREAKS_RE.sub("\n", text).strip().split("\n"):
        on_fence, fence = code_fence(line, fence)
        if on_fence:
            pass
        elif (m := _HEADING_RE.match(line)) and fence is None:
            level = min(6, len(m.group(1)) + 1)
            line = f"{'#' * level} {span} · summary · {m.group(2).strip()}"
        elif _HEADING_RE.match(line) or line == "---":
            line = "\\" + line
        out.append(line)
    return "\n".join(out)


def code_fence(line: str, fence: str | None) -> tuple[bool, str | None]:
    """Whether `line` is a code fence line, and the fence open after it (None: none).

    CommonMark's rule: a fence closes only on a run of its own character at least as long
    as the one that opened it; any other fence line inside it is code. The summary writer
    and its reader (memd.compaction.base) must agree on it, or a `#` in code would be
    taken for a heading by one of them."""
    m = _FENCE_RE.match(line)
    if m is None:
        return False, fence
    mark = m.group(1)
    if fence is None:
        return True, mark
    if mark[0] == fence[0] and len(mark) >= len(fence):
        return True, None
    return True, fence


def parse_summary_title(title: str) -> tuple[datetime, datetime] | None:
    """The time range a summary heading (chunk heading text, without `#`) covers."""
    m = _SPAN_RE.search(title)
    if not m or "summary" not in title:
        return None
    start, end = (
        datetime.strptime(g, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC) for g in m.groups()
    )
    return start, end


def read_front_matter(text: str) -> dict[str, str]:
    """The `key: value` lines between the opening and closing `---`; {} when there are none."""
    lines = text.split("\n")
    if not lines or lines[0] != "---":
        return {}
    meta: dict[str, str] = {}
    for line in lines[1:]:
        if line == "---":
            return meta
        key, _, value = line.partition(":")
        value = value.strip()
        if value.startswith('"'):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        meta[key.strip()] = value
    return {}


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """The front matter and the text after it (all of `text` when there is none)."""
    meta = read_front_matter(text)
    if not meta:
        return {}, text
    end = text.find("\n---\n", 4)
    return meta, text[end + 5 :] if end >= 0 else ""


def transcript_span(body: str, meta: dict[str, str], fallback: float) -> tuple[datetime, datetime]:
    """First and last exchange time; else the front matter's start; else the file time."""
    times = [
        parsed[0]
        for line in body.split("\n")
        if line.startswith("## ") and (parsed := parse_exchange_title(line[3:]))
    ]
    if times:
        return min(times), max(times)
    try:
        start = datetime.strptime(meta.get("started", ""), "%Y-%m-%dT%H:%M:%SZ")
        start = start.replace(tzinfo=UTC)
    except ValueError:
        start = datetime.fromtimestamp(fallback, UTC)
    return start, start


def _yaml_value(value: str) -> str:
    return value if _PLAIN_RE.match(value) else json.dumps(value, ensure_ascii=False)
