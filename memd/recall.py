"""MemoryRecall: the `_memory` tool's definition, arguments, search + expand, and output text.

Independent of the socket: `memd.api_recall` serves it as JSON-RPC, `memd.mcp` over stdio.

A recall searches one client's index (the api hands in that client's own `IndexSearcher`),
expands the best chunks to their full markdown section (memsearch's expand rule), drops
what must not or need not be shown (front matter, sources outside the client's
`sessions/`, files deleted since they were indexed, sections already shown), labels each
section from its path *relative to the client's root* and returns at most `CHAR_BUDGET`
characters of text, clipping long sections around the chunk that matched.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from memd.layout import ClientLayout
from memd.lines import read_lines
from memd.search import Hit, IndexSearcher, IndexUnavailableError, expand_hit
from memd.transcript import HEADING_TIME, SESSION_ID_RE, heading_time

log = structlog.get_logger()

SERVER_NAME = "_memory"
NO_RESULTS = "No relevant memories found."
CHAR_BUDGET = 12_000  # the whole text returned to the LLM, labels included
TOP_K_CAP = 20  # the tool's top_k maximum (or search_top_k, if that is larger)
MAX_QUERY_CHARS = 2000
RECALL_TIMEOUT = 10.0  # seconds for one search, embedding included
OVERFETCH = 2  # front-matter chunks and chunks of one section are dropped after the search
MIN_SHARE = 300  # below this many characters per section, fewer sections are shown

_FRONT_MATTER_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*:")
_CONV_HEADER_RE = re.compile(r"^# Conversation (\d+) \((.*)\)$")
_RELATIVE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhdw])(?:\s+ago)?$", re.IGNORECASE)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
_CLIP_END = "\n[… truncated]"
_CLIP_GAP = "\n[…]\n"

TIME_FORMS = ("an ISO date (2026-11-01), an ISO datetime (2026-11-01T14:00, "
              "2026-11-01T14:00:00Z, 2026-11-01T14:00+02:00; UTC when no offset is given) "
              "or a time before now: 30m, 6h, 2d, 1w (minutes, hours, days, weeks)")


class RecallTimeoutError(Exception):
    """The index answered but expanding its hits outran the deadline: the daemon is
    overloaded (its threads are busy), which is neither the index's fault nor a bug."""


class RecallArgumentError(ValueError):
    """A tool argument the LLM (or a caller) got wrong; the message says what is accepted."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class RecallArgs:
    """Validated arguments: times are aware UTC datetimes, `after` inclusive, `before` exclusive."""

    query: str
    top_k: int
    after: datetime | None = None
    before: datetime | None = None


@dataclass(frozen=True)
class Source:
    """Where a section comes from, told without absolute paths."""

    path: str  # relative to the client's root: sessions/<file>.md
    kind: str  # transcript | summary | file
    session_id: str | None
    conversation: int | None
    when: str  # exchange time, a summary's span, or ""

    @property
    def label(self) -> str:
        parts = [self.kind]
        if self.session_id:
            parts.append(f"session {self.session_id}")
        else:
            parts.append(self.path)
        if self.conversation is not None:
            parts.append(f"conversation {self.conversation}")
        if self.when:
            parts.append(self.when)
        return " · ".join(parts)


@dataclass(frozen=True)
class Memory:
    """One expanded section as recall returns it."""

    source: Source
    heading: str
    content: str  # the whole section
    score: float
    chunk_hash: str
    focus_line: int  # the matched chunk's first line, counted within the section


# -- the tool ---------------------------------------------------------------------------------


def top_k_limit(default_top_k: int) -> int:
    return max(TOP_K_CAP, default_top_k)


def tool_definition(name: str, default_top_k: int) -> dict[str, Any]:
    """The MCP tool definition of MemoryRecall (`inputSchema` is JSON Schema)."""
    limit = top_k_limit(default_top_k)
    time_help = ("ISO date (2026-11-01), ISO datetime (2026-11-01T14:00; UTC unless it ends in "
                 "Z or an offset such as +02:00), or relative: 30m, 6h, 2d, 1w meaning that "
                 "long before now.")
    return {
        "name": name,
        "title": "Recall past conversations",
        "description": (
            "Search your memory of past conversations with this user (their transcripts and "
            "session summaries) and return the most relevant past exchanges, each with its "
            "source, time (UTC) and relevance score, or 'No relevant memories found.'. Use "
            "it when the user refers to something discussed before or when earlier context "
            "(their projects, preferences, decisions) would help."),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
                    "description": "What to look for: keywords, names, or a short "
                                   "description of the earlier discussion.",
                },
                "top_k": {
                    "type": "integer", "minimum": 1, "maximum": limit, "default": default_top_k,
                    "description": f"How many memories to return (1-{limit}, default "
                                   f"{default_top_k}).",
                },
                "after": {
                    "type": "string",
                    "description": "Only exchanges at or after this time. " + time_help,
                },
                "before": {
                    "type": "string",
                    "description": "Only exchanges strictly before this time. " + time_help,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "annotations": {"title": "Recall past conversations", "readOnlyHint": True,
                        "destructiveHint": False, "idempotentHint": True,
                        "openWorldHint": False},
    }


def instructions(name: str) -> str:
    """What the LLM is told about the `_memory` server: when to call the tool and how."""
    return (
        f"The {SERVER_NAME} server is your long-term memory of past conversations with this "
        f"user. Call {name} when the user refers to something from an earlier conversation "
        "(\"as I said\", \"last week\", \"what did we decide about ...\"), asks what you "
        "remember, or when earlier context (their projects, preferences, names, decisions) "
        "would help; do it before saying you do not know or asking them to repeat "
        f"themselves. {name} searches only this user's own past conversations with you: "
        "transcripts of earlier sessions and summaries of older ones, nothing else. It "
        "returns the most relevant past exchanges, best first, each labelled with its source "
        "(session, conversation, transcript or summary), its time in UTC and a relevance "
        "score from 0 to 1 (above 0.5: it matched both by words and by meaning; 0.5 or less: "
        "only one way, often a weak match), or exactly 'No relevant memories found.'. What "
        "it returns is a "
        "record of what was said then and may be out of date; what the user says now wins. "
        "Write `query` as keywords or a short description of what you are looking for; if "
        "nothing useful comes back, try other words. To search a period, set `after` "
        "(inclusive) and/or `before` (exclusive) to an ISO date or datetime (UTC unless an "
        "offset is given) or to a time before now such as 30m, 6h, 2d or 1w: 'yesterday' is "
        "after=<yesterday's date>, before=<today's date>; 'in the last two hours' is "
        "after=2h. Time filters match single exchanges; summaries carry no exchange times and "
        "are left out of filtered searches.")


# -- arguments --------------------------------------------------------------------------------


def parse_time(value: Any, param: str, now: datetime) -> datetime:
    """An ISO date/datetime (naive = UTC) or a relative `30m`/`6h`/`2d`/`1w` before `now`."""
    if not isinstance(value, str) or not value.strip():
        raise RecallArgumentError(param, f"{param} must be {TIME_FORMS}")
    text = value.strip()
    shown = text if len(text) <= 40 else text[:37] + "..."
    if m := _RELATIVE_RE.match(text):
        try:
            return now - timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()])
        except (OverflowError, ValueError):
            raise RecallArgumentError(param, f"{param} {shown!r} reaches too far back") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise RecallArgumentError(
            param, f"cannot read {param} {shown!r}: use {TIME_FORMS}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        raise RecallArgumentError(param, f"{param} {shown!r} is out of range") from None


def parse_top_k(value: Any, default_top_k: int) -> int:
    """An integer in 1..limit; integral floats and digit strings are forgiven (LLMs send both)."""
    limit = top_k_limit(default_top_k)
    if value is None:
        return default_top_k
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not 1 <= number <= limit:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RecallArgumentError("top_k", f"top_k must be an integer from 1 to {limit}, "
                                           f"got {shown}")
    return number


def parse_query(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecallArgumentError("query", "query must be a non-empty string: what to look for")
    if len(value) > MAX_QUERY_CHARS:
        raise RecallArgumentError("query", f"query is {len(value)} characters long; "
                                           f"keep it under {MAX_QUERY_CHARS}")
    return value.strip()


def parse_arguments(arguments: Mapping[str, Any] | None, default_top_k: int,
                    now: datetime | None = None) -> RecallArgs:
    """Tool arguments -> RecallArgs, or RecallArgumentError naming the argument at fault."""
    arguments = arguments or {}
    if not isinstance(arguments, Mapping):
        raise RecallArgumentError("arguments", "arguments must be an object")
    unknown = sorted(set(arguments) - {"query", "top_k", "after", "before"})
    if unknown:
        raise RecallArgumentError(unknown[0], f"unknown argument {', '.join(map(repr, unknown))}; "
                                              "accepted: query, top_k, after, before")
    now = now or datetime.now(UTC)
    query = parse_query(arguments.get("query"))
    top_k = parse_top_k(arguments.get("top_k"), default_top_k)
    after = _optional_time(arguments, "after", now)
    before = _optional_time(arguments, "before", now)
    if after is not None and before is not None and after >= before:
        raise RecallArgumentError(
            "after", f"after ({heading_time(after)}) must be earlier than before "
                     f"({heading_time(before)})")
    return RecallArgs(query, top_k, after, before)


def _optional_time(arguments: Mapping[str, Any], param: str, now: datetime) -> datetime | None:
    value = arguments.get(param)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_time(value, param, now)


# -- recall -----------------------------------------------------------------------------------


async def recall(searcher: IndexSearcher | None, query: str, top_k: int,
                 after: datetime | None, before: datetime | None, layout: ClientLayout, *,
                 timeout: float = RECALL_TIMEOUT, budget: int = CHAR_BUDGET) -> dict[str, Any]:
    """Search the client's index, expand the best hits, return `results` and `text`.

    Raises IndexUnavailableError when there is no searcher yet, the index does not answer,
    or the search overruns `timeout` (the thread is then abandoned, never awaited).
    """
    if searcher is None:
        raise IndexUnavailableError("the memory index is starting")
    fetch = top_k * OVERFETCH + 1
    deadline = time.monotonic() + timeout
    search = _lane(searcher).submit(functools.partial(
        _search_by, deadline, searcher, query, fetch, after, before))
    try:
        hits = await asyncio.wait_for(search, timeout + 1.0)
    except TimeoutError:
        raise IndexUnavailableError(f"the memory index did not answer within {timeout:g} s") \
            from None
    try:
        memories = await asyncio.wait_for(asyncio.to_thread(collect, hits, layout, top_k),
                                          timeout)
    except TimeoutError:
        raise RecallTimeoutError(f"reading the matching transcripts took over {timeout:g} s "
                                 "(memd is overloaded)") from None
    return render(memories, budget)


def _search_by(deadline: float, searcher: IndexSearcher, query: str, fetch: int,
               after: datetime | None, before: datetime | None) -> list[Hit]:
    """Runs on a lane thread, maybe after a wait in the lane's queue: search in the time
    that is left, so a busy lane never starts work its caller has stopped waiting for."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise IndexUnavailableError("the recall waited its whole timeout behind earlier ones")
    return searcher.search(query, fetch, after=after, before=before, timeout=left)


LANE_THREADS = 2  # searches of one client at once
# More may queue: a busy gateway has a few connections per client, each with a recall in
# flight. Past that a recall fails at once; queued ones that outwait their deadline give up.
LANE_WAITING = 16


class _Lane:
    """One client's own search threads: a hung index server ties up only these, never the
    threads other clients' recalls (or anything else on the loop's executor) need."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(LANE_THREADS, thread_name_prefix="memd-recall")
        self.busy = 0  # submitted and not finished: running or queued

    def submit(self, fn: Callable[[], list[Hit]]) -> asyncio.Future[list[Hit]]:
        if self.busy >= LANE_THREADS + LANE_WAITING:
            raise IndexUnavailableError(f"{self.busy} recalls of this client are already "
                                        "waiting for its index")
        self.busy += 1
        future = asyncio.get_running_loop().run_in_executor(self.pool, fn)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: asyncio.Future[list[Hit]]) -> None:
        self.busy -= 1


_LANES: weakref.WeakKeyDictionary[IndexSearcher, _Lane] = weakref.WeakKeyDictionary()


def _lane(searcher: IndexSearcher) -> _Lane:
    lane = _LANES.get(searcher)
    if lane is None:
        lane = _LANES[searcher] = _Lane()
        weakref.finalize(searcher, lane.pool.shutdown, wait=False)
    return lane


def collect(hits: Sequence[Hit], layout: ClientLayout, top_k: int) -> list[Memory]:
    """Expand hits best first into at most `top_k` distinct sections of this client's files."""
    sessions = layout.sessions.resolve()
    reader = _LineCache()
    seen: set[tuple[Path, int, int]] = set()
    out: list[Memory] = []
    for hit in hits:
        if len(out) >= top_k:
            break
        path = contained_path(hit.source, sessions)
        if path is None:
            log.warning("recall.source_refused", client=layout.client_id,
                        chunk_hash=hit.chunk_hash)
            continue
        if not path.is_file():
            continue  # deleted since it was indexed: deleting a file removes it from recall
        if _is_front_matter_only(hit):
            continue
        section = expand_hit(hit, sessions, reader.lines(path))
        key = (path, section.start_line, section.end_line)
        if key in seen:
            continue
        seen.add(key)
        content = _strip_front_matter(section.content).strip("\n")
        if not content.strip():
            continue
        focus = max(0, hit.start_line - section.start_line)
        out.append(Memory(
            source=describe_source(path, sessions, hit, reader),
            heading=section.heading, content=content, score=hit.score,
            chunk_hash=hit.chunk_hash, focus_line=focus))
    return out


def contained_path(source: str, sessions: Path) -> Path | None:
    """The source file if it lies inside the client's `sessions/` (symlinks resolved), else None.

    This is what keeps another client's chunk unresolvable even if one ever reached this
    client's results: only files under the requesting client's own sessions/ are read.
    """
    try:
        path = Path(source).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return path if path.is_relative_to(sessions) and path != sessions else None


def describe_source(path: Path, sessions: Path, hit: Hit,
                    reader: _LineCache | None = None) -> Source:
    """Label a section from its path relative to the client root: never an absolute path."""
    rel = "sessions/" + path.relative_to(sessions).as_posix()
    stem = path.stem
    if path.suffix == ".md" and stem.endswith("-summary") and \
            SESSION_ID_RE.match(stem.removesuffix("-summary")):
        return Source(rel, "summary", stem.removesuffix("-summary"), None,
                      _summary_span(hit.heading))
    if path.suffix == ".md" and SESSION_ID_RE.match(stem):
        number, started = _conversation_at(reader or _LineCache(), path, hit.start_line)
        when = heading_time(hit.when) if hit.when else started
        return Source(rel, "transcript", stem, number, when)
    return Source(rel, "file", None, None, heading_time(hit.when) if hit.when else "")


def _summary_span(heading: str) -> str:
    from memd.compaction import parse_summary_title

    span = parse_summary_title(heading)
    return f"{heading_time(span[0])} – {heading_time(span[1])}" if span else ""


def _conversation_at(reader: _LineCache, path: Path, line: int) -> tuple[int | None, str]:
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


class _LineCache:
    """Each source file is read at most once per recall (lines decoded only when used)."""

    def __init__(self) -> None:
        self._lines: dict[Path, Sequence[str]] = {}

    def lines(self, path: Path) -> Sequence[str]:
        if path not in self._lines:
            try:
                self._lines[path] = read_lines(path)
            except OSError:
                self._lines[path] = []
        return self._lines[path]


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


# -- output -----------------------------------------------------------------------------------


def render(memories: Sequence[Memory], budget: int = CHAR_BUDGET) -> dict[str, Any]:
    """`results` (JSON) and `text` (for the LLM) of the same memories, within `budget` chars."""
    if not memories:
        return {"results": [], "text": NO_RESULTS}
    shown, contents = fit(memories, budget)
    results = [_result(m, text) for m, text in zip(shown, contents, strict=True)]
    return {"results": results, "text": format_text(shown, contents, len(memories))}


def _result(memory: Memory, content: str) -> dict[str, Any]:
    src = memory.source
    return {
        "source": src.path, "label": src.label, "kind": src.kind, "session_id": src.session_id,
        "conversation": src.conversation, "when": src.when or None, "heading": memory.heading,
        "content": content, "truncated": content != memory.content,
        "score": round(memory.score, 4), "chunk_hash": memory.chunk_hash,
    }


def _title(total: int) -> str:
    noun = "memory" if total == 1 else "memories"
    return (f"Found {total} {noun} in past conversations with this user "
            "(most relevant first):")


def _label_line(i: int, memory: Memory) -> str:
    return f"[{i}] relevance {memory.score:.2f} · {memory.source.label}"


def _omitted_line(n: int) -> str:
    return f"({n} less relevant {'memory' if n == 1 else 'memories'} left out to keep this short)"


def format_text(shown: Sequence[Memory], contents: Sequence[str], found: int) -> str:
    """Numbered results, each a label line (relevance, kind, session, conversation, time)
    followed by the section's markdown."""
    blocks = [_title(found)]
    blocks += [f"{_label_line(i, m)}\n{c}" for i, (m, c) in enumerate(zip(shown, contents,
                                                                          strict=True), 1)]
    if found > len(shown):
        blocks.append(_omitted_line(found - len(shown)))
    return "\n\n".join(blocks)


def fit(memories: Sequence[Memory], budget: int) -> tuple[list[Memory], list[str]]:
    """Pick how many sections to show and clip each so the whole text stays within budget.

    Short sections keep all of their text; the characters they leave unused go to the long
    ones (water-filling), best first. When even that leaves fewer than MIN_SHARE characters
    per section, the least relevant sections are left out.
    """
    count = len(memories)
    while True:
        shown = list(memories[:count])
        overhead = len(_title(len(memories))) + sum(
            len(_label_line(i, m)) + 3 for i, m in enumerate(shown, 1))  # "\n\n" + "\n"
        if count < len(memories):
            overhead += len(_omitted_line(len(memories) - count)) + 2
        room = budget - overhead
        if count == 1 or room >= MIN_SHARE * count:
            break
        count -= 1
    limits = allot([len(m.content) for m in shown], max(room, 0))
    return shown, [clip(m.content, lim, m.focus_line) for m, lim in zip(shown, limits,
                                                                        strict=True)]


def allot(lengths: Sequence[int], total: int) -> list[int]:
    """Split `total` characters: no one gets more than it needs, the rest is shared evenly."""
    caps = [0] * len(lengths)
    remaining = total
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for pos, i in enumerate(order):
        share = remaining // (len(lengths) - pos)
        caps[i] = min(lengths[i], share)
        remaining -= caps[i]
    return caps


def clip(text: str, limit: int, focus_line: int = 0) -> str:
    """At most `limit` chars of a section: its start (heading, the question) and, when the
    matched chunk lies further down, the text around that chunk."""
    if len(text) <= limit:
        return text
    room = limit - len(_CLIP_END)
    if room <= 0:
        return _CLIP_END.strip()[:max(limit, 0)]
    lines = text.split("\n")
    focus = sum(len(line) + 1 for line in lines[:focus_line])
    if focus + room // 2 <= room:  # the match is near the top: one cut shows it
        return _cut(text, room) + _CLIP_END
    head = _cut(text, max(room // 4, 1))
    body_room = room - len(head) - len(_CLIP_GAP)
    if body_room <= 0:
        return _cut(text, room) + _CLIP_END
    return head + _CLIP_GAP + _cut(text[focus:], body_room) + _CLIP_END


def _cut(text: str, n: int) -> str:
    """The first `n` chars, ending at a line or word break when one is near the end."""
    if len(text) <= n:
        return text
    piece = text[:n]
    floor = math.floor(n * 0.75)
    for sep in ("\n", " "):
        at = piece.rfind(sep)
        if at >= floor:
            return piece[:at].rstrip()
    return piece

