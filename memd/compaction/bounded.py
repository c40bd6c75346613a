"""Bounded summarisation: a transcript of any length summarised in requests of bounded size.

`summarize` bounds what any single request carries: a long text is cut into parts at
section headings (`#`/`##` lines; a single oversized section is cut by characters), each
part is summarised, and the part summaries are combined, again in batches that fit,
until one summary is left. Every prompt is at most `max_request_chars` characters. The
calls themselves are memd.compaction.llm's `complete`, passed in as `call`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger()

DEFAULT_MAX_REQUEST_CHARS = 24_000
MIN_REQUEST_CHARS = 2_000  # below this the prompts themselves leave no room for text
SEPARATOR = "\n\n---\n\n"  # what memsearch's compact_chunks puts between chunks
_SECTION_RE = re.compile(r"^#{1,2} ", re.MULTILINE)
_TRUNCATED = "\n[…]"

Complete = Callable[[str], Awaitable[str]]  # one prompt in, the LLM's text out


PART_PROMPT = """\
You are summarising {what} of a recorded conversation session between a user and an AI \
assistant ({span}). In the transcript, each `## ` heading is one exchange (its time and \
number) and **User:** / **Assistant:** mark who said what.

Write a concise markdown summary that can serve as long-term memory of this session: \
what the user wanted and asked, facts about the user and their work, decisions and \
conclusions, answers and solutions given, and the names, numbers, dates, commands and \
code worth remembering. Keep open questions. Do not invent anything. Use short `##` \
headings and bullet points, at most about {words} words.

Transcript:
{chunks}"""

MERGE_PROMPT = """\
Below are summaries of consecutive parts of one recorded conversation session between a \
user and an AI assistant ({span}), oldest first, separated by `---`.

Combine them into one concise markdown summary of the whole session that can serve as \
long-term memory: keep every fact, decision, answer, name, number, date, command and \
code snippet worth remembering, and drop repetition. Do not invent anything. Use short \
`##` headings and bullet points, at most about {words} words.

Summaries:
{chunks}"""


@dataclass
class Summary:
    """The result of `summarize`: the text and what it cost."""

    text: str
    parts: int = 1
    requests: int = 0
    largest_request: int = 0


@dataclass
class _Budget:
    limit: int
    words: int
    requests: int = 0
    largest: int = 0


async def summarize(
    text: str, call: Complete, *, span: str, max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS
) -> Summary:
    """Summarise `text` of any length with `call`, no prompt longer than `max_request_chars`.

    Parts are summarised one after another, not at once: one compaction never holds more
    than one request open, so the compactor's concurrency bound is the LLM's load bound.
    """
    if max_request_chars < MIN_REQUEST_CHARS:
        raise ValueError(f"max_request_chars must be at least {MIN_REQUEST_CHARS}")
    # Ask for summaries short enough that about four fit into one combining request.
    budget = _Budget(max_request_chars, words=max(80, min(800, max_request_chars // 24)))
    room = max_request_chars - len(
        _prompt(PART_PROMPT, "", "part 999999999 of 999999999", span, budget.words)
    )
    parts = split_text(text, room)
    summaries = []
    for i, part in enumerate(parts, 1):
        what = "the transcript" if len(parts) == 1 else f"part {i} of {len(parts)}"
        summaries.append(await _ask(call, budget, PART_PROMPT, part, what, span))
    final = await _combine(summaries, call, budget, span)
    return Summary(
        final, parts=len(parts), requests=budget.requests, largest_request=budget.largest
    )


async def _combine(summaries: list[str], call: Complete, budget: _Budget, span: str) -> str:
    """Merge part summaries in batches that fit, round after round, until one is left."""
    room = budget.limit - len(_prompt(MERGE_PROMPT, "", "", span, budget.words))
    while len(summaries) > 1:
        batches = _pack(summaries, room)
        if len(batches) == len(summaries):
            # Summaries so long that no two fit together: the LLM ignored the length it
            # was asked for. Shorten them so the rounds always end.
            log.warning("compaction.summaries_truncated", count=len(summaries))
            keep = room // 2 - len(SEPARATOR) - len(_TRUNCATED)
            summaries = [s if len(s) <= keep else s[:keep] + _TRUNCATED for s in summaries]
            batches = _pack(summaries, room)
        summaries = [
            await _ask(call, budget, MERGE_PROMPT, SEPARATOR.join(batch), "", span)
            for batch in batches
        ]
    return summaries[0]


async def _ask(
    call: Complete, budget: _Budget, template: str, body: str, what: str, span: str
) -> str:
    prompt = _prompt(template, body, what, span, budget.words)
    if len(prompt) > budget.limit:  # a bug in the packing, never the LLM's problem
        raise AssertionError(f"prompt of {len(prompt)} chars exceeds {budget.limit}")
    budget.requests += 1
    budget.largest = max(budget.largest, len(prompt))
    return (await call(prompt)).strip()


def _prompt(template: str, body: str, what: str, span: str, words: int) -> str:
    # One format call with every field: text inside `body` is never parsed as a template.
    return template.format(chunks=body, what=what, span=span, words=words)


def _pack(items: list[str], room: int) -> list[list[str]]:
    """Consecutive items joined by SEPARATOR into batches of at most `room` characters."""
    batches: list[list[str]] = []
    size = 0
    for item in items:
        extra = len(item) + (len(SEPARATOR) if batches and batches[-1] else 0)
        if batches and size + extra <= room:
            batches[-1].append(item)
            size += extra
        else:
            batches.append([item])
            size = len(item)
    return batches


def split_text(text: str, room: int) -> list[str]:
    """Cut `text` into parts of at most `room` characters at `#`/`##` heading lines.

    A section is never cut unless it alone is longer than `room`; then it is cut at line
    ends where possible, and every later piece repeats the section's heading marked
    `(continued)` so each part still says which exchange it belongs to.
    """
    starts = [m.start() for m in _SECTION_RE.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    sections = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    parts: list[str] = []
    current = ""
    for section in sections:
        pieces = [section] if len(section) <= room else _cut_section(section, room)
        for piece in pieces:
            if len(current) + len(piece) <= room:
                current += piece
            else:
                if current.strip():
                    parts.append(current)
                current = piece
    if current.strip() or not parts:
        parts.append(current)
    return parts


def _cut_section(section: str, room: int) -> list[str]:
    first_line = section.split("\n", 1)[0]
    head = (first_line + " (continued)\n\n") if _SECTION_RE.match(first_line) else ""
    if len(head) > room // 2:
        head = ""
    pieces: list[str] = []
    rest = section
    while rest:
        limit = room - (len(head) if pieces else 0)
        if len(rest) <= limit:
            piece, rest = rest, ""
        else:
            cut = rest.rfind("\n", limit // 2, limit)
            cut = cut + 1 if cut > 0 else limit
            piece, rest = rest[:cut], rest[cut:]
        pieces.append((head if pieces else "") + piece)
    return pieces
