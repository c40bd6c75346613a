"""The base of an incremental re-compaction: the last summary of a session that resumed.

A restore brings the raw transcript back into `sessions/` and moves the summary out of
the watched tree, to `.memd/compaction-base/S-summary.md` (a delete for the watcher, so
the session is not indexed twice). When the session ends again, only the bytes the
transcript gained since that summary are summarised, with the base's text as context.

A base is used only if it still describes a prefix of the transcript: its front matter
records `source_bytes` and `source_sha256` of the transcript it was made from, and
`compaction_key`, the settings that made it (provider, model, request bound, prompt
version). Anything else — a transcript rewritten by hand, other settings, a summary from
before this format — means a full compaction from the whole transcript, as before.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from memd.layout import ClientLayout
from memd.markdown import code_fence, read_front_matter, split_front_matter

BASE_DIR = "compaction-base"
PROMPT_VERSION = "1"  # bump when the prompts change so much that old bases should not be used

_SHAPED_RE = re.compile(r"^(#{2,6}) .+? · summary · (.*)$")
_ESCAPED_RE = re.compile(r"^\\(#{1,6}\s|---$)")
_TITLE_RE = re.compile(r"^# .* · session summary$")


@dataclass(frozen=True)
class Base:
    """A summary that the next compaction of its session can start from."""

    body: str  # the LLM's text, as it wrote it (headings and escapes undone)
    source_bytes: int  # how much of the transcript it covers
    started: datetime | None  # the first exchange it covers


def base_file(layout: ClientLayout, session_id: str) -> Path:
    """Where a restored session's last summary waits; outside sessions/, so not indexed."""
    layout.session_file(session_id)  # refuses ids that are not file names
    return layout.state_dir / BASE_DIR / f"{session_id}-summary.md"


def compaction_key(provider: str, model: str, max_request_chars: int) -> str:
    """The settings a summary was made with; a base made with others is not used."""
    raw = f"{provider}\0{model}\0{max_request_chars}\0{PROMPT_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def find_base(layout: ClientLayout, session_id: str, data: bytes, key: str) -> Base | None:
    """The base for the transcript `data`, or None when it must be summarised in full.

    The kept base comes first; a summary still in sessions/ (a restore cut short by a
    crash) is as good, if it describes a prefix of `data`.
    """
    for path in (base_file(layout, session_id), layout.summary_file(session_id)):
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        base = _usable(text, data, key)
        if base is not None:
            return base
    return None


def _usable(text: str, data: bytes, key: str) -> Base | None:
    meta = read_front_matter(text)
    try:
        size = int(meta.get("source_bytes", ""))
    except ValueError:
        return None
    if meta.get("compaction_key") != key or not 0 < size < len(data):
        return None
    if hashlib.sha256(data[:size]).hexdigest() != meta.get("source_sha256"):
        return None
    return Base(unshape_body(text), size, _parse_iso(meta.get("started", "")))


def unshape_body(summary: str) -> str:
    """The LLM's text of a summary file: `summary.shape_body` undone, title dropped.

    Without this each cycle would date its headings again (`span · summary · span ·
    summary · …`), so the base is given back to the LLM the way the LLM wrote it.
    """
    _, body = split_front_matter(summary)
    lines = body.strip("\n").split("\n")
    if lines and _TITLE_RE.match(lines[0]):
        lines = lines[1:]
    out: list[str] = []
    fence: str | None = None
    for line in lines:
        on_fence, fence = code_fence(line, fence)
        if on_fence:
            pass
        elif fence is None and (m := _SHAPED_RE.match(line)):
            line = f"{'#' * (len(m.group(1)) - 1)} {m.group(2)}"
        elif _ESCAPED_RE.match(line):
            line = line[1:]
        out.append(line)
    return "\n".join(out).strip()


def stale_bases(layout: ClientLayout) -> list[Path]:
    """Bases left behind once their session was compacted again (a crash before cleanup).

    A base is only needed while its transcript is live in sessions/.
    """
    folder = layout.state_dir / BASE_DIR
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*-summary.md"):
        sid = path.name.removesuffix("-summary.md")
        if not layout.session_file(sid).exists() and layout.summary_file(sid).exists():
            found.append(path)
    return found


def _parse_iso(value: str) -> datetime | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
