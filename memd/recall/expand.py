"""A recall's hits expanded into the sections shown: distinct, labelled, in this client's files.

memsearch's expand rule: a chunk becomes its whole markdown section. What must not or
need not be shown is dropped (front matter, sources outside the client's `sessions/`,
files deleted since they were indexed, sections already shown); each section is labelled
from its path *relative to the client's root* (memd.recall.service runs this on a lane
thread, after the search).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import structlog

from memd import trust
from memd.indexing import Hit, Section
from memd.layout import ClientLayout
from memd.markdown import (
    HEADING_TIME,
    SESSION_ID_RE,
    heading_time,
)
from memd.recall import context
from memd.recall.files import LineCache, RecentFiles
from memd.recall.output import Memory, Source
from memd.recall.shown import Neighbours, Shown, dated, headless
from memd.recall.surround import surround, within

log = structlog.get_logger()

_FRONT_MATTER_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*:")
_CONV_HEADER_RE = re.compile(r"^# Conversation (\d+) \((.*)\)$")


def collect(
    hits: Sequence[Hit],
    layout: ClientLayout,
    top_k: int,
    follow_questions: bool = True,
    neighbours: bool = True,
    files: RecentFiles | None = None,
    context_chars: int = 0,
    period: tuple[datetime | None, datetime | None] = (None, None),
) -> list[Memory]:
    """Expand hits best first into at most `top_k` distinct sections of this client's files.

    No two results share a line, nor show a conversation's title (memd.recall.shown).
    With `follow_questions`, a section that ends by asking a question is followed by the
    user's next message, its likely answer (memd.recall.context), unless that exchange is
    among the results itself. With `neighbours`, a hit that did not make the top_k but is
    the exchange right before or after a result is shown inside that result, clipped
    (memd.recall.shown.Neighbours): it matched the query too, and beside its neighbour it
    costs a few hundred characters instead of a result. Then the exchanges around the
    best results, within `context_chars` and `period` (memd.recall.surround).
    `files`: RecallLane.recent."""
    reader = LineCache(files or RecentFiles())
    try:
        return _collect(
            hits, layout, top_k, follow_questions, neighbours, reader, context_chars, period
        )
    finally:
        reader.close()  # the transcripts' descriptors, open since each was first shown


def _collect(
    hits: Sequence[Hit],
    layout: ClientLayout,
    top_k: int,
    follow_questions: bool,
    neighbours: bool,
    reader: LineCache,
    context_chars: int,
    period: tuple[datetime | None, datetime | None],
) -> list[Memory]:
    sessions = layout.sessions.resolve()
    shown = Shown()
    out: list[Memory] = []
    follows: list[tuple[Path, int, str] | None] = []
    near = Neighbours()
    paths: dict[str, Path | None] = {}
    for hit in hits:
        path = _servable(hit, layout, sessions, reader, paths)
        if path is None:
            continue
        section = shown.section(hit, path, sessions, reader.lines(path))
        if len(out) >= top_k:
            if neighbours:
                near.offer(path, section)
            continue
        content = _strip_front_matter(section.content).strip("\n")
        if not content.strip() or not shown.add(path, section.start_line, section.end_line):
            continue
        content = shown.untitled(hit.heading, content)
        lines = reader.lines(path)
        found = _follow(content, lines, section.end_line, period) if follow_questions else None
        follows.append((path, found[0] + 1, found[1]) if found else None)
        near.shown(path, section)
        out.append(_memory(hit, section, content, describe_source(path, sessions, hit, reader)))
    out = near.attach(_with_follows(out, follows, shown.starts()), shown)
    return surround(out, near.results(), shown, reader, context_chars, period)


def _follow(
    content: str,
    lines: Sequence[str],
    end: int,
    period: tuple[datetime | None, datetime | None],
) -> tuple[int, str] | None:
    """The follow-up of a result that asks a question (memd.recall.context.follow), unless
    it lies outside the recall's `after`/`before`: a filtered recall shows nothing else."""
    found = context.follow(content, lines, end)
    return found if found is not None and within(lines[found[0]], period) else None


def _servable(
    hit: Hit, layout: ClientLayout, sessions: Path, reader: LineCache, paths: dict[str, Path | None]
) -> Path | None:
    """The hit's file when recall may show it: inside the client's `sessions/`, still
    there (deleting a file removes it from recall), a regular file of memd's uid opened
    without following a link (memd.trust), and not only front matter. `paths`: the
    recall's `contained_path` answers by source, asked once per file rather than once
    per hit (most hits of a recall share a file; pathlib made it ~1 ms of a recall)."""
    if hit.source not in paths:
        paths[hit.source] = contained_path(hit.source, sessions)
    path = paths[hit.source]
    if path is None:
        log.warning("recall.source_refused", client=layout.client_id, chunk_hash=hit.chunk_hash)
        return None
    if not reader.servable(path) or _is_front_matter_only(hit):
        return None
    return path


def _memory(hit: Hit, section: Section, content: str, source: Source) -> Memory:
    text, dropped = headless(dated(content, hit), hit.heading)
    return Memory(
        source=source,
        heading=section.heading,
        content=text,
        score=hit.score,
        chunk_hash=hit.chunk_hash,
        focus_line=max(0, hit.start_line - section.start_line - dropped),
    )


def _with_follows(
    memories: list[Memory],
    follows: Sequence[tuple[Path, int, str] | None],
    shown: set[tuple[Path, int]],
) -> list[Memory]:
    """Each memory with its follow-up text appended, unless that exchange is shown anyway."""
    out = []
    for memory, extra in zip(memories, follows, strict=True):
        if extra is not None and (extra[0], extra[1]) not in shown:
            memory = dataclasses.replace(memory, content=f"{memory.content}\n\n{extra[2]}")
        out.append(memory)
    return out


def contained_path(source: str, sessions: Path) -> Path | None:
    """The source file if it lies inside the client's `sessions/` (the resolved folder),
    else None. Nothing of the source itself is resolved: a symlink anywhere below
    sessions/ makes it unservable, rather than leading to wherever it points (a
    `bob/sessions -> alice/sessions` link passed a check that resolved both sides).

    This is what keeps another client's chunk unresolvable even if one ever reached this
    client's results: only files under the requesting client's own sessions/ are read.
    """
    try:
        path = Path(os.path.normpath(source))
    except (TypeError, ValueError):
        return None
    if not path.is_absolute() or not trust.trusted_below(path, sessions):
        return None
    return path


def describe_source(path: Path, sessions: Path, hit: Hit, reader: LineCache) -> Source:
    """Label a section from its path relative to the client root: never an absolute path."""
    rel = "sessions/" + path.relative_to(sessions).as_posix()
    stem = path.stem
    if (
        path.suffix == ".md"
        and stem.endswith("-summary")
        and SESSION_ID_RE.match(stem.removesuffix("-summary"))
    ):
        return Source(
            rel, "summary", stem.removesuffix("-summary"), None, _summary_span(hit.heading)
        )
    if path.suffix == ".md" and SESSION_ID_RE.match(stem):
        number, started = _conversation_at(reader, path, hit.start_line)
        when = heading_time(hit.when) if hit.when else started
        return Source(rel, "transcript", stem, number, when)
    return Source(rel, "file", None, None, heading_time(hit.when) if hit.when else "")


def _summary_span(heading: str) -> str:
    from memd.markdown import parse_summary_title

    span = parse_summary_title(heading)
    return f"{heading_time(span[0])} – {heading_time(span[1])}" if span else ""


def _conversation_at(reader: LineCache, path: Path, line: int) -> tuple[int | None, str]:
    """The `# Conversation N (...)` header above 1-based `line`, and the time it names."""
    lines = reader.lines(path)
    for i in range(min(line, len(lines)) - 1, -1, -1):
        if m := _CONV_HEADER_RE.match(lines[i]):
            started = m.group(2).split(",", 1)[0].strip()
            try:
                datetime.strptime(started, HEADING_TIME)
            except ValueError:
                started = ""
            return int(m.group(1)), started
    return None, ""


def _front_matter_end(lines: list[str]) -> int:
    """Index after the closing `---` of a leading YAML front matter block, or 0."""
    if not lines or lines[0].strip() != "---":
        return 0
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return i + 1
        if not _FRONT_MATTER_KEY_RE.match(lines[i]):
            return 0
    return 0


def _is_front_matter_only(hit: Hit) -> bool:
    """memsearch indexes a file's front matter as a chunk of its own; it is no memory."""
    if hit.heading_level != 0 or hit.start_line > 1:
        return False
    lines = hit.content.strip("\n").split("\n")
    end = _front_matter_end(lines)
    return end > 0 and not "\n".join(lines[end:]).strip()


def _strip_front_matter(text: str) -> str:
    lines = text.split("\n")
    end = _front_matter_end(lines)
    return "\n".join(lines[end:]) if end else text
