"""Recall's output: memories as JSON results and as the text an LLM reads, within a budget."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memd.recall.tool import NO_RESULTS

CHAR_BUDGET = 12_000  # the whole text returned to the LLM, labels included
MIN_SHARE = 300  # below this many characters per section, fewer sections are shown
_CLIP_END = "\n[… truncated]"
_CLIP_GAP = "\n[…]\n"


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


# -- recall -----------------------------------------------------------------------------------
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
        "source": src.path,
        "label": src.label,
        "kind": src.kind,
        "session_id": src.session_id,
        "conversation": src.conversation,
        "when": src.when or None,
        "heading": memory.heading,
        "content": content,
        "truncated": content != memory.content,
        "score": round(memory.score, 4),
        "chunk_hash": memory.chunk_hash,
    }


def _title(total: int) -> str:
    noun = "memory" if total == 1 else "memories"
    return f"Found {total} {noun} in past conversations with this user (most relevant first):"


def _label_line(i: int, memory: Memory) -> str:
    return f"[{i}] relevance {memory.score:.2f} · {memory.source.label}"


def _omitted_line(n: int) -> str:
    return f"({n} less relevant {'memory' if n == 1 else 'memories'} left out to keep this short)"


def format_text(shown: Sequence[Memory], contents: Sequence[str], found: int) -> str:
    """Numbered results, each a label line (relevance, kind, session, conversation, time)
    followed by the section's markdown."""
    blocks = [_title(found)]
    blocks += [
        f"{_label_line(i, m)}\n{c}" for i, (m, c) in enumerate(zip(shown, contents, strict=True), 1)
    ]
    if found > len(shown):
        blocks.append(_omitted_line(found - len(shown)))
    return "\n\n".join(blocks)


def fit(memories: Sequence[Memory], budget: int) -> tuple[list[Memory], list[str]]:
    """Pick how many sections to show and clip each so the whole text stays within budget.

    Each section gets at most an equal share of the room: a section shorter than that keeps
    all of its text, a longer one is cut around its matching chunk, with a marker. The
    room short sections leave is not handed to long ones, so one huge section (a long
    system prompt) never crowds out the other results. When the shares fall under
    MIN_SHARE characters, the least relevant sections are left out.
    """
    count = len(memories)
    while True:
        shown = list(memories[:count])
        overhead = len(_title(len(memories))) + sum(
            len(_label_line(i, m)) + 3 for i, m in enumerate(shown, 1)
        )  # "\n\n" + "\n"
        if count < len(memories):
            overhead += len(_omitted_line(len(memories) - count)) + 2
        room = budget - overhead
        if count == 1 or room >= MIN_SHARE * count:
            break
        count -= 1
    limits = allot([len(m.content) for m in shown], max(room, 0))
    return shown, [clip(m.content, lim, m.focus_line) for m, lim in zip(shown, limits, strict=True)]


def allot(lengths: Sequence[int], total: int) -> list[int]:
    """Split `total` characters fairly: each gets what it needs, up to an equal share."""
    if not lengths:
        return []
    share = total // len(lengths)
    return [min(n, share) for n in lengths]


def clip(text: str, limit: int, focus_line: int = 0) -> str:
    """At most `limit` chars of a section: its start (heading, the question) and, when the
    matched chunk lies further down, the text around that chunk."""
    if len(text) <= limit:
        return text
    room = limit - len(_CLIP_END)
    if room <= 0:
        return _CLIP_END.strip()[: max(limit, 0)]
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
